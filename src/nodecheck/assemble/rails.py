"""The rails of a GPU node: the RDMA NICs NCCL moves a job's inter-node data over, and what they allow. `bench`
bounds a job by them (src/nodecheck/bench/distributed.py); `scale` predicts with them when nothing was measured
(src/nodecheck/scale.py). Pure: reads the Report, the Config and the NCCL variables given."""

from __future__ import annotations

from nodecheck.assemble.paths import gpu_hops, gpu_nvlink_spec, nic_pcie_bound
from nodecheck.core.ifnames import nccl_selection
from nodecheck.core.pairing import rails_capacity
from nodecheck.core.pci import link_of, normal_pci
from nodecheck.report.model import Report


def nic_rate(report: Report, nic, config) -> float | None:
    """A NIC's one-way rate in bytes/s: [nics] speed_mbps from the config, else its negotiated speed; either
    bounded by its PCIe path where that is slower (its path spec)."""
    expected = config.nic_speed_mbps(nic) if config and nic else None
    path = report.path_spec(f"nic:{nic.name}") if nic else None
    if not expected:
        return path.bytes_per_second if path else None
    if path and path.line_bytes_per_second and path.bytes_per_second:
        return min(expected * 1e6 / 8, path.bytes_per_second)
    return expected * 1e6 / 8


def fabric_nics(report: Report, environ: dict[str, str]) -> list:
    """The RDMA NICs NCCL moves inter-node data over on a GPU node: RDMA devices with an ACTIVE port,
    as NCCL_IB_HCA selects them (NCCL's syntax; the environment's, else /etc/nccl.conf's), and of those the rails: the ones nearest to the node's
    GPUs (every one of them when the topology names none). [] with NCCL_IB_DISABLE=1 or no RDMA device:
    NCCL then falls back to sockets over the traffic NIC."""
    environ = nccl_environ(report, environ)
    if environ.get("NCCL_IB_DISABLE", "").strip() == "1":
        return []
    active = report.rdma_nics_up()
    hca = environ.get("NCCL_IB_HCA")
    if hca and hca.strip():
        chosen = set(nccl_selection(hca, [n.rdma_device for n in active]))
        active = [n for n in active if n.rdma_device in chosen]
    return near_gpus(active, report.gpus) or active


def nccl_environ(report: Report, environ: dict[str, str]) -> dict[str, str]:
    """The NCCL variables a job sees: the environment's, and /etc/nccl.conf's for what it leaves unset (as NCCL
    reads them)."""
    return {**(report.nccl_conf() or {}), **environ}


def near_gpus(nics: list, gpus: list) -> list:
    """Those of these NICs one of `gpus` is nearest to in the topology, by whichever name it gave them (the
    netdev's or the RDMA device's)."""
    nearest = {name for gpu in gpus for name in gpu.nearest_nics}
    return [n for n in nics if n.rdma_device in nearest or n.name in nearest]


def ring_bound(report: Report, nics: list, config) -> tuple[float | None, str]:
    """The busbw bound of a ring all-reduce across nodes over these rails: NCCL runs one ring per rail,
    each crossing between nodes once per node over its own NIC, so a node's inter-node traffic is
    spread over all its rails and busbw (algbw x 2(n-1)/n) is bounded by the sum of their one-way data
    rates (docs/report-schema.md, "Across nodes"). Tree, SHARP and NVLS algorithms move less data
    between nodes and can exceed it."""
    rails = rail_rates(report, nics, config)
    unknown = [r["name"] for r in rails if r["rate"] is None]
    if unknown:
        return None, f"the rate of {unknown[0]} is unknown"
    total = rails_capacity(rails)
    shared = "" if total >= sum(r["rate"] for r in rails) else ", bounded by the PCIe links rails share"
    return total, (f"ring bound: {len(rails)} rail(s) ({','.join(r['name'] for r in rails)}), {total * 8 / 1e9:g} Gbit/s "
                   f"one way in all{shared}")


def rail_rates(report: Report, nics: list, config) -> list[dict]:
    """[{"name", "rate", "link", "link_rate"}] for these NICs: the RDMA device's name where it has one; the
    rate in bytes/s from [nics] speed_mbps, else the negotiated speed (None when neither is known); the PCIe
    link its traffic crosses (pci.link_of: the ports of a dual-port card share one) and what that path moves
    (its slowest hop), each where known: a job's bound counts a shared link once (pairing.rails_capacity)."""
    hops = report.hops()
    shared = gpu_hops(report, hops)
    rails = []
    for nic in nics:
        rail = {"name": nic.rdma_device or nic.name, "rate": nic_rate(report, nic, config)}
        address = normal_pci(nic.pci_address)
        path = hops.get(address, []) if address else []
        bound = nic_pcie_bound(path, shared)
        if address:
            rail["link"] = link_of(address, path)
        if bound:
            rail["link_rate"] = bound[0].bytes_per_second
        rails.append(rail)
    return rails


def rank_rails(report: Report, gpu, fabric: list) -> list:
    """The rails a rank's traffic leaves by: those nearest its GPU (a one-rank-per-node job drives one GPU
    and its NIC, not the node's eight), or every rail when the topology names none near it."""
    return near_gpus(fabric, [gpu] if gpu is not None else []) or fabric


def rank_nvlink(report: Report, gpu, environ: dict[str, str]) -> dict | None:
    """{"domain", "rate", "basis"} for a rank whose GPU is registered in a multi-node NVLink domain (GB200 NVL72:
    NVML's fabric names a cluster, and registration completed): NCCL carries the job over NVLink to every GPU of
    the same cluster and clique, at the GPU's NVLink rate (its active links, by its architecture; rate None where
    unknown). None outside such a domain, where IMEX is not ready (Report.nvlink_across_nodes), or with
    NCCL_MNNVL_ENABLE=0 (the environment's, else /etc/nccl.conf's): the job's data leaves by the rails."""
    fabric = gpu.fabric if gpu is not None else None
    if fabric is None or not fabric.cluster_uuid or not fabric.registered or not report.nvlink_across_nodes()[0]:
        return None  # without IMEX ready a GPU shares no memory across nodes: the job takes the rails
    if nccl_environ(report, environ).get("NCCL_MNNVL_ENABLE", "").strip() == "0":
        return None
    spec, why = gpu_nvlink_spec(gpu, sum(1 for link in gpu.nvlinks if link.get("active")))
    return {"domain": f"{fabric.cluster_uuid}/{fabric.clique_id}", "rate": spec.bytes_per_second if spec else None,
            "basis": spec.basis if spec else why}
