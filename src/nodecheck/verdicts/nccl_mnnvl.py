"""What NCCL's reading of each GPU's NVLink fabric says (bench.nccl_mnnvl): a GPU whose registration had not completed, a
fabric health condition, and a job across the nodes of one NVLink domain whose NCCL kept multi-node NVLink (MNNVL) off.

NCCL turns MNNVL on for a communicator across nodes only when every rank's GPU reports fabric state 3 (completed) with a
non-zero cluster UUID, cuMem is enabled, the CUDA driver supports fabric handles and IMEX can export and import one
(src/mnnvl.cc, from 2.25; src/init.cc in 2.20 to 2.24, which also wanted one clique for all ranks), unless
NCCL_MNNVL_ENABLE=0 or P2P is off (NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL=LOC). Otherwise its traffic between nodes takes the
network: on a GB200 NVL72 rack, a few rails instead of 18 NVLinks per GPU. Pure: no I/O."""

from __future__ import annotations

from nodecheck.checks.fabric import WHERE_TO_LOOK, is_grave
from nodecheck.core.units import first_of
from nodecheck.probes.nvml_fabric import FABRIC_STATES, health_conditions
from nodecheck.report.findings import Finding

COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED


def mnnvl_findings(run) -> list[Finding]:
    """The findings NCCL's fabric lines and MNNVL decisions give, by themselves (no node needed)."""
    not_ready = [e for e in run.fabric if e["state"] != COMPLETED]
    return _not_ready(not_ready) + _unhealthy(run.fabric) + ([] if not_ready else _mnnvl_off(run))


def _state(value: int) -> str:
    return FABRIC_STATES[value].replace("_", " ") if value < len(FABRIC_STATES) else f"unknown ({value})"


def _by_host(entries: list[dict], key) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for entry in entries:
        groups.setdefault((entry["host"], key(entry)), []).append(entry)
    return groups


def _bus_ids(entries: list[dict]) -> str:
    return first_of([f"0x{e['bus_id']}" for e in entries], 4)


def _not_ready(entries: list[dict]) -> list[Finding]:
    findings = []
    for (host, state), group in _by_host(entries, lambda e: e["state"]).items():
        where = host[:60] or "a host the log does not name"
        findings.append(Finding(
            "nccl_fabric_not_ready", "error", where, f"busId {_bus_ids(group)}: {_state(state)}", "completed",
            f"NCCL read the NVLink fabric registration of {where}'s GPU {_bus_ids(group)} as {_state(state)} (its "
            f"`MNNVL busId` line, NVML fabric state {state}): such a GPU takes no part in NVLink peer traffic until it "
            "completes, and NCCL keeps multi-node NVLink off for every communicator with it in (src/mnnvl.cc): their "
            f"traffic between nodes goes over the network. On {where}: `nvidia-smi -q` (its Fabric section), "
            f"{WHERE_TO_LOOK}"))
    return findings


def _unhealthy(entries: list[dict]) -> list[Finding]:
    registered = [e for e in entries if e["state"] == COMPLETED]
    findings = []
    for (host, conditions), group in _by_host(registered, lambda e: tuple(health_conditions(e["health_mask"]))).items():
        if not conditions:
            continue
        where, said = host[:60] or "a host the log does not name", ", ".join(conditions)
        grave = is_grave(list(conditions))
        findings.append(Finding(
            "nccl_fabric_unhealthy", "error" if grave else "warning", where, said, "healthy",
            f"NCCL read {where}'s GPU {_bus_ids(group)} NVLink fabric as {said} (healthMask 0x{group[0]['health_mask']:x}, "
            "NVML's fabric health bits): "
            + (f"NVLink traffic through the fabric is at risk; on {where}: {WHERE_TO_LOOK}" if grave else
               "NVLink bandwidth may be below spec until it recovers: `nvidia-smi nvlink -s` there, and `nodecheck bench`")))
    return findings


def _mnnvl_off(run) -> list[Finding]:
    """A communicator across nodes that NCCL kept off multi-node NVLink, where the log's GPUs on two hosts or more report
    one NVLink domain and clique (the hardware offers it), all registered: what the log says turned it off."""
    spans = sorted({nodes for nodes, on in run.comm_mnnvl if nodes > 1 and on == 0})
    domains = {(e["uuid"], e["clique_id"]) for e in run.fabric}
    hosts = {e["host"] for e in run.fabric}
    if not spans or len(domains) != 1 or None in next(iter(domains)) or len(hosts) < 2:
        return []
    settings = run.settings
    causes = [f"{name}={settings[name]}" for name, values in _TURNS_OFF.items() if settings.get(name, "").strip().upper() in values]
    cause = (f"the run took {' and '.join(causes)} from its environment (the job's, or /etc/nccl.conf's)" if causes else
             "NCCL printed no cause: its other conditions are cuMem, the CUDA driver's fabric handles and IMEX "
             "(`nvidia-imex-ctl -N`; the job's container needs /dev/nvidia-caps-imex-channels)")
    return [Finding("nccl_mnnvl_off", "warning", "nccl", f"MNNVL 0 across {spans[-1]} nodes", "MNNVL 1",
                    f"NCCL kept multi-node NVLink off for a communicator across {spans[-1]} nodes whose GPUs on "
                    f"{len(hosts)} hosts share one NVLink domain (fabric UUID {next(iter(domains))[0]}, clique "
                    f"0x{next(iter(domains))[1]:x}): its traffic between the nodes took the network instead of NVLink; {cause}")]


# settings that keep NCCL off multi-node NVLink (src/init.cc, src/mnnvl.cc): the values that do
_TURNS_OFF = {"NCCL_MNNVL_ENABLE": ("0",), "NCCL_CUMEM_ENABLE": ("0",), "NCCL_P2P_DISABLE": ("1",),
              "NCCL_P2P_LEVEL": ("LOC", "0")}
