"""Human output of a Report with rich: identity, probes, GPUs, link matrix, NICs, findings, advice."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nodecheck.errors import NodecheckError
from nodecheck.model import Report
from nodecheck.units import format_bits, format_rate

_SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "error": "red", "critical": "bold red"}
# C0 and C1 control characters (ESC starts terminal escape sequences; CSI is 0x9b): never to a terminal
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _clean(value) -> str:
    """Any value from a source nodecheck does not control, made safe to print: control characters and
    escape sequences become '?' (rich markup is escaped where the text is printed: _esc, _cell)."""
    return _CONTROL.sub("?", str(value))


def _esc(value) -> str:
    """An untrusted value inside a rich markup string: `[bold]` in a host name prints as written."""
    return escape(_clean(value))


def _cell(value) -> Text:
    """An untrusted value as a table cell: plain text, never read as markup."""
    return Text(_clean(value))


def _unknown(value) -> Text:
    return Text("unknown") if value is None or value == "" else _cell(value)


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=160)  # piped: do not squeeze tables into 80 columns


def render(report: Report, console: Console | None = None) -> None:
    console = console or _console()
    node = report.node
    console.print(f"[bold]nodecheck[/bold] {_esc(node.get('hostname') or '?')}  kernel {_esc(node.get('kernel') or 'unknown')}  "
                  f"driver {_esc(node.get('driver_version') or 'unknown')}  [dim]({_esc(report.source)})[/dim]")
    console.print("probes: " + "  ".join(
        f"{p.name} [{'green' if p.ok else 'dim' if p.no_data else 'red'}]"
        f"{'ok' if p.ok else 'no data' if p.no_data else 'FAILED'}[/] {p.duration_seconds * 1000:.0f} ms"
        for p in report.probes))
    if report.cpu:
        c = report.cpu
        numa = ", ".join(f"node{n['node']}: {n['cpus']}" for n in c.numa)
        console.print(f"CPU: {c.packages} package(s), {c.numa_nodes} NUMA node(s) ({_esc(numa)}), {c.cores} cores, {c.pus} PUs"
                      + (f"  [dim]{_esc(c.model)}[/dim]" if c.model else ""))
    _gpus(console, report)
    _matrix(console, report)
    _nics(console, report)
    for line in platform_lines(report):
        console.print(_clean(line), highlight=False, markup=False)
    _findings(console, report)
    _advice(console, report)


def _gpus(console: Console, report: Report) -> None:
    if not report.gpus:
        console.print(f"[yellow]No GPUs:[/yellow] {_esc(report.gpus_absent_reason)}")
        return
    specs = {p.path: p for p in report.paths}
    table = Table(title="GPUs", title_justify="left")
    for column in ("GPU", "model", "PCIe now / max", "host link spec", "NVLinks", "NUMA", "CPU affinity", "nearest NICs"):
        table.add_column(column)
    for g in report.gpus:
        p = g.pcie or {}
        pcie = (f"gen{_unknown(p.get('gen_current'))} x{_unknown(p.get('width_current'))} / "
                f"gen{_unknown(p.get('gen_max'))} x{_unknown(p.get('width_max'))}") if g.pcie else "unknown"
        active = sum(1 for l in g.nvlinks if l["active"])
        nvlinks = f"{active}/{len(g.nvlinks)} up" if g.nvlinks else "-"
        table.add_row(str(g.index), _unknown(g.name), _cell(pcie), format_rate(specs[f"gpu{g.index}:host"].bytes_per_second),
                      nvlinks, _unknown(g.numa_node), _unknown(g.cpu_affinity), _cell(", ".join(g.nearest_nics) or "-"))
    console.print(table)


def _matrix(console: Console, report: Report) -> None:
    """Plain aligned text, laid out like nvidia-smi's own matrix (and much cheaper than a rich Table)."""
    if len(report.gpus) < 2 and not any(isinstance(l.b, str) for l in report.links):
        return
    cells = {}
    for link in report.links:
        cells[(link.a, link.b)] = cells[(link.b, link.a)] = link.type
    devices = [g.index for g in report.gpus] + sorted({l.b for l in report.links if isinstance(l.b, str)})
    names = [f"GPU{d}" if isinstance(d, int) else d for d in devices]
    width = max(len(n) for n in names) + 2
    lines = ["".ljust(width) + "".join(n.ljust(width) for n in names)]
    for a in (g.index for g in report.gpus):
        lines.append(f"GPU{a}".ljust(width) + "".join(("X" if a == b else cells.get((a, b), "?")).ljust(width) for b in devices))
    console.print("[italic]Links (nvidia-smi topo -m)[/italic]")
    console.print(_clean("\n".join(line.rstrip() for line in lines)), highlight=False, markup=False, soft_wrap=True)


