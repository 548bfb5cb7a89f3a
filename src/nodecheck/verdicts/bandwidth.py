"""Measurements judged: each against its path's spec and the threshold calibrated for that path, failed
and corrupting runs named, an all-reduce past what its rails allow flagged as misread, the slow node of a
cluster all-reduce found from its pair exchanges, and what NCCL chose during a run. Pure: no I/O.
with_measurements is the one way every face (bench, serve, the prolog, nccl-log) attaches and judges them."""

from __future__ import annotations

import dataclasses

from nodecheck.assemble.gpu_load import why_slow
from nodecheck.config import Config
from nodecheck.core.units import format_figure, format_size, is_int, plural
from nodecheck.report.findings import Finding
from nodecheck.report.model import Measurement, Report, path_identity

FABRIC_KINDS = ("infiniband", "ethernet")


def _what_to_check(m) -> str:
    """Advice for the kind of path that was slow: a GPU's host link is not a network cable, a PCIe box has
    no NVLink to check."""
    kind = m.details.get("path_kind")
    if m.scope == "host-link" and kind == "c2c":
        return ("check the GPU's NVLink-C2C links to its Grace CPU (`nvidia-smi c2c -s`: every link at its speed), that "
                "nothing else was copying over them, and the host memory's NUMA node")
    if m.scope == "gpu" and (during := why_slow(m.details.get("load"))):
        return (f"while it ran: {during}; check its cooling and power (`nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE`) "
                "and its memory's health (`nvidia-smi -q -d ROW_REMAPPER,ECC`)")
    if m.scope == "gpu":
        return ("check the GPU's clocks and braking while it runs (`nvidia-smi -q -d PERFORMANCE,CLOCK`: the memory clock at "
                "its maximum, no HW slowdown), its power limit, and its memory's health (`nvidia-smi -q -d ROW_REMAPPER,ECC`)")
    if m.scope == "host-link":
        return ("check the GPU's PCIe link (`nvidia-smi -q -d PCI`: generation and width now vs max), that nothing else "
                "was copying over it, and the host memory's NUMA node")
    if m.scope == "cluster" or kind in FABRIC_KINDS:
        return "check that node's cable, switch port and NIC speed"
    if kind == "nvlink-no-peer":
        return ("the GPUs are linked by NVLink but have no peer access, so the copies went through host memory: check "
                "the fabric manager on NVSwitch systems (`systemctl status nvidia-fabricmanager`), `nvidia-smi topo -p2p r`, "
                "NCCL_P2P_DISABLE, and that both GPUs are passed to this VM or container")
    if kind == "nvlink":
        return "check the GPUs' NVLink state (`nvidia-smi nvlink -s`) and that no other job was using them"
    return ("check the GPUs' PCIe links (`nvidia-smi -q -d PCI`: generation and width now vs max), ACS and the IOMMU on "
            "their path (`nodecheck inspect`), and that no other job was using them")


def algorithm_bound(m) -> float | None:
    """For an all-reduce across nodes (bench's, or an nccl-tests log's) judged against the ring bound of its rails:
    the most any algorithm can reach, as a ratio to that bound. A ring sends 2(n-1)/n x S of each node's data over
    its rails, a tree or SHARP about S, so busbw (algbw x 2(n-1)/n) can reach 2(n-1)/n x the ring bound and no
    more (other collectives reach less). None for other measurements."""
    if m.test not in ("allreduce", "nccl_tests") or m.scope != "cluster" or not m.ranks or m.ranks < 2 \
            or m.details.get("path_kind") not in FABRIC_KINDS:
        return None
    return 2 * (m.ranks - 1) / m.ranks


# a copy over one path moves at most its line rate: measured this far above the spec nodecheck derived, the path
# was misread (a link count, generation or width; NVLink-C2C judged as PCIe), and the verdict passes whatever it
# measured (published healthy copies read 0.77-0.87 of their spec; the margin covers rounding in published rates)
COPY_BOUND = 1.1
PARTIAL_MESH = "partial NVLink mesh"  # how bench/bounds.py names the spec of a mesh without NVSwitch


def copy_bound(m) -> float | None:
    """For one copy over a GPU's host link or between two GPUs, and for a collective inside a node over PCIe or a
    partial NVLink mesh (no switch there reduces: NVLS and SHARP need an NVSwitch or a SHARP switch, so busbw stays
    under the links' rate): COPY_BOUND. None for other measurements (an all-reduce on an NVSwitch node: NVLS)."""
    if m.test in ("allreduce", "nccl_tests") and m.scope != "cluster":
        details = m.details if isinstance(m.details, dict) else {}
        partial_mesh = str(details.get("spec_basis") or "").startswith(PARTIAL_MESH)
        return COPY_BOUND if details.get("path_kind") in ("pcie", "pcie-staged") or partial_mesh else None
    if m.test == "hbm" and path_identity(m.path)[0] == "gpu":  # a copy reads and writes each byte once: 2 x size at most
        return COPY_BOUND
    if m.test not in ("h2d", "d2h", "p2p") or path_identity(m.path)[0] not in ("host-link", "gpu-pair"):
        return None
    return COPY_BOUND


