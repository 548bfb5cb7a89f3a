"""What an NCCL run did: the transports and rails it chose, and the settings it took. Judged from the run's own
debug output (verdicts/nccl_run.py: `bench`, `bench --nccl-log`, `nccl-log`), declared here with the other checks;
unknown until an NCCL run recorded what it chose."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.report.model import Report


def no_nccl_run(report: Report) -> dict[str, str]:
    if any(isinstance(m.details, dict) and m.details.get("nccl") for m in report.measurements):
        return {}
    return {kind.name: "no NCCL run recorded what it chose" for kind in CHECK.kinds}


NCCL_SOCKET_FALLBACK = Kind("nccl_socket_fallback", "fabric", "NCCL over sockets, RDMA NICs up",
    doc=(
        ("warning",
         "an NCCL debug log (`nodecheck nccl-log`) shows inter-node traffic over TCP sockets while this node has RDMA NICs up"),
    ))
NCCL_NO_GDR = Kind("nccl_no_gdr", "fabric", "NCCL without GPUDirect RDMA",
    doc=(
        ("warning",
         "the log's network channels run without GPUDirect RDMA (no `/GDRDMA`): data staged through host memory. The "
         "cause NCCL printed is named: an HCA it found no GPUDirect on (\"GPU Direct RDMA Disabled for HCA 1 'mlx5_1' "
         "(no module)\": no peer-memory module, no DMA-BUF; aws-ofi-nccl's \"disabling GDR\"), the run's "
         "`NCCL_NET_GDR_LEVEL` below the node's GPU-NIC switch, or NCCL's distance rule (\"distance 5 > 4\") on a node "
         "whose GPUs share a PCIe switch with an RDMA NIC (NCCL's picture of the PCI tree is not the node's)"),
        ("info",
         "the same on a node whose GPUs give NICs no GPUDirect RDMA by design (DGX Spark's GB10, NVIDIA's DGX Spark porting "
         "guide: unified memory; specs.toml `[[no_gpudirect_rdma]]`), or on a node where no GPU shares a PCIe switch with an RDMA NIC (`topo -m` NODE, PHB or SYS: NCCL stages "
         "through the CPU there by design, NCCL_NET_GDR_LEVEL defaulting to PXB, NVIDIA/nccl#465), or where only NCCL's "
         "distance rule says why and the node's GPU-NIC paths are unknown"),
    ))
NCCL_P2P_DISABLED = Kind("nccl_p2p_disabled", "fabric", "NCCL over {measured} inside the node",
    doc=(
        ("warning",
         "two GPUs of one node talked over SHM although the topology links that pair by NVLink or a PCIe switch "
         "(PIX, PXB), where NCCL takes P2P unless told otherwise (the run's NCCL_P2P_LEVEL moves that line; "
         "NCCL_P2P_DISABLE=1 is said as `nccl_setting`); SHM past PXB (PHB, NODE, SYS) is NCCL's default "
         "(src/graph/paths.cc), no finding, as on a pair NVML says has no P2P (GeForce). A log whose SHM lines name no "
         "GPUs is held against the node's closest link; also channels through the network in a log naming one host whose "
         "ranks fit the node, where that host printed more ranks of a communicator than NCCL counted per node "
         "(`localRanks`): NCCL took its ranks for different hosts"),
        ("info",
         "the same channels through the network where NCCL printed no per-node count (before 2.19): that, or a paste of one "
         "host's lines of a job across nodes. Where every rank the host printed fits NCCL's count, no finding"),
    ))
NCCL_RAIL_MISMATCH = Kind("nccl_rail_mismatch", "fabric", "{subject} NCCL on {measured}, nearest {expected}",
    doc=(
        ("warning",
         "a GPU of this node (matched by host name) whose NCCL network channels use only HCAs that are not its nearest NICs by "
         "`nvidia-smi topo -m` (the log must hold NCCL's `NET/IB : Using [N]hca:port` list; PXN channels are not counted): "
         "subject the GPU, measured the HCAs used, expected the nearest"),
    ))
NCCL_WARNING = Kind("nccl_warning", "fabric", "{head}",
    doc=(
        ("warning",
         "an `NCCL WARN` line of the log, quoted (ten at most; the rest counted)"),
    ))
NCCL_IB_ERROR = Kind("nccl_ib_error", "fabric", "NCCL IB transfers failed: {measured}",
    doc=(
        ("warning",
         "the log's NET/IB \"Got completion ... with error N\" / \"with status=N\" WARN lines (NCCL's IB transport: a work "
         "request failed and the job died), judged together instead of quoted: the commonest status that is not a flush "
         "(libibverbs' name for it; 5, flushed, follows an earlier error), what NCCL's maintainers say it means (12: the two "
         "NICs cannot reach each other or the path is too lossy; 4: usually ACS breaking GPUDirect RDMA), and the end the "
         "failed connections share: subject the peer several hosts failed with (its address, and its host where the log's "
         "Bootstrap or OOB lines name it), the host (and HCA) that failed with several peers or logged a local error, or "
         "`host -> peer` for one connection; measured `status N (name) xCOUNT`. Each record is in `details.nccl.ib_errors`"),
    ))
NCCL_FABRIC_NOT_READY = Kind("nccl_fabric_not_ready", "fabric", "{subject} NVLink fabric {measured}",
    doc=(
        ("error",
         "the log's `MNNVL busId ... state S` line (NCCL 2.20 on: what NVML's fabric info told it at init) gives a GPU's "
         "NVLink fabric registration as not started (1), in progress (2) or a state this nodecheck does not know: that GPU "
         "takes no part in NVLink peer traffic, and NCCL keeps multi-node NVLink off for every communicator with it in "
         "(src/mnnvl.cc), so their traffic between nodes takes the network; subject the host, measured its GPUs' bus ids "
         "and the state. Each GPU's reading is in `details.nccl.fabric`"),
    ))
NCCL_FABRIC_UNHEALTHY = Kind("nccl_fabric_unhealthy", "fabric", "{subject} NVLink fabric {measured}",
    doc=(
        ("error, warning",
         "the `healthMask` of a registered GPU's `MNNVL busId` line raises a fabric health condition (NVML's "
         "NVML_GPU_FABRIC_HEALTH_MASK_* bits, two per condition: 1 raised, 2 not, 0 not reported; 0xaa, every "
         "condition not raised, is healthy): an unhealthy route, an incorrect configuration or a disconnected global "
         "fabric manager is an error, degraded bandwidth or a recovery in progress a warning, as for the node's own "
         "`gpu_fabric_unhealthy`; subject the host"),
    ))
NCCL_MNNVL_OFF = Kind("nccl_mnnvl_off", "fabric", "NCCL {measured}",
    doc=(
        ("warning",
         "a communicator across nodes printed `MNNVL 0` (\"comm ... nNodes 2 ... MNNVL 0\") while the log's GPUs on two "
         "hosts or more all report one NVLink domain and clique (one non-zero fabric UUID), each registered: its traffic "
         "between the nodes took the network instead of NVLink. The cause the log holds is named: the run's "
         "`NCCL_MNNVL_ENABLE=0`, `NCCL_CUMEM_ENABLE=0` (MNNVL needs cuMem), `NCCL_P2P_DISABLE=1` or `NCCL_P2P_LEVEL=LOC`; "
         "else NCCL's other conditions (the driver's fabric handles, IMEX). GPUs in several domains or cliques (a job "
         "across racks or partitions), or fabric lines from one host only, are no finding"),
    ))
NCCL_NVLS_FAILED = Kind("nccl_nvls_failed", "fabric", "{subject} NCCL NVLS {measured}",
    doc=(
        ("error",
         "NCCL's NVLink SHARP transport failed a CUDA call while setting up a communicator (its WARN lines from "
         "`transport/nvls.cc`, \"Cuda failure 401 'the operation cannot be performed in the present state'\", or \"Failed "
         "to bind NVLink SHARP (NVLS) Multicast memory ... : CUDA error N\"): the communicator failed to initialise, and so "
         "does every job NCCL gives NVLS on that node (its default on an NVSwitch board of Hopper or later). NCCL: "
         "\"usually caused by a system or configuration error in the Fabric Manager or NVSwitches\"; NVIDIA on H800 "
         "(NVIDIA/nccl#1338): typically Fabric Manager not restarted correctly, the GPUs to be reset after it is "
         "(#1488). Judged together instead of quoted: subject the host(s), measured the commonest CUDA error and its "
         "count; each record in `details.nccl.nvls_errors`. \"NVLS multicast support is not available\" is no finding "
         "(NCCL's choice on a board without NVLink SHARP)"),
    ))
NCCL_SETTING = Kind("nccl_setting", "fabric", "NCCL run took {measured}",
    doc=(
        ("warning",
         "the NCCL run (bench's, or a log given to `nodecheck nccl-log` or `bench --nccl-log`) took a debugging variable from "
         "its environment (\"NCCL_PROTO set by environment to simple\": the job's environment, or /etc/nccl.conf's values, "
         "which NCCL loads into it): `NCCL_P2P_DISABLE=1`, `NCCL_SHM_DISABLE=1`, `NCCL_P2P_LEVEL`/`NCCL_NET_GDR_LEVEL` `LOC` or"
         " `0`, any `NCCL_ALGO` or `NCCL_PROTO`; or an `NCCL_IB_HCA` that selects none of the active RDMA devices or leaves out"
         " one nearest to a GPU (expected \"every rail (8)\"; bench judges the run against the rails it selected, so this is "
         "where the job's shortfall is said; the same value in /etc/nccl.conf is `nccl_config`'s); subject `nccl`, measured "
         "`NAME=value`. The settings NCCL logged are in `details.nccl.settings` (at most 64)"),
    ))

CHECK = Check((NCCL_SOCKET_FALLBACK, NCCL_NO_GDR, NCCL_P2P_DISABLED, NCCL_RAIL_MISMATCH, NCCL_WARNING, NCCL_IB_ERROR,
               NCCL_FABRIC_NOT_READY, NCCL_FABRIC_UNHEALTHY, NCCL_MNNVL_OFF, NCCL_NVLS_FAILED, NCCL_SETTING),
              made_by="an NCCL run", unknown=no_nccl_run)