def _nics(console: Console, report: Report) -> None:
    shown = [n for n in report.nics if not n.virtual or n.addresses]
    if not shown:
        return
    specs = {p.path: p for p in report.paths}
    table = Table(title="NICs", title_justify="left")
    for column in ("NIC", "kind", "state", "speed", "spec", "MTU", "NUMA", "driver", "PCI", "addresses"):
        table.add_column(column)
    for n in shown:
        spec = specs.get(f"nic:{n.name}")
        name = f"{n.name} ({n.rdma_device})" if n.rdma_device and n.rdma_device != n.name else n.name
        speed = f"{n.speed_mbps} Mb/s" if n.speed_mbps else "unknown"
        addresses = " ".join(f"{a['address']}/{a['prefixlen']}" for a in n.addresses if a["family"] == "inet")
        table.add_row(_cell(name), _cell(n.kind), _unknown(n.state), speed, format_bits(spec.bytes_per_second if spec else None),
                      _unknown(n.mtu), _unknown(n.numa_node), _unknown(n.driver), _unknown(n.pci_address), _cell(addresses or "-"))
    console.print(table)


def platform_lines(report: Report) -> list[str]:
    """What peer-to-peer and GPUDirect traffic depend on: the peer-memory module, the IOMMU mode of the GPUs'
    and NICs' groups, ACS on the PCIe bridges; each said as known, or why it is not."""
    from nodecheck.bench.identity import normal_pci

    lines = []
    platform = report.platform if isinstance(report.platform, dict) else None
    if platform is not None:
        module = platform.get("peer_memory")
        dma_buf = {True: "DMA-BUF possible (open kernel modules, Linux >= 5.12)", False: "no DMA-BUF",
                   None: "DMA-BUF unknown"}.get(platform.get("dma_buf"), "DMA-BUF unknown")
        lines.append("GPUDirect RDMA: " + (f"{module} loaded" if module else
                     f"no peer-memory module (nvidia_peermem, nv_peer_mem); {dma_buf}" if platform.get("modules_known")
                     else "unknown"))
        groups = {normal_pci(k): v for k, v in (platform.get("iommu") or {}).items() if isinstance(k, str)}
        devices = [(f"gpu{g.index}", g.pci_bus_id) for g in report.gpus] + [(n.name, n.pci_address) for n in report.nics
                                                                           if n.pci_address]
        modes: dict[str, list[str]] = {}
        for name, pci in devices:
            modes.setdefault(str(groups.get(normal_pci(pci), "no IOMMU group")), []).append(name)
        if modes:
            lines.append("IOMMU: " + "; ".join(f"{mode} ({', '.join(names)})" for mode, names in sorted(modes.items())))
    acs = report.pcie_acs if isinstance(report.pcie_acs, dict) else None
    if acs is not None:
        redirect = acs.get("redirect") if isinstance(acs.get("redirect"), dict) else {}
        on = sorted(str(bdf) for bdf, value in redirect.items() if value is True)
        lines.append("ACS: " + (str(acs.get("why")) if not acs.get("known") else
                                f"P2P redirect on {', '.join(on)}" if on else
                                f"no P2P redirect ({len(redirect)} ACS-capable bridge(s) read)"))
    return lines


def _findings(console: Console, report: Report) -> None:
    if not report.findings:
        console.print("[green]No findings.[/green]")
        return
    table = Table(title="Findings", title_justify="left")
    for column in ("severity", "subject", "measured", "expected", "what to do"):
        table.add_column(column)
    for f in report.findings:
        style = _SEVERITY_STYLE.get(f.severity, "")
        table.add_row(Text(_clean(f.severity), style=style), _cell(f.subject), _cell(f.measured), _cell(f.expected), _cell(f.message))
    console.print(table)


def _advice(console: Console, report: Report) -> None:
    if not report.advice:
        return
    console.print("[bold]Binding advice[/bold] (one process per GPU):")
    for entry in report.advice:
        console.print(Text(f"  gpu{entry['gpu']}: " + _clean("  ".join(entry["lines"]))), soft_wrap=True, highlight=False)


