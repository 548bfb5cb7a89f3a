"""Build /sys trees from captured real values, so the real sysfs reader runs against them
(LiveHost(root=tree)). Nothing here re-implements the reader."""

from __future__ import annotations

import os
import re
from pathlib import Path

# ibstat prints the rate alone; the kernel's sysfs file reads "<rate> Gb/sec (<width>X <speed>)".
_IB_RATE_NAMES = {"400": "4X NDR", "200": "4X HDR", "100": "4X EDR", "56": "4X FDR", "40": "4X QDR"}
_IB_STATES = {"Active": "4: ACTIVE", "Down": "1: DOWN", "Initializing": "2: INIT", "Armed": "3: ARMED"}
_IB_PHYS = {"LinkUp": "5: LinkUp", "Disabled": "3: Disabled", "Polling": "2: Polling", "Sleep": "1: Sleep"}


class CapturedTree:
    """A captured folder read as a host reads sysfs (read_text: its text, None when absent), for a reader that
    takes paths relative to it (src/nodecheck/probes/ib_counters.read_port_counters)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read_text(self, path: str) -> str | None:
        file = self.root / path
        return file.read_text() if file.is_file() else None


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def net_tree_from_capture(root: Path, capture: str) -> None:
    """The '/sys/class/net' half of captures/h100-pcie-vm/sysfs.txt: '# /sys/class/net/X -> TARGET' then 'key: value'."""
    current = None
    for line in capture.split("# /sys/class/net, read with cat", 1)[1].splitlines():
        header = re.match(r"^# /sys/class/net/(\S+) -> /sys/(\S+)$", line)
        if header:
            name, target = header[1], header[2]
            current = root / "sys" / target
            link(root / "sys/class/net" / name, "../../" + target)
            current.mkdir(parents=True, exist_ok=True)
            continue
        key, _, value = line.partition(": ")
        if current is not None and key and not value.startswith("cat: "):  # 'cat: ... Invalid argument': unreadable
            write(current / key, value)


def ib_tree_from_ibstat(root: Path, ibstat: str) -> list[dict]:
    """/sys/class/infiniband/<ca>/ports/<n>/{state,phys_state,rate,link_layer} from ibstat's text. Returns the ports."""
    ports, ca, port = [], None, None
    for line in ibstat.splitlines():
        if m := re.match(r"^CA '(\S+)'", line):
            ca = m[1]
            pci = f"0000:{len(ports) + 0x10:02x}:00.0"
            link(root / "sys/class/infiniband" / ca / "device", f"../../../devices/pci0000:00/{pci}")
        elif m := re.match(r"^\s+Port (\d+):", line):
            port = {"ca": ca, "port": int(m[1])}
            ports.append(port)
        elif port is not None and (m := re.match(r"^\s+(State|Physical state|Rate|Link layer): (.+)$", line)):
            port[m[1]] = m[2].strip()
    for p in ports:
        base = root / "sys/class/infiniband" / p["ca"] / "ports" / str(p["port"])
        write(base / "state", _IB_STATES.get(p["State"], p["State"]))
        write(base / "phys_state", _IB_PHYS.get(p["Physical state"], p["Physical state"]))
        write(base / "rate", f"{p['Rate']} Gb/sec ({_IB_RATE_NAMES[p['Rate']]})" if p["Rate"] in _IB_RATE_NAMES else f"{p['Rate']} Gb/sec")
        write(base / "link_layer", p["Link layer"])
    return ports


def hca_below_switch_port(root: Path, port_source: Path) -> Path:
    """A node's /sys and /proc as the live reader sees them: one HCA, mlx5_0 (its netdev ibp26s0) at 0000:1a:00.0
    below the switch port 0000:16:00.0, both gen5 x16 with AER files at 0; its port 1 a copy of `port_source` (a
    captured ports/N folder); boot id ...0001 and an uptime of 1000 s. Returns the port's folder."""
    import shutil

    sys_ = root / "sys"
    port = sys_ / "class/infiniband/mlx5_0/ports/1"
    shutil.copytree(port_source, port, symlinks=False)
    hca = "pci0000:00/0000:16:00.0/0000:1a:00.0"
    for name, value in (("type", "32"), ("operstate", "up"), ("mtu", "4092")):
        write(sys_ / "devices" / hca / "net/ibp26s0" / name, value)
    link(sys_ / "class/infiniband/mlx5_0/device", f"../../../devices/{hca}")
    link(sys_ / "class/net/ibp26s0", f"../../devices/{hca}/net/ibp26s0")
    for bdf, real, kind in (("0000:1a:00.0", hca, "0x020700"), ("0000:16:00.0", "pci0000:00/0000:16:00.0", "0x060400")):
        folder = sys_ / "devices" / real
        for name, value in (("class", kind), ("current_link_width", "16"), ("max_link_width", "16"),
                            ("current_link_speed", "32.0 GT/s PCIe"), ("max_link_speed", "32.0 GT/s PCIe")):
            write(folder / name, value)
        for family, total in (("correctable", "TOTAL_ERR_COR"), ("nonfatal", "TOTAL_ERR_NONFATAL"), ("fatal", "TOTAL_ERR_FATAL")):
            write(folder / f"aer_dev_{family}", f"{total} 0")
        link(sys_ / "bus/pci/devices" / bdf, f"../../../devices/{real}")
    write(root / "proc/sys/kernel/random/boot_id", "3c0ffee0-0000-4000-8000-000000000001")
    write(root / "proc/uptime", "1000.00 1.00")
    return port
