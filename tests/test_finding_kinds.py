"""One registry of finding kinds (nodecheck.report.model.FINDING_KINDS): every kind the code raises is in it,
docs/report-schema.md lists exactly its kinds, and each has a drain-reason template that formats."""

import ast
import re

from helpers import REPO

from nodecheck.report.findings import FINDING_KINDS


def raised_kinds() -> dict[str, str]:
    """kind -> where, for every Finding("kind", ...) written in the code."""
    found = {}
    for folder in ("src",):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    found[node.args[0].value] = f"{path.relative_to(REPO)}:{node.lineno}"
    return found


def test_every_raised_kind_is_registered():
    raised = raised_kinds()
    assert len(raised) >= 15  # the scan sees the rules
    assert {kind: where for kind, where in raised.items() if kind not in FINDING_KINDS} == {}


def test_the_docs_list_the_registered_kinds():
    text = (REPO / "docs" / "report-schema.md").read_text()
    table = text.split("| kind | severity | when |", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", table, re.M))
    assert documented == set(FINDING_KINDS)


def test_every_drain_template_formats():
    for kind, template in FINDING_KINDS.items():
        text = template.format(subject="gpu3", measured="x8", expected="x16", head="h2d on gpu0:host")
        assert text and "{" not in text, kind


def test_every_kind_has_one_home():
    """A kind is raised by one rule of rules.RULES (whose row names the probe it reads), by the judging of
    measurements or NCCL runs, or by the prolog: the exporter's check_healthy/check_unknown follow from it."""
    from nodecheck.checks.coverage import FROM_NCCL, MEASURED, PROLOG_ONLY
    from nodecheck.checks.rules import RULES

    homes = [kind for rule in RULES for kind in rule.kinds] + [*MEASURED, *FROM_NCCL, *PROLOG_ONLY]
    assert sorted(homes) == sorted(FINDING_KINDS)
