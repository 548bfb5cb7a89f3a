"""The layers of DESIGN.md, stated once and enforced: data flows one way, host -> probes -> Report ->
rules -> faces. An import (at the top of a module or inside a function) may reach its own layer or a
lower one; services and faces reach other modules of their layer only inside their own package, except
the CLI, which wires everything."""

import ast
from pathlib import Path

from helpers import REPO

PACKAGES = {"agent": "nodecheck", "probes": "nodecheck.probes", "exporters": "nodecheck.exporters"}

# lowest first
LAYERS = [
    ("bottom", ["nodecheck", "nodecheck.errors", "nodecheck.units", "nodecheck.limits", "nodecheck.specs",
                "nodecheck.pairing", "nodecheck.pci", "nodecheck.link_types", "nodecheck.ifnames", "nodecheck.xid_catalog", "nodecheck.shipped"]),
    ("model", ["nodecheck.model", "nodecheck.model_gpu", "nodecheck.findings", "nodecheck.events", "nodecheck.typed_json"]),
    ("host", ["nodecheck.host", "nodecheck.commands", "nodecheck.network", "nodecheck.files", "nodecheck.process_tree", "nodecheck.log_file", "nodecheck.http_call", "nodecheck.netif", "nodecheck.snapshot", "nodecheck.state"]),
    ("probes", ["nodecheck.probes"]),
    ("assembly", ["nodecheck.config", "nodecheck.config_init", "nodecheck.rails", "nodecheck.build", "nodecheck.paths", "nodecheck.pipeline", "nodecheck.log_memory", "nodecheck.rules", "nodecheck.nvlink_rules", "nodecheck.rail_rules", "nodecheck.pcie_rules", "nodecheck.nccl_conf_rules", "nodecheck.roce_rules", "nodecheck.roce_gid", "nodecheck.signal_rules", "nodecheck.nic_event_rules", "nodecheck.error_rules", "nodecheck.gpu_error_rules", "nodecheck.gpu_process_rules", "nodecheck.compute_mode_rules", "nodecheck.gpu_presence", "nodecheck.fabric_rules", "nodecheck.imex_rules", "nodecheck.signal_join", "nodecheck.fingerprint", "nodecheck.verdicts", "nodecheck.nccl_run", "nodecheck.advice",
                  "nodecheck.coverage", "nodecheck.config_check", "nodecheck.npd"]),
    ("services", ["nodecheck.bench", "nodecheck.proximity", "nodecheck.slurm", "nodecheck.scale", "nodecheck.fleet"]),
    ("faces", ["nodecheck.render", "nodecheck.exporters", "nodecheck.prolog", "nodecheck.cli", "nodecheck.__main__"]),
]
ISOLATED = ("services", "faces")  # their modules import each other only within one package
WIRING = ("nodecheck.cli", "nodecheck.__main__")


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def layer_of(module: str) -> tuple[int, str]:
    """(rank, the entry it matched): the most specific entry naming the module or a package above it."""
    best = None
    for rank, (_, names) in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > len(best[1]):
                    best = (rank, name)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def imports(path: Path, known: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("nodecheck")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nodecheck"):
            for alias in node.names:  # `from nodecheck import specs` imports the module nodecheck.specs
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found


def wiring(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in WIRING)


def package_of(entry: str, module: str) -> str:
    """The package a service or face module belongs to: its entry when that is a package, else itself."""
    return entry if module != entry else module


def arrows_that_run_up() -> list[str]:
    known = modules()
    wrong = []
    for module, path in sorted(known.items()):
        rank, entry = layer_of(module)
        for target in sorted(imports(path, set(known))):
            target_rank, target_entry = layer_of(target)
            if target_rank > rank:
                wrong.append(f"{module} ({LAYERS[rank][0]}) imports {target} ({LAYERS[target_rank][0]})")
            elif (target_rank == rank and LAYERS[rank][0] in ISOLATED and not wiring(module)
                  and package_of(entry, module) != package_of(target_entry, target)):
                wrong.append(f"{module} imports {target}: {LAYERS[rank][0]} do not import each other")
    return wrong


def test_no_import_runs_up_the_layers():
    assert arrows_that_run_up() == []


def test_the_layer_test_sees_an_arrow_that_runs_up(tmp_path, monkeypatch):
    """A model that imported a probe (as model.py once imported Nic from probes/nics.py) is caught."""
    real = modules()
    planted = tmp_path / "model.py"
    planted.write_text(real["nodecheck.model"].read_text() + "\nfrom nodecheck.probes.nics import collect\n")
    monkeypatch.setattr(__import__(__name__), "modules", lambda: dict(real, **{"nodecheck.model": planted}))
    assert arrows_that_run_up() == ["nodecheck.model (model) imports nodecheck.probes.nics (probes)"]


def test_no_source_module_is_over_400_lines():
    """Past that, a module holds more than one idea: split it by command family or by source."""
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def test_every_package_is_installed():
    """A package missing from pyproject.toml works in the editable checkout and is absent from a real
    install (the container's `nodecheck -V` failed so when cli and render became packages)."""
    import tomllib

    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert on_disk == declared
