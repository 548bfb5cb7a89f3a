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

import itertools
import json
import os
import tarfile
import tempfile
import time
import zlib
from pathlib import Path, PurePosixPath

from nodecheck.core import typed_json
from nodecheck.core.errors import NoData, NodecheckError, NotRecorded, ProbeFailed, TimedOut
from nodecheck.core.limits import (
    MAX_COMMAND_OUTPUT,
    MAX_CONF_FILE,
    MAX_DIR_ENTRIES,
    MAX_JSON_DOCUMENT,
    MAX_SNAPSHOT_BYTES,
    MAX_SNAPSHOT_MEMBERS,
    MAX_SYSFS_FILE,
    READ_HEAD,
)
from nodecheck.host.commands import stop_at_deadline
from nodecheck.host.files import atomic_file, open_beneath, read_fd
from nodecheck.host.live import Host
from nodecheck.host.log_file import starts_compressed

KMSG = "kmsg.txt"  # the /dev/kmsg records read, as they were
_FAILURES = {"no_data": NoData, "failed": ProbeFailed, "timed_out": TimedOut}


PEERS_NOT_IN_SNAPSHOT = "a snapshot holds this node only: other nodes are not reached when replaying one"


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

    def history(self) -> dict:
        return self._document("state.json", self.inner.history)

    def remember(self, sample, min_interval_s: float, log=None) -> str | None:
        return self.inner.remember(sample, min_interval_s, log)

    def kernel_messages(self, timeout: float) -> str:
        text = self._record(KMSG, None, lambda: self.inner.kernel_messages(timeout))
        self.outputs[KMSG] = text
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

    def nvml(self, timeout: float, dump) -> dict:
        return self._document("nvml.json", lambda: self.inner.nvml(timeout, dump))

    def addresses(self) -> dict[str, list[dict]]:
        return self._document("addresses.json", self.inner.addresses)

    def resolve(self, name: str, port: int, timeout: float) -> str:  # other nodes are not this node's record
        return self.inner.resolve(name, port, timeout)

    def route(self, address: str, interface: str | None, timeout: float):
        return self.inner.route(address, interface, timeout)

    def connect_rtt_ms(self, address: str, port: int, timeout: float) -> float:
        return self.inner.connect_rtt_ms(address, port, timeout)

    def identity(self) -> dict:
        return self._document("identity.json", self.inner.identity)

    def _document(self, source: str, read):
        value = self._record(source, None, read)
        self.documents[source] = value
        return value

    def write(self, out: Path) -> Path:
        """Write the snapshot to directory `out`, or to a tarball when out ends in .tar.gz."""
        if out.is_symlink():
            raise NodecheckError(f"{out} is a symbolic link: refusing to write through it")
        if str(out).endswith(".tar.gz"):
            # built beside out and renamed over it: never half a tarball, never through a link at out
            with tempfile.TemporaryDirectory() as tmp, atomic_file(out, 0o600) as part:
                root = Path(tmp) / out.name[: -len(".tar.gz")]
                self._write_dir(root)
                with tarfile.open(fileobj=part, mode="w:gz") as tar:
                    tar.add(root, arcname=root.name)
            return out
        self._write_dir(out)
        return out

    def _write_dir(self, root: Path) -> None:
        root.mkdir(exist_ok=True)  # its parent must exist: a typo in a path creates no tree of directories
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
    """Replays a snapshot directory. Sources it does not hold are 'no data'.

    A snapshot is untrusted input (it comes with support tickets, and nodecheck often runs as root):
    every read stays inside the snapshot's root (a symbolic link out of it, or a `..` in a name it
    lists, is refused), reads only regular files, and is bounded in size; every JSON document is
    checked for its shape before use."""

    def __init__(self, root: Path, label: str | None = None) -> None:
        self.root = Path(os.path.realpath(root))
        self.label = label or f"snapshot:{root}"
        self.sources = self._json("sources.json", _sources_shape) or {}
        self.links = self._json("fs-links.json", _links_shape) or {}
        self.dirs = self._json("fs-dirs.json", _dirs_shape) or {}

    def _open(self, relative: str, directory: bool = False) -> int | None:
        """A descriptor for root/relative, opened beneath the root's (files.open_beneath: no link swapped in
        between a check and the open leads out); ProbeFailed when the path or a link on it leaves the root."""
        if ".." in PurePosixPath(relative).parts:
            raise ProbeFailed(f"snapshot: {relative[:120]!r} climbs out of the snapshot with '..': refused")
        try:
            return open_beneath(self.root, relative, directory)
        except ProbeFailed as error:
            raise ProbeFailed(f"snapshot: {str(error).replace(str(self.root), 'the snapshot')}") from None
        except OSError:  # the snapshot's root itself is gone
            return None

    def _read(self, relative: str, limit: int, head: bool = False) -> str | None:
        fd = self._open(relative)
        return None if fd is None else read_fd(fd, limit, str(self.root / relative.lstrip("/")), head)

    def _json(self, name: str, shape=None):
        text = self._read(name, MAX_JSON_DOCUMENT)
        if text is None:
            return None
        try:
            value = typed_json.loads(text)
        except (ValueError, RecursionError) as error:
            raise NodecheckError(f"{self.root / name}: not valid JSON ({str(error)[:200]})") from None
        if shape is not None and not shape(value):
            raise NodecheckError(f"{self.root / name}: not what nodecheck writes there ({_SHAPES[shape]})")
        return value

    def _replay_failure(self, source: str) -> None:
        entry = self.sources.get(source, {})
        if entry.get("outcome") in _FAILURES:
            raise _FAILURES[entry["outcome"]](f"{str(entry.get('error', 'failed'))[:500]} (replayed from snapshot)")
        raise NotRecorded(f"{source} is not in the snapshot")

    def command(self, source: str, argv: list[str], timeout: float) -> str:
        text = self._read(source, MAX_COMMAND_OUTPUT)
        if text is not None:
            return text
        self._replay_failure(source)

    def kernel_messages(self, timeout: float) -> str:
        return self.command(KMSG, [], timeout)

    def history(self) -> dict:
        return self._document("state.json", _history_shape)

    def remember(self, sample, min_interval_s: float, log=None) -> str | None:
        return "a replayed snapshot keeps no state"

    def read_text(self, path: str) -> str | None:
        stop_at_deadline(path)
        if path in READ_HEAD:
            return self._read("fs/" + path.lstrip("/"), MAX_CONF_FILE, head=True)
        return self._read("fs/" + path.lstrip("/"), MAX_SYSFS_FILE)

    def read_link(self, path: str) -> str | None:
        stop_at_deadline(path)
        return self.links.get(path)

    def list_dir(self, path: str) -> list[str]:
        stop_at_deadline(path)
        if path in self.dirs:
            names = self.dirs[path][:MAX_DIR_ENTRIES]  # a recorded listing is bounded like a live one
        else:
            fd = self._open("fs/" + path.lstrip("/"), directory=True)
            names = []
            if fd is not None:
                try:
                    with os.scandir(fd) as entries:
                        names = sorted(e.name for e in itertools.islice(entries, MAX_DIR_ENTRIES))
                finally:
                    os.close(fd)
        # a listed name is one path component: `../../etc` would walk out of the tree
        return [name for name in names if name not in ("", ".", "..") and "/" not in name and "\0" not in name]

    def nvml(self, timeout: float, dump=None) -> dict:
        return self._document("nvml.json")  # what NVML said when the snapshot was taken

    def addresses(self) -> dict[str, list[dict]]:
        try:
            return self._document("addresses.json", _addresses_shape)
        except NoData:
            return {}

    def resolve(self, name: str, port: int, timeout: float) -> str:
        raise NoData(PEERS_NOT_IN_SNAPSHOT)

    def route(self, address: str, interface: str | None, timeout: float):
        raise NoData(PEERS_NOT_IN_SNAPSHOT)

    def connect_rtt_ms(self, address: str, port: int, timeout: float) -> float:
        raise NoData(PEERS_NOT_IN_SNAPSHOT)

    def identity(self) -> dict:
        try:
            return self._document("identity.json", _identity_shape)
        except NoData:
            return {}

    def _document(self, source: str, shape=None):
        value = self._json(source, shape)
        if value is None:
            self._replay_failure(source)
        return value


