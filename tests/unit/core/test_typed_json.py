"""The typed reader (src/nodecheck/core/typed_json.py) on small dataclasses of every shape it meets: each class is
read by a function written once from its fields, so what the loop it replaced did is pinned here field kind by
field kind (a Report's own shapes are pinned by tests/unit/report/test_report_from_dict.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import pytest

from nodecheck.core.typed_json import ESSENTIAL, record


@dataclass
class Port:
    name: str = field(metadata=ESSENTIAL)
    speed: float | None = None
    up: bool | None = None


@dataclass
class Card:
    index: int = field(metadata=ESSENTIAL)
    required: list[int]  # no default: a missing one reads as its empty value
    ports: list[Port] = field(default_factory=list)
    counters: dict[str, int] | None = None
    label: str = "none"
    extra: object = None
    tail: int = field(default=7, kw_only=True)
    derived: int = field(default=0, init=False)


class Level(enum.IntEnum):
    HIGH = 2


def test_each_field_reads_by_its_type_and_a_missing_one_takes_its_default():
    card = record(Card, {"index": 3, "ports": [{"name": "p0", "speed": 100, "up": True}], "counters": {"a": 1},
                         "extra": {"any": [1]}, "tail": 9, "derived": 5, "unknown": 1})
    assert card == Card(3, [], [Port("p0", 100, True)], {"a": 1}, "none", {"any": [1]}, tail=9)
    assert card.derived == 0  # not an __init__ field: never read
    assert record(Card, {"index": 0}) == Card(0, [], [], None, "none", None, tail=7)


@pytest.mark.parametrize(("raw", "error"), [
    ({}, "Card.index: missing"),
    ({"index": True}, "Card.index: expected int, got bool"),  # JSON's true is no index
    ({"index": 1.5}, "Card.index: expected int, got float"),
    ({"index": 1, "ports": [{"speed": 1}]}, "Port.name: missing"),
    ({"index": 1, "ports": [{"name": "p", "up": 1}]}, "Port.up: expected bool, got int"),
    ({"index": 1, "counters": {"a": "x"}}, "Card.counters: expected int, got str"),
    ({"index": 1, "required": [1, "2"]}, "Card.required: expected int, got str"),
    ([], "Card: expected an object, got list"),
])
def test_a_value_of_the_wrong_shape_is_refused_naming_its_field(raw, error):
    with pytest.raises(ValueError, match=error):
        record(Card, raw)


def test_an_int_where_a_float_is_asked_and_an_ints_subclass_where_an_int_is_are_taken():
    assert record(Port, {"name": "p", "speed": 25}).speed == 25
    assert record(Card, {"index": Level.HIGH}).index == 2


def test_a_lenient_field_of_the_wrong_shape_is_dropped_as_if_absent():
    assert record(Card, {"index": 1, "label": 5}, frozenset({(Card, "label")})).label == "none"
    assert record(Card, {"index": 1, "required": "x"}, frozenset({(Card, "required")})).required == []
    with pytest.raises(ValueError, match="Card.index: missing"):  # an essential one is still missing
        record(Card, {"index": "x"}, frozenset({(Card, "index")}))
