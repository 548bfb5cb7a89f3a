"""`nodecheck fleet` at a terminal: one block per node type, each line at most 80 columns."""

from __future__ import annotations

import typer

WIDTH = 80


def _line(text: str) -> None:
    typer.echo(text if len(text) <= WIDTH else text[: WIDTH - 3] + "...")


def render_fleet(groups: list, skipped: list[dict], fraction: float) -> None:
    for group in groups:
        _line(f"{group.sku}: {len(group.nodes)} node(s)")
        if not group.judged:
            for part in (group.why or "").split("; "):  # one clause a line: each fits the width
                _line(f"  {part}")
            for d in group.drift:  # a node short of its model's GPUs (agent/fleet)
                _line(f"  {d.node}: {d.value} {d.field}; {d.majority_nodes} of {d.nodes} nodes of this model have {d.majority}")
            continue
        for o in group.outliers:
            what = o.key.split(":", 1)[1]
            if o.key.startswith("measured:"):
                _line(f"  {o.node}: {what} {o.value:.2f} of spec, peers' median {o.median:.2f}"
                      f" ({o.ratio:.2f}x" + (f", z {o.z:.1f})" if o.z is not None else ")"))
            else:
                _line(f"  {o.node}: {what} {o.value:g}, peers' median {o.median:g}")
        for d in group.drift:
            _line(f"  {d.node}: {d.field} {d.value or '(none)'}; {d.majority_nodes} of {d.nodes} nodes run {d.majority or '(none)'}")
            for difference in d.differs:
                _line(f"    {difference}")
        if not group.outliers and not group.drift:
            _line(f"  every node in line with its peers (measurements within {fraction:g} of the median, same fingerprint)")
    for entry in skipped:
        _line(f"skipped {entry['file']}: {entry['why']}")
