"""A small cluster of "nodes" as network namespaces on one bridge (198.18.0.0/24), links shaped with
tc tbf in both directions (after ../shared/recipes/netns-cluster.sh). Removed on exit."""

from __future__ import annotations

import subprocess
import uuid


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=10, capture_output=True)


class Cluster:
    def __init__(self, size: int) -> None:
        self.tag = tag = uuid.uuid4().hex[:5]
        self.fabric = f"nc-fab-{tag}"
        self.routed: list[str] = []  # namespaces added by add_routed_node (router first)
        self.nodes = [f"nc-n{i}-{tag}" for i in range(size)]
        self.addresses = [f"198.18.0.{i + 1}" for i in range(size)]
        self.ports = [f"p{i}-{tag}" for i in range(size)]

    def __enter__(self) -> "Cluster":
        try:
            ip("netns", "add", self.fabric)
            ip("-n", self.fabric, "link", "add", "br0", "type", "bridge")
            ip("-n", self.fabric, "link", "set", "br0", "up")
            for node, address, port in zip(self.nodes, self.addresses, self.ports, strict=True):
                ip("netns", "add", node)
                ip("link", "add", "eth0", "netns", node, "type", "veth", "peer", "name", port, "netns", self.fabric)
                ip("-n", self.fabric, "link", "set", port, "master", "br0", "up")
                ip("-n", node, "addr", "add", f"{address}/24", "dev", "eth0")
                ip("-n", node, "link", "set", "eth0", "up")
                ip("-n", node, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def shape(self, index: int, rate: str) -> None:
        """Both directions of node `index`: its eth0 (egress) and the bridge port facing it (its ingress)."""
        for ns, dev in ((self.nodes[index], "eth0"), (self.fabric, self.ports[index])):
            ip("-n", ns, "link", "set", dev, "up")
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                            "rate", rate, "burst", "256kb", "latency", "20ms"], check=True, timeout=10, capture_output=True)

    def add_routed_node(self) -> tuple[str, str]:
        """One more node in another subnet (198.18.1.2/24) behind a router on the bridge (198.18.0.254):
        reachable from every node, but through a gateway. Returns (namespace, address)."""
        router, node = f"nc-r-{self.tag}", f"nc-x-{self.tag}"
        self.routed += [router, node]
        ip("netns", "add", router)
        ip("netns", "add", node)
        ip("link", "add", "eth0", "netns", router, "type", "veth", "peer", "name", f"pr-{self.tag}", "netns", self.fabric)
        ip("-n", self.fabric, "link", "set", f"pr-{self.tag}", "master", "br0", "up")
        ip("link", "add", "eth1", "netns", router, "type", "veth", "peer", "name", "eth0", "netns", node)
        for ns, dev, address in ((router, "eth0", "198.18.0.254/24"), (router, "eth1", "198.18.1.1/24"), (node, "eth0", "198.18.1.2/24")):
            ip("-n", ns, "addr", "add", address, "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
        ip("-n", node, "link", "set", "lo", "up")
        subprocess.run(["ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True, timeout=10)
        ip("-n", node, "route", "add", "default", "via", "198.18.1.1")
        for member in self.nodes:
            ip("-n", member, "route", "add", "198.18.1.0/24", "via", "198.18.0.254")
        return node, "198.18.1.2"

    def __exit__(self, *exc) -> None:
        for ns in self.nodes + self.routed + [self.fabric]:
            subprocess.run(["ip", "netns", "del", ns], timeout=10, capture_output=True)
