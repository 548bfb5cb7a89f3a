"""`nodecheck bench`, `nccl-log` and `nccl-topo`: bandwidth measured and judged, saved logs and NCCL's topology
read and judged."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from nodecheck.cli.app import CONFIG_OPTION, EXIT_FINDINGS, EXIT_OK, app, fail, load_report
from nodecheck.core.errors import NodecheckError
from nodecheck.report.model import BENCH_TESTS


@app.command()
def bench(
    tests: Optional[str] = typer.Option(None, "--tests", help=f"Comma-separated from {','.join(BENCH_TESTS)} (default: all that apply here)."),
    full: bool = typer.Option(False, "--full", help="Payload sweep (and pageable host memory) instead of one saturating payload."),
    quick: bool = typer.Option(False, "--quick", help="One payload past saturation (the default)."),
    timeout: float = typer.Option(120.0, "--timeout", min=1, help="Seconds before a test is killed and recorded as failed."),
    nccl_log: Optional[Path] = typer.Option(None, "--nccl-log", help="Only read a saved nccl-tests log (text or -J JSON), report every row, and judge its peak busbw against this node's (or --from's) slowest GPU pair, or its rails for a job across nodes."),
    source: Optional[Path] = typer.Option(None, "--from", help="With --nccl-log: judge the log against this snapshot's node instead of this machine."),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="With --nccl-log: the nodes the run spanned, where the log does not say (a paste without its device lines)."),
    as_json: bool = typer.Option(False, "--json", help="Print the Report with its measurements as JSON."),
    measure_only: bool = typer.Option(False, "--measure-only", hidden=True, help="Print the measurements alone, unjudged, as JSON (what `serve` and `prolog` run)."),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Measure bandwidth and compare it with the spec of its path; below the path's threshold (its calibrated share
    of spec where healthy hardware cannot reach 0.8, else [thresholds] bandwidth_ratio) is a finding.
    Under torchrun or srun, `allreduce` runs across the job's nodes (NCCL on GPUs, gloo on CPUs)."""
    if nccl_log is not None:
        _read_nccl_log(nccl_log, as_json, source, config_path, nodes)
        return
    if source is not None or nodes is not None:
        fail(f"{'--from' if source is not None else '--nodes'} goes with --nccl-log: it says how to judge a saved log")
    if full and quick:
        fail("--quick and --full exclude each other")
    import os

    from nodecheck.bench import plan
    from nodecheck.bench.distributed import distributed_env
    from nodecheck.verdicts.bandwidth import with_measurements

    try:
        env = distributed_env(dict(os.environ))
        report, config = load_report(None, config_path, judge=not measure_only)
    except NodecheckError as error:
        fail(str(error))
    across = env is not None and env.across_nodes
    chosen = _chosen_tests(tests, report, config, across, as_json)
    level = "full" if full else "quick"
    measurements = _measure(lambda: plan.run(report, config, chosen, level, timeout, dict(os.environ), env),
                            None if as_json or measure_only else f"nodecheck bench: {', '.join(chosen)} ({level})")
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
        from nodecheck.render.bench import render_measurements

        render_measurements(report)
    raise typer.Exit(EXIT_FINDINGS if report.fails(config.fail_severity) else EXIT_OK)


def _chosen_tests(tests: Optional[str], report, config, across: bool, as_json: bool = False) -> list[str]:
    """--tests as given, else every test that applies here; a usage error for a name not in BENCH_TESTS."""
    import os

    from nodecheck.bench import plan
    from nodecheck.bench.nccl_binary import find_binary

    if tests:
        chosen = [t.strip() for t in tests.split(",") if t.strip()]
    else:
        chosen = plan.applicable(report, across, find_binary(config, dict(os.environ)) is not None)
    unknown = sorted(set(chosen) - set(BENCH_TESTS))
    if unknown:
        fail(f"unknown test(s): {', '.join(unknown)} (known: {', '.join(BENCH_TESTS)})")
    if not chosen:
        why = ("no test applies here: no GPU, and not launched by torchrun/srun (RANK, WORLD_SIZE, MASTER_ADDR) "
               "for an all-reduce across nodes")
        if as_json:  # a script reading the JSON gets a Report that says so: measurements [], nothing judged
            typer.echo(json.dumps(dict(report.to_dict(), measurements=[]), indent=2))
        fail(why)
    return chosen


