"""What each GPU's model is rated at: its memory bandwidth and dense matrix throughput from specs.toml, by the
name and memory NVML reports. A GPU held in MIG mode is rated as its whole board (its tests run on none of it)."""

from __future__ import annotations

from nodecheck.core import specs
from nodecheck.report.gpu import GpuModelSpec
from nodecheck.report.model import Report


def gpu_spec(name: str | None, memory_bytes: int | None) -> GpuModelSpec | None:
    row = specs.gpu_model(name, memory_bytes)
    if row is None:
        return None
    return GpuModelSpec(row["model"], row["memory_tbytes_per_s"] * 1e12, dict(row.get("dense_tflops", {})), row["source"])


def mark_gpu_specs(report: Report) -> None:
    """Each GPU's model spec, for the GPU table, the exporter and the judging of its own tests."""
    for gpu in report.gpus:
        gpu.spec = gpu_spec(gpu.name, gpu.memory_bytes)
