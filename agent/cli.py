"""The command line: inspect, snapshot, config init, bench, check, serve, prolog, healthcheck.

Exit codes: 0 healthy, 1 a finding at or above the failing severity, 2 usage or config error.
Only this module turns a NodecheckError into a message and an exit code.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from nodecheck import __version__
from nodecheck.errors import ConfigError, NodecheckError
from nodecheck.limits import MAX_GPUS
from nodecheck.model import BENCH_TESTS

# rich_markup_mode=None: help texts are plain text, so `[prolog]` and `[serve]` print as written
app = typer.Typer(add_completion=True, no_args_is_help=True, rich_markup_mode=None,
                  help="What a GPU node is, and whether it performs to spec.")
config_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Expectations file (TOML).")
app.add_typer(config_app, name="config")

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2

_FROM = typer.Option(None, "--from", help="Replay a snapshot (directory or .tar.gz) instead of this machine.")
_CONFIG = typer.Option(None, "--config", "-c", help="Expectations file (default /etc/nodecheck/config.toml if present).")


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    typer.echo(f"nodecheck: {message}", err=True)
    raise typer.Exit(code)


def _report(source: Optional[Path], config_path: Optional[Path], judge: bool = True):
    from nodecheck import config as config_module
    from nodecheck.build import build_report
    from nodecheck.host import LiveHost
    from nodecheck.snapshot import open_snapshot

    config = config_module.load(config_path)
    if source is None:
        return build_report(LiveHost(), config, judge=judge), config
    with tempfile.TemporaryDirectory(prefix="nodecheck-snapshot-") as workdir:
        return build_report(open_snapshot(source, Path(workdir)), config), config


@app.command()
def inspect(
    source: Optional[Path] = _FROM,
    as_json: bool = typer.Option(False, "--json", help="Print the Report as JSON (docs/report-schema.md)."),
    config_path: Optional[Path] = _CONFIG,
) -> None:
    """Report GPUs, links, NUMA locality, NICs, path specs, findings and binding advice."""

    try:
        report, config = _report(source, config_path)
    except NodecheckError as error:
        _fail(str(error))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        from nodecheck.render import render

        render(report)
    raise typer.Exit(EXIT_FINDINGS if report.fails(config.fail_severity) else EXIT_OK)


@app.command()
def snapshot(
    out: Path = typer.Argument(..., help="Directory to create, or a path ending in .tar.gz."),
    config_path: Optional[Path] = _CONFIG,
) -> None:
    """Record every raw source the probes read (for `inspect --from` and support tickets)."""
    from nodecheck import config as config_module
    from nodecheck.build import build_report
    from nodecheck.host import LiveHost
    from nodecheck.snapshot import RecordingHost

    if out.is_symlink():  # dangling or not: nodecheck runs as root and must not write where a link points
        _fail(f"{out} is a symbolic link: give the real path")
    if out.exists() and (out.is_file() or any(out.iterdir())):
        _fail(f"{out} already exists and is not empty")
    try:
        recorder = RecordingHost(LiveHost())
        report = build_report(recorder, config_module.load(config_path))
        recorder.write(out)
    except (NodecheckError, OSError) as error:
        _fail(str(error))
    failed = [p.name for p in report.probes if not p.ok]
    typer.echo(f"snapshot written to {out} ({len(recorder.sources)} sources"
               + (f"; without data from: {', '.join(failed)}" if failed else "") + ")")


@config_app.command("init")
def config_init(
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of standard output."),
    source: Optional[Path] = _FROM,
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Write this node's facts as a starting config (run it on a known-good node)."""
    from nodecheck.config import generate

    try:
        report, _ = _report(source, None)
    except NodecheckError as error:
        _fail(str(error))
    text = generate(report)
    if output is None:
        typer.echo(text, nl=False)
        return
    if output.exists() and not force:
        _fail(f"{output} exists; use --force to overwrite")
    try:
        output.write_text(text)
    except OSError as error:
        _fail(f"cannot write {output}: {error.strerror or error}")
    typer.echo(f"config written to {output}")


