"""`nodecheck config check`: a config's expectations beside what a node has, before the config is pushed to
every node (a typo there drains the fleet); the CLI adds what the Slurm prolog would decide."""

from __future__ import annotations

from nodecheck.assemble.nvlinks import nvlink_pairs
from nodecheck.config import Config
from nodecheck.config.init import nic_mbps
from nodecheck.core.units import format_figure, natural_key
from nodecheck.report.model import Report


def expectation_rows(config: Config, report: Report) -> list[tuple[str, str, str]]:
    """(key, what the config expects, what the node has) for every expectation the config sets."""
    gpus, rows = report.gpus, []
    pcie = [g.pcie or {} for g in gpus]

    def spread(values) -> str:
        known = sorted({v for v in values if v is not None})
        return "unknown" if not known else str(known[0]) if len(known) == 1 else f"{known[0]}-{known[-1]}"

    if config.gpu_count is not None:
        rows.append(("gpus.count", str(config.gpu_count), f"{len(gpus)} visible"))
    if config.pcie_gen is not None:
        rows.append(("gpus.pcie_gen", str(config.pcie_gen), f"gen {spread(p.get('gen_max') for p in pcie)} (max)"))
    if config.pcie_width is not None:
        rows.append(("gpus.pcie_width", f"x{config.pcie_width}", f"x{spread(p.get('width_current') for p in pcie)} (now)"))
    if config.nvlinks_per_gpu is not None:
        rows.append(("gpus.nvlinks_per_gpu", str(config.nvlinks_per_gpu),
                     f"{spread(sum(1 for link in g.nvlinks if link['active']) for g in gpus)} active"))
    if config.ecc is not None:
        rows.append(("gpus.ecc", str(config.ecc).lower(), spread(str(g.ecc_enabled).lower() for g in gpus
                                                                  if g.ecc_enabled is not None)))
    if config.mig is not None:
        rows.append(("gpus.mig", str(config.mig).lower(), spread(str(g.mig_enabled).lower() for g in gpus
                                                                  if g.mig_enabled is not None)))
    links = nvlink_pairs(report)
    differing = [(pair, expected) for pair, expected in sorted(config.links.items()) if links.get(pair) != expected]
    if config.links and not differing:  # 28 equal rows on an 8-GPU board say less than one
        kinds = ", ".join(sorted(set(config.links.values())))
        rows.append((f"links ({len(config.links)} GPU pairs)", kinds, "the same"))
    for (a, b), expected in differing:
        rows.append((f'links."gpu{a}-gpu{b}"', expected, links.get((a, b), "no such pair")))
    nics = {n.name: n for n in report.nics} | {n.rdma_device: n for n in report.nics if n.rdma_device}
    for name, want in sorted(config.nics.items(), key=lambda item: natural_key(item[0])):
        nic = nics.get(name)
        speed = f"{want.speed_mbps} Mb/s, " if want.speed_mbps else ""
        has = "no such NIC" if nic is None else f"{nic_mbps(report, nic) or 'unknown'} Mb/s, {nic.state or 'state unknown'}"
        rows.append((f'nics."{name}"', f"{speed}{want.state}", has))
    rows.append(("thresholds.bandwidth_ratio", f"{config.bandwidth_ratio:g}", "(bandwidth tests)"))
    rows += [(f"thresholds.tests.{test}", f"{ratio:g}", f"({test})") for test, ratio in sorted(config.test_ratios.items())]
    if config.prolog.bench:
        rows.append(("prolog.bench", ", ".join(config.prolog.bench), "(the tests the prolog runs)"))
    rows.append(("thresholds.fail_severity", config.fail_severity, "(what drains)"))
    return rows


def as_the_prolog_judges(config: Config, report: Report) -> tuple[list, list[tuple[str, bool]]]:
    """What the prolog would count on a node whose saved Report this is (its facts judged by `config` already:
    build.judged_again): the Report's findings and those of its measurements of the tests [prolog] bench lists,
    judged by `config`'s thresholds and joined to the error signals as the prolog joins them; and a line for each
    measurement, saying whether the prolog runs its test. Others are shown, not counted: `bench` and `serve`
    judge them, the prolog does not run them. Without measurements, the Report's findings as they are."""
    from nodecheck.verdicts.bandwidth import judge_measurements
    from nodecheck.verdicts.signal_join import joined

    lines, counted, counted_findings, seen = [], [], [], set()
    for saved in report.measurements:
        (m,), findings = judge_measurements(report, [saved], config)
        findings = [f for f in findings if (f.kind, f.subject, f.message) not in seen]  # NCCL's, once per run
        seen.update((f.kind, f.subject, f.message) for f in findings)
        in_prolog = m.test in config.prolog.bench
        if in_prolog:
            counted.append(m)
            counted_findings += findings
        if not m.ok:
            verdict = f"failed: {m.error}"
        elif m.ratio is None:
            verdict = f"{format_figure(m)}, no spec to judge it by"
        else:
            verdict = (f"{format_figure(m)} = {m.ratio:.2f} x spec, threshold "
                       f"{m.details['threshold']:.2f} ({m.details['threshold_basis']})")
        said = "; ".join(f"{f.severity}: {f.kind}" for f in findings) or "passes"
        lines.append((f"{m.test} on {m.path}: {verdict}: {said}", in_prolog))
    if not counted:
        return report.findings, lines
    return joined(report, counted, report.findings + counted_findings), lines
