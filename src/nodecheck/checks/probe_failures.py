"""A probe whose source exists but could not be read or parsed, or hung until killed. Pure."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def probe_failures(report: Report, config: Config) -> list[Finding]:
    """Garbled output is a warning (the tool changed, the facts are unknown); a source that hung until
    killed is an error: a hung nvidia-smi or NVML call is how a failing GPU or driver shows (NHC drains on it)."""
    return [Finding("probe_failed", "error" if r.timed_out else "warning", f"probe:{r.name}",
                    "timed out" if r.timed_out else "failed", "ok",
                    f"probe {r.name} {'timed out' if r.timed_out else 'failed'}: {r.error}")
            for r in report.probes if not r.ok and not r.no_data]


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
PROBE_FAILED = Kind("probe_failed", "gpu", "{subject} {measured}",
    doc=(
        ("warning; error when the source timed out",
         "a probe's source exists but could not be read or parsed, or hung until killed (`measured` is `timed out`)"),
    ))

CHECK = Check((PROBE_FAILED,), probe_failures)
