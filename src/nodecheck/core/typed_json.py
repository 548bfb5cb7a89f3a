"""Dataclasses from their JSON objects, each field decoded by its type hint: what Report.from_dict and
model.from_json read untrusted documents (a snapshot, a bench child's output) with. No hand-written lists."""

from __future__ import annotations

import functools
import json
import math
import types
import typing
from dataclasses import MISSING, fields, is_dataclass

# field(metadata=ESSENTIAL): what an object is nothing without: what names it (a GPU's index, a measurement's path,
# a link's type) or what it says (whether a measurement ran). A document lacking one is not of its shape.
ESSENTIAL = {"essential": True}


def loads(text: str | bytes):
    """JSON as every untrusted document (a Report, a snapshot, a child's or a peer's answer) is read: Python's
    json.loads, except that NaN, Infinity and numbers past a float's range (1e999, or an integer of 309 digits) are
    refused (ValueError): JSON has no NaN, every comparison with one is false (a NaN ratio would pass any
    threshold), and arithmetic on a float with such an integer raises OverflowError."""
    return json.loads(text, parse_constant=_not_a_number, parse_float=_finite, parse_int=_whole)


def _not_a_number(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is past a float's range")
    return value


def _whole(text: str) -> int:
    if len(text.lstrip("-")) > 308:
        raise ValueError(f"{text[:40]}... is past a float's range")
    return int(text)


def record(kind, raw, lenient=frozenset()):
    """One dataclass from its JSON object, each field decoded by its type: unknown keys dropped, a missing
    one takes its default (None, [] or {} where it has none), except an essential field (ESSENTIAL): the
    object is not one without it. ValueError on a value of the wrong shape, except in a field named in `lenient` ((class,
    field name) pairs: what a source read), which is dropped instead, as if absent."""
    if not isinstance(raw, dict):
        raise ValueError(f"{kind.__name__}: expected an object, got {type(raw).__name__}")
    hints = _hints(kind)
    values = {}
    for spec in _fields(kind):
        value = raw.get(spec.name)
        if value is not None:
            try:
                values[spec.name] = _decode(hints[spec.name], value, f"{kind.__name__}.{spec.name}", lenient)
                continue
            except ValueError:
                if (kind, spec.name) not in lenient:
                    raise  # a lenient one is dropped: as if absent
        if spec.metadata.get("essential"):
            raise ValueError(f"{kind.__name__}.{spec.name}: missing")
        if spec.default is MISSING and spec.default_factory is MISSING:  # required: its empty value
            values[spec.name] = _empty(hints[spec.name])
    return kind(**values)


@functools.lru_cache(maxsize=None)
def _hints(kind) -> dict:
    return typing.get_type_hints(kind)


@functools.lru_cache(maxsize=None)
def _fields(kind) -> tuple:
    return fields(kind)


def _empty(hint):
    origin = typing.get_origin(hint)
    return [] if origin is list or hint is list else {} if origin is dict or hint is dict else None


@functools.lru_cache(maxsize=None)
def _shape(hint) -> tuple:
    """How a value of this type hint is read, worked out once per hint (a Report holds thousands of values)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return ("union", tuple(a for a in args if a is not type(None)), type(None) in args)
    if is_dataclass(hint):
        return ("record", hint)
    if origin is list or hint is list:
        return ("list", args[0] if args else None)
    if origin is dict or hint is dict:
        return ("dict", args or None)
    if hint is object:
        return ("any",)
    return ("scalar", (int, float) if hint is float else (hint,), hint is bool, hint.__name__)


def _decode(hint, value, where: str, lenient):
    shape = _shape(hint)
    kind = shape[0]
    if kind == "union":
        if value is None and shape[2]:
            return None
        errors = []
        for arg in shape[1]:
            try:
                return _decode(arg, value, where, lenient)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError("; ".join(errors))
    if kind == "record":
        return record(shape[1], value, lenient)
    if kind == "list":
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        return [_decode(shape[1], v, where, lenient) for v in value] if shape[1] is not None else value
    if kind == "dict":
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        if shape[1] is None:
            return value
        key, item = shape[1]
        return {_decode(key, k, where, lenient): _decode(item, v, where, lenient) for k, v in value.items()}
    if kind == "any":
        return value
    _, allowed, is_bool, name = shape
    if not isinstance(value, allowed) or (isinstance(value, bool) and not is_bool):
        raise ValueError(f"{where}: expected {name}, got {type(value).__name__}")
    return value
