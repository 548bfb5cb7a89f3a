"""`nodecheck config init`: a starting config written from a known-good node's facts (like NHC's genconf), so a
fleet is checked against its own golden node (src/nodecheck/config/__init__.py reads it back)."""

from __future__ import annotations

from nodecheck.config import GPU_LIMITS
from nodecheck.report.findings import one_line
from nodecheck.report.model import Report


def generate(report: Report) -> str:
    """A starting config holding this node's facts: GPU count, PCIe, NVLinks, link types, NIC speeds."""
    lines = [f"# nodecheck expectations, generated from {one_line(str(report.node.get('hostname') or 'this node'))}.",
             "# Review, then install as /etc/nodecheck/config.toml on every node of this kind.", "", "[gpus]"]
    # the GPUs the node has, not only those that answer now: a lost GPU must not become the node type's count
    count = max(len(report.gpus) + len(report.gpus_inaccessible), len(report.driver_gpus or []))
    if count > len(report.gpus):
        lines.append(f"# {len(report.gpus)} GPUs answer on this node now: it is no golden node until all {count} do")
    lines += _within("count", count)
    pcie = [g.pcie for g in report.gpus if g.pcie]
    if pcie and all(p.get("gen_max") for p in pcie):
        lines += _within("pcie_gen", min(p["gen_max"] for p in pcie))
    if pcie and all(p.get("width_max") for p in pcie):
        lines += _within("pcie_width", min(p["width_max"] for p in pcie))
    active = [sum(1 for l in g.nvlinks if l["active"]) for g in report.gpus]
    if active and min(active) > 0:
        lines += _within("nvlinks_per_gpu", min(active))
    if report.gpus and all(g.ecc_enabled for g in report.gpus):
        lines.append("ecc = true")
    modes = {g.mig_enabled for g in report.gpus}
    if len(modes) == 1 and None not in modes:  # the golden node's MIG mode, where NVML said it for every GPU
        lines.append(f"mig = {'true' if modes.pop() else 'false'}")
    compute = {g.compute_mode for g in report.gpus}
    if len(compute) == 1 and None not in compute and next(iter(compute)) != "exclusive_thread":
        lines.append(f"compute_mode = {toml_string(compute.pop())}")
    gpu_links = [l for l in report.links if isinstance(l.a, int) and isinstance(l.b, int)]
    if gpu_links:
        lines += ["", "[links]"] + [f'"gpu{l.a}-gpu{l.b}" = {toml_string(l.type)}' for l in gpu_links]
    for nic in report.nics:
        speed = nic_mbps(report, nic)
        if nic.state == "up" and not nic.virtual and speed:
            lines += ["", f"[nics.{toml_string(nic.name)}]", f"speed_mbps = {speed}", 'state = "up"']
    lines += ["", "[thresholds]", "bandwidth_ratio = 0.8", 'fail_severity = "error"', ""]
    return "\n".join(lines)


def _within(key: str, value: int) -> list[str]:
    """`key = value` for [gpus], or, where the node reports what the config reader refuses (NVML's answer from a broken
    driver or a snapshot), a comment saying so: the config written must load."""
    low, high = GPU_LIMITS[key]
    if isinstance(value, int) and low <= value <= high:
        return [f"{key} = {value}"]
    return [f"# {key}: this node reports {str(value)[:20]}, not from {low} to {high}: not written"]


def nic_mbps(report: Report, nic) -> int | None:
    spec = report.path_spec(f"nic:{nic.name}")
    rate = spec and spec.link_bytes_per_second  # its link's, not its PCIe path's
    return round(rate * 8 / 1e6) if rate else None


def toml_string(value) -> str:
    """A TOML basic string of `value` (a NIC's name from sysfs or a snapshot may hold a quote, a backslash or a
    control character, which TOML must have escaped); a character that is no Unicode scalar (a byte sysfs gave
    that is not UTF-8) becomes U+FFFD."""
    out = []
    for char in str(value):
        if char in '"\\':
            out.append("\\" + char)
        elif char < " " or char == "\x7f":
            out.append(f"\\u{ord(char):04x}")
        elif "\ud800" <= char <= "\udfff":
            out.append("\ufffd")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
