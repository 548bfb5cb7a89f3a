"""`nodecheck scale` as text and as a plot."""

from __future__ import annotations

import math

from nodecheck.core.errors import NodecheckError, install_extra
from nodecheck.core.units import format_bits


def scale_lines(work, fabric, rows, levers, target) -> list[str]:
    """`nodecheck scale` as text: the workload, the fabric, the table and the levers."""
    from nodecheck.core.units import format_bytes, format_params, plural

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
    domain = (f", inside the multi-node NVLink domain (up to {fabric.domain_gpus} GPUs) "
              f"{rate(fabric.domain_busbw or fabric.intra_busbw)}" if fabric.domain_gpus else "")
    lines.append(f"busbw: across nodes {rate(fabric.inter_busbw)} = {format_bits(fabric.inter_busbw)}, inside a node "
               f"{rate(fabric.intra_busbw)} = {format_bits(fabric.intra_busbw)}{domain} ({fabric.source}); "
               f"{plural(fabric.gpus_per_node, 'GPU')} per node")
    header = (f"{'GPUs':>5} {'nodes':>5} {'comm/step':>10} {'eff':>6} {'eff(ovl)':>8} {'speed-up':>8} "
              f"{'busbw for ' + format(target, '.0%'):>14} {'(overlap)':>11}")
    lines.append(header)
    for r in rows:
        lines.append(f"{r.gpus:>5} {r.nodes:>5} {r.comm_s * 1000:>8.1f}ms {_pct(r.efficiency):>6} {_pct(r.efficiency_overlap):>8} "
                   f"{r.speedup:>7.2f}x {rate(r.needed_busbw):>14} {rate(r.needed_busbw_overlap):>11}")
    lines.append(f"levers at {plural(rows[-1].gpus, 'GPU')} (each on top of the previous, no overlap):")
    width = max(58, *(len(label) for label, _ in levers))  # one column, however long the longest lever
    for label, r in levers:
        lines.append(f"  {label:{width}} comm {r.comm_s * 1000:7.1f} ms  efficiency {_pct(r.efficiency):>6}  speed-up {r.speedup:.2f}x")
    return lines


def _pct(value: float) -> str:
    """A share as a percentage; '-' where the inputs gave none (inf over inf is no figure, never 'nan%')."""
    return f"{value:.1%}" if math.isfinite(value) else "-"


def plot_scale(path, rows, work, fabric, target: float = 0.9) -> None:
    """Efficiency vs GPUs as a PNG, saying what it assumed (busbw inside and across nodes, GPUs per node),
    with the target line and the step where training leaves the node; NodecheckError when matplotlib is
    missing or the file cannot be written."""
    from nodecheck.core.units import format_params, plural

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