def judge_measurements(report: Report, measurements: list, config: Config | None) -> tuple[list, list[Finding]]:
    """The measurements with their thresholds, and the findings they raise against `report` (its own findings
    not included): the one judgment behind with_measurements, for faces that count the Report's findings apart
    (the prolog's node check, nccl-log)."""
    config = config or Config()
    measurements = [with_threshold(m, config) for m in measurements]
    return measurements, measurement_findings(measurements, config) + _what_nccl_did(report, measurements)


def with_measurements(report: Report, measurements: list, measured_at: float, config: Config | None) -> Report:
    """The Report with these measurements attached and judged: the one way `bench` and `serve` add them."""
    from nodecheck.verdicts.signal_join import joined

    measurements, findings = judge_measurements(report, measurements, config)
    return dataclasses.replace(report, measurements=measurements, measured_at=measured_at,
                               findings=joined(report, measurements, report.findings + findings))


def with_threshold(m, config: Config):
    """The measurement with the threshold it is judged by, and where that comes from, in its details
    (details["threshold"], ["threshold_basis"]): the exporter publishes it for the alert to compare with.
    None where no figure is judged (a failed test, an unknown spec)."""
    if not m.ok or m.ratio is None:
        return m
    ratio, basis = config.threshold(m.test, m.details.get("path_kind"), m.direction, m.details.get("calibration"))
    return dataclasses.replace(m, details=dict(m.details, threshold=ratio, threshold_basis=basis))


def _what_nccl_did(report: Report, measurements: list) -> list[Finding]:
    """The findings of what NCCL logged during the measurements (details["nccl"]) and of the topology it routed by
    (details["nccl_topology"]), each named once."""
    from nodecheck.verdicts.nccl_run import nccl_findings, nccl_run_from_details
    from nodecheck.verdicts.nccl_topo import topo_findings, topology_from_details

    findings, seen = [], set()
    for m in measurements:
        run = nccl_run_from_details((m.details or {}).get("nccl") if isinstance(m.details, dict) else None)
        topology = topology_from_details((m.details or {}).get("nccl_topology") if isinstance(m.details, dict) else None)
        for finding in (nccl_findings(run, report) if run else []) + (topo_findings(topology, report) if topology else []):
            if (finding.kind, finding.subject, finding.message) not in seen:
                seen.add((finding.kind, finding.subject, finding.message))
                findings.append(finding)
    return findings


def _wrong_data(m: Measurement) -> list[Finding]:
    """A data check that found wrong data (details.data_check, from a saved Report too: untrusted): nodecheck's own
    (`wrong_elements` of `elements`), or nccl-tests' (its #wrong rows and 'Out of bounds values' line)."""
    check = m.details.get("data_check") if isinstance(m.details, dict) else None
    if not isinstance(check, dict):
        return []
    wrong, bounds = check.get("wrong_elements"), check.get("out_of_bounds")
    wrong = wrong if is_int(wrong) and wrong > 0 else 0
    bounds = bounds if is_int(bounds) and bounds > 0 else 0
    if not wrong and not bounds:
        return []
    if m.test != "nccl_tests":
        what = f"{wrong} of {check.get('elements')} elements arrived wrong (expected: {check.get('expected')})"
    else:
        rows = [r for r in check.get("wrong_rows") or [] if isinstance(r, dict) and is_int(r.get("size_bytes"))]
        sizes = f" in {plural(len(rows), 'row')} from {format_size(min(r['size_bytes'] for r in rows))}" if rows else ""
        what = "nccl-tests' own check found " + ", and ".join(
            ([f"{wrong} wrong elements{sizes}"] if wrong else []) + ([f"'Out of bounds values : {bounds} FAILED'"] if bounds else []))
    return [Finding("bench_wrong_result", "error", m.path, f"{wrong or bounds} wrong", "0 wrong",
                    f"{m.test} on {m.path} returned wrong data: {what}: a GPU, a link, peer-to-peer the platform carries wrong "
                    "or the NCCL build corrupts data at whatever speed; check Xid and ECC errors (`nodecheck inspect`), and "
                    "run nccl-tests with -c 1 or nvbandwidth on each node alone")]


