"""NCCL failing to set up NVLink SHARP (NVLS), as its WARN lines say: a CUDA call of its NVLS transport that failed
("host:pid:tid [1] transport/nvls.cc:254 NCCL WARN Cuda failure 401 'the operation cannot be performed in the present
state'", CUCHECK's form; before NCCL 2.19 without the number) or its own words when binding the multicast memory failed
("Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 1 'invalid argument'."). Kept per
host and error, counted, in NcclRun.nvls_errors; judged by verdicts/nccl_nvls.py."""

from __future__ import annotations

import re

from nodecheck.core.units import tally
from nodecheck.verdicts.nccl_run import MAX_NVLS_ERRORS

NVLS_SOURCE = "transport/nvls.cc:"  # the source file NCCL's WARN head names (src/debug.cc prints file:line)
_BIND = re.compile(r"^Failed to bind NVLink SHARP \(NVLS\) Multicast memory(?: of size \d{1,20})? ?: CUDA error "
                   r"(?P<code>\d{1,5}) '(?P<text>[^'\n]{0,80})'")
_CUDA_FAILURE = re.compile(r"^Cuda failure (?:(?P<code>\d{1,5}) )?'(?P<text>[^'\n]{0,80})'")


def note_nvls_failure(run, host: str, body: str, source: str | None) -> bool:
    """Whether a WARN line is NCCL's NVLS transport failing a CUDA call; if so it is counted, by (host, error). Another
    WARN of that file (NCCL_NVLS_ENABLE=1 with two ranks on one GPU: the job's usage) stays a quoted warning."""
    failed = _BIND.match(body)
    if failed is None and (source or "").startswith(NVLS_SOURCE):
        failed = _CUDA_FAILURE.match(body)
    if failed is None:
        return False
    run.nvls_error_lines += 1
    key = {"host": host[:255], "code": int(failed["code"]) if failed["code"] else None, "error": failed["text"]}
    tally(run.nvls_errors, key, MAX_NVLS_ERRORS)
    return True
