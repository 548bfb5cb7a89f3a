"""`nodecheck scale`: how a data-parallel job scales over the fabric measured or recorded."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from nodecheck.cli.app import app, fail, is_report_file, load_report, read_report_file
from nodecheck.core.errors import ConfigError, NodecheckError
from nodecheck.core.limits import MAX_GPUS

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
    domain_gpus: Optional[int] = typer.Option(None, "--nvlink-domain-gpus", help="GPUs in one multi-node NVLink domain (GB200 NVL72: 72): jobs up to it cross nodes over NVLink. Default: from --from's IMEX node list."),
    target: float = typer.Option(0.9, "--target", help="Target efficiency for the bandwidth-needed columns."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw efficiency vs GPUs to this PNG (needs the plot extra: sh deploy/install.sh plot)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table and the levers as JSON."),
) -> None:
    """Predict data-parallel scaling: communication per step, efficiency with and without overlap,
    speed-up, and the busbw needed for --target, from this cluster's measured all-reduce busbw."""
    from nodecheck import scale as model
    from nodecheck.core.units import parse_count

    try:
        work = model.Workload(parse_count(params), grad_dtype, model.micro_step(step_time, flops, peak_tflops, mfu), accum)
        if grad_dtype not in model.GRAD_BYTES:
            raise ValueError(f"--grad-dtype {grad_dtype!r}: expected one of {', '.join(model.GRAD_BYTES)}")
        if not (1 <= accum <= SCALE_MAX_ACCUM and 1 <= nodes <= SCALE_MAX_NODES and 0 < target < 1
                and (gpus_per_node is None or 1 <= gpus_per_node <= MAX_GPUS)
                and (domain_gpus is None or 1 <= domain_gpus <= SCALE_MAX_NODES * MAX_GPUS)):
            raise ValueError(f"--accum must be 1..{SCALE_MAX_ACCUM:,}, --nodes 1..{SCALE_MAX_NODES:,}, --gpus-per-node "
                             f"1..{MAX_GPUS}, --nvlink-domain-gpus 1..{SCALE_MAX_NODES * MAX_GPUS:,}, and --target between 0 and 1")
        if not (0 < work.step_s < math.inf and 0 < work.grad_bytes < math.inf):  # else inf/inf prints "nan%"
            raise ValueError(f"a step of {work.step_s:g} s with {work.grad_bytes:g} gradient bytes: not a usable workload "
                             "(each must be finite and above 0)")
        fabric = _fabric(source, busbw, intra_busbw, gpus_per_node, work.grad_bytes, domain_gpus)
    except (ValueError, NodecheckError) as error:
        fail(str(error))
    rows = model.table(work, fabric, nodes, target)
    levers = model.levers(work, fabric, rows[-1].gpus, target)
    if plot is not None:
        from nodecheck.render.scale import plot_scale

        try:
            plot_scale(plot, rows, work, fabric, target)
        except NodecheckError as error:
            fail(str(error))
        typer.echo(f"nodecheck scale: chart written to {plot}", err=True)  # stderr: --json stays one document
    if as_json:
        document = {"schema": "nodecheck.scale", "schema_version": 1, "workload": {**asdict(work), "grad_bytes": work.grad_bytes},
                    "fabric": asdict(fabric), "target": target, "rows": [r.to_dict() for r in rows],
                    "levers": [{"lever": label, **r.to_dict()} for label, r in levers]}
        typer.echo(json.dumps(model.finite(document), indent=2, allow_nan=False))  # strict JSON: no NaN or Infinity
    else:
        from nodecheck.render.scale import scale_lines

        typer.echo("\n".join(scale_lines(work, fabric, rows, levers, target)))


def _fabric(source, busbw, intra_busbw, gpus_per_node, grad_bytes, domain_gpus=None):
    from nodecheck import scale as model
    from nodecheck.core.units import parse_rate

    if busbw is not None:
        inter = parse_rate(busbw)
        intra = parse_rate(intra_busbw) if intra_busbw else inter
        return model.Fabric(gpus_per_node or 8, inter, intra, f"by hand: --busbw {_clean_arg(busbw)}"
                            + (f", --intra-busbw {_clean_arg(intra_busbw)}" if intra_busbw else "")
                            + (f", a multi-node NVLink domain of {domain_gpus} GPUs at the in-node busbw" if domain_gpus else ""),
                            domain_gpus=domain_gpus)
    if source is None:
        raise ValueError("give --busbw RATE, or --from a Report (nodecheck bench --json) or a snapshot")
    try:
        report = read_report_file(source) if is_report_file(source) else load_report(source, None)[0]
    except (OSError, ValueError, TypeError, RecursionError, ConfigError) as error:
        raise NodecheckError(f"{source}: cannot read a Report ({str(error)[:300]})") from None
    try:
        return model.fabric_from_report(report, gpus_per_node, grad_bytes, domain_gpus)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as error:
        raise NodecheckError(f"{source}: not a nodecheck Report ({type(error).__name__}: {error})") from None
    except NodecheckError as error:
        raise NodecheckError(f"{source}: {error}") from None


def _clean_arg(text: str) -> str:
    """An argument echoed as the user wrote it (its unit kept), bounded and printable."""
    return "".join(c if c.isprintable() else "?" for c in text.strip())[:40]