def _slow_before_plateau(m: Measurement, threshold: float) -> str | None:
    """Why a figure from a payload below where busbw levels off is slow all the same, or None: a healthy run reached a
    known share of its level at a smaller size (details.plateau_share), and this figure over that share stays under
    half the threshold, a margin for a path that climbs later than the published one."""
    plateau, below = m.details.get("plateau_share"), m.details.get("payload_below_plateau")
    if not isinstance(plateau, dict) or not isinstance(below, str) or not is_int(plateau.get("size_bytes")):
        return None
    share = plateau.get("share")
    if not isinstance(share, (int, float)) or not 0 < share <= 1 or m.ratio / share >= threshold / 2:
        return None
    return (f"slow even for its payload: {below}, and a healthy run already reads {share:g} of its level at "
            f"{format_size(plateau['size_bytes'])}, so this path would level off near {m.ratio / share:.2f} of spec, "
            f"under half the threshold")


def measurement_findings(measurements, config: Config) -> list[Finding]:
    """Bandwidth below the test's ratio x spec, and tests that failed, each naming its path (and the slow node)."""
    findings = []
    for m in measurements:
        threshold = config.ratio_for(m.test, m.details.get("path_kind"), m.direction, m.details.get("calibration"))
        if not m.ok and m.details.get("skipped"):  # not run, and why (a GPU another process holds): said, never failed
            findings.append(Finding("bench_skipped", "info", m.path, "not run", "run", f"{m.test} on {m.path}: {m.error}"))
            continue
        if not m.ok:
            findings.append(Finding("bench_failed", "error", m.path, "failed", "completed", f"{m.test} on {m.path}: {m.error}"))
            continue
        findings += _below_siblings(m) + _result_mismatch(m) + _wrong_data(m)
        if m.ratio is not None and (copy_bound(m) or float("inf")) < m.ratio:
            findings.append(Finding(
                "bandwidth_above_bound", "warning", m.path, f"{m.ratio:.2f}", f"<= {COPY_BOUND:.2f}",
                f"{m.path} {m.test} {format_figure(m)} = {m.ratio:.2f} x the spec nodecheck derived "
                f"for the path ({format_figure(m, spec=True)}), more than one copy moves over it: the "
                "path was misread (its link width, generation or count; a Grace GPU's NVLink-C2C judged as PCIe), so a slow "
                "link would pass here; `nodecheck inspect` shows what it read"))
        elif m.ratio is not None and (algorithm_bound(m) or float("inf")) < m.ratio:
            bound = algorithm_bound(m)
            findings.append(Finding(
                "bandwidth_above_bound", "warning", m.path, f"{m.ratio:.2f}", f"<= {bound:.2f}",
                f"{m.path} {m.test} {format_figure(m)} = {m.ratio:.2f} x the ring bound of the rails nodecheck "
                f"read, more than any all-reduce algorithm moves over them ({bound:.2f} x): NCCL used other or more NICs, "
                "or a rail's rate was misread (set [nics] speed_mbps); this verdict cannot be trusted"))
        elif m.ratio is not None and m.ratio < threshold and (slow := _slow_before_plateau(m, threshold)):
            findings.append(Finding(
                "bandwidth_below_spec", "error", m.path, f"{m.ratio:.2f}", f">= {threshold:g}",
                f"{m.path} {m.test} {format_figure(m)} = {m.ratio:.2f} of spec {format_figure(m, spec=True)}, {slow}: "
                f"{_what_to_check(m)}"))
        elif m.ratio is not None and m.ratio < threshold and m.details.get("payload_below_plateau"):
            findings.append(Finding(  # a latency-bound payload: a healthy path reads low there too
                "bandwidth_below_spec", "info", m.path, f"{m.ratio:.2f}", f">= {threshold:g}",
                f"{m.path} {m.test} {format_figure(m)} = {m.ratio:.2f} of spec {format_figure(m, spec=True)}, not judged: "
                f"{m.details['payload_below_plateau']}; run nccl-tests up to 1G or more (-e 1G, as nodecheck bench does)"))
        elif m.ratio is not None and m.ratio < threshold and m.details.get("path_assumed"):
            findings.append(Finding(  # the path's kind is a guess: a staged path would pass at this figure
                "bandwidth_below_spec", "info", m.path, f"{m.ratio:.2f}", f">= {threshold:g}",
                f"{m.path} {m.test} {format_figure(m)} = {m.ratio:.2f} of spec "
                f"{format_figure(m, spec=True)}, {m.details['path_assumed']}: without peer access "
                "the GPUs copy through host memory and this figure may be healthy; run it with NCCL_DEBUG=INFO (its "
                "transport lines settle it) or on the node itself"))
        elif m.ratio is not None and m.ratio < threshold:
            suspects = slow_nodes(m, threshold)
            where = "; slow: " + ", ".join(f"{name} at {ratio:.2f} of spec" + (f" (rail {rails})" if rails else "")
                                           for name, ratio, rails in suspects) if suspects else ""
            findings.append(Finding(
                "bandwidth_below_spec", "error", suspects[0][0] if suspects else m.path, f"{m.ratio:.2f}", f">= {threshold:g}",
                f"{m.path} {m.test} {format_figure(m)} = {m.ratio:.2f} of spec "
                f"{format_figure(m, spec=True)}{where}: {_what_to_check(m)}"))
    return findings


