"""Structure-aware mutation of real captures: numbers, ranges, separators, types, lines.

Text is cut into tokens (runs of digits, runs of letters, runs of white space, single other
characters) so that a mutation changes one field the way a broken tool, a new driver or an attacker
would: a number becomes a boundary value, a range explodes, a separator changes, a number turns into
a word, a line repeats or disappears, markup or control characters appear. JSON-like values (dicts,
lists) get a value swapped for another type, a key dropped, an item repeated, a nesting deepened.
"""

from __future__ import annotations

import copy
import random
import re

NUMBERS = ["0", "-1", "1", "255", "65536", "2147483648", "4294967295", "18446744073709551616", "9" * 40,
           "1e308", "nan", "inf", "-0", "007", "0x1f", "1.5", "\u00b2", "\u0663"]
RANGES = ["0-4294967295", "0-300000000", "5-1", "0-0", "1-", "-3", "0--1"]
SEPARATORS = [",", "-", ":", " ", "\t", "\n", "\r\n", ";", "=", "/", "..", "[", "]", "(", ")", "", "  "]
INJECTIONS = ["[/]", "[bold red]", "\x1b[2J", "\x00", "\x07", "\ufffd", "<", ">", "&", '"', "'", "{", "}", "\u202e",
              "é", "GPU0", "NV18", "X", "N/A", "$(reboot)", "../../etc/shadow", "%s%n"]
_TOKEN = re.compile(r"\d+|[A-Za-z_]+|[ \t]+|\r?\n|.", re.S)


def mutate_text(text: str, rng: random.Random, rounds: int | None = None) -> str:
    tokens = _TOKEN.findall(text)
    for _ in range(rounds or rng.randint(1, 4)):
        if not tokens:
            tokens = [rng.choice(INJECTIONS)]
        rng.choice(_TEXT_OPS)(tokens, rng)
    return "".join(tokens)


def _pick(tokens: list[str], rng: random.Random, want) -> int | None:
    candidates = [i for i, token in enumerate(tokens) if want(token)]
    return rng.choice(candidates) if candidates else None


def _number(tokens, rng):
    i = _pick(tokens, rng, str.isdigit)
    if i is not None:
        tokens[i] = rng.choice(NUMBERS + [str(rng.randint(0, 10 ** rng.randint(1, 25)))])


def _range(tokens, rng):
    i = _pick(tokens, rng, str.isdigit)
    if i is not None:
        tokens[i] = rng.choice(RANGES)


def _separator(tokens, rng):
    i = _pick(tokens, rng, lambda t: len(t) == 1 and not t.isalnum())
    if i is not None:
        tokens[i] = rng.choice(SEPARATORS)


def _type_swap(tokens, rng):
    i = _pick(tokens, rng, lambda t: t.isdigit() or t.isalpha())
    if i is not None:
        tokens[i] = rng.choice(["abc", "NaN", "None", "true", "-", "x" * rng.randint(1, 300)]) if tokens[i].isdigit() \
            else rng.choice(NUMBERS)


def _delete(tokens, rng):
    i = rng.randrange(len(tokens))
    del tokens[i: i + rng.randint(1, 8)]


def _duplicate(tokens, rng):
    i = rng.randrange(len(tokens))
    span = tokens[i: i + rng.randint(1, 8)]
    tokens[i:i] = span * rng.randint(1, 3)


def _inject(tokens, rng):
    tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(INJECTIONS))


def _lines(tokens, rng):
    lines = "".join(tokens).split("\n")
    i = rng.randrange(len(lines))
    op = rng.randrange(4)
    if op == 0:
        del lines[i]
    elif op == 1:
        lines[i:i] = [lines[i]] * rng.randint(1, 50)
    elif op == 2:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines = lines[:i] + [lines[i][: rng.randrange(len(lines[i]) + 1)]]  # truncated output
    tokens[:] = _TOKEN.findall("\n".join(lines))


_TEXT_OPS = [_number, _number, _range, _separator, _separator, _type_swap, _delete, _duplicate, _inject, _lines]

ODD_VALUES = [None, True, False, 0, -1, 2 ** 70, 1.5, float("nan"), "", "x", "\x00", "9" * 5000, [], {}, [[[[[]]]]],
              {"error": 3}, {"a": {"b": {"c": {}}}}]


def mutate_value(value, rng: random.Random, rounds: int | None = None):
    """A mutated deep copy of a JSON-like value (dicts, lists, strings, numbers)."""
    value = copy.deepcopy(value)
    for _ in range(rounds or rng.randint(1, 3)):
        value = _mutate_somewhere(value, rng)
    return value


def _mutate_somewhere(value, rng, depth: int = 0):
    descend = 1.0 if depth < 1 else 0.8  # the top level stays what the reader returns; below it anything goes
    if isinstance(value, dict) and value and rng.random() < descend:
        key = rng.choice(list(value))
        op = rng.randrange(4)
        if op == 0 and depth > 0:
            del value[key]
        elif op == 1:
            value[rng.choice(["", "../x", "n" * 100, key + "_"])] = value[key]
        else:
            value[key] = _mutate_somewhere(value[key], rng, depth + 1)
        return value
    if isinstance(value, list) and value and rng.random() < descend:
        i = rng.randrange(len(value))
        op = rng.randrange(4)
        if op == 0:
            del value[i]
        elif op == 1:
            value[i:i] = [value[i]] * rng.randint(1, 20)
        else:
            value[i] = _mutate_somewhere(value[i], rng, depth + 1)
        return value
    if isinstance(value, str) and rng.random() < 0.6:
        return mutate_text(value, rng, 1)
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
        return rng.choice([0, -1, 2 ** 31, 2 ** 64, -(2 ** 63), 10 ** 30])
    # a copy: the shared [] and {} would otherwise be mutated in place later, and one put inside itself (a list
    # containing itself) made the mutator fail with IndexError
    replacement = copy.deepcopy(rng.choice(ODD_VALUES))
    if rng.random() < 0.1:
        for _ in range(rng.randint(10, 200)):  # deep nesting
            replacement = [replacement]
    return replacement
