"""`nodecheck serve` and `check --textfile-dir`: the Report as Prometheus metrics."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Optional

import typer

from nodecheck.cli.app import CONFIG_OPTION, FROM_OPTION, app, fail, load_report
from nodecheck.core.errors import NodecheckError


@app.command()
def check(
    textfile_dir: Optional[Path] = typer.Option(None, "--textfile-dir", help="node_exporter's textfile collector directory."),
    npd: Optional[str] = typer.Option(None, "--npd", help="Speak node-problem-detector's custom-plugin protocol for one area: gpu, fabric or bandwidth (exit 0 ok, 1 problem, 2 unknown; one line of at most 80 characters)."),
    npd_severity: str = typer.Option("error", "--npd-severity", help="With --npd: the least severity that is a problem (error for a condition; warning for NPD's temporary events)."),
    measurements_file: Optional[Path] = typer.Option(None, "--measurements", help="With --npd bandwidth: the measurements this file holds (what `nodecheck bench --json` wrote), judged as `serve --measurements` judges them; older than 7 days, unknown."),
    source: Optional[Path] = FROM_OPTION,
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Probe once and write the metrics as DIR/nodecheck.prom, atomically (for node_exporter sites); or, with
    --npd AREA, answer node-problem-detector as its custom plugin."""
    from nodecheck.prometheus.exposition import write_textfile

    if (textfile_dir is None) == (npd is None):
        fail("give --textfile-dir DIR or --npd AREA (one of them)")
    if npd is not None:
        _npd(npd, npd_severity, source, config_path, measurements_file)
    if measurements_file is not None:
        fail("--measurements goes with --npd bandwidth")
    if not textfile_dir.is_dir():
        fail(f"--textfile-dir {textfile_dir} is not a directory")
    try:
        report, config = load_report(source, config_path)
        target = write_textfile(report, textfile_dir, config.virtual_nics)
    except NodecheckError as error:
        fail(str(error))
    except OSError as error:
        fail(f"cannot write into {textfile_dir}: {error.strerror or error}")
    typer.echo(f"metrics written to {target} ({len(report.findings)} findings)")


def _npd(area: str, severity: str, source: Optional[Path], config_path: Optional[Path], measurements: Optional[Path]) -> None:
    """NPD reads the exit code and the first line of stdout; anything nodecheck cannot answer is unknown (2),
    never a problem: a broken config must not mark every node unhealthy."""
    from nodecheck.kubernetes.npd import AREAS, NPD_UNKNOWN, npd_verdict
    from nodecheck.report.findings import SEVERITIES

    if area not in AREAS or severity not in SEVERITIES:
        typer.echo(f"unknown: --npd {area[:20]} (one of {', '.join(AREAS)}) --npd-severity {severity[:10]}"[:80])
        raise typer.Exit(NPD_UNKNOWN)
    if (measurements is not None) != (area == "bandwidth"):
        typer.echo("unknown: --npd bandwidth reads --measurements FILE (bench --json's)"
                   if measurements is None else "unknown: --measurements goes with --npd bandwidth")
        raise typer.Exit(NPD_UNKNOWN)
    try:
        report, config = load_report(source, config_path)
        if measurements is not None:
            report = _with_measurements_file(report, config, measurements)
    except NodecheckError as error:
        typer.echo(" ".join(f"unknown: {error}".split())[:80])
        raise typer.Exit(NPD_UNKNOWN) from None
    code, line = npd_verdict(report, area, severity)
    typer.echo(line)
    raise typer.Exit(code)


MEASUREMENTS_MAX_AGE_S = 7 * 86400  # as NodecheckBandwidthStale (deploy/prometheus/nodecheck-rules.yml) alerts


def _with_measurements_file(report, config, path: Path):
    """The Report judged with the measurements a bench wrote, as `serve --measurements` publishes them; a file
    older than a week is no verdict (a bench timer that stopped keeps no node healthy)."""
    import time

    from nodecheck.bench.plan import read_measurements_file
    from nodecheck.verdicts.bandwidth import with_measurements

    try:
        measurements, measured_at = read_measurements_file(path, report.node.get("hostname") or None)
    except NodecheckError as error:  # NPD shows 80 characters: the file's name, not its directory
        raise NodecheckError(str(error).replace(str(path), path.name, 1)) from None
    if measured_at is None:
        raise NodecheckError(f"{path}: says not when it was measured")
    age = time.time() - measured_at
    if age > MEASUREMENTS_MAX_AGE_S:
        raise NodecheckError(f"{path.name}: measured {age / 86400:.0f} days ago (bench not run since)")
    return with_measurements(report, measurements, measured_at, config)