# a GPU below this share of the median of its node's GPUs of the same model is out of line, though it passes its spec:
# healthy GPUs of one model on one board run within a few percent of each other (gpu-fryer's and DCGM's peer checks
# flag 10% apart)
SIBLING_FRACTION = 0.9


def _below_siblings(m) -> list[Finding]:
    ratio = m.details.get("sibling_ratio") if isinstance(m.details, dict) else None
    if not isinstance(ratio, (int, float)) or ratio >= SIBLING_FRACTION:
        return []
    median = m.details.get("sibling_median")
    return [Finding("gpu_below_siblings", "warning", m.path, f"{ratio:.2f}", f">= {SIBLING_FRACTION:g}",
                    f"{m.path} {m.test} {format_figure(m)} = {ratio:.2f} of the median of its "
                    f"{m.details.get('siblings')} sibling GPUs of the same model ({format_figure(m, value=median)}): "
                    f"{_what_to_check(m)}")]


def _result_mismatch(m) -> list[Finding]:
    """The silent-data-corruption check of a gemm: the same multiply twice on one GPU, and on each GPU of its model."""
    check = m.details.get("result_check") if isinstance(m.details, dict) else None
    if not isinstance(check, dict):
        return []
    gpu = m.path.split(":")[0]
    mine = (check.get("digests") or [None])[0]
    if check.get("repeat_agrees") is False:
        why = f"{gpu} gave two different results for the same multiply on the same inputs ({check.get('inputs')})"
    elif check.get("of", 0) >= 2 and check.get("usual") is None:
        why = f"the {check.get('of')} GPUs of {gpu}'s model computed different bits for the same multiply, none a majority"
    elif check.get("usual") is not None and mine != check.get("usual"):
        why = (f"{gpu} computed other bits than {check.get('agreeing')} of the {check.get('of')} GPUs of its model for the "
               "same multiply on the same inputs")
    else:
        return []
    return [Finding("gpu_result_mismatch", "error", m.path, "other bits", "identical bits",
                    f"{why}: a GPU that computes wrong silently (SDC); stop using it and run the vendor's field diagnostic "
                    "(`dcgmi diag -r 3` or NVIDIA's field diagnostic), checking Xid and ECC errors (`nodecheck inspect`)")]


def slow_nodes(m, threshold: float) -> list[tuple[str, float, str]]:
    """From the pair exchanges (nodecheck.core.pairing): the nodes with a rank whose every exchange was slow
    against that exchange's own rails, each with its best ratio and the rails of its slow ranks; with only
    two nodes, both ends of the slow pairs."""
    from nodecheck.core.pairing import node_groups, rank_ratio, slow_ranks

    members = [n for n in m.details.get("nodes", []) if isinstance(n, dict) and isinstance(n.get("rank"), int)]
    by_rank = {n["rank"]: n for n in members}
    exchanges = m.details.get("pair_exchanges") or []
    if not exchanges or not m.spec_bytes_per_second:
        return []
    nodes = len(node_groups(members)) if members else 1 + max(max(e["a"], e["b"]) for e in exchanges)
    slow, undecided = slow_ranks(exchanges, nodes, threshold, m.spec_bytes_per_second)
    suspects = slow or sorted({rank for pair in undecided for rank in pair})
    named: dict[str, tuple[float, set]] = {}
    for rank in suspects:
        member = by_rank.get(rank, {})
        name = f"{member.get('node', f'rank{rank}')} ({member.get('address') or 'rank ' + str(rank)})"
        ratio = rank_ratio(exchanges, rank, m.spec_bytes_per_second) or 0.0
        rails = {r.get("name") for r in member.get("rails") or [] if isinstance(r, dict) and r.get("name")}
        best, seen = named.get(name, (ratio, set()))
        named[name] = (min(best, ratio), seen | rails)
    return sorted(((name, ratio, ",".join(sorted(rails))) for name, (ratio, rails) in named.items()), key=lambda s: s[1])


# Every static check, in the order its findings are listed. A new rule: its function and a row here (and its
# kinds declared in checks/measured.py).
