"""`nodecheck inspect` as text: identity, probes, GPUs, the link matrix, NICs, platform, findings, advice."""

from __future__ import annotations

import time

from rich.console import Console
from rich.text import Text

from nodecheck.assemble.roce_gid import nccl_roce_ports
from nodecheck.core.link_types import link_distance
from nodecheck.core.pci import normal_pci
from nodecheck.core.units import format_bits, format_rate, natural_key
from nodecheck.render.bench import measurement_tables
from nodecheck.render.kernel_log import counter_lines, kernel_log_lines
from nodecheck.render.table import (
    IDENTITY,
    LIST,
    cell,
    clean,
    esc,
    fitted_table,
    new_console,
    render_findings,
    unknown_cell,
)
from nodecheck.report.model import Report


def render(report: Report, console: Console | None = None, saved_in=None) -> None:
    """The Report as text; `saved_in`: the file a saved Report was read from (its findings are as judged then)."""
    console = console or new_console()
    node = report.node
    console.print(f"[bold]nodecheck[/bold] {esc(node.get('hostname') or '(host name not recorded)')}  kernel {esc(node.get('kernel') or 'unknown')}  "
                  f"driver {esc(node.get('driver_version') or 'unknown')}  [dim]({esc(report.source)})[/dim]")
    if saved_in is not None:
        console.print(clean(f"a saved Report ({saved_in}), written {_when(report.generated_at)}: shown as it was judged then; "
                            "nothing was probed now"), highlight=False, markup=False)
    console.print("probes: " + "  ".join(
        f"{esc(p.name)} [{'green' if p.ok else 'dim' if p.no_data else 'red'}]"
        f"{'ok' if p.ok else 'no data' if p.no_data else 'FAILED'}[/] "
        + (f"{p.duration_seconds * 1000:.0f} ms" if isinstance(p.duration_seconds, (int, float)) else "? ms")
        for p in report.probes))
    if report.cpu:
        c = report.cpu
        numa = ", ".join(f"node{n['node']}: {n['cpus']}" for n in c.numa)
        console.print(f"CPU: {c.packages} package(s), {c.numa_nodes} NUMA node(s) ({esc(numa)}), {c.cores} cores, {c.pus} PUs"
                      + (f"  [dim]{esc(c.model)}[/dim]" if c.model else ""))
    _gpus(console, report)
    _matrix(console, report)
    _nics(console, report)
    for line in platform_lines(report) + process_lines(report) + kernel_log_lines(report) + counter_lines(report):
        console.print(clean(line), highlight=False, markup=False)
    if report.measurements:  # a saved bench Report: its figures before the findings they raised
        measurement_tables(console, report)
    render_findings(console, report)
    _advice(console, report)


