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
    if len(text) > 308 and len(text.lstrip("-")) > 308:  # the first test alone for all but the longest
        raise ValueError(f"{text[:40]}... is past a float's range")
    return int(text)


def member(value, key: str, kind: type):
    """value[key] when value is a JSON object and the member has the kind expected; None otherwise: how an answer
    read as untrusted input (an API server's object) is walked without a KeyError or a list taken for a dict."""
    found = value.get(key) if isinstance(value, dict) else None
    return found if isinstance(found, kind) else None


def record(kind, raw, lenient=frozenset()):
    """One dataclass from its JSON object, each field decoded by its type: unknown keys dropped, a missing
    one takes its default (None, [] or {} where it has none), except an essential field (ESSENTIAL): the
    object is not one without it. ValueError on a value of the wrong shape, except in a field named in `lenient` ((class,
    field name) pairs: what a source read), which is dropped instead, as if absent."""
    return _reader(kind)(raw, None, lenient)


@functools.lru_cache(maxsize=None)
def _reader(kind):
    """The function (raw, where, lenient) -> kind that reads one, written out once per class with each field's
    reading in line, as dataclasses writes __init__: a fleet reads thousands of Reports of hundreds of objects each,
    and a loop over a plan per object cost more than parsing their JSON. A scalar of its field's exact type (JSON's
    own int, float, str, bool) is taken as it is; any other value goes through the field's decoder, which names
    what is wrong."""
    hints = typing.get_type_hints(kind)
    names = {"kind": kind, "dict": dict, "type": type, "isinstance": isinstance, "ValueError": ValueError}
    lines = ["def read(raw, where, lenient):",
             "    if type(raw) is not dict and not isinstance(raw, dict):",
             f"        raise ValueError(f'{kind.__name__}: expected an object, got {{type(raw).__name__}}')",
             "    get = raw.get"]
    arguments = []  # as __init__ takes them: in order, a keyword-only field by its name
    for n, spec in enumerate(f for f in fields(kind) if f.init):
        hint, key = hints[spec.name], repr(spec.name)
        arguments.append(f"{spec.name}=v{n}" if spec.kw_only else f"v{n}")
        names.update({f"D{n}": _decoder(hint), f"W{n}": f"{kind.__name__}.{spec.name}", f"E{n}": _empty(hint),
                      f"V{n}": spec.default, f"F{n}": spec.default_factory, f"T{n}": _exact_types(hint)})
        if spec.metadata.get("essential"):
            missing = f"raise ValueError(W{n} + ': missing')"
        elif spec.default is not MISSING:
            missing = f"v{n} = V{n}"
        elif spec.default_factory is not MISSING:
            missing = f"v{n} = F{n}()"
        else:  # its empty value
            missing = f"v{n} = E{n}()" if names[f"E{n}"] is not None else f"v{n} = None"
        lines += [f"    v{n} = get({key})", f"    if v{n} is None:", f"        {missing}"]
        if names[f"T{n}"] is not None:  # the common case, taken as it is: most of a Report's values are scalars
            lines += [f"    elif type(v{n}) not in T{n}:"]
        else:
            lines += ["    else:"]
        lines += ["        try:", f"            v{n} = D{n}(v{n}, W{n}, lenient)",
                  "        except ValueError:", f"            if (kind, {key}) not in lenient:", "                raise",
                  f"            {missing}"]
    lines.append(f"    return kind({', '.join(arguments)})")
    exec(compile("\n".join(lines), f"<read {kind.__name__}>", "exec"), names)  # noqa: S102 (written from field names, never from input)
    return names["read"]


def _scalar_of(hint) -> tuple | None:
    """(the types a scalar field takes, whether a bool is one of them) for a field of a scalar or an optional scalar;
    None for any other. A value that fails this check still goes through the decoder, which names what is wrong."""
    options = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else [hint]
    if not options or not all(option in (int, str, bool, float) for option in options):
        return None
    allowed = {int, float} if float in options else set()
    return tuple(allowed | set(options)), bool in options


def _exact_types(hint) -> frozenset | None:
    """The exact types a scalar field's value takes as it is (an int where a float is asked; a bool only where
    a bool is); None for a field of any other type."""
    scalar = _scalar_of(hint)
    return None if scalar is None else frozenset(scalar[0]) if scalar[1] else frozenset(scalar[0]) - {bool}


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
        return _reader(hint)
    if origin is list or hint is list:
        return _list(_decoder(args[0]) if args else None, _exact_types(args[0]) if args else None)
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


def _list(item, exact: frozenset | None):
    """A list's decoder; `exact`: the types its items take as they are, for a list of scalars."""
    def decode(value, where, lenient):
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        return [item(v, where, lenient) for v in value] if item is not None else value

    def scalars(value, where, lenient):
        if type(value) is list and all(type(v) in exact for v in value):
            return list(value)  # a list of plain values, checked in one pass
        return decode(value, where, lenient)
    return scalars if exact is not None else decode


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
    return decode
