"""`nodecheck nccl-job` at a terminal: what was read, the ranks named, what could not be judged."""

from __future__ import annotations

from nodecheck.render.table import clean


def nccl_job_lines(verdict, files: int, ranks: int, ras_reports: int, prom: tuple[int, int] = (0, 0)) -> list[str]:
    lines = []
    if files:
        lines.append(f"NCCL Inspector: {files} file(s), {ranks} rank(s), {verdict.comms} communicator(s), "
                     f"{verdict.ops} operation(s) with every rank's record")
    if ras_reports:
        lines.append(f"NCCL RAS: {ras_reports} report(s), read in the order given")
    if prom[0]:
        lines.append(f"NCCL Inspector (Prometheus): {prom[0]} file(s), {prom[1]} GPU(s)")
    if not verdict.named:
        lines.append("No rank holds the job back" if verdict.ops or ras_reports or prom[0] else "Nothing to compare: no operation has every rank's record")
    for entry in verdict.named:
        lines.append(clean(f"  {entry.why.replace('_', ' ')}: {entry.message}"))
        lines += [clean(f"    because {said}") for said in entry.because]
    lines += [clean(f"  note: {note}") for note in verdict.notes]
    return lines