def render_nccl_log(log, name: str, console: Console | None = None) -> None:
    console = console or _console()
    what = log.collective or "nccl-tests"
    console.print(f"[bold]{_esc(what)}[/bold] from {_esc(name)} ({_esc(log.format)}; {len(log.rows)} rows"
                  + (f", {log.ngpus} GPU(s) per thread" if log.ngpus else "") + ")")
    table = Table(title_justify="left")
    for column in ("size (B)", "count", "type", "redop", "oop time (us)", "oop algbw (GB/s)", "oop busbw (GB/s)",
                   "ip time (us)", "ip algbw (GB/s)", "ip busbw (GB/s)"):
        table.add_column(column, justify="right")
    for row in log.rows:
        cells = []
        for timing in (row.out_of_place, row.in_place):
            cells += [f"{timing.time_us:g}", f"{timing.algbw_gbytes:.2f}", f"{timing.busbw_gbytes:.2f}"] if timing else ["-"] * 3
        table.add_row(str(row.size_bytes), str(row.count), _cell(row.dtype), _cell(row.redop or "-"), *cells)
    console.print(table)
    avg = "not in the log" if log.avg_busbw_gbytes is None else f"{log.avg_busbw_gbytes:g} GB/s"
    console.print(f"Avg bus bandwidth: {avg}")
    for issue in log.issues:
        console.print(f"[yellow]could not read[/yellow] {_esc(issue)}", highlight=False)


def render_verdict(measurement, findings, where: str, console: Console | None = None) -> None:
    """An nccl-tests log judged against a node: its peak busbw, the spec it is compared with, the verdict."""
    console = console or _console()
    if measurement is None:
        console.print("[yellow]no out-of-place result to judge[/yellow]")
        return
    spec = measurement.spec_bytes_per_second
    basis = measurement.details.get("spec_basis")
    if spec is None:
        console.print(f"busbw {format_rate(measurement.bytes_per_second)} at {measurement.payload_bytes} B; "
                      f"{_esc(where)} has no GPU pair spec to compare it with (no GPU pair, or a pair's spec unknown)")
        return
    console.print(f"busbw {format_rate(measurement.bytes_per_second)} at {measurement.payload_bytes} B = "
                  f"{measurement.ratio:.2f} of {format_rate(spec)} ({_esc(basis or 'slowest GPU pair')} on {_esc(where)})")
    if not findings:
        console.print("[green]normal for this node[/green]")
    for f in findings:
        console.print(Text(f"{f.severity}: {_clean(f.message)}", style=_SEVERITY_STYLE.get(f.severity, "")))


def render_measurements(report: Report, console: Console | None = None) -> None:
    console = console or _console()
    table = Table(title="Bandwidth", title_justify="left")
    for column in ("path", "test", "payload", "measured", "spec", "ratio", "method / error"):
        table.add_column(column)
    for m in report.measurements:
        ratio = f"{m.ratio:.2f}" if m.ratio is not None else "-"
        payload = f"{m.payload_bytes / (1 << 20):g} MiB" if m.payload_bytes else "-"
        measured = "[red]FAILED[/red]" if not m.ok else "no data moved" if m.direction == "none" else format_bits(m.bytes_per_second)
        table.add_row(_cell(m.path), _cell(m.test), payload, measured,
                      format_bits(m.spec_bytes_per_second), ratio, _cell(m.method if m.ok else m.error))
    console.print(table)
    for m in report.measurements:
        nccl = (m.details or {}).get("nccl") if isinstance(m.details, dict) else None
        if isinstance(nccl, dict):
            transports = ", ".join(str(t) for t in (nccl.get("inter_node_transports") or []) + (nccl.get("intra_node_transports") or []))
            console.print(_clean(f"{m.path}: NCCL {nccl.get('nccl_version') or '?'}, network {nccl.get('network') or '-'}, "
                                 f"transports {transports or '-'}, {nccl.get('warning_count') or 0} NCCL WARN"),
                          highlight=False, markup=False)
    _findings(console, report)


def scale_lines(work, fabric, rows, levers, target) -> list[str]:
    """`nodecheck scale` as text: the workload, the fabric, the table and the levers."""
    from nodecheck.units import format_bytes, format_count

    lines = []

    def rate(value) -> str:
        return "-" if value is None else "inf" if value == float("inf") else f"{value / 1e9:.3g} GB/s"

    lines.append(f"gradients: {format_count(work.params)} params x {work.grad_dtype} = {format_bytes(work.grad_bytes)} per step; "
               f"compute {work.step_s * 1000:.4g} ms per step ({work.accum} x {work.micro_step_s * 1000:.4g} ms)")
    lines.append(f"busbw: across nodes {rate(fabric.inter_busbw)}, inside a node {rate(fabric.intra_busbw)} "
               f"({fabric.source}); {fabric.gpus_per_node} GPUs per node")
    header = (f"{'GPUs':>5} {'nodes':>5} {'comm/step':>10} {'eff':>6} {'eff(ovl)':>8} {'speed-up':>8} "
              f"{'busbw for ' + format(target, '.0%'):>14} {'(overlap)':>11}")
    lines.append(header)
    for r in rows:
        lines.append(f"{r.gpus:>5} {r.nodes:>5} {r.comm_s * 1000:>8.1f}ms {r.efficiency:>6.1%} {r.efficiency_overlap:>8.1%} "
                   f"{r.speedup:>7.2f}x {rate(r.needed_busbw):>14} {rate(r.needed_busbw_overlap):>11}")
    lines.append(f"levers at {rows[-1].gpus} GPUs (each on top of the previous, no overlap):")
    for label, r in levers:
        lines.append(f"  {label:58} comm {r.comm_s * 1000:7.1f} ms  efficiency {r.efficiency:6.1%}  speed-up {r.speedup:.2f}x")
    return lines