@config_app.command("check")
def config_check(
    file: Path = typer.Argument(..., help="The config to check (TOML)."),
    source: Optional[Path] = _FROM,
) -> None:
    """Validate a config and show what it would judge on this node (or a snapshot of a known-good node, --from)
    before it is deployed: each expectation beside what the node has, the findings, and whether the Slurm
    prolog would drain the node. Exit 0: valid, the node passes; 1: the prolog would drain it; 2: invalid."""
    from nodecheck.config_check import expectation_rows
    from nodecheck.prolog import drain_reason, failing_findings

    try:
        report, config = _report(source, file)
    except NodecheckError as error:
        _fail(str(error))
    from nodecheck.render import config_check_lines

    where = f"snapshot {source}" if source else "this node"
    failing = failing_findings(report.findings, config.fail_severity)  # as the prolog's node check judges
    reason = drain_reason(failing) or None
    typer.echo("\n".join(config_check_lines(str(file), where, report, expectation_rows(config, report), failing, reason,
                                            config.fail_severity)))
    raise typer.Exit(EXIT_FINDINGS if reason else EXIT_OK)


@app.command()
def bench(
    tests: Optional[str] = typer.Option(None, "--tests", help=f"Comma-separated from {','.join(BENCH_TESTS)} (default: all that apply here)."),
    full: bool = typer.Option(False, "--full", help="Payload sweep (and pageable host memory) instead of one saturating payload."),
    quick: bool = typer.Option(False, "--quick", help="One payload past saturation (the default)."),
    timeout: float = typer.Option(120.0, "--timeout", min=1, help="Seconds before a test is killed and recorded as failed."),
    nccl_log: Optional[Path] = typer.Option(None, "--nccl-log", help="Only read a saved nccl-tests log (text or -J JSON), report every row, and judge its peak busbw against this node's (or --from's) slowest GPU pair."),
    source: Optional[Path] = typer.Option(None, "--from", help="With --nccl-log: judge the log against this snapshot's node instead of this machine."),
    as_json: bool = typer.Option(False, "--json", help="Print the Report with its measurements as JSON."),
    measure_only: bool = typer.Option(False, "--measure-only", hidden=True, help="Print the measurements alone, unjudged, as JSON (what `serve` and `prolog` run)."),
    config_path: Optional[Path] = _CONFIG,
) -> None:
    """Measure bandwidth and compare it with the spec of its path; below thresholds.bandwidth_ratio is a finding.
    Under torchrun or srun, `allreduce` runs across the job's nodes (NCCL on GPUs, gloo on CPUs)."""
    if nccl_log is not None:
        _read_nccl_log(nccl_log, as_json, source, config_path)
        return
    if source is not None:
        _fail("--from goes with --nccl-log: a snapshot can be judged, not measured")
    if full and quick:
        _fail("--quick and --full exclude each other")
    import os

    from nodecheck.bench import plan
    from nodecheck.bench.distributed import distributed_env
    from nodecheck.rules import with_measurements

    try:
        env = distributed_env(dict(os.environ))
        report, config = _report(None, config_path, judge=not measure_only)
    except NodecheckError as error:
        _fail(str(error))
    from nodecheck.bench.nccl_binary import find_binary

    installed = find_binary(config, dict(os.environ)) is not None
    across = env is not None and env.across_nodes
    chosen = [t.strip() for t in tests.split(",") if t.strip()] if tests else plan.applicable(report, across, installed)
    unknown = sorted(set(chosen) - set(BENCH_TESTS))
    if unknown:
        _fail(f"unknown test(s): {', '.join(unknown)} (known: {', '.join(BENCH_TESTS)})")
    if not chosen:
        _fail("no test applies here: no GPU, and not launched by torchrun/srun (RANK, WORLD_SIZE, MASTER_ADDR) "
              "for an all-reduce across nodes")
    level = "full" if full else "quick"
    if as_json or measure_only:
        measurements = plan.run(report, config, chosen, level, timeout, dict(os.environ), env)
    else:
        from rich.console import Console

        with Console(stderr=True).status(f"nodecheck bench: {', '.join(chosen)} ({level})"):
            measurements = plan.run(report, config, chosen, level, timeout, dict(os.environ), env)
    if measure_only:  # the caller judges them, once, against its own Report
        typer.echo(json.dumps({"schema": "nodecheck.measurements", "measured_at": time.time(),
                               "measurements": [asdict(m) for m in measurements]}))
        raise typer.Exit(EXIT_OK)
    report = with_measurements(report, measurements, time.time(), config)
    if across and env.rank != 0:
        # One Report for the job, rank 0's: it holds every node's figures and verdict. A rank that exited 1
        # would make torchrun kill the others, rank 0 before it prints, exactly when the fabric is bad.
        typer.echo(f"nodecheck bench: rank {env.rank} of {env.world_size}: the job's Report is rank 0's", err=True)
        raise typer.Exit(EXIT_OK)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        from nodecheck.render import render_measurements

        render_measurements(report)
    raise typer.Exit(EXIT_FINDINGS if report.fails(config.fail_severity) else EXIT_OK)


