"""A GPU's memory and board health beyond its ECC counts, as NVML reports it (src/nodecheck/probes/nvml.py asks for each GPU):

- the SRAM error status (nvmlDeviceGetSramEccErrorStatus, Ampere and newer, root only): whether the SRAM
  uncorrectable errors passed the field diagnostic's threshold, NVIDIA's RMA criterion for the GPU's L2 and SRAM
  ("More than 4 UCE Unique Count events within an address bank for parity protected SRAMs, more than 2 for SECDED",
  NVIDIA GPU Memory Error Management, RMA Policy);
- retired pages (nvmlDeviceGetRetiredPages, nvmlDeviceGetRetiredPagesPendingStatus): how GPUs before Ampere (V100,
  T4) take bad memory out of use; A100 and newer remap rows instead and answer Not Supported;
- the InfoROM's validity (nvmlDeviceValidateInforom): NVML answers Corrupted InfoROM for one whose checksum fails.

dump_memory(): NVML's answers for one GPU, {"error": ...} where it refused; parse_memory(): the facts."""

from __future__ import annotations

from nodecheck.core.units import is_int
from nodecheck.probes.nvml_calls import ask_struct

NVML_ERROR_CORRUPTED_INFOROM = 14
RETIREMENT_CAUSES = {"sbe": 0, "dbe": 1}  # NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, _DOUBLE_BIT_ECC_ERROR
MAX_COUNT = 1 << 40


def dump_memory(pynvml, handle, ask) -> dict:
    """ask: src/nodecheck/probes/nvml.py's _ask (the call's value, or {"error": ...})."""
    retired = getattr(pynvml, "nvmlDeviceGetRetiredPages", None)
    pages = {cause: ask(pynvml, retired, handle, code) for cause, code in RETIREMENT_CAUSES.items()}
    return {
        "sram_ecc": _sram(pynvml, handle),
        "retired_pages": {cause: len(value) if isinstance(value, list) else value for cause, value in pages.items()},
        "retired_pages_pending": ask(pynvml, getattr(pynvml, "nvmlDeviceGetRetiredPagesPendingStatus", None), handle),
        "inforom_valid": _inforom(pynvml, handle),
    }


def _sram(pynvml, handle) -> dict:
    status = ask_struct(pynvml, "nvmlDeviceGetSramEccErrorStatus", "c_nvmlEccSramErrorStatus_v1_t", handle)
    if isinstance(status, dict):
        return status
    return {"threshold_exceeded": int(status.bThresholdExceeded), "uncorrected_parity": int(status.aggregateUncParity),
            "uncorrected_secded": int(status.aggregateUncSecDed)}


def _inforom(pynvml, handle):
    ask = getattr(pynvml, "nvmlDeviceValidateInforom", None)
    if ask is None:
        return {"error": "not in this nvidia-ml-py"}
    try:
        ask(handle)
    except pynvml.NVMLError as error:
        return False if getattr(error, "value", None) == NVML_ERROR_CORRUPTED_INFOROM else {"error": str(error)}
    return True


def _count(value) -> int | None:
    return value if is_int(value) and 0 <= value < MAX_COUNT else None


def _flag(value) -> bool | None:
    """NVML's 0 or 1 (an nvmlEnableState_t, a structure's flag) as a bool; None for anything else."""
    return bool(value) if is_int(value) and value in (0, 1) else None


def parse_memory(raw: dict, errors: dict[str, str]) -> dict:
    """The facts of a GPU record's memory health: sram_threshold_exceeded, retired_pages (single- and double-bit
    causes together), retired_pages_pending, inforom_valid; None where NVML did not say (its reason into `errors`).
    Lenient: a malformed answer is no answer. The SRAM counts stay in the record for whoever reads a snapshot."""
    facts: dict = {}
    sram = raw.get("sram_ecc")
    if isinstance(sram, dict) and "error" in sram:
        errors["sram_ecc"] = str(sram["error"])[:200]
    sram = sram if isinstance(sram, dict) else {}
    exceeded = sram.get("threshold_exceeded")
    facts["sram_threshold_exceeded"] = _flag(exceeded)
    pages = raw.get("retired_pages")
    pages = pages if isinstance(pages, dict) else {}
    counts = [_count(pages.get(cause)) for cause in RETIREMENT_CAUSES]
    refused = next((p["error"] for p in pages.values() if isinstance(p, dict) and "error" in p), None)
    if refused is not None:
        errors["retired_pages"] = str(refused)[:200]
    facts["retired_pages"] = sum(counts) if None not in counts else None
    pending = raw.get("retired_pages_pending")
    facts["retired_pages_pending"] = _flag(pending)
    valid = raw.get("inforom_valid")
    if isinstance(valid, dict) and "error" in valid:
        errors["inforom_valid"] = str(valid["error"])[:200]
    facts["inforom_valid"] = valid if isinstance(valid, bool) else None
    return facts
