"""The bandwidth tests' verdicts: a measurement against its path's spec. Judged where measurements meet a Report
(verdicts/bandwidth.py `with_measurements`: `bench`, the prolog, `serve --measurements`), declared here with the
other checks; unknown until a test has run."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.report.model import Report


def no_measurements(report: Report) -> dict[str, str]:
    return {} if report.measurements else {kind.name: "no bandwidth test has run" for kind in CHECK.kinds}


BANDWIDTH_BELOW_SPEC = Kind("bandwidth_below_spec", "bandwidth", "{subject} bandwidth {measured} of spec, {expected} expected",
    doc=(
        ("error",
         "a measurement below `thresholds.bandwidth_ratio` x its spec; subject = the slow node when one can be named"),
    ))
BANDWIDTH_ABOVE_BOUND = Kind("bandwidth_above_bound", "bandwidth", "{subject} {measured} x its bound: path misread",
    doc=(
        ("warning",
         "an all-reduce across nodes above 2(n-1)/n x the ring bound of its rails, which no algorithm reaches: the rails "
         "nodecheck read are not the ones NCCL used, or a rate is misread; or one copy (h2d, d2h, p2p one way or both) above "
         "1.1 x the spec of its path, which no copy reaches: the path was misread (a link's width, generation or count; a Grace"
         " GPU's NVLink-C2C judged as PCIe: its healthy 346 GB/s read 5.49 x PCIe 5.0 x16), and a slow link would pass against "
         "that spec"),
    ))
BENCH_FAILED = Kind("bench_failed", "bandwidth", "{head} failed",
    doc=(
        ("error",
         "a bandwidth test failed or timed out (subject = its path)"),
    ))
BENCH_WRONG_RESULT = Kind("bench_wrong_result", "bandwidth", "{head} returned wrong data",
    doc=(
        ("error",
         "an all-reduce's data check failed: after timing, one all-reduce of ones is checked on every rank (each element must "
         "equal the world size, as nccl-tests' `-c 1`); a p2p copy's pattern, or `hbm`'s copied bytes, arrived wrong; "
         "nccl-tests' own check (its run under `bench`, or a saved log) counted wrong elements in a row's `#wrong` column "
         "or said 'Out of bounds values : N FAILED' (the `error` column of nccl-tests before 2.13 is a rounding "
         "difference, not counted); `details.data_check` holds `expected`, `elements`, `wrong_elements` (and for "
         "nccl-tests `wrong_rows`, `out_of_bounds`)"),
    ))

GPU_BELOW_SIBLINGS = Kind("gpu_below_siblings", "bandwidth", "{subject} {measured} of its siblings' median",
    doc=(
        ("warning",
         "a test of the GPU itself (`hbm`: its memory bandwidth; `gemm`: its dense BF16 throughput) below 0.9 of the median of the node's GPUs of the same model "
         "(three or more measured at once), though it may pass its spec: the sick GPU a spec threshold misses (braking, a "
         "lower clock, failing memory); `details.sibling_ratio`, `sibling_median`, `siblings`"),
    ))
GPU_RESULT_MISMATCH = Kind("gpu_result_mismatch", "bandwidth", "{subject} computed {measured}",
    doc=(
        ("error",
         "`gemm`'s silent-data-corruption check: one BF16 multiply of inputs made from a fixed seed, with deterministic "
         "cuBLAS settings, gave different bits on a repeat on the same GPU, or other bits than most GPUs of its model in the "
         "node (or no majority among them); `details.result_check` holds the digests. It cannot see a fault these inputs do "
         "not meet, nor one every GPU shares"),
    ))
BENCH_SKIPPED = Kind("bench_skipped", "bandwidth", "{head} not run",
    doc=(
        ("info",
         "a test not run, and why: a GPU another process holds (NVML's list) is not tested, as its memory is theirs"),
    ))

CHECK = Check((BANDWIDTH_BELOW_SPEC, BANDWIDTH_ABOVE_BOUND, BENCH_FAILED, BENCH_WRONG_RESULT, GPU_BELOW_SIBLINGS,
               GPU_RESULT_MISMATCH, BENCH_SKIPPED),
              made_by="the bandwidth tests", unknown=no_measurements)
