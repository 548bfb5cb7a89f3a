"""Which GID NCCL puts on each active RoCE rail's packets, and whether that GID routes (roce_gid_unroutable).

NCCL takes NCCL_IB_GID_INDEX where it is set; otherwise it walks the port's GID table for an address of
NCCL_IB_ADDR_FAMILY (IPv4 unless set) of RoCE version NCCL_IB_ROCE_VERSION_NUM (2 unless set), starting from index 0,
the link-local fe80:: GID every RoCE port has (src/transport/net_ib: ncclIbGetGidIndex, ncclUpdateGidIndex). A rail
without its IPv4 address leaves NCCL on that link-local GID (Broadcom NICs whose GIDs were all IPv6: uccl#803, "an
unroutable link-local address ... IBV_WC_RETRY_EXC_ERR on all RDMA operations"), and an index pinned to a link-local
or unset entry does the same: "Call to ibv_modify_qp failed with error Connection timed out" (NVIDIA/nccl#769, with
GID 1 = fe80::... RoCE v2). The node's links all pass; every job across nodes over that rail hangs or fails.

Warnings: /etc/nccl.conf is what the rule judges; what an NCCL run (bench's, in a job's environment) logged it took
from its environment is judged with the run (src/nodecheck/verdicts/nccl_run.py). A job's own environment may set otherwise, and a
fabric of one switch can run on link-local GIDs. NCCL_IB_ADDR_RANGE (`a.b.c.d/len`) narrows the walk to the GIDs
whose address lies in it, as envIbAddrRange and matchGidAddrPrefix read it: a range that holds none of the rail's
addresses leaves NCCL on the link-local GID too. Pure: reads the Report."""

from __future__ import annotations

from nodecheck.assemble.roce_gid import active_roce_ports, asked_settings, gid_family, in_range, nccl_roce_ports, routable
from nodecheck.checks.base import Check, Kind
from nodecheck.probes.roce_gids import ZERO_GID
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def roce_gid_findings(report: Report, config=None, settings: dict[str, str] | None = None,
                      where: str = "/etc/nccl.conf") -> list[Finding]:
    """`settings`: what an NCCL run took from its environment (nccl_run: "NCCL_IB_GID_INDEX set by environment to 3"),
    read over /etc/nccl.conf's, as NCCL reads them; `where` names their source in the finding."""
    asked = {**(report.nccl_conf() or {}), **(settings or {})}
    family, version, pinned, within = asked_settings(asked)
    narrowed = f", NCCL_IB_ADDR_RANGE={asked['NCCL_IB_ADDR_RANGE'][:50]}" if within is not None else ""
    findings = []
    for port, auto, netdevs in nccl_roce_ports(report, asked):
        index = pinned if pinned >= 0 else auto
        gid = (port.gids or {}).get(str(index), ZERO_GID)
        if routable(gid) and (pinned >= 0 or port.gid_versions.get(str(index)) == version):
            continue
        how = (f"NCCL_IB_GID_INDEX={pinned} ({where}) names" if pinned >= 0 else
               f"with NCCL_IB_GID_INDEX unset, NCCL ({family}, RoCE v{version}{narrowed}) "
               + ("takes" if routable(gid) else "falls back to"))
        short = ("unset" if gid == ZERO_GID else "link-local" if not routable(gid) else
                 f"RoCE v{port.gid_versions.get(str(index), '?')}")
        what = "an unset entry" if gid == ZERO_GID else f"{gid}, {short}"
        outside = [g for g in (port.gids or {}).values() if within is not None and gid_family(g) == family and routable(g)
                   and not in_range(g, family, within)]
        fix = ("RoCE v1 does not cross a router, and the port lists no RoCE v2 GID for this address: enable RoCE v2 "
               "on the NIC" if routable(gid) else
               f"NCCL_IB_ADDR_RANGE ({where}) leaves out the port's address {outside[0]}: set it to the rails' subnet, "
               "or unset it" if outside and pinned < 0 else
               f"give {netdevs} its {'IPv4' if family == 'AF_INET' else 'IPv6'} address, or set NCCL_IB_GID_INDEX to "
               "the entry `show_gids` lists for it (the same on every node)")
        findings.append(Finding(
            "roce_gid_unroutable", "warning", f"{port.device}/{port.port}", f"GID {index} {short}",
            f"a routable RoCE v{version} GID",
            f"{port.device}/{port.port} ({netdevs}): {how} GID {index}: {what}; packets from it do not route across "
            f"subnets, and every NCCL connection across nodes over this port times out (\"ibv_modify_qp failed with "
            f"error Connection timed out\"); {fix}"))
    return findings


def gids_unread(report: Report) -> dict[str, str]:
    """A RoCE rail whose GID table was not read: NCCL's choice there is unknown, not routable."""
    port = next((p for p in active_roce_ports(report) if p.gids is None), None)
    if port is None:
        return {}
    return {ROCE_GID_UNROUTABLE.name: f"{port.device}/{port.port}: its GID table was not read (a snapshot from before "
                                      "nodecheck read it?)"}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
ROCE_GID_UNROUTABLE = Kind("roce_gid_unroutable", "fabric", "{subject} {measured}", signal=True,
    doc=(
        ("warning",
         "an ACTIVE RoCE port NCCL would use (`NCCL_IB_HCA` of /etc/nccl.conf) whose GID NCCL takes does not route: with "
         "`NCCL_IB_GID_INDEX` unset, NCCL's own walk of the GID table (`NCCL_IB_ADDR_FAMILY` IPv4 unless set, "
         "`NCCL_IB_ROCE_VERSION_NUM` 2 unless set, `NCCL_IB_ADDR_RANGE` `a.b.c.d/len` narrowing it to the addresses in that "
         "range, read as NCCL reads it) ends on the link-local fe80:: GID (the rail's netdev has no address of that family, or "
         "none in the range: the message names the address the range leaves out), or the index /etc/nccl.conf pins (or an NCCL "
         "run on this node, bench's in a job's environment, logged it took: \"NCCL_IB_GID_INDEX set by environment to 3\") "
         "names a link-local or unset entry. Subject `DEVICE/PORT`; `measured` \"GID 0 link-local\". Every NCCL connection "
         "across nodes over the port times out (NVIDIA/nccl#769). The table's set entries are read, to 32 unset in a row (the "
         "kernel fills the lowest free entry) (`ports/N/gids/I`, `gid_attrs/types/I`: IbPort `gids`, `gid_versions`). A "
         "warning: a job's own environment may set otherwise, and a one-switch fabric can run on link-local GIDs; joined to the"
         " all-reduce across nodes over that NIC. Unknown (never healthy) where an active RoCE port's table was not read"),
    ))

CHECK = Check((ROCE_GID_UNROUTABLE,), roce_gid_findings, needs="nics", unknown=gids_unread)
