"""The IPv4 and IPv6 addresses of this machine's interfaces, from getifaddrs(3) through ctypes: what
psutil.net_if_addrs() reads, without its 18 ms import on every `nodecheck inspect`."""

from __future__ import annotations

import ctypes
import os
import socket


class _Sockaddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 14)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_Sockaddr)), ("netmask", ctypes.POINTER(_Sockaddr)),
                     ("broadaddr", ctypes.POINTER(_Sockaddr)), ("data", ctypes.c_void_p)]

# where the address sits in each family's sockaddr: sockaddr_in (port, then 4 bytes), sockaddr_in6 (port,
# flow info, then 16 bytes)
_LAYOUT = {socket.AF_INET: ("inet", 4, 4), socket.AF_INET6: ("inet6", 8, 16)}
MAX_ADDRESSES = 65536


def _raw(pointer, family: int) -> bytes:
    _, offset, size = _LAYOUT[family]
    return ctypes.string_at(ctypes.addressof(pointer.contents) + offset, size)


def interface_addresses() -> dict[str, list[dict]]:
    """{interface: [{family, address, prefixlen}]}, IPv4 and IPv6 only; OSError when getifaddrs fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"getifaddrs: {os.strerror(error)}")
    out: dict[str, list[dict]] = {}
    try:
        entry, seen = head, 0
        while entry and seen < MAX_ADDRESSES:
            seen += 1
            item = entry.contents
            family = item.addr.contents.family if item.addr else None
            if family in _LAYOUT and item.netmask and item.name:
                kind = _LAYOUT[family][0]
                address = socket.inet_ntop(family, _raw(item.addr, family))
                prefixlen = sum(bin(byte).count("1") for byte in _raw(item.netmask, family))
                name = item.name.decode("utf-8", "replace")
                out.setdefault(name, []).append({"family": kind, "address": address, "prefixlen": prefixlen})
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return out
