"""The layers of DESIGN.md, read from the tree: src/nodecheck's folders are the layers, and imports run only
downwards, host -> probes -> Report -> assemble -> checks -> verdicts -> services -> faces. An import (at the top of
a module or inside a function) may reach its own layer or a lower one; services and faces reach other packages of
their layer only through the CLI, which wires everything; and no module imports in a circle. A new module in an
existing package never edits this file."""

import ast
from pathlib import Path

from helpers import REPO

SOURCE = REPO / "src"

# lowest first: package prefixes
LAYERS = [
    ("core", ["nodecheck", "nodecheck.core"]),
    ("report", ["nodecheck.report"]),
    ("host", ["nodecheck.host"]),
    ("probes", ["nodecheck.probes"]),
    ("config", ["nodecheck.config"]),
    ("assemble", ["nodecheck.assemble"]),
    ("checks", ["nodecheck.checks"]),
    ("verdicts", ["nodecheck.verdicts"]),
    ("pipeline", ["nodecheck.pipeline"]),
    ("services", ["nodecheck.bench", "nodecheck.fleet", "nodecheck.job", "nodecheck.scale"]),
    ("faces", ["nodecheck.render", "nodecheck.prometheus", "nodecheck.kubernetes", "nodecheck.slurm", "nodecheck.cli",
               "nodecheck.__main__"]),
]
ISOLATED = ("services", "faces")  # their packages import each other only through the CLI
WIRING = ("nodecheck.cli", "nodecheck.__main__")


def modules() -> dict[str, Path]:
    out = {}
    for path in (SOURCE / "nodecheck").rglob("*.py"):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def layer_of(module: str) -> tuple[int, str]:
    """(rank, the prefix it matched): the longest prefix naming the module or a package above it. The bare
    `nodecheck` matches only itself (its __version__)."""
    best = None
    for rank, (_, names) in enumerate(LAYERS):
        for name in names:
            matches = module == name or (name != "nodecheck" and module.startswith(name + "."))
            if matches and (best is None or len(name) > len(best[1])):
                best = (rank, name)
    assert best is not None, f"{module} is in no layer: put it in a package of DESIGN.md's layers"
    return best


def imports(path: Path, known: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("nodecheck")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nodecheck"):
            for alias in node.names:  # `from nodecheck.core import specs` imports the module nodecheck.core.specs
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found


def wiring(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in WIRING)


def arrows_that_run_up(known: dict[str, Path] | None = None) -> list[str]:
    known = known or modules()
    wrong = []
    for module, path in sorted(known.items()):
        rank, entry = layer_of(module)
        for target in sorted(imports(path, set(known))):
            target_rank, target_entry = layer_of(target)
            if target_rank > rank:
                wrong.append(f"{module} ({LAYERS[rank][0]}) imports {target} ({LAYERS[target_rank][0]})")
            elif (target_rank == rank and LAYERS[rank][0] in ISOLATED and not wiring(module)
                  and entry != target_entry):
                wrong.append(f"{module} imports {target}: {LAYERS[rank][0]} do not import each other")
    return wrong


def circles(known: dict[str, Path] | None = None) -> list[list[str]]:
    """Every set of modules that import each other round (Tarjan's strongly connected components), imports
    inside functions counted: a circle closed by a late import is a circle still."""
    known = known or modules()
    graph = {m: imports(p, set(known)) - {m} for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_runs_up_the_layers():
    assert arrows_that_run_up() == []


# what the checks show outside: the registry (nodecheck.checks) and the declarations (checks.base)
READERS_OF_THE_REGISTRY = ("nodecheck.render", "nodecheck.prometheus", "nodecheck.kubernetes", "nodecheck.fleet",
                           "nodecheck.bench", "nodecheck.scale")


def judges_read_by_faces(known: dict[str, Path] | None = None) -> list[str]:
    """Faces and services read the Report, assemble and the checks' registry, never a check family's internals
    (the CLI wires the commands that run a family's judge; the prolog runs its own checks)."""
    known = known or modules()
    wrong = []
    for module, path in sorted(known.items()):
        if not module.startswith(READERS_OF_THE_REGISTRY):
            continue
        for target in sorted(imports(path, set(known))):
            if target.startswith("nodecheck.checks.") and target != "nodecheck.checks.base":
                wrong.append(f"{module} imports {target}")
    return wrong


def test_faces_read_the_registry_not_a_judge():
    assert judges_read_by_faces() == []


def test_no_module_imports_in_a_circle():
    assert circles() == []


def test_the_layer_test_sees_an_arrow_that_runs_up(tmp_path):
    """A Report module that imported a probe (as model.py once imported Nic from probes/nics.py) is caught."""
    real = modules()
    planted = tmp_path / "model.py"
    planted.write_text(real["nodecheck.report.model"].read_text() + "\nfrom nodecheck.probes.nics import collect\n")
    assert arrows_that_run_up(dict(real, **{"nodecheck.report.model": planted})) == [
        "nodecheck.report.model (report) imports nodecheck.probes.nics (probes)"]


def test_the_layer_test_sees_a_face_importing_another(tmp_path):
    real = modules()
    planted = tmp_path / "prolog.py"
    planted.write_text(real["nodecheck.slurm.prolog"].read_text() + "\n\ndef f():\n    from nodecheck.render.table import clean\n")
    assert arrows_that_run_up(dict(real, **{"nodecheck.slurm.prolog": planted})) == [
        "nodecheck.slurm.prolog imports nodecheck.render.table: faces do not import each other"]


def test_the_layer_test_sees_a_circle_closed_inside_a_function(tmp_path):
    """bench/plan.py once imported bench/distributed.py inside run(), which imported plan at its top."""
    real = modules()
    planted = tmp_path / "common.py"
    planted.write_text(real["nodecheck.bench.common"].read_text() + "\n\ndef f():\n    from nodecheck.bench import plan\n")
    found = circles(dict(real, **{"nodecheck.bench.common": planted}))
    assert found and all("nodecheck.bench.common" in c and "nodecheck.bench.plan" in c for c in found)


def test_no_source_module_is_over_400_lines():
    """Past that, a module holds more than one idea: split it by command family or by source."""
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def test_every_package_is_installed():
    """pyproject.toml finds the packages under src/: a folder of modules without an __init__.py works in the
    editable checkout and is absent from a real install (the container's `nodecheck -V` failed so once)."""
    folders = {p.parent for p in (SOURCE / "nodecheck").rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(f.relative_to(SOURCE)) for f in folders if not (f / "__init__.py").is_file()) == []
    data = {p.relative_to(SOURCE).as_posix() for p in (SOURCE / "nodecheck").rglob("*.toml")}
    assert data and all(d.startswith("nodecheck/core/data/") for d in data)  # package-data: "nodecheck.core" = data/*.toml
