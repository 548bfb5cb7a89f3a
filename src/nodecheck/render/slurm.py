"""`nodecheck prolog`, `healthcheck` and `config check` as lines of text."""

from __future__ import annotations

from nodecheck.render.table import clean
from nodecheck.report.model import Report


def outcome_lines(mode: str, outcome, dry_run: bool) -> list[tuple[str, bool]]:
    """A prolog or health check outcome as (line, for standard error) pairs."""
    lines: list[tuple[str, bool]] = []
    verdict = outcome.verdict
    if outcome.action == "skip":
        lines.append((f"nodecheck {mode}: skipped ({outcome.detail})", False))
        return lines
    if verdict is not None:
        for run in verdict.checks:
            status = "timed out" if run.timed_out else "ok" if not any(f in verdict.failing for f in run.findings) else "FAILED"
            lines.append((f"nodecheck {mode}: {run.name}: {status} ({run.seconds:.2f} s)", False))
            for peer in run.details if run.name == "proximity" else []:
                if not peer["examined"]:
                    continue  # counted once, in the check_timed_out finding
                where = "same subnet" if peer["same_subnet"] else f"outside, via {peer['gateway']}" if peer["gateway"] else "outside"
                facts = peer["error"] or f"{peer['address']} on {peer['interface']} ({peer['subnet']}): {where}, {peer['rtt_ms']:g} ms"
                lines.append((f"nodecheck {mode}:   peer {peer['name']}: {facts}", False))
        for finding in verdict.failing + [f for f in verdict.findings if f not in verdict.failing]:
            lines.append((f"nodecheck {mode}: {finding.severity}: {finding.message}", False))
    would = "would " if dry_run else ""
    if outcome.error and verdict is None:
        lines.append((f"nodecheck {mode}: {outcome.error}", True))
        return lines
    if outcome.action == "drain":
        lines.append((f"nodecheck {mode}: {would}drain {verdict.node}: {outcome.detail}", False))
    elif outcome.action == "resume":
        lines.append((f"nodecheck {mode}: {would}resume {verdict.node}", False))
    else:
        lines.append((f"nodecheck {mode}: no change ({outcome.detail})", False))
    if outcome.error:
        lines.append((f"nodecheck {mode}: {outcome.error}", True))
    if outcome.slurm_error:
        lines.append((f"nodecheck {mode}: {outcome.slurm_error}", True))
    return lines




def config_check_lines(name: str, where: str, report: Report, rows, findings, failing, reason: str | None, fail_severity: str,
                       measured: list[tuple[str, bool]] = ()) -> list[str]:
    """`nodecheck config check` as text: each expectation beside the node's value, the findings (those that
    fail the prolog first), a saved Report's measurements judged by the config (config_check.as_the_prolog_judges:
    whether the prolog runs each), and what the prolog would do."""
    rows = folded(rows)
    width = max((len(key) for key, _, _ in rows), default=0)
    lines = [f"{clean(name)}: valid. On {clean(where)} ({clean(report.node.get('hostname') or 'host name unknown')}):"]
    lines += [f"  {clean(key):<{width}}  expects {clean(expected):<22} has {clean(has)}" for key, expected, has in rows]
    lines += [f"  {f.severity}: {clean(f.message)}" for f in failing + [f for f in findings if f not in failing]]
    if measured:
        lines.append("  its measurements, judged by this config's thresholds:")
        lines += [f"    {clean(text)}" + ("" if counted else " (not in [prolog] bench: the prolog does not run it)")
                  for text, counted in measured]
    if reason:
        return lines + [f"the prolog would drain {clean(where)} with this config: {clean(reason)}"]
    below = f" ({len(findings)} finding(s) below {fail_severity})" if findings else ""
    return lines + [f"the prolog's node check passes on {clean(where)} with this config{below}"]


FOLD_AT = 4  # rows of one table with one expectation and one answer: past this many, one line says them all


def folded(rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Rows of one table ([links]) expecting the same and finding the same, folded into one row that names the first
    and last keys and how many (28 `links."gpuA-gpuB" expects NV18 has no such pair` lines read as one)."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for key, expected, has in rows:
        groups.setdefault((key.split(".", 1)[0], expected, has), []).append(key)
    out, said = [], set()
    for key, expected, has in rows:
        group = (key.split(".", 1)[0], expected, has)
        keys = groups[group]
        if len(keys) < FOLD_AT:
            out.append((key, expected, has))
        elif group not in said:
            said.add(group)
            out.append((f"{keys[0]} ... {keys[-1].split('.', 1)[-1]} ({len(keys)} keys)", expected, has))
    return out


def config_check_nodes_lines(name: str, where: str, judged: list[tuple[str, str, str | None]], skipped: list[tuple[str, str]]) -> list[str]:
    """`nodecheck config check FILE --from DIR` as text: the nodes the prolog would drain with this config, each
    with its reason ((host name, file, reason or None) each), how many pass, and the files that are no Report."""
    drained = [(host, file, reason) for host, file, reason in judged if reason]
    lines = [f"{clean(name)}: valid. On the {len(judged)} node(s) whose Reports are in {clean(where)} (as each was when "
             "its Report was written):"]
    lines += [f"  {clean(host)} ({clean(file)}): the prolog would drain it: {clean(reason)}" for host, file, reason in drained]
    lines.append(f"  {len(judged) - len(drained)} of {len(judged)} pass the prolog's node check with this config")
    lines += [f"  skipped {clean(file)}: {clean(why)}" for file, why in skipped]
    if not judged:
        lines.append(f"  no Report could be read in {clean(where)}")
    return lines
