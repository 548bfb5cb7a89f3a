"""The tables nodecheck ships in core/data (specs.toml, xid.toml, sxid.toml), each read once."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


@lru_cache(maxsize=4)
def shipped_table(name: str) -> dict:
    return tomllib.loads(resources.files("nodecheck.core").joinpath(f"data/{name}").read_text())
