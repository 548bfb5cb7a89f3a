"""Snapshots: every raw source a probe read, saved so `inspect --from` replays it through the
same probes. Layout of a snapshot directory (or the same inside OUT.tar.gz):

    nvidia-smi-topo-m.txt, lstopo.xml, ...   command outputs, named by source
    nvml.json                                 raw NVML values (probes.nvml.dump_nvml)
    addresses.json                            interface addresses
    identity.json                             host, kernel, nodecheck version, when
    sources.json                              per source: argv and outcome (a failure replays as one)
    fs/sys/..., fs/proc/...                   the files read, as a tree
    fs-links.json, fs-dirs.json               symlink targets and directory listings read

A snapshot may hold only some sources: the rest replay as "no data".
"""

from __future__ import annotations

import json
import tarfile
import tempfile
import time
from pathlib import Path

from nodecheck.errors import NoData, NodecheckError, ProbeFailed, TimedOut
from nodecheck.host import Host

_FAILURES = {"no_data": NoData, "failed": ProbeFailed, "timed_out": TimedOut}


class RecordingHost:
    """Wraps a host and keeps everything read through it, to write as a snapshot."""

    def __init__(self, inner: Host) -> None:
        self.inner = inner
        self.label = inner.label
        self.files: dict[str, str] = {}
        self.links: dict[str, str] = {}
        self.dirs: dict[str, list[str]] = {}
        self.outputs: dict[str, str] = {}
        self.sources: dict[str, dict] = {}
        self.documents: dict[str, object] = {}

    def _record(self, source: str, argv: list[str] | None, read):
        entry: dict = {"argv": argv} if argv else {}
        try:
            value = read()
        except (NoData, ProbeFailed) as error:
            outcome = "no_data" if isinstance(error, NoData) else "timed_out" if isinstance(error, TimedOut) else "failed"
            entry.update(outcome=outcome, error=str(error))
            self.sources[source] = entry
            raise
        entry["outcome"] = "ok"
        self.sources[source] = entry
        return value

    def command(self, source: str, argv: list[str], timeout: float) -> str:
        text = self._record(source, argv, lambda: self.inner.command(source, argv, timeout))
        self.outputs[source] = text
        return text

    def read_text(self, path: str) -> str | None:
        text = self.inner.read_text(path)
        if text is not None:
            self.files[path] = text
        return text

    def read_link(self, path: str) -> str | None:
        target = self.inner.read_link(path)
        if target is not None:
            self.links[path] = target
        return target

    def list_dir(self, path: str) -> list[str]:
        names = self.inner.list_dir(path)
        self.dirs[path] = names
        return names

    def nvml(self, timeout: float) -> dict:
        return self._document("nvml.json", lambda: self.inner.nvml(timeout))

    def addresses(self) -> dict[str, list[dict]]:
        return self._document("addresses.json", self.inner.addresses)

    def identity(self) -> dict:
        return self._document("identity.json", self.inner.identity)

    def _document(self, source: str, read):
        value = self._record(source, None, read)
        self.documents[source] = value
        return value

    def write(self, out: Path) -> Path:
        """Write the snapshot to directory `out`, or to a tarball when out ends in .tar.gz."""
        if str(out).endswith(".tar.gz"):
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp) / out.name[: -len(".tar.gz")]
                self._write_dir(root)
                with tarfile.open(out, "w:gz") as tar:
                    tar.add(root, arcname=root.name)
            return out
        self._write_dir(out)
        return out

    def _write_dir(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        for source, text in self.outputs.items():
            (root / source).write_text(text)
        identity = dict(self.documents.get("identity.json", {}), snapshot_taken_at=time.time())
        documents = dict(self.documents, **{"identity.json": identity})
        for source, value in documents.items():
            (root / source).write_text(json.dumps(value, indent=1, sort_keys=True))
        for path, text in self.files.items():
            target = root / "fs" / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        (root / "fs-links.json").write_text(json.dumps(self.links, indent=1, sort_keys=True))
        (root / "fs-dirs.json").write_text(json.dumps(self.dirs, indent=1, sort_keys=True))
        (root / "sources.json").write_text(json.dumps(self.sources, indent=1, sort_keys=True))


class SnapshotHost:
    """Replays a snapshot directory. Sources it does not hold are 'no data'."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.label = f"snapshot:{root}"
        self.sources = self._json("sources.json") or {}
        self.links = self._json("fs-links.json") or {}
        self.dirs = self._json("fs-dirs.json") or {}

    def _json(self, name: str):
        path = self.root / name
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError as error:
            raise NodecheckError(f"{path}: not valid JSON ({error})") from None

    def _replay_failure(self, source: str) -> None:
        entry = self.sources.get(source, {})
        if entry.get("outcome") in _FAILURES:
            raise _FAILURES[entry["outcome"]](f"{entry.get('error', 'failed')} (replayed from snapshot)")
        raise NoData(f"{source} is not in the snapshot")

    def command(self, source: str, argv: list[str], timeout: float) -> str:
        path = self.root / source
        if path.is_file():
            return path.read_text(errors="replace")
        self._replay_failure(source)

    def read_text(self, path: str) -> str | None:
        file = self.root / "fs" / path.lstrip("/")
        return file.read_text(errors="replace") if file.is_file() else None

    def read_link(self, path: str) -> str | None:
        return self.links.get(path)

    def list_dir(self, path: str) -> list[str]:
        if path in self.dirs:
            return list(self.dirs[path])
        directory = self.root / "fs" / path.lstrip("/")
        return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []

    def nvml(self, timeout: float) -> dict:
        return self._document("nvml.json")

    def addresses(self) -> dict[str, list[dict]]:
        try:
            return self._document("addresses.json")
        except NoData:
            return {}

    def identity(self) -> dict:
        try:
            return self._document("identity.json")
        except NoData:
            return {}

    def _document(self, source: str):
        value = self._json(source)
        if value is None:
            self._replay_failure(source)
        return value


def open_snapshot(path: Path, workdir: Path) -> SnapshotHost:
    """A SnapshotHost for a directory or a .tar.gz (extracted under workdir, regular files only)."""
    if path.is_dir():
        return SnapshotHost(path)
    if not path.is_file():
        raise NodecheckError(f"snapshot {path} does not exist")
    try:
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and _safe(m.name)]
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(workdir, members=members, **safe)
    except (tarfile.TarError, OSError) as error:
        raise NodecheckError(f"snapshot {path}: cannot read it as a tarball ({error})") from None
    tops = {Path(m.name).parts[0] for m in members}
    top = workdir / tops.pop() if len(tops) == 1 else workdir
    return SnapshotHost(top if top.is_dir() else workdir)


def _safe(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts
