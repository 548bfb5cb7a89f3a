"""Other nodes, for the prolog's proximity check: a name resolved, the kernel's route to an address, the round
trip of a TCP connect."""

from __future__ import annotations

import socket
import time

from nodecheck.core.errors import NodecheckError

CONNECT_ATTEMPTS = 3  # the fastest of these is the round trip: one slow SYN is noise, not distance


def resolve_name(name: str, port: int) -> str:
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise NodecheckError(f"{name} does not resolve ({error.strerror})") from None
    return infos[0][4][0]


def route_to(address: str, interface: str | None) -> tuple[str, str | None, list[str]]:
    """(interface, gateway, the interface's networks) the kernel would use to reach `address`; with
    `interface` given, that interface's networks (the route is still the kernel's, for the gateway)."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            route = ipr.route("get", dst=address)[0]
        except NetlinkError as error:
            raise NodecheckError(f"no route to {address} ({error})") from None
        gateway = route.get_attr("RTA_GATEWAY")
        if interface is not None:
            links = ipr.link_lookup(ifname=interface)
            if not links:
                raise NodecheckError(f"interface {interface} (config [proximity] interface) does not exist")
            index = links[0]
        else:
            index = route.get_attr("RTA_OIF")
            interface = ipr.get_links(index)[0].get_attr("IFLA_IFNAME")
        networks = [f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(index=index)]
    return interface, gateway, networks


def connect_rtt_ms(address: str, port: int, timeout: float) -> float:
    """The fastest of a few TCP connects (SYN -> SYN-ACK or RST), in milliseconds."""
    best = None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for _ in range(CONNECT_ATTEMPTS):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            started = time.perf_counter()
            try:
                sock.connect((address, port))
            except ConnectionRefusedError:
                pass  # the RST came back: a round trip all the same
            except socket.timeout:
                raise NodecheckError(f"no answer from {address}:{port} within {timeout:g} s") from None
            except OSError as error:
                raise NodecheckError(f"cannot reach {address}:{port} ({error.strerror or error})") from None
            elapsed = (time.perf_counter() - started) * 1000
        best = elapsed if best is None else min(best, elapsed)
    return round(best, 3)
