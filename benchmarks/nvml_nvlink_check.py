"""On a multi-GPU NVLink node: what NVML really returns for each GPU's architecture and NVLink version enum,
the per-link rate nodecheck derives from them, and the driver's own per-link rate (`nvidia-smi nvlink -s`)
beside it, in one table. The first run on an A100 or H100 HGX settles issue 20 (1) in seconds:

    python benchmarks/nvml_nvlink_check.py            # needs nvidia-ml-py and the NVIDIA driver

Columns: gpu, name, NVML architecture (number and name), the version enums of its active links, links
active/reported and NVML's own count of the GPU's links (NVML_FI_DEV_NVLINK_LINK_COUNT; "-" where it refuses:
whether it agrees with the links enumerated decides whether nodecheck may judge against it), nodecheck's per-link
data rate (GB/s, one direction) and its basis, the per-link figure the driver is expected to print (NVML's speed
field where it gives it, else specs.toml's: 25.0 A100, 14.062 GA102 boards, 26.562 Hopper, 53.125 Blackwell: the
links' signalling figure, which on Hopper is above NVLink 4's 25 GB/s of data) and nvidia-smi's own for link 0
("Link 0: 26.562 GB/s" on an H100), and the GPU's NVLink fabric registration (NVML's fabric state/status:
completed/Success on a healthy NVSwitch node). A row whose expected and printed figures differ (like with like, to
nvidia-smi's three decimals) says MISMATCH, and the exit status is 1. Above the table, the node's NVLink bandwidth mode;
below it, per GPU, the NVLink error counters NVML answers (Blackwell's NVLink 5 counters among them), its
NVLink-C2C links (GH200/GB200) and its own NVLink bandwidth mode (Blackwell: nvmlDeviceGetNvlinkBwMode, "best" or
"reduced"), so the first node of a kind confirms what nodecheck reads there.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from nodecheck.core import specs
from nodecheck.core.errors import NodecheckError
from nodecheck.probes.nvml import dump_nvml, parse_nvml


def driver_link_rates(index: int) -> list[float]:
    """Per-link rates nvidia-smi reports for one GPU, GB/s ([] when it cannot say)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "nvlink", "-s", "-i", str(index)], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except subprocess.TimeoutExpired:
        return []
    return [float(m[1]) for m in re.finditer(r"Link \d+:\s*([0-9.]+)\s*GB/s", out)]


def main() -> int:
    try:
        dump = dump_nvml()
        facts = parse_nvml(dump)
    except NodecheckError as error:
        print(f"nvml_nvlink_check: {error}", file=sys.stderr)
        return 2
    mismatches = 0
    print(f"NVLink bandwidth mode (nvmlSystemGetNvlinkBwMode): {facts.nvlink_bw_mode or '- (NVML does not say)'}")
    print(f"{'gpu':>3}  {'name':<26} {'arch':<14} {'enums':<8} {'links':<6} {'count':>5} {'nodecheck':>9}  {'expected':>8}  "
          f"{'nvidia-smi':>10}  {'fabric':<20} basis")
    for gpu in facts.gpus:
        active = [version for _, on, version in gpu.nvlinks if on]
        enums = sorted({v for v in active if v is not None})
        spec, why = specs.nvlink_for_gpu(gpu.architecture, gpu.name, min(enums) if enums else None, 1)
        ours = spec.bytes_per_second / 1e9 if spec else None
        theirs = driver_link_rates(gpu.index)
        arch = specs.architecture(gpu.architecture, None)[1].replace("NVML architecture ", "")
        expected = gpu.nvlink_speed_mbps or specs.nvlink_signalling_mbps(gpu.architecture, gpu.name)
        verdict = ""
        if expected is not None and theirs and abs(theirs[0] - expected / 1000) > 0.002:
            verdict, mismatches = "  MISMATCH", mismatches + 1
        print(f"{gpu.index:>3}  {(gpu.name or '?')[:26]:<26} {arch[:14]:<14} {','.join(map(str, enums)) or '-':<8} "
              f"{len(active)}/{len(gpu.nvlinks):<4} {_or_dash(gpu.nvlink_count):>5} {ours if ours is not None else '-':>9}  "
              f"{expected / 1000 if expected else '-':>8}  {theirs[0] if theirs else '-':>10}  {_fabric(gpu.fabric):<20} "
              f"{spec.basis if spec else why}{verdict}")
    modes = {raw.get("index"): raw.get("nvlink_bw_mode") for raw in dump.get("gpus", []) if isinstance(raw, dict)}
    for gpu in facts.gpus:  # what nodecheck reads beyond the links, for the first node of a kind to confirm
        c2c = gpu.c2c or {}
        fifth = sorted(k for k in (gpu.nvlink_errors or {}) if k not in ("replay", "recovery", "crc_flit", "crc_data"))
        print(f"gpu{gpu.index}: error counters {', '.join(sorted(gpu.nvlink_errors or {})) or '-'}"
              f"{' (NVLink 5: ' + str(len(fifth)) + ')' if fifth else ''}; C2C "
              f"{str(c2c.get('links')) + ' x ' + str(c2c.get('link_mbps')) + ' MB/s' if c2c.get('links') else '-'}"
              f"{', inactive ' + ','.join(map(str, c2c['inactive'])) if c2c.get('inactive') else ''}; "
              f"bw mode {_bw_mode(modes.get(gpu.index))}")
    return 1 if mismatches else 0


def _bw_mode(raw) -> str:
    """nvmlDeviceGetNvlinkBwMode's answer (Blackwell's per-GPU mode): best, reduced (mode N), or NVML's refusal."""
    if not isinstance(raw, dict) or "error" in raw:
        return f"- ({(raw or {}).get('error', 'not asked')})" if isinstance(raw, dict) or raw is None else "-"
    return f"{'best' if raw.get('best') else 'reduced'} (mode {raw.get('mode')})"


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def _fabric(fabric: dict | None) -> str:
    if fabric is None:
        return "-"
    return "/".join(str(v) for v in (fabric["state"], fabric.get("status")) if v)[:20]


if __name__ == "__main__":
    sys.exit(main())
