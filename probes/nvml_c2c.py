"""A GPU's NVLink-C2C link to its Grace CPU (GH200, GB200, GB300, GB10), as NVML's field values report it: how many
C2C links it has, and per link its status and speed. On these boards the host's memory reaches the GPU over C2C,
not over the GPU's PCIe link (narrow or idle there: NCCL's topology of a GB300 tray shows the GPU's PCIe at 64 GT/s
x2 beside `<c2c bw="44712" count="5"/>`), so a host copy judged against PCIe passed at 15 x its "spec" however
slow the C2C ran. NCCL reads the same fields the same way (src/graph/xml.cc: the active links, each one's
NVML_FI_DEV_C2C_LINK_GET_MAX_BW in MB/s).

dump_c2c(): NVML's answers for one GPU; parse_c2c(): {"links": active links, "link_mbps": the slowest active link's
MB/s, "inactive": the links NVML says are not active}, or None where the GPU has no C2C link (every PCIe GPU: NVML
answers Not Supported). A real GH200 says ten links at 44.712 GB/s each (`nvidia-smi c2c -s`, in xgboost's tests)."""

from __future__ import annotations

from nodecheck.units import is_int

MAX_C2C_LINKS = 64
_COUNT, _STATUS, _MAX_BW = "NVML_FI_DEV_C2C_LINK_COUNT", "NVML_FI_DEV_C2C_LINK_GET_STATUS", "NVML_FI_DEV_C2C_LINK_GET_MAX_BW"
C2C_ACTIVE = 1  # NVML_FI_DEV_C2C_LINK_GET_STATUS: 0 inactive, 1 active


def dump_c2c(pynvml, handle, error_text) -> dict:
    """{"count": n, "links": [{"status", "max_bw_mbps"}]} or {"error": ...}; error_text(code): NVML's words."""
    ask = getattr(pynvml, "nvmlDeviceGetFieldValues", None)
    ids = [getattr(pynvml, name, None) for name in (_COUNT, _STATUS, _MAX_BW)]
    if ask is None or None in ids:
        return {"error": "not in this nvidia-ml-py"}
    try:
        (count,) = ask(handle, [ids[0]])
        if count.nvmlReturn != 0:
            return {"error": error_text(count.nvmlReturn)}
        links = min(int(count.value.uiVal), MAX_C2C_LINKS)  # a confused driver must not make us ask forever
        answers = ask(handle, [(field_id, link) for link in range(links) for field_id in ids[1:]]) if links else []
    except pynvml.NVMLError as error:
        return {"error": str(error)}
    said = []
    for status, speed in zip(answers[0::2], answers[1::2], strict=False):
        said.append({"status": int(status.value.uiVal) if status.nvmlReturn == 0 else {"error": error_text(status.nvmlReturn)},
                     "max_bw_mbps": int(speed.value.uiVal) if speed.nvmlReturn == 0 else {"error": error_text(speed.nvmlReturn)}})
    return {"count": links, "links": said}


def parse_c2c(raw, errors: dict[str, str]) -> dict | None:
    """The GPU's active C2C links and the slowest one's MB/s; None without one (NVML's refusal into `errors`,
    "c2c"). Lenient: a malformed answer is no answer."""
    if not isinstance(raw, dict):
        return None
    if "error" in raw:
        errors["c2c"] = str(raw["error"])[:200]
        return None
    listed = raw.get("links") if isinstance(raw.get("links"), list) else []
    links = [link for link in listed[:MAX_C2C_LINKS] if isinstance(link, dict)]
    speeds = [link.get("max_bw_mbps") for link in links if link.get("status") == C2C_ACTIVE]
    if not links or not all(is_int(s) and 0 < s < 1 << 32 for s in speeds):
        return None
    inactive = [index for index, link in enumerate(links) if is_int(link.get("status")) and link["status"] != C2C_ACTIVE]
    return {"links": len(speeds), "link_mbps": min(speeds) if speeds else None, "inactive": inactive}
