"""`nodecheck fleet` at a terminal: one block per node type, each line wrapped between words at the terminal's
width (a file name or a command is never cut), untrusted names made plain."""

from __future__ import annotations

import textwrap

import typer

from nodecheck.render.table import clean, new_console


def _line(text: str, width: int) -> None:
    indent = " " * (len(text) - len(text.lstrip(" ")) + 2)
    typer.echo("\n".join(textwrap.wrap(clean(text), width, subsequent_indent=indent, break_long_words=False,
                                       break_on_hyphens=False)) or "")


def render_fleet(groups: list, skipped: list[dict], fraction: float) -> None:
    width = new_console().width

    def line(text: str) -> None:
        _line(text, width)

    for group in groups:
        line(f"{group.sku}: {len(group.nodes)} node(s)")
        if not group.judged:
            for part in (group.why or "").split("; "):  # one clause a line: each fits the width
                line(f"  {part}")
            for d in group.drift:  # a node short of its model's GPUs (fleet/__init__.py)
                line(f"  {d.node}: {d.value} {d.field}; {d.majority_nodes} of {d.nodes} nodes of this model have {d.majority}")
            continue
        for o in group.outliers:
            what = o.key.split(":", 1)[1]
            if o.key.startswith("measured:"):
                line(f"  {o.node}: {what} {o.value:.2f} of spec, peers' median {o.median:.2f}"
                      f" ({o.ratio:.2f}x" + (f", z {o.z:.1f})" if o.z is not None else ")"))
            else:
                line(f"  {o.node}: {what} {o.value:g}, peers' median {o.median:g}")
        for d in group.drift:
            line(f"  {d.node}: {d.field} {d.value or '(none)'}; {d.majority_nodes} of {d.nodes} nodes run {d.majority or '(none)'}")
            for difference in d.differs:
                line(f"    {difference}")
        if not group.outliers and not group.drift:
            line(f"  every node in line with its peers (measurements within {fraction:g} of the median, same fingerprint)")
    for entry in skipped:
        line(f"skipped {entry['file']}: {entry['why']}")
