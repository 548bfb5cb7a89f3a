"""Files read and written on this machine's own terms: regular files only, bounded in size, written
atomically with no temporary left behind. Used wherever an untrusted path or a published file is touched."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
from pathlib import Path

from nodecheck.errors import NodecheckError, ProbeFailed


def read_regular(path: Path, limit: int) -> bytes:
    """At most limit + 1 bytes of a regular file (one more than `limit` says it is larger). Never blocks
    on a FIFO or a device: OSError when the path is absent, unreadable or not a regular file (its
    strerror says which)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        return file.read(limit + 1)


def read_user_file(path: Path, limit: int, what: str) -> bytes:
    """A file a person named (a config, a log): its bytes, or NodecheckError naming the file and why (absent,
    not a regular file, larger than `limit`)."""
    try:
        data = read_regular(path, limit)
    except OSError as error:
        raise NodecheckError(f"{path}: cannot read {what} ({error.strerror or error})") from None
    if len(data) > limit:
        raise NodecheckError(f"{path}: {what} larger than {limit >> 20} MiB: not read")
    return data


def read_bounded(path: Path, limit: int) -> str | None:
    """A regular file's text (at most `limit` bytes, else ProbeFailed); None when it does not exist or
    cannot be read (sysfs refuses some reads: the speed of a down link is EINVAL)."""
    try:
        data = read_regular(path, limit)
    except OSError:
        return None
    if len(data) > limit:
        raise ProbeFailed(f"{path} is larger than {limit} bytes: not read")
    return data.decode("utf-8", errors="replace")


@contextlib.contextmanager
def atomic_file(target: Path, mode: int = 0o644):
    """A binary file that becomes `target` only when the block ends without an error: written beside it
    under a hidden temporary name, fsynced, renamed over it (never through a link at `target`), the
    directory fsynced. On any error or signal the temporary file is removed; one left by a SIGKILL is
    removed by the next call (remove_stale_temporaries)."""
    remove_stale_temporaries(target)
    part = tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp", delete=False)
    try:
        with part:
            yield part
            part.flush()
            os.fchmod(part.fileno(), mode)
            os.fsync(part.fileno())
        os.replace(part.name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part.name)
        raise
    directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


STALE_AFTER_S = 3600


def remove_stale_temporaries(target: Path) -> None:
    """Temporary files of atomic_file(target) older than an hour: left by a run that was killed."""
    for leftover in target.parent.glob(f".{target.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - leftover.lstat().st_mtime > STALE_AFTER_S:
                leftover.unlink()