@app.command("nccl-log")
def nccl_log(
    log: Path = typer.Argument(..., help="An NCCL_DEBUG=INFO log (mpirun or srun prefixes, nccl-tests output mixed in)."),
    source: Optional[Path] = typer.Option(None, "--from", help="Judge it against this snapshot's node instead of this machine."),
    as_json: bool = typer.Option(False, "--json", help="Print the facts and findings as JSON."),
    config_path: Optional[Path] = _CONFIG,
) -> None:
    """What NCCL really did, from its debug log: version, network, HCAs and interfaces, the transport inside
    and between nodes, GPUDirect RDMA, NVLS, its warnings; findings judged against this node (or --from)."""
    from dataclasses import asdict

    from nodecheck.bench.nccl_debug import parse_nccl_debug
    from nodecheck.findings import at_or_above
    from nodecheck.nccl_run import nccl_findings

    try:
        run = parse_nccl_debug(_read_log(log))
        report, config = _report(source, config_path)
    except NodecheckError as error:
        _fail(str(error) if str(log) in str(error) else f"{log}: {error}")
    findings = nccl_findings(run, report)
    where = f"snapshot {source}" if source else "this node"
    if as_json:
        typer.echo(json.dumps({"schema": "nodecheck.nccl_debug", "schema_version": 1, "nccl": asdict(run), "judged_against": where,
                               "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        from nodecheck.render import nccl_run_lines

        typer.echo("\n".join(nccl_run_lines(run, findings, where)))
    raise typer.Exit(EXIT_FINDINGS if at_or_above(findings, config.fail_severity) else EXIT_OK)


def _read_log(path: Path) -> str:
    """A log's text, bounded (MAX_COMMAND_OUTPUT); bytes that are not UTF-8 replaced."""
    from nodecheck.host import read_user_file
    from nodecheck.limits import MAX_COMMAND_OUTPUT

    return read_user_file(path, MAX_COMMAND_OUTPUT, "the log").decode("utf-8", errors="replace")


def _read_nccl_log(nccl_log: Path, as_json: bool, source: Optional[Path], config_path: Optional[Path]) -> None:
    """Every row of the log, then its largest out-of-place busbw judged against the slowest GPU pair of
    this node or of the snapshot: "is this log normal for this node?"."""
    from dataclasses import asdict

    from nodecheck.bench.gpu import staged_if_shm
    from nodecheck.bench.nccl_binary import measurement_from_log
    from nodecheck.bench.nccl_debug import attach, parse_nccl_debug
    from nodecheck.bench.nccl_tests import parse_nccl_log
    from nodecheck.errors import ParseError
    from nodecheck.nccl_run import nccl_findings
    from nodecheck.rules import with_measurements

    try:
        text = _read_log(nccl_log)
        log = parse_nccl_log(text)
        report, config = _report(source, config_path)
    except NodecheckError as error:
        _fail(str(error) if str(nccl_log) in str(error) else f"{nccl_log}: {error}")
    try:  # run with NCCL_DEBUG=INFO, the same log also says what NCCL chose
        run = parse_nccl_debug(text)
    except ParseError:
        run = None
    measurement = measurement_from_log(log, report, "nccl-log", f"nccl-tests log {nccl_log.name}")
    if measurement is not None:  # judged as bench judges it (over SHM a staged path), what NCCL chose with it
        judged = with_measurements(report, [staged_if_shm(attach(measurement, run))], time.time(), config)
        (measurement,), findings = judged.measurements, judged.findings[len(report.findings):]
    else:
        findings = nccl_findings(run, report) if run else []
    where = f"snapshot {source}" if source else "this node"
    if as_json:
        typer.echo(json.dumps({"schema": "nodecheck.nccl_log", "schema_version": 1, "nccl_log": asdict(log), "judged_against": where,
                               "measurement": asdict(measurement) if measurement else None,
                               "nccl": asdict(run) if run else None,
                               "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        from nodecheck.render import render_nccl_log, render_verdict

        render_nccl_log(log, str(nccl_log))
        render_verdict(measurement, [f for f in findings if not f.kind.startswith("nccl_")], where)
        if run:
            from nodecheck.render import nccl_run_lines

            typer.echo("\n".join(nccl_run_lines(run, [f for f in findings if f.kind.startswith("nccl_")], where,
                                                 verdict_above=measurement is not None)))
    from nodecheck.findings import at_or_above

    raise typer.Exit(EXIT_FINDINGS if at_or_above(findings, config.fail_severity) else EXIT_OK)


@app.command()
def check(
    textfile_dir: Path = typer.Option(..., "--textfile-dir", help="node_exporter's textfile collector directory."),
    source: Optional[Path] = _FROM,
    config_path: Optional[Path] = _CONFIG,
) -> None:
    """Probe once and write the metrics as DIR/nodecheck.prom, atomically (for node_exporter sites)."""
    from nodecheck.exporters.prometheus import write_textfile

    if not textfile_dir.is_dir():
        _fail(f"--textfile-dir {textfile_dir} is not a directory")
    try:
        report, config = _report(source, config_path)
        target = write_textfile(report, textfile_dir, config.virtual_nics)
    except NodecheckError as error:
        _fail(str(error))
    except OSError as error:
        _fail(f"cannot write into {textfile_dir}: {error.strerror or error}")
    typer.echo(f"metrics written to {target} ({len(report.findings)} findings)")


@app.command()
def serve(
    listen: Optional[str] = typer.Option(None, "--listen", help="HOST:PORT for /metrics (':PORT': all addresses). Default: [serve] listen in the config, else :10042."),
    source: Optional[Path] = _FROM,
    interval: Optional[float] = typer.Option(None, "--interval", min=1, help="Seconds between probe rounds. Default: [serve] interval in the config, else 60."),
    web_config: Optional[Path] = typer.Option(None, "--web-config", help="TLS and basic auth, in the exporter-toolkit web config format node_exporter reads (needs the web extra: sh deploy/install.sh web)."),
    bench_every: float = typer.Option(0.0, "--bench-every", min=0, help="Run `nodecheck bench --quick` in a subprocess every N seconds (0: never; leave 0 on nodes that run jobs)."),
    bench_timeout: float = typer.Option(600.0, "--bench-timeout", min=1, help="Seconds before a scheduled bench run is killed."),
    log_level: str = typer.Option("info", "--log-level", help="debug (a line per probe round), info (start, recoveries, bench runs), warning (probe failures), or error."),
    config_path: Optional[Path] = _CONFIG,
) -> None:
    """Serve the latest Report as Prometheus metrics (docs/metrics.md). A scrape never waits for a probe."""
    import logging
    import signal
    import threading

    from nodecheck import config as config_module
    from nodecheck.build import build_report
    from nodecheck.exporters.serve import serve as run_server
    from nodecheck.host import LiveHost
    from nodecheck.snapshot import open_snapshot

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
        web = None
        if web_config is not None:
            from nodecheck.exporters.webconfig import load_web_config

            web = load_web_config(web_config)
        with tempfile.TemporaryDirectory(prefix="nodecheck-serve-") as workdir:
            probe_host = LiveHost() if source is None else open_snapshot(source, Path(workdir))
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            from nodecheck.bench.plan import run_in_subprocess

            bench_args = ["--quick"] + (["--config", str(config_path)] if config_path else [])
            run_server(host, port, lambda: build_report(probe_host, config), interval, stop, web,
                       bench=lambda: run_in_subprocess(bench_args, bench_timeout), bench_every=bench_every, config=config)
    except NodecheckError as error:
        _fail(str(error))
    except OSError as error:  # port taken, unreadable certificate ...
        _fail(f"cannot serve on {host}:{port}: {error.strerror or error}")


SCALE_MAX_NODES = 1_000_000  # no cluster is larger; a 400-digit count overflowed float arithmetic
SCALE_MAX_ACCUM = 1_000_000


@app.command()
def scale(
    params: str = typer.Option(..., "--params", help="Model parameters: 25M, 7B, 1.3e9."),
    grad_dtype: str = typer.Option("fp32", "--grad-dtype", help="Gradient dtype on the wire: fp32, bf16, fp16."),
    step_time: Optional[float] = typer.Option(None, "--step-time", help="Compute seconds of one micro-step (forward+backward) on one GPU."),
    flops: Optional[str] = typer.Option(None, "--flops", help="Instead of --step-time: FLOPs of one micro-step on one GPU (6 x params x tokens)."),
    peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops", help="With --flops: the GPU's peak TFLOP/s for the dtype (A100 bf16: 312)."),
    mfu: float = typer.Option(0.5, "--mfu", help="With --flops: the fraction of peak the model reaches."),
    accum: int = typer.Option(1, "--accum", help="Gradient accumulation steps per optimizer step."),
    nodes: int = typer.Option(8, "--nodes", help="The largest node count in the table (1, 2, 4 ... up to it)."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="Default: from --from, else 8."),
    busbw: Optional[str] = typer.Option(None, "--busbw", help="All-reduce busbw across nodes by hand: 1.25GB/s, 100Gbit/s."),
    intra_busbw: Optional[str] = typer.Option(None, "--intra-busbw", help="All-reduce busbw inside a node (default: --busbw)."),
    source: Optional[Path] = typer.Option(None, "--from", help="A Report (`nodecheck bench --json` output) or a snapshot."),
    target: float = typer.Option(0.9, "--target", help="Target efficiency for the bandwidth-needed columns."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw efficiency vs GPUs to this PNG (needs the plot extra: sh deploy/install.sh plot)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table and the levers as JSON."),
) -> None:
    """Predict data-parallel scaling: communication per step, efficiency with and without overlap,
    speed-up, and the busbw needed for --target, from this cluster's measured all-reduce busbw."""
    from nodecheck import scale as model
    from nodecheck.units import parse_count

    try:
        work = model.Workload(parse_count(params), grad_dtype, model.micro_step(step_time, flops, peak_tflops, mfu), accum)
        if grad_dtype not in model.GRAD_BYTES:
            raise ValueError(f"--grad-dtype {grad_dtype!r}: expected one of {', '.join(model.GRAD_BYTES)}")
        if not (1 <= accum <= SCALE_MAX_ACCUM and 1 <= nodes <= SCALE_MAX_NODES and 0 < target < 1
                and (gpus_per_node is None or 1 <= gpus_per_node <= MAX_GPUS)):
            raise ValueError(f"--accum must be 1..{SCALE_MAX_ACCUM:,}, --nodes 1..{SCALE_MAX_NODES:,}, --gpus-per-node "
                             f"1..{MAX_GPUS}, and --target between 0 and 1")
        if not (0 < work.step_s < math.inf and 0 < work.grad_bytes < math.inf):  # else inf/inf prints "nan%"
            raise ValueError(f"a step of {work.step_s:g} s with {work.grad_bytes:g} gradient bytes: not a usable workload "
                             "(each must be finite and above 0)")
        fabric = _fabric(source, busbw, intra_busbw, gpus_per_node, work.grad_bytes)
    except (ValueError, NodecheckError) as error:
        _fail(str(error))
    rows = model.table(work, fabric, nodes, target)
    levers = model.levers(work, fabric, rows[-1].gpus, target)
    if plot is not None:
        from nodecheck.render import plot_scale

        try:
            plot_scale(plot, rows, work, fabric, target)
        except NodecheckError as error:
            _fail(str(error))
        typer.echo(f"nodecheck scale: chart written to {plot}", err=True)  # stderr: --json stays one document
    if as_json:
        document = {"schema": "nodecheck.scale", "schema_version": 1, "workload": {**asdict(work), "grad_bytes": work.grad_bytes},
                    "fabric": asdict(fabric), "target": target, "rows": [r.to_dict() for r in rows],
                    "levers": [{"lever": label, **r.to_dict()} for label, r in levers]}
        typer.echo(json.dumps(model.finite(document), indent=2, allow_nan=False))  # strict JSON: no NaN or Infinity
    else:
        from nodecheck.render import scale_lines

        typer.echo("\n".join(scale_lines(work, fabric, rows, levers, target)))


def _fabric(source, busbw, intra_busbw, gpus_per_node, grad_bytes):
    from nodecheck import scale as model
    from nodecheck.units import parse_rate

    if busbw is not None:
        inter = parse_rate(busbw)
        intra = parse_rate(intra_busbw) if intra_busbw else inter
        return model.Fabric(gpus_per_node or 8, inter, intra, f"by hand: --busbw {_clean_arg(busbw)}"
                            + (f", --intra-busbw {_clean_arg(intra_busbw)}" if intra_busbw else ""))
    if source is None:
        raise ValueError("give --busbw RATE, or --from a Report (nodecheck bench --json) or a snapshot")
    try:
        if source.is_file() and source.suffix == ".json":
            from nodecheck.config import read_config_text
            from nodecheck.model import Report

            report = Report.from_dict(json.loads(read_config_text(source, "Report")))
        else:
            report, _ = _report(source, None)
    except (OSError, ValueError, TypeError, RecursionError, ConfigError) as error:
        raise NodecheckError(f"{source}: cannot read a Report ({str(error)[:300]})") from None
    try:
        return model.fabric_from_report(report, gpus_per_node, grad_bytes)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as error:
        raise NodecheckError(f"{source}: not a nodecheck Report ({type(error).__name__}: {error})") from None
    except NodecheckError as error:
        raise NodecheckError(f"{source}: {error}") from None


def _clean_arg(text: str) -> str:
    """An argument echoed as the user wrote it (its unit kept), bounded and printable."""
    return "".join(c if c.isprintable() else "?" for c in text.strip())[:40]


_DRY_RUN = typer.Option(False, "--dry-run", help="Run the checks and print the drain or resume it would do; never call scontrol.")


@app.command()
def prolog(
    dry_run: bool = _DRY_RUN,
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
    source: Optional[Path] = _FROM,
    config_path: Optional[Path] = _CONFIG,
) -> None:
    """Slurm Prolog: the quick checks under [prolog] timeout_s; on failure drain this node with a
    `nodecheck:` reason and exit 1 (Slurm requeues the job). Skipped for [prolog] skip_partitions and
    for jobs whose --comment holds [prolog] skip_comment."""
    _slurm_check("prolog", dry_run, as_json, source, config_path)


@app.command()
def healthcheck(
    dry_run: bool = _DRY_RUN,
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
    source: Optional[Path] = _FROM,
    config_path: Optional[Path] = _CONFIG,
) -> None:
    """Slurm HealthCheckProgram: the same checks; drain on failure, resume a node nodecheck drained once
    it passes again (an admin's drain is never touched). Never runs bandwidth tests."""
    _slurm_check("healthcheck", dry_run, as_json, source, config_path)


def _slurm_check(mode: str, dry_run: bool, as_json: bool, source: Optional[Path], config_path: Optional[Path]) -> None:
    import os

    from nodecheck import config as config_module
    from nodecheck import prolog as checks
    from nodecheck.host import LiveHost
    from nodecheck.slurm import DEFAULT_PATH
    from nodecheck.snapshot import open_snapshot

    os.environ.setdefault("PATH", DEFAULT_PATH)  # Slurm runs prologs and health checks without one
    try:
        config = config_module.load(config_path)
    except ConfigError as error:
        outcome = checks.config_failure(str(error), dry_run)
    else:
        try:
            with tempfile.TemporaryDirectory(prefix="nodecheck-snapshot-") as workdir:
                host = LiveHost() if source is None else open_snapshot(source, Path(workdir))
                outcome = checks.execute(mode, host, config, dict(os.environ), dry_run)
        except NodecheckError as error:  # an unreadable --from snapshot
            _fail(str(error))
    if as_json:
        typer.echo(json.dumps(outcome.to_dict(), indent=2))
    else:
        from nodecheck.render import outcome_lines

        for line, to_stderr in outcome_lines(mode, outcome, dry_run):
            typer.echo(line, err=to_stderr)
    failed = outcome.error is not None or (outcome.verdict is not None and not outcome.verdict.passed)
    raise typer.Exit(EXIT_USAGE if outcome.slurm_error else EXIT_FINDINGS if failed else EXIT_OK)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nodecheck {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True, help="Show the version.")) -> None:
    pass


def main() -> None:
    import signal

    from nodecheck.host import kill_running_commands

    # SIGTERM (systemd, Slurm, a timeout) ends nodecheck like Ctrl-C: `finally` blocks remove temporary
    # files (an extracted snapshot), and commands it started are ended with it
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        app()
    except ConfigError as error:  # raised outside a command body (should not happen, but never a traceback)
        typer.echo(f"nodecheck: {error}", err=True)
        sys.exit(EXIT_USAGE)
    finally:
        kill_running_commands()