def _when(timestamp) -> str:
    """A Report's time in UTC, or why there is none (a saved Report's may be anything)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp)) if timestamp else "at a time not recorded"
    except (OverflowError, OSError, ValueError, TypeError):
        return f"at an impossible time ({str(timestamp)[:40]})"


def _gpus(console: Console, report: Report) -> None:
    if not report.gpus:
        console.print(f"[yellow]No GPUs:[/yellow] {esc(report.gpus_absent_reason)}")
        return
    listed = {g.index for g in report.gpus}
    for g in report.gpus_inaccessible:
        if g.index not in listed:  # nvidia-smi did not list it either: say it, as the table will not
            console.print(f"[red]gpu{g.index}:[/red] NVML counts it and cannot open it ({esc(g.error)})")
    specs = {p.path: p for p in report.paths}
    refused = {g.index: g.error for g in report.gpus_inaccessible}  # NVML counts them and cannot open them
    rows = []
    for g in report.gpus:
        p = g.pcie or {}
        pcie = (f"gen{unknown_cell(p.get('gen_current'))} x{unknown_cell(p.get('width_current'))} / "
                f"gen{unknown_cell(p.get('gen_max'))} x{unknown_cell(p.get('width_max'))}") if g.pcie else "unknown"
        host = specs.get(f"gpu{g.index}:host")
        model = cell(f"NVML: {refused[g.index]}") if g.name is None and g.index in refused else unknown_cell(g.name)
        over = " (C2C)" if host and host.kind == "c2c" else ""  # a Grace GPU's host path: NVLink-C2C, not its PCIe
        rows.append([cell(g.index), model, cell(pcie), format_rate(host.bytes_per_second if host else None) + over,
                     cell(_nvlinks(g, report)), unknown_cell(g.numa_node), unknown_cell(g.cpu_affinity),
                     cell(", ".join(g.nearest_nics) or "-")])
    headers = [("GPU", IDENTITY), ("model", 5), ("PCIe now / max", 2), ("host link spec", 3), ("NVLinks", 4), ("NUMA", IDENTITY),
               ("CPU affinity", IDENTITY), ("nearest NICs", LIST)]
    console.print(fitted_table(console, "GPUs", headers, rows))
    for line in spec_lines(report):
        console.print(Text(clean(line)), highlight=False)


def spec_lines(report: Report) -> list[str]:
    """What each GPU model of the node is rated at, its GPUs together ("gpu0-7 H100 SXM: memory 3.35 TB/s, dense
    BF16 989 / FP16 989 / TF32 495 / FP8 1979 TFLOPS"), and the GPUs whose model has no spec."""
    models: dict[tuple, list[int]] = {}
    for gpu in report.gpus:
        spec = gpu.spec
        key = (spec.model, spec.memory_bytes_per_second, tuple(spec.dense_tflops.items())) if spec else (gpu.name,)
        models.setdefault(key, []).append(gpu.index)
    lines = []
    for key, indices in models.items():
        if len(key) == 1:
            lines.append(f"GPU spec: {gpu_ranges(indices)} {key[0] or 'unnamed'}: a model with no spec in specs.toml")
            continue
        model, memory, tflops = key
        compute = " / ".join(f"{precision.upper()} {value:.0f}" for precision, value in tflops)
        lines.append(f"GPU spec: {gpu_ranges(indices)} {model}: memory {memory / 1e12:.4g} TB/s"
                     + (f", dense {compute} TFLOPS" if compute else ""))
    return lines


def gpu_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> "gpu0-3, gpu5"."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ", ".join(f"gpu{run[0]}" + (f"-{run[-1]}" if len(run) > 1 else "") for run in runs)


def process_lines(report: Report) -> list[str]:
    """Who holds each GPU (NVML's lists, /proc's names), nodecheck's own apart: what `nvidia-smi`'s process table
    shows, with the Slurm job of each; and the GPUs whose compute mode is not default."""
    said = []
    for gpu in report.gpus:
        for p in (p for p in gpu.processes or [] if not p.ours):
            owner = "gone from /proc" if p.gone else f"job {p.job}" if p.job is not None else "outside any job"
            extra = "".join([f", {p.memory_bytes / (1 << 30):.1f} GiB" if p.memory_bytes is not None else "",
                             f", state {p.state}" if p.state == "D" else "", ", graphics" if p.type == "graphics" else ""])
            said.append(f"gpu{gpu.index} pid {p.pid} {p.name or '?'} ({owner}{extra})")
    lines = [f"GPU processes: {'; '.join(said[:16])}" + (f" (+{len(said) - 16} more)" if len(said) > 16 else "")] if said else []
    modes = {g.index: g.compute_mode for g in report.gpus if g.compute_mode not in (None, "default")}
    if modes:  # who may open a GPU at all: uniform on a node, no finding names it
        every = len(set(modes.values())) == 1 and len(modes) == len(report.gpus)
        lines.append("GPU compute mode: " + (f"{next(iter(modes.values()))} on every GPU" if every
                                             else ", ".join(f"gpu{i} {m}" for i, m in modes.items())))
    return lines


def _nvlinks(gpu, report: Report) -> str:
    """NVML's count of active links and the GPU's NVLink fabric registration; without NVML, what the topology
    says of the GPU's links (NV18)."""
    if gpu.mig_enabled:  # the driver enables no NVLink under MIG: "0/18 up" would read as a fault
        return ", ".join(filter(None, ["off (MIG mode)", _fabric(gpu.fabric)]))
    if gpu.nvlinks:
        unread = sum(1 for l in gpu.nvlinks if l["active"] is None)
        wired = gpu.nvlinks_wired
        # "12/18 up, 12 wired": an H100 NVL's bridges wire 12 of its 18 slots; "0/12 up, none wired": no bridge
        wiring = "" if wired == len(gpu.nvlinks) else f"{wired} wired" if wired is not None else "none wired"
        return ", ".join(filter(None, [f"{sum(1 for l in gpu.nvlinks if l['active'])}/{len(gpu.nvlinks)} up", wiring,
                                       f"{unread} unreadable" if unread else "", _fabric(gpu.fabric)]))
    types = sorted({l.type for l in report.links if gpu.index in (l.a, l.b) and isinstance(l.a, int) and isinstance(l.b, int)
                    and l.type.startswith("NV")}, key=natural_key)
    return f"{', '.join(types)} (topo)" if types else "-"


def _fabric(fabric) -> str:
    """"fabric registered", "fabric in progress", "fabric failed" ...; "" without a fabric."""
    if fabric is None or fabric.state == "not_supported":
        return ""
    if fabric.state == "completed":
        return "fabric registered" if fabric.registered else "fabric failed"
    return "fabric unknown" if fabric.state == "unreadable" else f"fabric {fabric.state.replace('_', ' ')}"


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
        console.print(clean("\n".join(full)), highlight=False, markup=False, soft_wrap=True)
        return
    # too wide for this terminal: the GPU matrix, then each GPU's NICs grouped by link, nearest first
    among_gpus = _matrix_lines(gpus, gpus, cells)
    if len(gpus) > 1 and max(len(line) for line in among_gpus) <= console.width:
        console.print(clean("\n".join(among_gpus)), highlight=False, markup=False, soft_wrap=True)
    elif len(gpus) > 1:
        for a in gpus:
            console.print(Text(clean(f"GPU{a} to GPUs: " + _grouped(a, [b for b in gpus if b != a], cells))), highlight=False)
    for a in gpus if nics else []:
        console.print(Text(clean(f"GPU{a} to NICs: " + _grouped(a, nics, cells))), highlight=False)


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
    unknown_last = lambda kv: (kv[0] == "?", 0 if kv[0] == "?" else link_distance(kv[0]))  # "?": a pair the Report has no link of
    return "; ".join(f"{kind}: {', '.join(names)}" for kind, names in sorted(groups.items(), key=unknown_last))


def _nics(console: Console, report: Report) -> None:
    shown = [n for n in report.nics if not n.virtual or n.addresses]
    if not shown:
        return
    specs = {p.path: p for p in report.paths}
    rows = []
    for n in shown:
        spec = specs.get(f"nic:{n.name}")
        name = f"{n.name} ({n.rdma_device})" if n.rdma_device and n.rdma_device != n.name else n.name
        speed = f"{n.speed_mbps} Mb/s" if n.speed_mbps else _ib_rate(n) or "unknown"
        addresses = ", ".join(f"{a['address']}/{a['prefixlen']}" for a in n.addresses if a["family"] == "inet")
        rows.append([cell(name), cell(n.kind), unknown_cell(n.state), cell(speed), format_bits(spec.bytes_per_second if spec else None),
                     unknown_cell(n.mtu), unknown_cell(n.numa_node), unknown_cell(n.driver), unknown_cell(n.pci_address), cell(addresses or "-")])
    headers = [("NIC", IDENTITY), ("kind", 4), ("state", 7), ("speed", 6), ("spec", 1), ("MTU", 2), ("NUMA", IDENTITY),
               ("driver", 3), ("PCI", 5), ("addresses", LIST)]
    console.print(fitted_table(console, "NICs", headers, rows))


def _ib_rate(nic) -> str | None:
    """An RDMA device without a netdev speed (an InfiniBand HCA): its active port's rate ("400 Gb/sec")."""
    rates = [p.rate.split(" (")[0] for p in nic.ib_ports if p.state == "ACTIVE" and p.rate]
    return rates[0] if rates else None


def platform_lines(report: Report) -> list[str]:
    """What peer-to-peer and GPUDirect traffic depend on: the peer-memory module, the IOMMU mode of the GPUs'
    and NICs' groups, ACS on the PCIe bridges, the GID NCCL takes on each RoCE rail; each said as known, or why
    it is not."""
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
    mode = (report.node or {}).get("nvlink_bw_mode")
    if mode and any(link.get("active") for g in report.gpus for link in g.nvlinks):
        lines.append(f"NVLink bandwidth mode: {mode}")
    roce = nccl_roce_ports(report)
    if roce:  # the GID NCCL takes by itself on each RoCE rail (src/nodecheck/checks/roce.py)
        lines.append("RoCE GID NCCL takes: " + "; ".join(
            f"{port.device}/{port.port} {index} ({(port.gids or {}).get(str(index), 'unset')}, "
            f"v{port.gid_versions.get(str(index), '?')})" for port, index, _ in roce[:8]) + (" ..." if len(roce) > 8 else ""))
    imex = report.imex
    if imex is not None:  # a multi-node NVLink domain's service (GB200 NVL72)
        ready = sum(1 for n in imex.nodes if n.get("status") == "READY")
        lines.append("IMEX: " + (f"unread ({imex.why})" if imex.daemon is None else
                                 f"daemon {imex.daemon}, domain {imex.domain or 'unread'}"
                                 + (f" ({ready} of {len(imex.nodes)} listed nodes READY)" if imex.nodes else "")))
    return lines


def _advice(console: Console, report: Report) -> None:
    if not report.advice:
        return
    console.print("[bold]Binding advice[/bold] (one process per GPU):")
    for entry in report.advice:
        parts = entry.get("lines") if isinstance(entry, dict) else None
        if not isinstance(parts, list) or not parts or not all(isinstance(part, str) for part in parts):
            continue  # a saved Report's advice is what its writer put there: one of another shape is left out
        head = f"  gpu{clean(entry.get('gpu'))}: "
        line = head + clean("  ".join(parts))
        if len(line) > console.width:  # one part a line, joined by `\`: still one command when pasted
            line = (" \\\n" + " " * len(head)).join([head + clean(parts[0])] + [clean(p) for p in parts[1:]])
        console.print(Text(line), soft_wrap=True, highlight=False)
