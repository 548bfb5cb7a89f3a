"""Which interfaces a communication library will use, read as the library reads its variables.

NCCL_SOCKET_IFNAME and NCCL_IB_HCA (NCCL's environment documentation; HCCL documents the same
syntax): a comma-separated list of name prefixes; a leading `^` turns the list into exclusions, a
leading `=` (after the `^`, if any) makes every entry an exact name; NCCL_IB_HCA entries may carry a
`:port`. Unset, NCCL leaves out `docker*` and `lo*`. GLOO_SOCKET_IFNAME (PyTorch): exact names,
comma-separated.
"""

from __future__ import annotations

NCCL_DEFAULT_EXCLUDED = ("docker", "lo")


def nccl_selection(spec: str | None, names: list[str]) -> list[str]:
    """The names (in the order given) that NCCL would pick with this NCCL_SOCKET_IFNAME / NCCL_IB_HCA."""
    if not spec or not spec.strip():
        return [n for n in names if not n.startswith(NCCL_DEFAULT_EXCLUDED)]
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    entries = [entry.split(":", 1)[0].strip() for entry in spec.split(",") if entry.strip()]

    def listed(name: str) -> bool:
        return any(name == entry if exact else name.startswith(entry) for entry in entries)

    return [n for n in names if listed(n) != exclude]


def gloo_selection(spec: str | None, names: list[str]) -> list[str]:
    """GLOO_SOCKET_IFNAME: exact names, in the order the variable lists them (absent ones left out)."""
    wanted = [entry.strip() for entry in (spec or "").split(",") if entry.strip()]
    return [name for name in wanted if name in names]
