"""NVML calls shared by the NVML probe's modules: one that fills a structure the caller hands it (nvidia-ml-py
passes it on as it is), and counters read as field values (nvmlDeviceGetFieldValues) and read back from a dump."""

from __future__ import annotations

import ctypes

from nodecheck.core.units import is_int

# nvmlValueType_t -> the member of nvmlValue_t that holds it
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def as_text(value) -> str:
    """A string NVML hands back as bytes (a bus id, a name) as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def ask_struct(pynvml, function: str, struct: str, handle):
    """nvidia-ml-py's `function`(handle, &s) on a fresh `struct`: the filled structure, or {"error": ...} where this
    nvidia-ml-py lacks either or NVML refuses."""
    ask, kind = getattr(pynvml, function, None), getattr(pynvml, struct, None)
    if ask is None or kind is None:
        return {"error": "not in this nvidia-ml-py"}
    filled = kind()
    try:
        ask(handle, ctypes.byref(filled))  # by reference, as NVML writes into it
    except pynvml.NVMLError as error:
        return {"error": str(error)}
    return filled


def ask_counters(pynvml, handle, fields: dict[str, str], error_text, scope: int | None = None) -> dict:
    """{name: count or {"error": ...}} for each of `fields` ({name: nvml.h's field name}) in one
    nvmlDeviceGetFieldValues call, each asked of `scope` where given (a link; UINT_MAX: summed over them). NVML
    answers each field on its own: one this driver does not know is Not Supported, and the others still come.
    error_text(code): NVML's words for a code; {"error": ...} alone where the call itself fails."""
    ask = getattr(pynvml, "nvmlDeviceGetFieldValues", None)
    ids = {name: getattr(pynvml, field, None) for name, field in fields.items()}
    if ask is None or None in ids.values():
        return {"error": "not in this nvidia-ml-py"}
    try:
        values = ask(handle, [field_id if scope is None else (field_id, scope) for field_id in ids.values()])
    except pynvml.NVMLError as error:
        return {"error": str(error)}
    said: dict = {}
    for name, value in zip(ids, values, strict=False):
        if value.nvmlReturn != 0:
            said[name] = {"error": error_text(value.nvmlReturn)}
        else:
            member = _VALUE_MEMBERS.get(int(value.valueType))
            said[name] = int(getattr(value.value, member)) if member else {"error": f"value type {value.valueType}"}
    return said


def counters_of(raw, names, errors: dict[str, str], key: str) -> dict[str, int]:
    """ask_counters()'s answer read back: {name: count} of the `names` NVML gave as counts (0 <= n < 2^64); its
    first refusal into `errors`[key]. Lenient: a malformed answer is no answer."""
    if not isinstance(raw, dict):
        return {}
    refused = raw.get("error") or next((v["error"] for v in raw.values() if isinstance(v, dict) and "error" in v), None)
    if refused is not None:
        errors[key] = str(refused)[:200]
    return {name: value for name, value in raw.items() if name in names and is_int(value) and 0 <= value < 1 << 64}