def _str_map(value, of) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and of(v) for k, v in value.items())


def _scalar(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _sources_shape(value) -> bool:
    return _str_map(value, lambda entry: _str_map(entry, lambda v: _scalar(v) or _argv(v)))


def _argv(value) -> bool:
    return isinstance(value, list) and all(isinstance(a, str) for a in value)


def _links_shape(value) -> bool:
    return _str_map(value, lambda v: isinstance(v, str))


def _dirs_shape(value) -> bool:
    return _str_map(value, lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v))


def _addresses_shape(value) -> bool:
    return _str_map(value, lambda v: isinstance(v, list) and all(_address_shape(e) for e in v))


def _address_shape(entry) -> bool:  # what LiveHost.addresses() gives: the renderers and the NIC rules read each key
    return (_str_map(entry, _scalar) and isinstance(entry.get("address"), str) and entry.get("family") in ("inet", "inet6")
            and isinstance(entry.get("prefixlen"), int) and not isinstance(entry.get("prefixlen"), bool))


def _identity_shape(value) -> bool:
    return _str_map(value, _scalar)


def _history_shape(value) -> bool:
    return isinstance(value, dict) and set(value) <= {"boot_id", "state"}


_SHAPES = {
    _history_shape: "an object of boot_id and state",
    _sources_shape: "an object of source name -> {argv, outcome, error}",
    _links_shape: "an object of path -> link target",
    _dirs_shape: "an object of path -> list of names",
    _addresses_shape: "an object of interface -> list of {family, address, prefixlen}",
    _identity_shape: "an object of plain values",
}


