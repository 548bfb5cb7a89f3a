"""Human output of a Report with rich: identity, probes, GPUs, link matrix, NICs, findings, advice."""

from __future__ import annotations

import os
import re
import sys

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nodecheck.errors import NodecheckError, install_extra
from nodecheck.model import Report, link_distance
from nodecheck.pci import normal_pci
from nodecheck.units import format_bits, format_path_rate, format_rate, natural_key

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


PLAIN_WIDTH = 1000  # a console this wide prints plain output: unboxed tables, lines as long as they need


def _console() -> Console:
    """A terminal's own width; piped (`| less`), the width of the terminal the command runs in (stderr or
    stdin is still that terminal) or $COLUMNS; with no terminal at all (cron, a file), plain output."""
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    for stream in (sys.stderr, sys.stdin):
        try:
            return Console(width=os.get_terminal_size(stream.fileno()).columns)
        except (OSError, ValueError, AttributeError):
            continue
    return Console(width=PLAIN_WIDTH)


def _table(console: Console, title: str | None, headers: list[tuple[str, int]], rows: list[list],
           justify: str = "left") -> Table:
    """A table that fits the console: headers are (header, role) with role IDENTITY (names, CPU lists: never
    cut, never dropped), LIST (names separated by ", ": wrapped between names, never inside one), TEXT
    (wraps, never dropped), or a positive number: the order in which the column is left out when the table
    would not fit (1 first).
    Other text wraps instead of being cut. Says which columns it left out."""
    def text_of(cell) -> str:
        return cell.plain if isinstance(cell, Text) else str(cell)

    def natural(header, cells):
        return max([len(header)] + [len(text_of(c)) for c in cells])

    def longest_word(header, cells, separators=r"[ ,]+"):
        return max([len(header)] + [len(w) for c in cells for w in re.split(separators, text_of(c))])

    def width_of(header, role, cells):  # names need all of their width; text that wraps, a readable share
        if role in (IDENTITY, LIST):
            return natural(header, cells)
        floor = TEXT_MIN if role == TEXT else WRAPPED_MIN
        return max(min(natural(header, cells), floor), min(longest_word(header, cells), TEXT_MIN))

    def needed(cols):
        return sum(width_of(h, role, cells) + 3 for h, role, cells in cols) + 1

    kept = [(header, role, [row[i] for row in rows]) for i, (header, role) in enumerate(headers)]
    dropped = []
    while needed(kept) > console.width and any(role > 0 for _, role, _ in kept):
        victim = min((c for c in kept if c[1] > 0), key=lambda c: c[1])
        kept.remove(victim)
        dropped.append(victim[0])
    plain = console.width >= PLAIN_WIDTH
    caption = f"not shown at {console.width} columns: {', '.join(dropped)} (widen the terminal, or --json)" if dropped else None
    table = Table(title=title, title_justify="left", box=None if plain else box.HEAVY_HEAD, caption=caption,
                  caption_justify="left")
    for header, role, cells in kept:
        if role == IDENTITY:
            table.add_column(header, no_wrap=True, min_width=natural(header, cells), justify=justify)
        elif role == LIST:
            table.add_column(header, min_width=longest_word(header, cells, ", "), overflow="fold", justify=justify)
        else:  # words stay whole where they can: wraps between them
            table.add_column(header, overflow="fold", min_width=min(longest_word(header, cells), TEXT_MIN),
                             ratio=1 if role == TEXT else None, justify=justify)
    for row in zip(*(cells for _, _, cells in kept), strict=True):
        table.add_row(*row)
    return table


IDENTITY, LIST, TEXT = 0, -1, -2
WRAPPED_MIN = 16  # columns a wrapping column needs to stay readable
TEXT_MIN = 40  # ... and the column that says what to do


def render(report: Report, console: Console | None = None) -> None:
    console = console or _console()
    node = report.node
    console.print(f"[bold]nodecheck[/bold] {_esc(node.get('hostname') or '(host name not recorded)')}  kernel {_esc(node.get('kernel') or 'unknown')}  "
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
    rows = []
    for g in report.gpus:
        p = g.pcie or {}
        pcie = (f"gen{_unknown(p.get('gen_current'))} x{_unknown(p.get('width_current'))} / "
                f"gen{_unknown(p.get('gen_max'))} x{_unknown(p.get('width_max'))}") if g.pcie else "unknown"
        host = specs.get(f"gpu{g.index}:host")
        rows.append([_cell(g.index), _unknown(g.name), _cell(pcie), format_rate(host.bytes_per_second if host else None),
                     _cell(_nvlinks(g, report)), _unknown(g.numa_node), _unknown(g.cpu_affinity),
                     _cell(", ".join(g.nearest_nics) or "-")])
    headers = [("GPU", IDENTITY), ("model", 5), ("PCIe now / max", 2), ("host link spec", 3), ("NVLinks", 4), ("NUMA", IDENTITY),
               ("CPU affinity", IDENTITY), ("nearest NICs", LIST)]
    console.print(_table(console, "GPUs", headers, rows))


def _nvlinks(gpu, report: Report) -> str:
    """NVML's count of active links; without NVML, what the topology says of the GPU's links (NV18)."""
    if gpu.nvlinks:
        return f"{sum(1 for l in gpu.nvlinks if l['active'])}/{len(gpu.nvlinks)} up"
    types = sorted({l.type for l in report.links if gpu.index in (l.a, l.b) and isinstance(l.a, int) and isinstance(l.b, int)
                    and l.type.startswith("NV")}, key=natural_key)
    return f"{', '.join(types)} (topo)" if types else "-"


def _matrix(console: Console, report: Report) -> None:
    """Plain aligned text, laid out like nvidia-smi's own matrix (and much cheaper than a rich Table)."""
    if len(report.gpus) < 2 and not any(isinstance(l.b, str) for l in report.links):
        return
    cells = {}
    for link in report.links:
        cells[(link.a, link.b)] = cells[(link.b, link.a)] = link.type
    gpus = [g.index for g in report.gpus]
    position = {name: i for i, n in enumerate(report.nics) for name in (n.name, n.rdma_device) if name}
    nics = sorted({l.b for l in report.links if isinstance(l.b, str)}, key=lambda n: (position.get(n, len(position)), natural_key(n)))
    console.print("[italic]Links (nvidia-smi topo -m)[/italic]")
    full = _matrix_lines(gpus, gpus + nics, cells)
    if max(len(line) for line in full) <= console.width:
        console.print(_clean("\n".join(full)), highlight=False, markup=False, soft_wrap=True)
        return
    # too wide for this terminal: the GPU matrix, then each GPU's NICs grouped by link, nearest first
    among_gpus = _matrix_lines(gpus, gpus, cells)
    if len(gpus) > 1 and max(len(line) for line in among_gpus) <= console.width:
        console.print(_clean("\n".join(among_gpus)), highlight=False, markup=False, soft_wrap=True)
    elif len(gpus) > 1:
        for a in gpus:
            console.print(Text(_clean(f"GPU{a} to GPUs: " + _grouped(a, [b for b in gpus if b != a], cells))), highlight=False)
    for a in gpus if nics else []:
        console.print(Text(_clean(f"GPU{a} to NICs: " + _grouped(a, nics, cells))), highlight=False)


def _matrix_lines(rows: list[int], columns: list, cells: dict) -> list[str]:
    names = [f"GPU{d}" if isinstance(d, int) else d for d in columns]
    width = max(len(n) for n in names + [f"GPU{r}" for r in rows]) + 2
    lines = ["".ljust(width) + "".join(n.ljust(width) for n in names)]
    for a in rows:
        lines.append(f"GPU{a}".ljust(width) + "".join(("X" if a == b else cells.get((a, b), "?")).ljust(width) for b in columns))
    return [line.rstrip() for line in lines]


def _grouped(a: int, others: list, cells: dict) -> str:
    """`PXB: mlx5_5, mlx5_6; SYS: mlx5_0, ...`: the devices by their link to GPU a, nearest link first."""
    groups: dict[str, list[str]] = {}
    for b in others:
        groups.setdefault(cells.get((a, b), "?"), []).append(f"GPU{b}" if isinstance(b, int) else b)
    return "; ".join(f"{kind}: {', '.join(names)}" for kind, names in sorted(groups.items(), key=lambda kv: link_distance(kv[0])))


def _nics(console: Console, report: Report) -> None:
    shown = [n for n in report.nics if not n.virtual or n.addresses]
    if not shown:
        return
    specs = {p.path: p for p in report.paths}
    rows = []
    for n in shown:
        spec = specs.get(f"nic:{n.name}")
        name = f"{n.name} ({n.rdma_device})" if n.rdma_device and n.rdma_device != n.name else n.name
        speed = f"{n.speed_mbps} Mb/s" if n.speed_mbps else "unknown"
        addresses = ", ".join(f"{a['address']}/{a['prefixlen']}" for a in n.addresses if a["family"] == "inet")
        rows.append([_cell(name), _cell(n.kind), _unknown(n.state), speed, format_bits(spec.bytes_per_second if spec else None),
                     _unknown(n.mtu), _unknown(n.numa_node), _unknown(n.driver), _unknown(n.pci_address), _cell(addresses or "-")])
    headers = [("NIC", IDENTITY), ("kind", 4), ("state", 7), ("speed", 6), ("spec", 1), ("MTU", 2), ("NUMA", IDENTITY),
               ("driver", 3), ("PCI", 5), ("addresses", LIST)]
    console.print(_table(console, "NICs", headers, rows))


def platform_lines(report: Report) -> list[str]:
    """What peer-to-peer and GPUDirect traffic depend on: the peer-memory module, the IOMMU mode of the GPUs'
    and NICs' groups, ACS on the PCIe bridges; each said as known, or why it is not."""
    lines = []
    platform = report.platform
    if platform is not None:
        module = platform.peer_memory
        dma_buf = {True: "DMA-BUF possible (open kernel modules, Linux >= 5.12)", False: "no DMA-BUF",
                   None: "DMA-BUF unknown"}[platform.dma_buf]
        lines.append("GPUDirect RDMA: " + (f"{module} loaded" if module else
                     f"no peer-memory module (nvidia_peermem, nv_peer_mem); {dma_buf}" if platform.modules_known
                     else "unknown"))
        groups = report.iommu_modes()
        devices = [(f"gpu{g.index}", g.pci_bus_id) for g in report.gpus] + [(n.name, n.pci_address) for n in report.nics
                                                                           if n.pci_address]
        modes: dict[str, list[str]] = {}
        for name, pci in devices:
            modes.setdefault(str(groups.get(normal_pci(pci), "no IOMMU group")), []).append(name)
        if modes:
            lines.append("IOMMU: " + "; ".join(f"{mode} ({', '.join(names)})" for mode, names in sorted(modes.items())))
    acs = report.pcie_acs
    if acs is not None:
        redirect = report.acs_redirects() or {}
        on = sorted(bdf for bdf, value in redirect.items() if value)
        lines.append("ACS: " + (str(acs.why) if not acs.known else
                                f"P2P redirect on {', '.join(on)}" if on else
                                f"no P2P redirect ({len(redirect)} ACS-capable bridge(s) read)"))
    return lines


def _findings(console: Console, report: Report) -> None:
    if not report.findings:
        console.print("[green]No findings.[/green]")
        return
    rows = [[Text(_clean(f.severity), style=_SEVERITY_STYLE.get(f.severity, "")), _cell(f.subject), _cell(f.measured),
             _cell(f.expected), _cell(f.message)] for f in report.findings]
    headers = [("severity", IDENTITY), ("subject", IDENTITY), ("measured", 2), ("expected", 1), ("what to do", TEXT)]
    console.print(_table(console, "Findings", headers, rows))


def _advice(console: Console, report: Report) -> None:
    if not report.advice:
        return
    console.print("[bold]Binding advice[/bold] (one process per GPU):")
    for entry in report.advice:
        head = f"  gpu{entry['gpu']}: "
        line = head + _clean("  ".join(entry["lines"]))
        if len(line) > console.width:  # one part a line, joined by `\`: still one command when pasted
            line = (" \\\n" + " " * len(head)).join([head + _clean(entry["lines"][0])] + [_clean(p) for p in entry["lines"][1:]])
        console.print(Text(line), soft_wrap=True, highlight=False)


def render_nccl_log(log, name: str, console: Console | None = None) -> None:
    console = console or _console()
    what = log.collective or "nccl-tests"
    console.print(f"[bold]{_esc(what)}[/bold] from {_esc(name)} ({_esc(log.format)}; {len(log.rows)} rows"
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
        rows.append([str(row.size_bytes), str(row.count), _cell(row.dtype), _cell(row.redop or "-"), *cells])
    console.print(_table(console, None, headers, rows, justify="right"))
    avg = "not in the log" if log.avg_busbw_gbytes is None else f"{log.avg_busbw_gbytes:g} GB/s"
    peak = max((r for r in log.rows if r.out_of_place), key=lambda r: r.out_of_place.busbw_gbytes, default=None)
    if peak is not None:
        console.print(f"Peak bus bandwidth: {peak.out_of_place.busbw_gbytes:g} GB/s (out-of-place, {peak.size_bytes} B)")
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
        measured = ("[red]FAILED[/red]" if not m.ok else "no data moved" if m.direction == "none"
                    else format_path_rate(m.scope, m.bytes_per_second))
        table.add_row(_cell(m.path), _cell(m.test), payload, measured,
                      format_path_rate(m.scope, m.spec_bytes_per_second), ratio, _cell(m.method if m.ok else m.error))
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
    from nodecheck.units import format_bytes, format_params, plural

    lines = []

    def rate(value) -> str:
        if value is None:
            return "-"
        if value == float("inf"):
            return "inf"
        scale, unit = next(((s, u) for s, u in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")) if value >= s), (1, "B/s"))
        return f"{value / scale:.3g} {unit}"

    lines.append(f"gradients: {format_params(work.params)} params x {work.grad_dtype} = {format_bytes(work.grad_bytes)} per step; "
               f"compute {work.step_s * 1000:.4g} ms per step ({work.accum} x {work.micro_step_s * 1000:.4g} ms)")
    lines.append(f"busbw: across nodes {rate(fabric.inter_busbw)} = {format_bits(fabric.inter_busbw)}, inside a node "
               f"{rate(fabric.intra_busbw)} = {format_bits(fabric.intra_busbw)} ({fabric.source}); "
               f"{plural(fabric.gpus_per_node, 'GPU')} per node")
    header = (f"{'GPUs':>5} {'nodes':>5} {'comm/step':>10} {'eff':>6} {'eff(ovl)':>8} {'speed-up':>8} "
              f"{'busbw for ' + format(target, '.0%'):>14} {'(overlap)':>11}")
    lines.append(header)
    for r in rows:
        lines.append(f"{r.gpus:>5} {r.nodes:>5} {r.comm_s * 1000:>8.1f}ms {r.efficiency:>6.1%} {r.efficiency_overlap:>8.1%} "
                   f"{r.speedup:>7.2f}x {rate(r.needed_busbw):>14} {rate(r.needed_busbw_overlap):>11}")
    lines.append(f"levers at {plural(rows[-1].gpus, 'GPU')} (each on top of the previous, no overlap):")
    for label, r in levers:
        lines.append(f"  {label:58} comm {r.comm_s * 1000:7.1f} ms  efficiency {r.efficiency:6.1%}  speed-up {r.speedup:.2f}x")
    return lines


def plot_scale(path, rows, work, fabric, target: float = 0.9) -> None:
    """Efficiency vs GPUs as a PNG, saying what it assumed (busbw inside and across nodes, GPUs per node),
    with the target line and the step where training leaves the node; NodecheckError when matplotlib is
    missing or the file cannot be written."""
    from nodecheck.units import format_params, plural

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise NodecheckError(f"--plot needs matplotlib: {install_extra('plot')}") from None
    figure, axes = plt.subplots(figsize=(7, 4.5))
    gpus = [r.gpus for r in rows]
    axes.plot(gpus, [r.efficiency * 100 for r in rows], marker="o", label="no overlap")
    axes.plot(gpus, [r.efficiency_overlap * 100 for r in rows], marker="s", label="full overlap")
    axes.axhline(target * 100, color="grey", linestyle="--", linewidth=1, label=f"target {target:.0%}")
    if any(r.nodes > 1 for r in rows):
        axes.axvline(fabric.gpus_per_node * 1.41, color="tab:red", linestyle=":", linewidth=1,
                     label=f"beyond one node ({plural(fabric.gpus_per_node, 'GPU')})")
    axes.set_xscale("log", base=2)
    axes.set_xticks(gpus, [str(g) for g in gpus])
    axes.set_ylim(0, 105)
    axes.set_xlabel("GPUs")
    axes.set_ylabel("scaling efficiency (%)")
    axes.set_title(f"{format_params(work.params)} params, {work.grad_dtype} gradients, {work.step_s * 1000:.4g} ms/step\n"
                   f"busbw {format_bits(fabric.inter_busbw)} across nodes, {format_bits(fabric.intra_busbw)} inside a node, "
                   f"{plural(fabric.gpus_per_node, 'GPU')} per node ({fabric.source})"[:200], fontsize=9)
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
    if outcome.slurm_error:
        lines.append((f"nodecheck {mode}: {outcome.slurm_error}", True))
    return lines


def nccl_run_lines(run, findings, where: str, verdict_above: bool = False) -> list[str]:
    """`nodecheck nccl-log` as text: what NCCL did, then what is wrong with it on `where` (verdict_above: the
    bandwidth verdict was printed before, so no second "nothing wrong" may contradict it)."""
    def listed(values) -> str:
        return ", ".join(values) if values else "-"

    gdr = {True: "yes", False: "no", None: "-"}[run.gdr]
    nvls = {True: "in use", False: "not in use", None: "-"}[run.nvls]
    nodes = f"{len(run.nodes)} node{'' if len(run.nodes) == 1 else 's'}"
    lines = [f"NCCL {run.nccl_version or '(version not in the log)'} on {nodes}: {listed(run.nodes[:8])}"
             + (" ..." if len(run.nodes) > 8 else ""),
             f"network: {run.network or '-'}  HCAs: {listed(run.ib_devices)}  socket interfaces: {listed(run.socket_ifaces)}",
             f"between nodes: {listed(run.inter_node_transports)}  (GPUDirect RDMA: {gdr})",
             f"inside a node: {listed(run.intra_node_transports)}  (NVLS: {nvls})",
             f"NCCL WARN lines: {run.warning_count}"]
    quiet = "no finding in what NCCL chose" if verdict_above else f"nothing wrong for {where}"
    lines += [f"{f.severity}: {_clean(f.message)}" for f in findings] or [quiet]
    return lines


def config_check_lines(name: str, where: str, report: Report, rows, failing, reason: str | None, fail_severity: str) -> list[str]:
    """`nodecheck config check` as text: each expectation beside the node's value, the findings (those that
    fail the prolog first), and what the prolog would do."""
    width = max(len(key) for key, _, _ in rows)
    lines = [f"{_clean(name)}: valid. On {_clean(where)} ({_clean(report.node.get('hostname') or 'host name unknown')}):"]
    lines += [f"  {_clean(key):<{width}}  expects {_clean(expected):<22} has {_clean(has)}" for key, expected, has in rows]
    lines += [f"  {f.severity}: {_clean(f.message)}" for f in failing + [f for f in report.findings if f not in failing]]
    if reason:
        return lines + [f"the prolog would drain {_clean(where)} with this config: {_clean(reason)}"]
    below = f" ({len(report.findings)} finding(s) below {fail_severity})" if report.findings else ""
    return lines + [f"the prolog's node check passes on {_clean(where)} with this config{below}"]
