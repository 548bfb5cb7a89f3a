"""One kernel-log line split into the kernel's message and its time since boot, whatever wrote it: /dev/kmsg
records (`6,1234,8312000001,-;msg`), `dmesg` (`[ 8312.000001] msg`, `--ctime`, `--time-format iso`, `-r`, `-x`,
`-t`, `-H`/`--reltime`, `-d`), `journalctl -k` (short, short-precise, short-iso, short-full, short-monotonic), rsyslog's kern.log
(`Nov 29 09:06:40 gpu017 kernel: [ 8312.000001] msg`) and RFC 3339 syslog, each also as a ticket or e-mail quotes
it (`> `). A line that carries none of these
prefixes is still a kernel message when it starts like one nodecheck reads (`NVRM: ...`: `dmesg -t`); anything
else (prose, a config, a README quoting a log line mid-sentence) is not a kernel-log line, so not an event.

Every pattern is anchored and bounded, and each is tried at most once per line: linear in the line."""

from __future__ import annotations

import re

# a log pasted into a ticket, an e-mail or a markdown quote: "> [ 8312.000001] NVRM: ...", "> > ..." (no kernel
# message starts with '>')
_QUOTE = re.compile(r"[ \t]{0,3}>(?:[ \t]{0,3}>){0,7}[ \t]?")
_PRIORITY = re.compile(r"<\d{1,3}>")  # dmesg -r, syslog on the wire
_KMSG = re.compile(r"\d{1,3},\d{1,20},(\d{1,20}),[^;\n]{0,64};")  # /dev/kmsg: prio,seq,usec,flags;message
_SYSLOG_TIME = re.compile(  # journalctl short/-precise, short-iso, short-full; syslog BSD and RFC 3339
    r"(?:[A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d(?:\.\d{1,9})?"
    r"|(?:[A-Z][a-z]{2} )?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d| [A-Z]{1,5})?) ")
_DMESG_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d ")  # dmesg --time-format iso
_MONOTONIC = re.compile(r"\[\s{0,12}(\d{1,10})\.(\d{1,9})\] ?")  # dmesg, journalctl -o short-monotonic
# dmesg --ctime / -T, and with -d the time since the record before it (util-linux sys-utils/dmesg.c, "[%s <%12.06f>] ")
_CTIME = re.compile(r"\[[A-Z][a-z]{2} [A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4}(?: <\s{0,12}\d{1,10}\.\d{6}>)?\] ?")
# dmesg -d (util-linux: "[%5ld.%06ld <%12.06f>] ", or "[<%12.06f>] " alone): the time since boot where it is there
_DELTA = re.compile(r"\[(?:\s{0,12}(\d{1,10})\.(\d{1,9}) )?<\s{0,12}\d{1,10}\.\d{6}>\] ?")
# dmesg -H / --reltime (util-linux: "[%b%e %H:%M] " on a minute's first record, then "[  %+8.06f] " since the one
# before): neither is the time since boot
_RELTIME = re.compile(r"\[(?:[A-Z][a-z]{2}[ \d]\d \d\d:\d\d|\s{0,3}[+-]\d{1,10}\.\d{6})\] ?")
_HOST_KERNEL = re.compile(r"(?:[^\s:]{1,255} )?kernel: ?")  # the journal's and syslog's "gpu017 kernel: "
_FACILITY = re.compile(r"kern {0,2}:[a-z]{3,6} {0,3}: ")  # dmesg -x: "kern  :err   : "
# a ConnectX NIC's message: `mlx5_core ADDRESS: ...`, or mlx5's own function name where the device's prefix was cut
# off (gpud's matcher reads those)
NIC_MESSAGE = re.compile(r"mlx5_core |(?:mlx5_)?(?:port_module|pcie)(?:_event)?:\d")
# how the messages nodecheck reads begin: with no stamp before them, a line is a kernel message only if it does
BARE_MESSAGE = re.compile(r"NVRM: |nvidia-nvswitch\d{1,4}: |" + NIC_MESSAGE.pattern)


def kernel_message(line: str) -> tuple[str, int | None, bool]:
    """(the message, microseconds since boot or None, whether the line carried a kernel-log prefix). A line
    with no prefix is returned whole, unstamped: the caller decides whether it starts like a message."""
    at, usec, timed = 0, None, False
    if match := _QUOTE.match(line):
        at = match.end()
    if match := _PRIORITY.match(line, at):
        at = match.end()
    if facility := _FACILITY.match(line, at):  # dmesg -x: before the stamp
        at = facility.end()
    if match := _KMSG.match(line, at):
        at, usec, timed = match.end(), int(match[1]), True
    elif match := _SYSLOG_TIME.match(line, at) or _DMESG_ISO.match(line, at):
        at, timed = match.end(), True
    if usec is None and (match := (_MONOTONIC.match(line, at) or _DELTA.match(line, at) or _CTIME.match(line, at)
                                   or _RELTIME.match(line, at))):
        at, timed = match.end(), True
        usec = _usec(match) if match.re in (_MONOTONIC, _DELTA) and match[1] else None
    if match := _HOST_KERNEL.match(line, at):  # unstamped, "host kernel: " alone proves nothing (prose says it)
        at = match.end()
        if match := _MONOTONIC.match(line, at):  # rsyslog's kern.log: the kernel's own stamp after "kernel: "
            at, usec = match.end(), _usec(match)
    stamped = timed or facility is not None
    return line[at:], usec, stamped


def _usec(stamp: re.Match) -> int:
    return int(stamp[1]) * 1_000_000 + int(stamp[2].ljust(6, "0")[:6])


# a line a kernel log holds: a stamped message, or an unstamped one that starts like a message nodecheck reads;
# one search over the whole text (a log of a million empty lines costs no Python loop)
_KERNEL_LINE = re.compile(f"^(?:{_QUOTE.pattern})?(?:{_PRIORITY.pattern})?(?:" + "|".join(
    p.pattern for p in (_FACILITY, _KMSG, _SYSLOG_TIME, _DMESG_ISO, _MONOTONIC, _DELTA, _CTIME, _RELTIME)) +
    f"|(?:{_HOST_KERNEL.pattern})?(?:{BARE_MESSAGE.pattern}))", re.MULTILINE)


def has_kernel_line(text: str) -> bool:
    """Whether any line of the text is one a kernel log holds (prose, a config, random bytes hold none)."""
    return _KERNEL_LINE.search(text) is not None
