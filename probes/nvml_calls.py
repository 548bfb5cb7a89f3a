"""NVML calls that fill a structure the caller hands them (nvidia-ml-py passes it on as it is)."""

from __future__ import annotations

import ctypes


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
