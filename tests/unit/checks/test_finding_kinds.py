"""One registry of finding kinds: the checks' declarations (src/nodecheck/checks/), listed once in
checks/__init__.py. Every kind the code raises is declared, each kind has one home, every table derives from the
declarations, and docs/checks.md is the page they write. Regenerate the page on purpose:
    NODECHECK_REGENERATE_DOCS=1 .venv/bin/python -m pytest tests/unit/checks/test_finding_kinds.py"""

import ast
import importlib
import os
import pkgutil

from helpers import REPO

import nodecheck.checks as registry
from nodecheck.checks import AREAS, CHECKS, FINDING_KINDS, KINDS
from nodecheck.checks.base import Check, Kind
from nodecheck.probes import PROBES

PAGE = REPO / "docs" / "checks.md"


def raised_kinds() -> dict[str, str]:
    """kind -> where, for every Finding("kind", ...) written in the code."""
    found = {}
    for path in (REPO / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                found[node.args[0].value] = f"{path.relative_to(REPO)}:{node.lineno}"
    return found


def declared() -> tuple[list[Kind], list[Check]]:
    """Every Kind and Check a module of nodecheck.checks holds."""
    kinds, checks = [], []
    for info in pkgutil.iter_modules(registry.__path__):
        module = importlib.import_module(f"nodecheck.checks.{info.name}")
        kinds += [v for v in vars(module).values() if isinstance(v, Kind)]
        checks += [v for v in vars(module).values() if isinstance(v, Check)]
    return kinds, checks


def test_every_raised_kind_is_declared():
    raised = raised_kinds()
    assert len(raised) >= 60  # the scan sees the checks
    assert {kind: where for kind, where in raised.items() if kind not in FINDING_KINDS} == {}


def test_every_kind_has_one_home_and_every_declaration_is_listed():
    """A kind is in one check; a Kind or a Check a module declares but the registry does not list is caught (it
    would raise findings no table knows)."""
    listed = [kind.name for check in CHECKS for kind in check.kinds]
    assert len(listed) == len(set(listed)) == len(KINDS)
    kinds, checks = declared()
    assert {k.name for k in kinds} == set(KINDS)
    assert all(any(c is listed for listed in CHECKS) for c in checks)


def test_every_check_reads_a_probe_that_exists_and_is_made_somewhere():
    probes = {p.name for p in PROBES}
    for check in CHECKS:
        assert check.needs is None or check.needs in probes, check
        assert (check.judge is None) == (check.made_by is not None), check


def test_the_tables_derive_from_the_declarations():
    assert sorted(kind for kinds in AREAS.values() for kind in kinds) == sorted(KINDS)  # each kind in one area
    assert set(registry.CLEARABLE) == {"gpu_xid", "nvswitch_sxid", "pcie_aer_fatal", "nic_module_error", "nic_slot_power"}
    assert set(registry.TEMPERED) <= set(registry.SIGNALS)
    assert registry.ESCALATED == ("pcie_replays",)


def test_every_drain_template_formats():
    for kind, template in FINDING_KINDS.items():
        text = template.format(subject="gpu3", measured="x8", expected="x16", head="h2d on gpu0:host")
        assert text and "{" not in text, kind


def test_every_kind_is_documented():
    for kind in KINDS.values():
        assert kind.doc and all(severity and when for severity, when in kind.doc), kind.name


def test_the_checks_page_is_fresh():
    from nodecheck.checks.page import checks_page

    page = checks_page()
    if os.environ.get("NODECHECK_REGENERATE_DOCS"):
        PAGE.write_text(page)
    assert PAGE.read_text() == page, "docs/checks.md is stale: regenerate it (this module's docstring says how)"
    assert all(f"| `{kind}`" in page for kind in KINDS)
