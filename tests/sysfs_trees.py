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
