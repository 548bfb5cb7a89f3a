"""The README is a front door and docs/ holds the detail: the README fits in 10 KiB and opens with the two commands
for a fresh machine; every command the CLI has is in the README's table and in docs/commands.md; every relative
link resolves; the pages speak of the product, not of how it was built."""

import re

from helpers import REPO

import nodecheck.cli  # noqa: F401  (registers every command on the app)
from nodecheck.cli.app import app

README = REPO / "README.md"
PAGES = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]


def commands() -> list[str]:
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    return names + [f"{g.name} {c.name or c.callback.__name__}" for g in app.registered_groups
                    for c in g.typer_instance.registered_commands]


def test_the_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.encode()) <= 10 * 1024
    head = text.splitlines()[:25]
    assert any("deploy/install.sh" in line and "nodecheck inspect" in line for line in head)
    assert any(line.strip() == "bash tests/run.sh" for line in head)


def test_every_command_is_in_the_readme_and_in_the_commands_page():
    table = [line for line in README.read_text().splitlines() if line.startswith("| `nodecheck ")]
    page = (REPO / "docs" / "commands.md").read_text()
    assert len(commands()) >= 13
    for name in commands():
        assert any(f"nodecheck {name}" in row or f"`{name.split()[-1]}" in row for row in table), name
        assert f"nodecheck {name}" in page, name
    assert all(len(row.split(" | ")[1].split()) <= 16 for row in table)  # one short line each


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == []


def test_the_pages_speak_of_the_product_not_its_history():
    said = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"\b[Ss]ession \d|\b[Ii]ssue \d+'s|\(issue \d|\bitems? \d+ (?:to|and) \d", line):
                said.append(f"{page.relative_to(REPO)}:{n}: {line[:80]}")
    assert said == []