@app.command()
def serve(
    listen: Optional[str] = typer.Option(None, "--listen", help="HOST:PORT for /metrics (':PORT': all addresses). Default: [serve] listen in the config, else :10042."),
    source: Optional[Path] = FROM_OPTION,
    interval: Optional[float] = typer.Option(None, "--interval", min=1, help="Seconds between probe rounds. Default: [serve] interval in the config, else 60."),
    web_config: Optional[Path] = typer.Option(None, "--web-config", help="TLS and basic auth, in the exporter-toolkit web config format node_exporter reads (needs the web extra: sh deploy/install.sh web)."),
    bench_every: float = typer.Option(0.0, "--bench-every", min=0, help="Run `nodecheck bench --quick` in a subprocess every N seconds (0: never; leave 0 on nodes that run jobs); a round is skipped while a GPU is busy."),
    bench_timeout: float = typer.Option(600.0, "--bench-timeout", min=1, help="Seconds before a scheduled bench run is killed."),
    log_level: str = typer.Option("info", "--log-level", help="debug (a line per probe round), info (start, recoveries, bench runs), warning (probe failures), or error."),
    measurements_file: Optional[Path] = typer.Option(None, "--measurements", help="Publish the measurements this file holds (what `nodecheck bench --json` wrote, e.g. from a timer), read again every interval."),
    kubernetes_conditions: bool = typer.Option(False, "--kubernetes-conditions", help="In a pod: patch this node's conditions NodecheckGpuProblem, NodecheckFabricProblem, NodecheckBandwidthProblem and post Events for warnings, with the pod's service account (deploy/kubernetes/rbac.yaml)."),
    kubernetes_taint: bool = typer.Option(False, "--kubernetes-taint", help="With --kubernetes-conditions: taint the node nodecheck/unhealthy:NoSchedule while a condition is True, and lift that taint (only that one) when none is (deploy/kubernetes/rbac-taint.yaml)."),
    kubernetes_device_taints: bool = typer.Option(False, "--kubernetes-device-taints", help="With --kubernetes-conditions: take a GPU with a failing finding from the scheduler by a DRA DeviceTaintRule on exactly its device (key nodecheck/<check>), found in the node's ResourceSlices by UUID or PCI address; lifted when the finding clears (deploy/kubernetes/rbac-device-taints.yaml)."),
    kubernetes_device_taint_effect: str = typer.Option("NoSchedule", "--kubernetes-device-taint-effect", help="With --kubernetes-device-taints: NoSchedule (new pods keep off the GPU), NoExecute (its pods are evicted too) or None (said, not acted on: a dry run)."),
    kubernetes_device_taint_max_share: float = typer.Option(0.5, "--kubernetes-device-taint-max-share", help="With --kubernetes-device-taints: the most of the node's GPUs device taints may take (above 0, at most 1); past it no new GPU is tainted by device, and the node condition (and --kubernetes-taint) speaks for the rest."),
    kubernetes_node: Optional[str] = typer.Option(None, "--kubernetes-node", envvar="NODE_NAME", help="The Node's name (default: $NODE_NAME, which the DaemonSet sets from spec.nodeName)."),
    kubernetes_credentials: Path = typer.Option(Path("/var/run/secrets/kubernetes.io/serviceaccount"), "--kubernetes-credentials", help="The service account's token and ca.crt."),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Serve the latest Report as Prometheus metrics (docs/metrics.md). A scrape never waits for a probe."""
    import logging
    import signal
    import threading

    from nodecheck import config as config_module
    from nodecheck.host.live import LiveHost
    from nodecheck.host.snapshot import open_snapshot
    from nodecheck.pipeline import build_report
    from nodecheck.prometheus.serve import serve as run_server

    levels = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
    if log_level.lower() not in levels:
        raise typer.BadParameter(f"{log_level!r}: one of {', '.join(levels)}", param_hint="'--log-level'")
    logging.basicConfig(level=levels[log_level.lower()], format="nodecheck serve: %(levelname)s %(message)s")
    try:
        config = config_module.load(config_path)
        address = config_module.parse_listen(listen) if listen is not None else config.listen
        if address is None:
            raise typer.BadParameter(f"{listen!r}: expected HOST:PORT, e.g. 127.0.0.1:{config_module.DEFAULT_PORT} or :{config_module.DEFAULT_PORT} (all addresses)",
                                     param_hint="'--listen'")
        host, port = address
        interval = interval if interval is not None else config.interval
        node_health = None
        if not kubernetes_device_taints and (kubernetes_device_taint_effect, kubernetes_device_taint_max_share) != ("NoSchedule", 0.5):
            raise typer.BadParameter("goes with --kubernetes-device-taints", param_hint="'--kubernetes-device-taint-*'")
        if kubernetes_conditions or kubernetes_taint or kubernetes_device_taints:
            device_taints = (kubernetes_device_taint_effect, kubernetes_device_taint_max_share) if kubernetes_device_taints else None
            node_health = _node_health(kubernetes_conditions, kubernetes_taint, kubernetes_node, kubernetes_credentials, config,
                                       device_taints)
        web = None
        if web_config is not None:
            from nodecheck.prometheus.webconfig import load_web_config

            web = load_web_config(web_config)
            for warning in web.warnings:
                logging.getLogger("nodecheck.serve").warning("%s", warning)
        with tempfile.TemporaryDirectory(prefix="nodecheck-serve-") as workdir:
            probe_host = LiveHost() if source is None else open_snapshot(source, Path(workdir))
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            from nodecheck.bench.plan import read_measurements_file, run_in_subprocess

            bench_args = ["--quick"] + (["--config", str(config_path)] if config_path else [])
            this_host = _hostname(probe_host) if measurements_file else None
            run_server(host, port, lambda: build_report(probe_host, config), interval, stop, web,
                       bench=lambda: run_in_subprocess(bench_args, bench_timeout), bench_every=bench_every, config=config,
                       measurements=(lambda: read_measurements_file(measurements_file, this_host)) if measurements_file else None,
                       node_health=node_health)
    except NodecheckError as error:
        fail(str(error))
    except OSError as error:  # port taken, unreadable certificate ...
        fail(f"cannot serve on {host}:{port}: {error.strerror or error}")


def _hostname(host) -> str | None:
    """The node's name as its Report gives it (the snapshot's when replaying one); None when unknown."""
    try:
        name = host.identity().get("hostname")
    except NodecheckError:
        return None
    return name if isinstance(name, str) and name else None


NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _node_health(conditions: bool, taint: bool, node: Optional[str], credentials: Path, config,
                 device_taints: tuple[str, float] | None = None):
    """The Kubernetes publisher, or a clear configuration error before anything is served. device_taints: (effect,
    max share) with --kubernetes-device-taints."""
    import os

    from nodecheck.kubernetes.api import ApiClient
    from nodecheck.kubernetes.device_taint_rules import EFFECTS
    from nodecheck.kubernetes.device_taints import DeviceTaints
    from nodecheck.kubernetes.node_health import NodeHealth

    if taint and not conditions:
        raise typer.BadParameter("needs --kubernetes-conditions as well", param_hint="'--kubernetes-taint'")
    if device_taints is not None:
        effect, share = device_taints
        if not conditions:
            raise typer.BadParameter("needs --kubernetes-conditions as well", param_hint="'--kubernetes-device-taints'")
        if effect not in EFFECTS:
            raise typer.BadParameter(f"{effect[:20]!r}: one of {', '.join(EFFECTS)}", param_hint="'--kubernetes-device-taint-effect'")
        if not 0 < share <= 1:
            raise typer.BadParameter(f"{share:g}: a share of the node's GPUs, above 0 and at most 1",
                                     param_hint="'--kubernetes-device-taint-max-share'")
    if not node:
        raise typer.BadParameter("no node name: set NODE_NAME from the pod's spec.nodeName (deploy/kubernetes/daemonset.yaml)",
                                 param_hint="'--kubernetes-node'")
    if len(node) > 253 or not NODE_NAME.fullmatch(node):
        raise typer.BadParameter(f"{node[:60]!r} is not a Kubernetes node name", param_hint="'--kubernetes-node'")
    api = ApiClient.in_cluster(dict(os.environ), credentials)
    devices = None if device_taints is None else DeviceTaints(api, node, config.fail_severity, *device_taints)
    return NodeHealth(api, node, config.fail_severity, taint, device_taints=devices)
