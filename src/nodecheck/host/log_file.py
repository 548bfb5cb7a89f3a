"""A log file an operator hands over, as text: compressed as logs are kept (`dmesg.gz`, rotated `kern.log.2.gz`:
gzip, xz, bzip2), written in what real logs are written in (UTF-8, UTF-16 from a Windows editor or PowerShell
redirect), or a journal export (`journalctl -k -o export` or `-o json`) turned into stamped lines. Every step is
bounded after decompression, so a small bomb cannot take memory; anything else is refused with its name."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import zlib
from pathlib import Path

from nodecheck.core.errors import NodecheckError
from nodecheck.host.files import read_regular, read_user_file

# (magic, name, opener) of the compressions logrotate and people use; zstd and the journal's own files are named
_COMPRESSED = ((b"\x1f\x8b", "gzip", lambda raw: gzip.GzipFile(fileobj=raw)), (b"\xfd7zXZ\x00", "xz", lzma.LZMAFile), (b"BZh", "bzip2", bz2.BZ2File))
_REFUSED = ((b"\x28\xb5\x2f\xfd", "zstd-compressed: decompress it first (zstd -dc FILE > FILE.log)"),
            (b"LPKSHHRH", "a systemd journal file: read it with journalctl --file FILE -k -o short-monotonic"))
_JOURNAL_FIELDS = ("MESSAGE", "_SOURCE_MONOTONIC_TIMESTAMP", "__MONOTONIC_TIMESTAMP")


def starts_compressed(path: Path) -> bool:
    """Whether the file begins as gzip, xz or bzip2 does (a tarball or a log, broken or not)."""
    try:
        head = read_regular(path, 5)  # regular files only: a FIFO never blocks it
    except OSError:
        return False
    return head.startswith(tuple(magic for magic, _, _ in _COMPRESSED))


def read_log_file(path: Path, limit: int, what: str = "kernel log") -> str:
    """The file's text (at most `limit` bytes once decompressed), or NodecheckError naming the file and why."""
    data = read_user_file(path, limit, what)
    if not data:
        raise NodecheckError(f"{path}: the {what} is empty")
    for magic, why in _REFUSED:
        if data.startswith(magic):
            raise NodecheckError(f"{path}: {why}")
    for magic, name, opener in _COMPRESSED:
        if data.startswith(magic):
            data = _decompressed(path, data, name, opener, limit, what)
            break
    text = _decoded(data)
    if text.startswith("__CURSOR="):
        return _from_export(data if data.startswith(b"__CURSOR=") else text.encode("utf-8"))
    if text.startswith("{") and '"MESSAGE"' in text[:65536]:
        return _from_json_lines(text)
    return text


def _decompressed(path: Path, data: bytes, name: str, opener, limit: int, what: str) -> bytes:
    try:
        with opener(io.BytesIO(data)) as stream:
            out = stream.read(limit + 1)  # decompresses no further than this: a bomb stops here
    except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError) as error:
        raise NodecheckError(f"{path}: not a whole {name} file ({error})") from None
    if len(out) > limit:
        raise NodecheckError(f"{path}: the {what} is larger than {limit >> 20} MiB once decompressed: not read "
                             f"(its newest part: {name} -dc FILE | tail -c {limit >> 20}M > part.log)")
    if not out:
        raise NodecheckError(f"{path}: the {what} is empty once decompressed")
    return out


def _decoded(data: bytes) -> str:
    """UTF-8 (its BOM dropped) unless a BOM or the zero bytes of ASCII text say UTF-16; bytes that decode to
    nothing become U+FFFD, never an error."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    head = data[:4096]
    if head.count(0) > len(head) // 4:  # ASCII text in UTF-16: every other byte is zero
        odd = head[1::2].count(0)
        return data.decode("utf-16-le" if odd > head[0::2].count(0) else "utf-16-be", errors="replace")
    return data.decode("utf-8-sig", errors="replace")


def _stamped(fields: dict[str, str]) -> list[str]:
    """One journal entry as dmesg-style lines, stamped with the kernel's time where the entry carries it."""
    stamp = fields.get("_SOURCE_MONOTONIC_TIMESTAMP") or fields.get("__MONOTONIC_TIMESTAMP") or ""
    prefix = f"[{int(stamp) // 1_000_000:5d}.{int(stamp) % 1_000_000:06d}] " if stamp.isascii() and stamp.isdigit() and len(stamp) < 20 else ""
    return [prefix + line for line in fields.get("MESSAGE", "").splitlines()]


def _from_export(data: bytes) -> str:
    """`journalctl -o export`: fields `NAME=value` one per line, a binary field as NAME, a 64-bit little-endian
    length and the bytes; a blank line ends an entry. Read in one pass."""
    lines, fields, at = [], {}, 0
    while at < len(data):
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end
        line = data[at:end]
        if not line:
            if fields:
                lines += _stamped(fields)
            fields, at = {}, end + 1
            continue
        name, equals, value = line.partition(b"=")
        if not equals:  # a binary field: its length follows its name
            size = int.from_bytes(data[end + 1:end + 9], "little")
            value, end = data[end + 9:end + 9 + size], end + 9 + size
        key = name.decode("ascii", errors="replace")
        if key in _JOURNAL_FIELDS:
            fields[key] = value.decode("utf-8", errors="replace")
        at = end + 1
    return "\n".join(lines + _stamped(fields))


def _from_json_lines(text: str) -> str:
    """`journalctl -o json`: one object per line; MESSAGE is a string, or an array of bytes when not UTF-8."""
    lines = []
    for raw in text.splitlines():
        if not raw.startswith("{"):
            continue
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if not isinstance(entry, dict):
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
            message = bytes(message).decode("utf-8", errors="replace")
        if isinstance(message, str):
            lines += _stamped({k: entry[k] if isinstance(entry.get(k), str) else "" for k in _JOURNAL_FIELDS[1:]}
                              | {"MESSAGE": message})
    return "\n".join(lines)
