"""A whole snapshot, a few of its files mutated: what `inspect --from SNAPSHOT` does with it, every probe, the rules,
the drain reason, `config init`'s config, the text, the JSON and the metrics. Seeded from the snapshots this project took on real nodes
(tests/fixtures: the lent H100 twice, the CI kind of VM) and the shipped HGX example (examples/README.md). A snapshot
is untrusted input: nothing may escape but the clear refusal of a snapshot whose replay documents are broken, and no
probe may end in an "internal error" (run_probe's record of a probe's own bug)."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

from fuzz.mutate import mutate_text, mutate_value

TESTS = Path(__file__).resolve().parent.parent
# the lent H100 twice and the CI kind of VM, and the shipped 8-GPU HGX example (an NDR node's InfiniBand ports)
SNAPSHOTS = (TESTS / "fixtures/h100-vm-signals", TESTS / "fixtures/h100-vm-1gpu", TESTS / "fixtures/cpu-vm-2core",
             TESTS.parent / "examples/hgx-h100-8gpu")
REPLAY_DOCUMENTS = {"sources.json", "fs-links.json", "fs-dirs.json"}  # broken, no replay: a clear NodecheckError
MAX_FILE = 400_000


class Refused(Exception):
    """The snapshot was refused as a whole, saying why (its replay documents were mutated)."""


def snapshot_seeds() -> list[dict[str, str]]:
    """Each snapshot as {relative path: text}, less what the capture keeps beside it (live-*)."""
    seeds = []
    for root in SNAPSHOTS:
        files = {str(f.relative_to(root)): f.read_text(errors="surrogateescape") for f in sorted(root.rglob("*"))
                 if f.is_file() and not f.name.startswith("live-") and f.stat().st_size <= MAX_FILE}
        if files:
            seeds.append(files)
    return seeds


def mutate_snapshot(seed: dict[str, str], rng) -> dict:
    """One to three of its files mutated as a broken tool or an attacker would (tests/fuzz/mutate.py): a JSON
    document as text, or half the time as values (valid JSON of the wrong content, which its reader must catch)."""
    names = rng.sample(sorted(seed), k=min(len(seed), rng.randint(1, 3)))
    return {"files": {**seed, **{name: _mutated(name, seed[name], rng) for name in names}}, "mutated": names}


def _mutated(name: str, text: str, rng) -> str:
    if name.endswith(".json") and rng.random() < 0.5:
        try:
            return json.dumps(mutate_value(json.loads(text), rng))
        except (ValueError, RecursionError):
            pass
    return mutate_text(text, rng)


def replayed(document: dict) -> str:
    """Build the Report from the mutated snapshot and show it every way nodecheck does."""
    from rich.console import Console

    from nodecheck.config import loads
    from nodecheck.config.init import generate
    from nodecheck.core.errors import NodecheckError
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report
    from nodecheck.prometheus.exposition import exposition
    from nodecheck.render.report import render
    from nodecheck.report.model import Report
    from nodecheck.slurm.prolog import drain_reason, failing_findings
    from nodecheck.slurm.scontrol import MAX_REASON

    with tempfile.TemporaryDirectory(prefix="nodecheck-fuzz-") as folder:
        for name, text in document["files"].items():
            path = Path(folder) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, errors="surrogateescape")
        try:
            report = build_report(SnapshotHost(Path(folder)))
        except NodecheckError as error:
            if set(document["mutated"]) & REPLAY_DOCUMENTS:
                raise Refused(str(error)) from None
            raise
    bugs = [p.error for p in report.probes if p.error and p.error.startswith("internal error")]
    if bugs:
        raise AssertionError(f"a probe's own bug on a mutated snapshot: {bugs[0]}")
    reason = drain_reason(failing_findings(report.findings, "info"))  # what the prolog would hand scontrol
    if len(reason) > MAX_REASON or not reason.isprintable():
        raise AssertionError(f"a drain reason Slurm cannot keep on one line: {reason!r}")
    loads(generate(report), "init.toml")  # `config init` on this node writes a config nodecheck reads back
    out = io.StringIO()
    render(report, Console(file=out, width=160))
    exposition(report)
    Report.from_dict(json.loads(json.dumps(report.to_dict())))
    return out.getvalue()
