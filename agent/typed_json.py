"""Dataclasses from their JSON objects, each field decoded by its type hint: what Report.from_dict and
model.from_json read untrusted documents (a snapshot, a bench child's output) with. No hand-written lists."""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import MISSING, fields, is_dataclass


def record(kind, raw, lenient=frozenset()):
    """One dataclass from its JSON object, each field decoded by its type: unknown keys dropped, a missing
    one takes its default (None, [] or {} where it has none). ValueError on a value of the wrong shape, except
    in a field named in `lenient` ((class, field name) pairs: what a source read), which is dropped instead."""
    if not isinstance(raw, dict):
        raise ValueError(f"{kind.__name__}: expected an object, got {type(raw).__name__}")
    hints = _hints(kind)
    values = {}
    for spec in fields(kind):
        value = raw.get(spec.name)
        if value is None:
            if spec.default is MISSING and spec.default_factory is MISSING:  # required: its empty value
                values[spec.name] = _empty(hints[spec.name])
            continue
        try:
            values[spec.name] = _decode(hints[spec.name], value, f"{kind.__name__}.{spec.name}", lenient)
        except ValueError:
            if (kind, spec.name) not in lenient:
                raise
    return kind(**values)


@functools.lru_cache(maxsize=None)
def _hints(kind) -> dict:
    return typing.get_type_hints(kind)


def _empty(hint):
    origin = typing.get_origin(hint)
    return [] if origin is list or hint is list else {} if origin is dict or hint is dict else None


def _decode(hint, value, where: str, lenient):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _decode(arg, value, where, lenient)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError("; ".join(errors))
    if is_dataclass(hint):
        return record(hint, value, lenient)
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        return [_decode(args[0], v, where, lenient) for v in value] if args else value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        if not args:
            return value
        return {_decode(args[0], k, where, lenient): _decode(args[1], v, where, lenient) for k, v in value.items()}
    if hint is object:
        return value
    allowed = (int, float) if hint is float else (hint,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and hint is not bool):
        raise ValueError(f"{where}: expected {hint.__name__}, got {type(value).__name__}")
    return value
