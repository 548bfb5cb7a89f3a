"""The one domain error type of nodecheck, and the few refinements callers act on."""

import sys


class NodecheckError(Exception):
    """Anything nodecheck reports as a clear message instead of a traceback."""


class ParseError(NodecheckError):
    """Text handed to a parser is not what that parser reads (garbled, truncated, another tool)."""


class NoData(NodecheckError):
    """The source a probe reads is absent (binary not installed, no driver, not in the snapshot)."""


class NotRecorded(NoData):
    """A snapshot holds nothing of this source (taken before nodecheck read it): no data, never a finding."""


class ProbeFailed(NodecheckError):
    """The source exists but reading it failed (timeout, non-zero exit, driver error)."""


class TimedOut(ProbeFailed):
    """The source did not answer within its deadline (a hung command or driver call): killed or abandoned."""


class ConfigError(NodecheckError):
    """A config file is missing, unreadable or holds a wrong key or value."""


def install_extra(extra: str) -> str:
    """How to add one of nodecheck's extras (bench, web, plot) where it was installed from. nodecheck is not
    published, so asking pip for nodecheck with an extra finds nothing: the extra comes from the checkout."""
    return (f"from nodecheck's checkout, sh deploy/install.sh {extra} (the system install, as root) "
            f"or {sys.executable} -m pip install '.[{extra}]' (this Python)")


NO_DRIVER = "no NVIDIA driver"  # how NVML's "no GPU stack here" starts: the rules tell a missing driver from a missing GPU by it