def plot_scale(path, rows, work, fabric) -> None:
    """Efficiency vs GPUs as a PNG; NodecheckError when matplotlib is missing or the file cannot be written."""
    from nodecheck.units import format_count

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise NodecheckError("--plot needs matplotlib: pip install 'nodecheck[plot]'") from None
    figure, axes = plt.subplots(figsize=(7, 4.5))
    gpus = [r.gpus for r in rows]
    axes.plot(gpus, [r.efficiency * 100 for r in rows], marker="o", label="no overlap")
    axes.plot(gpus, [r.efficiency_overlap * 100 for r in rows], marker="s", label="full overlap")
    axes.set_xscale("log", base=2)
    axes.set_xticks(gpus, [str(g) for g in gpus])
    axes.set_ylim(0, 105)
    axes.set_xlabel("GPUs")
    axes.set_ylabel("scaling efficiency (%)")
    axes.set_title(f"{format_count(work.params)} params, {work.grad_dtype} gradients, {work.step_s * 1000:.4g} ms/step")
    axes.grid(True, alpha=0.3)
    axes.legend()
    try:
        figure.savefig(path, dpi=100, bbox_inches="tight")
    except OSError as error:
        raise NodecheckError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        plt.close(figure)


def outcome_lines(mode: str, outcome, dry_run: bool) -> list[tuple[str, bool]]:
    """A prolog or health check outcome as (line, for standard error) pairs."""
    lines: list[tuple[str, bool]] = []
    verdict = outcome.verdict
    if outcome.action == "skip":
        lines.append((f"nodecheck {mode}: skipped ({outcome.detail})", False))
        return lines
    if verdict is not None:
        for run in verdict.checks:
            status = "timed out" if run.timed_out else "ok" if not any(f in verdict.failing for f in run.findings) else "FAILED"
            lines.append((f"nodecheck {mode}: {run.name}: {status} ({run.seconds:.2f} s)", False))
            for peer in run.details if run.name == "proximity" else []:
                if not peer["examined"]:
                    continue  # counted once, in the check_timed_out finding
                where = "same subnet" if peer["same_subnet"] else f"outside, via {peer['gateway']}" if peer["gateway"] else "outside"
                facts = peer["error"] or f"{peer['address']} on {peer['interface']} ({peer['subnet']}): {where}, {peer['rtt_ms']:g} ms"
                lines.append((f"nodecheck {mode}:   peer {peer['name']}: {facts}", False))
        for finding in verdict.failing + [f for f in verdict.findings if f not in verdict.failing]:
            lines.append((f"nodecheck {mode}: {finding.severity}: {finding.message}", False))
    would = "would " if dry_run else ""
    if outcome.error and verdict is None:
        lines.append((f"nodecheck {mode}: {outcome.error}", True))
        return lines
    if outcome.action == "drain":
        lines.append((f"nodecheck {mode}: {would}drain {verdict.node}: {outcome.detail}", False))
    elif outcome.action == "resume":
        lines.append((f"nodecheck {mode}: {would}resume {verdict.node}", False))
    else:
        lines.append((f"nodecheck {mode}: no change ({outcome.detail})", False))
    if outcome.error:
        lines.append((f"nodecheck {mode}: {outcome.error}", True))
    return lines


def nccl_run_lines(run, findings, where: str) -> list[str]:
    """`nodecheck nccl-log` as text: what NCCL did, then what is wrong with it on `where`."""
    def listed(values) -> str:
        return ", ".join(values) if values else "-"

    gdr = {True: "yes", False: "no", None: "-"}[run.gdr]
    nvls = {True: "in use", False: "not in use", None: "-"}[run.nvls]
    lines = [f"NCCL {run.nccl_version or '(version not in the log)'} on {len(run.nodes)} node(s): {listed(run.nodes[:8])}"
             + (" ..." if len(run.nodes) > 8 else ""),
             f"network: {run.network or '-'}  HCAs: {listed(run.ib_devices)}  socket interfaces: {listed(run.socket_ifaces)}",
             f"between nodes: {listed(run.inter_node_transports)}  (GPUDirect RDMA: {gdr})",
             f"inside a node: {listed(run.intra_node_transports)}  (NVLS: {nvls})",
             f"NCCL WARN lines: {run.warning_count}"]
    lines += [f"{f.severity}: {_clean(f.message)}" for f in findings] or [f"nothing wrong for {where}"]
    return lines