def _measure(run, status: Optional[str]):
    """run(), with a spinner on standard error saying `status` (None: quiet, for JSON)."""
    if status is None:
        return run()
    from rich.console import Console

    with Console(stderr=True).status(status):
        return run()


@app.command("nccl-log")
def nccl_log(
    log: Path = typer.Argument(..., help="An NCCL_DEBUG=INFO log (mpirun or srun prefixes, nccl-tests output mixed in)."),
    source: Optional[Path] = typer.Option(None, "--from", help="Judge it against this snapshot's node instead of this machine."),
    as_json: bool = typer.Option(False, "--json", help="Print the facts and findings as JSON."),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """What NCCL really did, from its debug log: version, network, HCAs and interfaces, the transport inside
    and between nodes, GPUDirect RDMA, NVLS, its warnings; findings judged against this node (or --from)."""
    from dataclasses import asdict

    from nodecheck.bench.nccl_debug import parse_nccl_debug
    from nodecheck.report.findings import at_or_above
    from nodecheck.verdicts.nccl_run import nccl_findings, other_node, without_node

    try:
        run = parse_nccl_debug(_read_log(log))
        report, config = load_report(source, config_path)
    except NodecheckError as error:
        fail(str(error) if str(log) in str(error) else f"{log}: {error}")
    where = f"snapshot {source}" if source else "this node"
    # another node's log: only what it says by itself (failed IB transfers, NCCL's warnings, its settings) is judged
    other = other_node(run, report, where)
    findings = nccl_findings(run, without_node(report) if other else report)
    if as_json:
        typer.echo(json.dumps({"schema": "nodecheck.nccl_debug", "schema_version": 1, "nccl": asdict(run), "judged_against": where,
                               "not_judged": other, "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        from nodecheck.render.bench import nccl_run_lines

        typer.echo("\n".join(nccl_run_lines(run, findings, where, not_judged=other)))
    if other:  # what NCCL did is shown; held against another node, the log says nothing of this one
        fail(f"{log}: {other}")
    raise typer.Exit(EXIT_FINDINGS if at_or_above(findings, config.fail_severity) else EXIT_OK)


# NCCL reads this file when NCCL_TOPO_FILE is unset (src/graph/topo.cc): where providers' topology daemons put theirs
VIRTUAL_TOPOLOGY = "/var/run/nvidia-topologyd/virtualTopology.xml"


@app.command("nccl-topo")
def nccl_topo(
    dump: Optional[Path] = typer.Argument(None, help="NCCL's topology: its dump (NCCL_TOPO_DUMP_FILE), a topology file (NCCL_TOPO_FILE) or a debug log with NCCL_DEBUG_SUBSYS=GRAPH."),
    source: Optional[Path] = typer.Option(None, "--from", help="Judge it against this snapshot's node instead of this machine."),
    as_json: bool = typer.Option(False, "--json", help="Print NCCL's picture and the findings as JSON (schema nodecheck.nccl_topo)."),
    write: Optional[Path] = typer.Option(None, "--write", help="Write a topology file for this VM's flattened PCI tree (no dump to read)."),
    install: bool = typer.Option(False, "--install", help=f"Write it where NCCL reads one when NCCL_TOPO_FILE is unset ({VIRTUAL_TOPOLOGY})."),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """NCCL's own picture of the node (CPUs, each GPU's PCI chain, NVLinks and NICs) against the node's: NVLinks NCCL
    does not see, PCIe links, NUMA nodes and NIC speeds it reads otherwise, NICs it places elsewhere than topo -m.
    With --write or --install: a topology file for a VM whose PCI tree is flattened, paired by the config's
    [topology] pairs or the guest's NUMA nodes, never by a guess."""
    from dataclasses import asdict

    if (dump is None) == (write is None and not install):
        fail("give NCCL's topology to read, or --write FILE / --install to write one (one of them)")
    if dump is None:
        _write_topology(write, install, source, config_path)
        return

    from nodecheck.core.errors import ParseError
    from nodecheck.host.files import read_user_file
    from nodecheck.probes.nccl_topo import MAX_TOPO_BYTES, parse_nccl_topo_log, parse_nccl_topo_xml
    from nodecheck.report.findings import at_or_above
    from nodecheck.verdicts.nccl_topo import topo_findings, unmatched, with_bare_devices_named

    try:
        text = read_user_file(dump, MAX_TOPO_BYTES, "NCCL's topology").decode("utf-8", errors="replace")
        form = "xml" if text.lstrip().startswith("<") else "log"
        topo = parse_nccl_topo_xml(text) if form == "xml" else parse_nccl_topo_log(text)
        report, config = load_report(source, config_path)
    except (NodecheckError, ParseError) as error:
        fail(str(error) if str(dump) in str(error) else f"{dump}: {error}")
    topo = with_bare_devices_named(topo, report)  # a file's devices without a class, as this node makes them
    where = f"snapshot {source}" if source else "this node"
    apart = unmatched(topo, report, where)
    findings = [] if apart else topo_findings(topo, report)
    if as_json:
        typer.echo(json.dumps({"schema": "nodecheck.nccl_topo", "schema_version": 1, "form": form, "topology": asdict(topo),
                               "judged_against": where, "not_compared": apart,
                               "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        from nodecheck.render.nccl_topo import nccl_topo_lines

        typer.echo("\n".join(nccl_topo_lines(topo, form, findings, where, apart)))
    if apart:  # what NCCL saw is shown; held against nothing, it neither agrees nor disagrees
        fail(f"{dump}: {apart}")
    raise typer.Exit(EXIT_FINDINGS if at_or_above(findings, config.fail_severity) else EXIT_OK)


def _write_topology(write: Optional[Path], install: bool, source: Optional[Path], config_path: Optional[Path]) -> None:
    """The topology file for a flattened VM, read back through the reader before it is written (atomically)."""
    from nodecheck.assemble.nccl_topo_file import flattened, pairing, topology_xml
    from nodecheck.host.files import atomic_file
    from nodecheck.probes.nccl_topo import parse_nccl_topo_xml

    try:
        report, config = load_report(source, config_path)
        flat, seen = flattened(report)
        if not flat:
            raise NodecheckError(f"no topology file written: {seen}")
        paired, how = pairing(report, config.topology_pairs)
    except NodecheckError as error:
        fail(str(error))
    text = topology_xml(report, paired)
    back = parse_nccl_topo_xml(text)  # what NCCL will read: each GPU and its NICs under one bridge, as intended
    bridges = {g.busid: g.chain[0].busid for g in back.gpus}
    astray = [n.busid for g, nics in _busids(report, paired).items() for n in back.nics if n.busid in nics and n.chain[0].busid != bridges.get(g)]
    if astray or len(back.gpus) != len(paired):
        fail(f"the topology file would not read back as paired ({', '.join(map(str, astray)) or 'a GPU missing'}): not written")
    target = Path(VIRTUAL_TOPOLOGY) if install else write
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(target) as handle:  # a failed write leaves no half file, and no temporary
            handle.write(text.encode())
    except OSError as error:
        fail(f"{target}: cannot write the topology file ({error.strerror or error})")
    typer.echo(f"{target}: {len(paired)} GPU(s) and their NICs, paired by {how} ({seen})")
    typer.echo(f"NCCL reads it {'when NCCL_TOPO_FILE is unset' if install else f'with NCCL_TOPO_FILE={target}'}; "
               f"`nodecheck nccl-topo {target}` reads it back")


def _busids(report, paired: dict) -> dict[str, set[str]]:
    from nodecheck.core.pci import normal_pci

    gpus = {g.index: normal_pci(g.pci_bus_id) for g in report.gpus}
    return {gpus[index]: {normal_pci(n.pci_address) for n in nics} for index, nics in paired.items()}


def _read_log(path: Path) -> str:
    """A log's text, bounded (MAX_COMMAND_OUTPUT) once decompressed: gzip, xz or bzip2 as job logs are kept, UTF-8 or
    UTF-16 (host/log_file.py, as kernel-log reads its logs); bytes that decode to nothing replaced."""
    from nodecheck.core.limits import MAX_COMMAND_OUTPUT
    from nodecheck.host.log_file import read_log_file

    return read_log_file(path, MAX_COMMAND_OUTPUT, "log")


def _read_nccl_log(nccl_log: Path, as_json: bool, source: Optional[Path], config_path: Optional[Path],
                   nodes: Optional[int] = None) -> None:
    """Every row of the log, then its largest out-of-place busbw judged against the slowest GPU pair of
    this node or of the snapshot (its rails for a job across nodes): "is this log normal for this node?"."""
    from dataclasses import asdict

    from nodecheck.bench.common import staged_if_shm
    from nodecheck.bench.nccl_binary import measurement_from_log
    from nodecheck.bench.nccl_debug import attach, parse_nccl_debug
    from nodecheck.bench.nccl_tests import parse_nccl_log
    from nodecheck.bench.nccl_tests_job import other_gpus
    from nodecheck.core.errors import ParseError
    from nodecheck.verdicts.bandwidth import judge_measurements
    from nodecheck.verdicts.nccl_run import nccl_findings, other_node

    try:
        text = _read_log(nccl_log)
        log = parse_nccl_log(text)
        report, config = load_report(source, config_path)
    except NodecheckError as error:
        fail(str(error) if str(nccl_log) in str(error) else f"{nccl_log}: {error}")
    try:  # run with NCCL_DEBUG=INFO, the same log also says what NCCL chose
        run = parse_nccl_debug(text)
    except ParseError:
        run = None
    where = f"snapshot {source}" if source else "this node"
    if other := other_gpus(log, report, where):
        fail(f"{nccl_log}: {other}")
    try:  # a log of several runs, or of one rank, is refused whatever node it is held against
        measurement = measurement_from_log(log, report, "nccl-log", f"nccl-tests log {nccl_log.name}", config, run, nodes,
                                           name=nccl_log.name)
    except NodecheckError as error:
        fail(f"{nccl_log}: {error}")
    if other := run and other_node(run, report, where):
        fail(f"{nccl_log}: {other}")
    if measurement is not None:  # judged as bench judges it (over SHM a staged path), what NCCL chose with it
        (measurement,), findings = judge_measurements(report, [staged_if_shm(attach(measurement, run))], config)
    else:
        findings = nccl_findings(run, report) if run else []
    if as_json:
        typer.echo(json.dumps({"schema": "nodecheck.nccl_log", "schema_version": 1, "nccl_log": asdict(log), "judged_against": where,
                               "measurement": asdict(measurement) if measurement else None,
                               "nccl": asdict(run) if run else None,
                               "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        from nodecheck.render.bench import render_nccl_log, render_verdict

        render_nccl_log(log, str(nccl_log))
        render_verdict(measurement, [f for f in findings if not f.kind.startswith("nccl_")], where)
        if run:
            from nodecheck.render.bench import nccl_run_lines

            typer.echo("\n".join(nccl_run_lines(run, [f for f in findings if f.kind.startswith("nccl_")], where,
                                                 verdict_above=measurement is not None)))
    from nodecheck.report.findings import at_or_above

    raise typer.Exit(EXIT_FINDINGS if at_or_above(findings, config.fail_severity) else EXIT_OK)
