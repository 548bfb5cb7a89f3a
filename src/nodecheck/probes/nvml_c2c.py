"""A GPU's NVLink-C2C link to its Grace CPU (GH200, GB200, GB300, GB10), as NVML's field values report it: how many
C2C links it has, and per link its status and speed. On these boards the host's memory reaches the GPU over C2C,
not over the GPU's PCIe link (narrow or idle there: NCCL's topology of a GB300 tray shows the GPU's PCIe at 64 GT/s
x2 beside `<c2c bw="44712" count="5"/>`), so a host copy judged against PCIe passed at 15 x its "spec" however
slow the C2C ran. NCCL reads the same fields the same way (src/graph/xml.cc: the active links, each one's
NVML_FI_DEV_C2C_LINK_GET_MAX_BW in MB/s).

dump_c2c(): NVML's answers for one GPU; parse_c2c(): {"links": active links, "link_mbps": the slowest active link's
MB/s, "inactive": the links NVML says are not active and not idling in low power}, or None where the GPU has no C2C
link (every PCIe GPU: NVML answers Not Supported). A real GH200 says ten links at 44.712 GB/s each
(`nvidia-smi c2c -s`, in xgboost's tests)."""

from __future__ import annotations

from nodecheck.core.units import is_int

MAX_C2C_LINKS = 64
_COUNT, _STATUS, _MAX_BW = "NVML_FI_DEV_C2C_LINK_COUNT", "NVML_FI_DEV_C2C_LINK_GET_STATUS", "NVML_FI_DEV_C2C_LINK_GET_MAX_BW"
_POWER = "NVML_FI_DEV_C2C_LINK_POWER_STATE"
C2C_ACTIVE = 1  # NVML_FI_DEV_C2C_LINK_GET_STATUS: 0 inactive, 1 active
C2C_LOW_POWER = 1  # NVML_C2C_POWER_STATE_LOW_POWER: a link idling in low power wakes with traffic, it is not down


def dump_c2c(pynvml, handle, error_text) -> dict:
    """{"count": n, "links": [{"status", "max_bw_mbps", "power_state"}]} or {"error": ...}; error_text(code): NVML's
    words. The power state is asked where this nvidia-ml-py knows the field (each answer on its own)."""
    ask = getattr(pynvml, "nvmlDeviceGetFieldValues", None)
    ids = [getattr(pynvml, name, None) for name in (_COUNT, _STATUS, _MAX_BW)]
    if ask is None or None in ids:
        return {"error": "not in this nvidia-ml-py"}
    per_link = [(key, field_id) for key, field_id in (("status", ids[1]), ("max_bw_mbps", ids[2]),
                                                      ("power_state", getattr(pynvml, _POWER, None))) if field_id is not None]
    try:
        (count,) = ask(handle, [ids[0]])
        if count.nvmlReturn != 0:
            return {"error": error_text(count.nvmlReturn)}
        links = min(int(count.value.uiVal), MAX_C2C_LINKS)  # a confused driver must not make us ask forever
        answers = ask(handle, [(field_id, link) for link in range(links) for _, field_id in per_link]) if links else []
    except pynvml.NVMLError as error:
        return {"error": str(error)}
    said = []
    for link in range(len(answers) // len(per_link)):
        row = answers[link * len(per_link):(link + 1) * len(per_link)]
        said.append({key: int(value.value.uiVal) if value.nvmlReturn == 0 else {"error": error_text(value.nvmlReturn)}
                     for (key, _), value in zip(per_link, row, strict=True)})
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
    up = [link for link in links if link.get("status") == C2C_ACTIVE or link.get("power_state") == C2C_LOW_POWER]
    speeds = [link.get("max_bw_mbps") for link in up if link.get("status") == C2C_ACTIVE]
    if not links or not all(is_int(s) and 0 < s < 1 << 32 for s in speeds):
        return None
    speeds += [link["max_bw_mbps"] for link in up if link.get("status") != C2C_ACTIVE  # asleep, where NVML says its speed
               and is_int(link.get("max_bw_mbps")) and 0 < link["max_bw_mbps"] < 1 << 32]
    inactive = [index for index, link in enumerate(links) if is_int(link.get("status")) and link["status"] != C2C_ACTIVE
                and link.get("power_state") != C2C_LOW_POWER]
    return {"links": len(up), "link_mbps": min(speeds) if speeds else None, "inactive": inactive}
