"""Files read and written on this machine's own terms: regular files only, bounded in size, written
atomically with no temporary left behind. Used wherever an untrusted path or a published file is touched."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
import time
from pathlib import Path, PurePosixPath

from nodecheck.core.errors import NoData, NodecheckError, ProbeFailed, TimedOut


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


MAX_LINKS_FOLLOWED = 40  # as the kernel's own limit on links in one path


def open_beneath(root: Path, relative: str, directory: bool = False) -> int | None:
    """A descriptor for root/relative opened one component at a time from root's descriptor, never following a
    link in the kernel: a link is read (readlinkat) and its target walked the same way, so no one who swaps
    entries between the steps can lead the open outside root (as openat2's RESOLVE_BENEATH). None when a
    component is absent or not a directory; ProbeFailed when the path, or a link on it, leads outside root."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    stack = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    pending, followed = list(reversed(PurePosixPath(relative.lstrip("/")).parts)), 0
    try:
        while pending:
            name = pending.pop()
            if name in ("", ".", "/"):
                continue
            if name == "..":
                if len(stack) == 1:
                    raise ProbeFailed(f"{relative[:120]!r} leads outside {root}: refused")
                os.close(stack.pop())
                continue
            try:
                fd = os.open(name, flags, dir_fd=stack[-1])
            except OSError as error:
                if error.errno != errno.ELOOP:
                    if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
                        return None
                    raise ProbeFailed(f"{relative[:120]!r}: {error.strerror}") from None
                followed += 1
                target = os.readlink(name, dir_fd=stack[-1])
                if followed > MAX_LINKS_FOLLOWED or target.startswith("/"):
                    raise ProbeFailed(f"{relative[:120]!r} is a link that leads outside {root}: refused") from None
                pending.extend(reversed(PurePosixPath(target).parts))
                continue
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            if pending or directory:
                if not is_dir:
                    os.close(fd)
                    return None
                if pending:
                    stack.append(fd)
                    continue
            return fd
        return os.dup(stack[-1]) if directory else None
    finally:
        for fd in stack:
            os.close(fd)


def read_fd(fd: int, limit: int, name: str, head: bool = False) -> str | None:
    """A regular file's text from its descriptor (closed here); None when it is not a regular file; ProbeFailed
    past `limit` bytes, or with `head` its first `limit` bytes."""
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return None
        data = file.read(limit + 1)
        return _text(Path(name), data[:limit] if head else data, limit)


def read_head(path: Path, limit: int) -> str | None:
    """A regular file's first `limit` bytes as text (a file read as its reader reads it, whatever its size);
    None when it does not exist or cannot be read."""
    try:
        data = read_regular(path, limit)
    except OSError:
        return None
    return data[:limit].decode("utf-8", errors="replace")


def untrusted_why(path: Path) -> str | None:
    """None when no one but root and this user can have written `path`: each directory from / down and the file
    itself owned by root or this user and writable by no one else (a sticky directory such as /tmp is fine: no
    one else can replace an entry in it), or lying under a root-owned directory no one else may enter (systemd's
    /var/lib/private of DynamicUser= services). Else why not, as sshd refuses a key file others could change.
    A path that does not exist yet is trusted as far as it goes: its creator is this process."""
    euid, current = os.geteuid(), Path("/")
    real = Path(os.path.realpath(path))
    for part in real.parts[1:] + ("",):
        try:
            st = os.lstat(current)
        except OSError:
            return None
        directory = stat.S_ISDIR(st.st_mode)
        if directory and st.st_uid == 0 and not st.st_mode & 0o077 and current != real:
            return None  # a root-private subtree: no one else reaches what lies below
        if st.st_uid not in (0, euid):
            return f"{current} is owned by uid {st.st_uid}, not root"
        if st.st_mode & 0o022 and not (directory and st.st_mode & stat.S_ISVTX):
            return f"{current} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
        if not part:
            break
        current = current / part
    return None


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
    return _text(path, data, limit)


def _text(path: Path, data: bytes, limit: int) -> str:
    if len(data) > limit:
        raise ProbeFailed(f"{path} is larger than {limit} bytes: not read")
    return data.decode("utf-8", errors="replace")


# an InfiniBand port's counter file, and the port it belongs to
PORT_COUNTER = re.compile(r"(/sys/class/infiniband/[^/]{1,64}/ports/[0-9]{1,3})/(?:hw_)?counters/")
REFUSED_RETRY_S = 3600.0


def read_port_counter(path: Path, port: str, refused: dict[str, float], limit: int) -> str | None:
    """An InfiniBand port counter's text, as read_bounded; None without reading it while the port's firmware refused
    one within the last REFUSED_RETRY_S (`refused`: port -> when, kept by the caller for its lifetime). Reading a
    counter of a port the firmware manages itself (the Fabric Manager's "limited PFs" of HGX B200/B300, DGX and GB200
    ConnectX-7 cards) fails in firmware with EINVAL and logs an mlx5 "ACCESS_REG(0x805) ... failed" line to the
    kernel log, for every file of every round (node_exporter#3434, gpud#1164): once a port refused, its other
    counters are not asked in that round, nor again within the hour."""
    when = refused.get(port)
    if when is not None and time.monotonic() - when < REFUSED_RETRY_S:
        return None
    try:
        data = read_regular(path, limit)
    except OSError as error:
        if error.errno == errno.EINVAL:
            refused[port] = time.monotonic()
        return None
    refused.pop(port, None)
    return _text(path, data, limit)


KMSG_RECORD = 16384  # a read of /dev/kmsg returns one record; a smaller buffer than the record is EINVAL


def read_kmsg(path: Path, limit: int, timeout: float) -> str:
    """The records of the kernel's ring buffer as /dev/kmsg hands them (`prio,seq,usec,flags;message`, one
    per read), up to the newest, without waiting for more. NoData when it cannot be opened (it needs
    CAP_SYSLOG where kernel.dmesg_restrict is 1); ProbeFailed past `limit` bytes, TimedOut past `timeout`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        raise NoData(f"{path}: permission denied (needs CAP_SYSLOG)") from None
    except OSError as error:
        raise NoData(f"{path}: {error.strerror or error}") from None
    records, size, deadline = [], 0, time.monotonic() + timeout
    try:
        while True:
            try:
                record = os.read(fd, KMSG_RECORD)
            except BlockingIOError:
                break  # the newest record was read
            except BrokenPipeError:
                continue  # records were overwritten while reading: the next read gives the oldest left
            except OSError as error:
                raise ProbeFailed(f"{path}: {error.strerror or error}") from None
            if not record:
                break  # a regular file (a copy) at its end
            size += len(record)
            if size > limit:
                raise ProbeFailed(f"{path}: more than {limit >> 20} MiB: not read")
            if time.monotonic() > deadline:
                raise TimedOut(f"{path}: not read to its end within {timeout:g} s")
            records.append(record)
    finally:
        os.close(fd)
    return b"".join(records).decode("utf-8", errors="replace")


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
