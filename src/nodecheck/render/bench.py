"""`nodecheck bench` and `nccl-log` as text: the measurements, a saved nccl-tests log, its verdict, what
NCCL did."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from nodecheck.bench.nccl_mnnvl import ran_mnnvl_across_nodes
from nodecheck.bench.nccl_tests import check_said
from nodecheck.core.units import format_figure, format_rate
from nodecheck.render.table import IDENTITY, SEVERITY_STYLE, TEXT, cell, clean, esc, fitted_table, new_console, render_findings
from nodecheck.report.model import Report
from nodecheck.verdicts.nccl_mnnvl import COMPLETED


def render_nccl_log(log, name: str, console: Console | None = None) -> None:
    console = console or new_console()
    what = log.collective or "nccl-tests"
    console.print(f"[bold]{esc(what)}[/bold] from {esc(name)} ({esc(log.format)}; {len(log.rows)} rows"
                  + (f", {log.ngpus} GPU(s) per thread" if log.ngpus else "") + ")")
    # Numbers are never cut: where the table does not fit, whole columns go (the caption names them), as
    # in inspect's tables; the size and the out-of-place busbw, which the verdict reads, always stay.
    headers = [("size (B)", IDENTITY), ("count", 7), ("type", 6), ("redop", 5), ("oop time (us)", 3), ("oop algbw (GB/s)", 4),
               ("oop busbw (GB/s)", IDENTITY), ("ip time (us)", 1), ("ip algbw (GB/s)", 2), ("ip busbw (GB/s)", 8)]
    rows = []
    for row in log.rows:
        cells = []
        for timing in (row.out_of_place, row.in_place):
            cells += [f"{timing.time_us:g}", f"{timing.algbw_gbytes:.2f}", f"{timing.busbw_gbytes:.2f}"] if timing else ["-"] * 3
        rows.append([str(row.size_bytes), str(row.count), cell(row.dtype), cell(row.redop or "-"), *cells])
    console.print(fitted_table(console, None, headers, rows, justify="right"))
    avg = "not in the log" if log.avg_busbw_gbytes is None else f"{log.avg_busbw_gbytes:g} GB/s"
    peak = max((r for r in log.rows if r.out_of_place), key=lambda r: r.out_of_place.busbw_gbytes, default=None)
    if peak is not None:
        console.print(f"Peak bus bandwidth: {peak.out_of_place.busbw_gbytes:g} GB/s (out-of-place, {peak.size_bytes} B)")
    console.print(f"Avg bus bandwidth: {avg}")
    console.print(f"nccl-tests' data check: {esc(check_said(log))}", highlight=False)
    for issue in log.issues:
        console.print(f"[yellow]could not read[/yellow] {esc(issue)}", highlight=False)


def render_verdict(measurement, findings, where: str, console: Console | None = None) -> None:
    """An nccl-tests log judged against a node: its peak busbw, the spec it is compared with, the verdict."""
    console = console or new_console()
    if measurement is None:
        console.print("[yellow]no out-of-place result to judge[/yellow]")
        return
    spec = measurement.spec_bytes_per_second
    basis = measurement.details.get("spec_basis")
    if spec is None:
        why = basis or "no GPU pair, or a pair's spec unknown"
        console.print(f"busbw {format_rate(measurement.bytes_per_second)} at {measurement.payload_bytes} B; "
                      f"{esc(where)} has no spec to compare it with ({esc(why.removeprefix('no spec: '))})")
        _finding_lines(console, findings)  # wrong data is wrong without a spec
        return
    console.print(f"busbw {format_rate(measurement.bytes_per_second)} at {measurement.payload_bytes} B = "
                  f"{measurement.ratio:.2f} of {format_rate(spec)} ({esc(basis or 'slowest GPU pair')} on {esc(where)})")
    if measurement.details.get("across_nodes"):
        console.print(f"a job across nodes ({esc(measurement.details['across_nodes'])}): judged against the network, "
                      "not the GPUs' links")
    else:  # a paste without its header lines says nothing of its hosts: the assumption is shown
        console.print("judged as a run inside one node: the log names no second host and no rank past this node's GPUs "
                      "(--nodes N says it spanned N nodes)")
    if not findings:
        console.print("[green]normal for this node[/green]")
    _finding_lines(console, findings)


def _finding_lines(console: Console, findings) -> None:
    for f in findings:
        console.print(Text(f"{f.severity}: {clean(f.message)}", style=SEVERITY_STYLE.get(f.severity, "")))


def render_measurements(report: Report, console: Console | None = None) -> None:
    console = console or new_console()
    measurement_tables(console, report)
    render_findings(console, report)


def measurement_tables(console: Console, report: Report) -> None:
    """The measurements' table, then why a figure has no spec and what NCCL did in each run. As inspect's tables:
    no word is cut (a path, a test, a command to paste); where it does not fit, whole columns go, named."""
    headers = [("path", IDENTITY), ("test", IDENTITY), ("payload", 1), ("measured", IDENTITY), ("spec", 2),
               ("ratio", IDENTITY), ("method / error", TEXT)]
    rows = []
    for m in report.measurements:
        ratio = f"{m.ratio:.2f}" if m.ratio is not None else "-"
        payload = f"{m.payload_bytes / (1 << 20):g} MiB" if m.payload_bytes else "-"
        measured = ("[red]FAILED[/red]" if not m.ok else "no data moved" if m.direction == "none"
                    else format_figure(m))
        rows.append([cell(m.path), cell(m.test), payload, Text.from_markup(measured),
                     format_figure(m, spec=True), ratio, cell(m.method if m.ok else m.error)])
    console.print(fitted_table(console, "Bandwidth", headers, rows))
    for m in report.measurements:  # why a figure has no spec, or may pass it (a job on one node, NVLS, a world of one)
        note = (m.details or {}).get("note") if isinstance(m.details, dict) else None
        if note:
            console.print(clean(f"{m.path}: {note}"), highlight=False, markup=False)
    for m in report.measurements:
        nccl = (m.details or {}).get("nccl") if isinstance(m.details, dict) else None
        if isinstance(nccl, dict):
            transports = ", ".join(str(t) for t in (nccl.get("inter_node_transports") or []) + (nccl.get("intra_node_transports") or []))
            console.print(clean(f"{m.path}: NCCL {nccl.get('nccl_version') or '?'}, network {nccl.get('network') or '-'}, "
                                 f"transports {transports or '-'}, {nccl.get('warning_count') or 0} NCCL WARN"),
                          highlight=False, markup=False)




def _over_nvlink(run) -> list[str]:
    """The P2P transports over the NVLink fabric ("P2P/MNNVL") of a run whose communicators crossed nodes on it: NCCL's
    channels between the nodes' GPUs, as between one node's."""
    return [t for t in run.intra_node_transports if "MNNVL" in t] if ran_mnnvl_across_nodes(run) else []


def _fabric_line(run) -> str:
    """NCCL's reading of its GPUs' NVLink fabric and whether its communicators ran multi-node NVLink, in one line."""
    count = len(run.fabric), len({e["host"] for e in run.fabric})
    gpus, hosts = (f"{n} {word}{'' if n == 1 else 's'}" for n, word in zip(count, ("GPU", "host"), strict=True))
    domains = {(e["uuid"], e["clique_id"]) for e in run.fabric}
    if not domains:
        where = "no GPU's fabric line"
    elif len(domains) > 1:
        where = f"{gpus} on {hosts} in {len(domains)} NVLink domains or cliques"
    else:
        uuid, clique = next(iter(domains))
        where = (f"{gpus} on {hosts}, " + (f"NVLink domain {uuid} clique 0x{clique:x}" if uuid else
                                                        "in no multi-node NVLink domain (fabric UUID 0.0)"))
    pending = sum(1 for e in run.fabric if e["state"] != COMPLETED)
    said = {on for _, on in run.comm_mnnvl}
    mnnvl = {frozenset({1}): "on", frozenset({0}): "off", frozenset({0, 1}): "on in some communicators"}.get(frozenset(said), "-")
    return (f"NVLink fabric: {where}" + (f", {pending} not registered" if pending else "")
            + f"  (multi-node NVLink: {mnnvl})")


def nccl_run_lines(run, findings, where: str, verdict_above: bool = False, not_judged: str | None = None) -> list[str]:
    """`nodecheck nccl-log` as text: what NCCL did, then what is wrong with it on `where` (verdict_above: the
    bandwidth verdict was printed before, so no second "nothing wrong" may contradict it; not_judged: why the log was
    not held against `where`, only what it says by itself)."""
    def listed(values) -> str:
        return ", ".join(values) if values else "-"

    gdr = {True: "yes", False: "no", None: "-"}[run.gdr]
    nvls = "failed to set up" if run.nvls_errors else {True: "in use", False: "not in use", None: "-"}[run.nvls]
    nodes = f"{len(run.nodes)} node{'' if len(run.nodes) == 1 else 's'}"
    lines = [f"NCCL {run.nccl_version or '(version not in the log)'} on {nodes}: {listed(run.nodes[:8])}"
             + (" ..." if len(run.nodes) > 8 else ""),
             f"network: {run.network or '-'}  HCAs: {listed(run.ib_devices)}  socket interfaces: {listed(run.socket_ifaces)}",
             f"between nodes: {listed(run.inter_node_transports + _over_nvlink(run))}  (GPUDirect RDMA: {gdr})",
             f"inside a node: {listed(run.intra_node_transports)}  (NVLS: {nvls})",
             f"NCCL WARN lines: {run.warning_count}"]
    if run.fabric or any(on for _, on in run.comm_mnnvl):  # "MNNVL 0" alone: any node without an NVLink fabric
        lines.insert(-1, _fabric_line(run))
    if run.separate_hosts:
        lines.insert(1, f"separate jobs, no communicator across the hosts: {run.separate_hosts}")
    if run.settings:
        lines.insert(-1, f"set from its environment: {listed([f'{k}={v}' for k, v in list(run.settings.items())[:8]])}"
                     + (" ..." if len(run.settings) > 8 else ""))
    quiet = "no finding in what NCCL chose" if verdict_above else f"nothing wrong for {where}"
    if not_judged:
        lines.append(f"not judged against {where}: {clean(not_judged)}")
        quiet = "nothing wrong in what the log says by itself"
    lines += [f"{f.severity}: {clean(f.message)}" for f in findings] or [quiet]
    return lines
