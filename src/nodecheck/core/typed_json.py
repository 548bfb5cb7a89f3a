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
    values = {}
    for name, decode, scalar, where, essential, required, empty in _plan(kind):
        value = raw.get(name)
        if value is not None:
            if scalar is not None and isinstance(value, scalar[0]) and (scalar[1] or not isinstance(value, bool)):
                values[name] = value  # the common case, read inline: most of a Report's values are scalars
                continue
            try:
                values[name] = decode(value, where, lenient)
                continue
            except ValueError:
                if (kind, name) not in lenient:
                    raise  # a lenient one is dropped: as if absent
        if essential:
            raise ValueError(f"{where}: missing")
        if required:  # its empty value
            values[name] = empty() if empty is not None else None
    return kind(**values)


@functools.lru_cache(maxsize=None)
def _plan(kind) -> tuple:
    """How each field of a dataclass is read, worked out once per class (a fleet reads thousands of Reports, each of
    thousands of values): its decoder, where an error names it, whether it is essential or required, its empty value."""
    hints = typing.get_type_hints(kind)
    return tuple((spec.name, _decoder(hints[spec.name]), _scalar_of(hints[spec.name]), f"{kind.__name__}.{spec.name}",
                  bool(spec.metadata.get("essential")), spec.default is MISSING and spec.default_factory is MISSING,
                  _empty(hints[spec.name])) for spec in fields(kind))


def _scalar_of(hint) -> tuple | None:
    """(the types a scalar field takes, whether a bool is one of them) for a field of a scalar or an optional scalar;
    None for any other. A value that fails this check still goes through the decoder, which names what is wrong."""
    options = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else [hint]
    if not options or not all(option in (int, str, bool, float) for option in options):
        return None
    allowed = {int, float} if float in options else set()
    return tuple(allowed | set(options)), bool in options


def _empty(hint):
    origin = typing.get_origin(hint)
    return list if origin is list or hint is list else dict if origin is dict or hint is dict else None


@functools.lru_cache(maxsize=None)
def _decoder(hint):
    """A function (value, where, lenient) -> value that reads a value of this type hint, made once per hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union(tuple(_decoder(a) for a in args if a is not type(None)), type(None) in args)
    if is_dataclass(hint):
        return lambda value, where, lenient: record(hint, value, lenient)
    if origin is list or hint is list:
        return _list(_decoder(args[0]) if args else None)
    if origin is dict or hint is dict:
        return _dict((_decoder(args[0]), _decoder(args[1])) if args else None)
    if hint is object:
        return lambda value, where, lenient: value
    return _scalar((int, float) if hint is float else (hint,), hint is bool, hint.__name__)


def _union(options: tuple, nullable: bool):
    def decode(value, where, lenient):
        if value is None and nullable:
            return None
        errors = []
        for option in options:
            try:
                return option(value, where, lenient)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError("; ".join(errors))
    return decode


def _list(item):
    if item is not None and getattr(item, "scalar", None) is not None:
        allowed, is_bool = item.scalar

        def scalars(value, where, lenient):
            if isinstance(value, list) and all(isinstance(v, allowed) and (is_bool or not isinstance(v, bool)) for v in value):
                return list(value)  # a list of plain values, checked in one pass
            return decode(value, where, lenient)
    else:
        scalars = None

    def decode(value, where, lenient):
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        return [item(v, where, lenient) for v in value] if item is not None else value
    return scalars or decode


def _dict(items):
    def decode(value, where, lenient):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        if items is None:
            return value
        key, item = items
        return {key(k, where, lenient): item(v, where, lenient) for k, v in value.items()}
    return decode


def _scalar(allowed: tuple, is_bool: bool, name: str):
    def decode(value, where, lenient):
        if not isinstance(value, allowed) or (isinstance(value, bool) and not is_bool):
            raise ValueError(f"{where}: expected {name}, got {type(value).__name__}")
        return value
    decode.scalar = (allowed, is_bool)
    return decode
