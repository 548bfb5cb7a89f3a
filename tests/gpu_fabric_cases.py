"""The Fabric sections of `nvidia-smi -q` others published (tests/fixtures/gpu-fabric/published.txt), turned back
into the numbers NVML's nvmlDeviceGetGpuFabricInfoV writes: what tests/unit/probes/test_gpu_fabric.py and the NVML fuzz seeds
replay through the pynvml stand-in."""

import re

from helpers import REPO, need

PUBLISHED = REPO / "tests" / "fixtures" / "gpu-fabric" / "published.txt"

# the words nvidia-smi prints for NVML's values (nvml.h: NVML_GPU_FABRIC_STATE_*, nvmlReturn_t,
# NVML_GPU_FABRIC_HEALTH_SUMMARY_*, NVML_GPU_FABRIC_HEALTH_MASK_*)
STATES = {"Not Supported": 0, "Not Started": 1, "In Progress": 2, "Completed": 3}
STATUSES = {"N/A": 0, "Success": 0, "Insufficient Resources": 23, "Unknown Error": 999}
SUMMARIES = {"N/A": 0, "Not Supported": 0, "Healthy": 1, "Unhealthy": 2, "Limited Capacity": 3}
MASK = {"Bandwidth": (0, {"Degraded": 1, "Full": 2}), "Route Recovery in progress": (2, {"True": 1, "False": 2}),
        "Route Unhealthy": (4, {"True": 1, "False": 2}), "Access Timeout Recovery": (6, {"True": 1, "False": 2})}


def published() -> dict[str, dict]:
    """Case name -> the NVML values its Fabric section says, as nvmlDeviceGetGpuFabricInfoV writes them."""
    cases = {}
    for block in need(PUBLISHED).read_text().split("\n== ")[1:]:
        name, *lines = block.splitlines()
        said = dict(re.match(r"\s*(.+?)\s+: (.+)", line).groups() for line in lines if " : " in line)
        uuid = said.get("ClusterUUID", "N/A")
        mask = sum(words[said[key]] << shift for key, (shift, words) in MASK.items() if said.get(key) in words)
        cases[name] = {"state": STATES[said["State"]], "status": STATUSES[said.get("Status", "N/A")],
                       "cliqueId": int(said.get("CliqueId", "0").replace("N/A", "0")),
                       "clusterUuid": bytes(16) if uuid == "N/A" else bytes.fromhex(uuid.replace("-", "")),
                       "healthMask": mask, "healthSummary": SUMMARIES[said.get("Summary", "N/A")]}
    return cases