def open_snapshot(path: Path, workdir: Path) -> SnapshotHost:
    """A SnapshotHost for a directory or a .tar.gz (extracted under workdir: regular files and
    directories only, at most MAX_SNAPSHOT_MEMBERS of them and MAX_SNAPSHOT_BYTES in all, refused
    whole beyond that). The caller removes workdir on every exit path."""
    if path.is_dir():
        return SnapshotHost(_holding_a_snapshot(path, path))
    if not path.is_file():
        raise NodecheckError(f"snapshot {path} does not exist")
    try:
        with tarfile.open(path) as tar:
            members = _bounded_members(tar, path)
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(workdir, members=members, **safe)  # noqa: S202 members vetted by _bounded_members, and the data filter
    except (tarfile.ReadError, EOFError, zlib.error):  # tarfile lists each method it tried: one sentence instead
        if starts_compressed(path):
            raise NodecheckError(f"snapshot {path}: cannot read it as a tarball (cut short or corrupt)") from None
        raise NodecheckError(f"{path}: neither a snapshot (a directory or a .tar.gz `nodecheck snapshot` wrote) nor a "
                             "Report (`inspect --json`, `bench --json`)") from None
    except (tarfile.TarError, OSError) as error:
        raise NodecheckError(f"snapshot {path}: cannot read it as a tarball ({str(error).splitlines()[0][:200]})") from None
    tops = {Path(m.name).parts[0] for m in members}
    top = workdir / tops.pop() if len(tops) == 1 else workdir
    return SnapshotHost(_holding_a_snapshot(top if top.is_dir() else workdir, path), label=f"snapshot:{path}")


# What `nodecheck snapshot` writes (and what tests assemble by hand): a directory with none of them is an
# empty or mistyped path, whose replay would read as a healthy node without GPUs.
SNAPSHOT_MARKERS = ("sources.json", "identity.json", "nvml.json", "nvidia-smi-topo-m.txt", "lstopo.xml", "lspci-vvv.txt",
                    "addresses.json", "fs")


def _holding_a_snapshot(root: Path, given: Path) -> Path:
    if not any(os.path.lexists(root / name) for name in SNAPSHOT_MARKERS):
        raise NodecheckError(f"{given} holds no nodecheck snapshot (none of {', '.join(SNAPSHOT_MARKERS)}): an empty or "
                             "mistyped path? `nodecheck snapshot OUT` writes one")
    return root


def _bounded_members(tar: tarfile.TarFile, path: Path) -> list[tarfile.TarInfo]:
    """The members to extract, read one header at a time so a tar bomb is refused before it is written."""
    members, total, seen = [], 0, 0
    while (member := tar.next()) is not None:
        seen += 1
        if seen > MAX_SNAPSHOT_MEMBERS:
            raise NodecheckError(f"snapshot {path}: more than {MAX_SNAPSHOT_MEMBERS} members: not a nodecheck snapshot")
        if not (member.isreg() or member.isdir()) or member.issparse() or not _safe(member.name):
            continue  # links, devices, FIFOs, sparse files and names outside the tree are never extracted
        total += member.size
        if total > MAX_SNAPSHOT_BYTES:
            raise NodecheckError(f"snapshot {path}: more than {MAX_SNAPSHOT_BYTES >> 20} MiB once extracted: "
                                 "not a nodecheck snapshot")
        members.append(member)
    return members


def _safe(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts
