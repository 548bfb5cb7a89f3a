"""NVIDIA's Xid catalog, the rows nodecheck acts on (agent/data/xid.toml, each from its source): what an
Xid is called and whether it drains the node now or is watched for repeats."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ACTIONS = ("drain", "watch")


@dataclass(frozen=True)
class XidEntry:
    code: int
    name: str
    action: str  # drain (now) or watch (a warning; an error when it repeats on one GPU)
    sympathetic: bool = False  # follows another Xid and is that one's fault (45)
    listed: bool = True  # in the catalog file; False: an Xid nodecheck has no row for
    resolution: str = "UNKNOWN"  # the catalog's immediate resolution (RESET_GPU, RESTART_BM, WORKFLOW_...)
    short: str = ""  # what a drain reason calls it ("fallen off the bus"); the name when not given
    sustained: bool = False  # drains only when it repeats (92: a high single-bit ECC rate that goes on)

    @property
    def label(self) -> str:
        return self.short or self.name

    def advice(self, subject: str) -> str:
        """What NVIDIA's catalog says to do, in words."""
        index = subject[3:] if subject.startswith("gpu") else None
        reset = f"reset the GPU (`nvidia-smi -r -i {index}`)" if index else "reset the GPU"
        return {"RESET_GPU": f"{reset} when idle, or reboot", "RESTART_BM": "reboot the node (power-cycle if it does not come back)",
                "RESTART_APP": "the application must restart; repeated, check the GPU", "IGNORE": "informational on its own",
                }.get(self.resolution, f"follow NVIDIA's {self.resolution} in the Xid catalog")


@lru_cache(maxsize=1)
def _catalog() -> dict:
    return tomllib.loads(resources.files("nodecheck").joinpath("data/xid.toml").read_text())


def source() -> dict[str, str]:
    return dict(_catalog()["source"])


def xid_entry(code: int) -> XidEntry:
    """The catalog's row for an Xid; one nodecheck has no row for is watched, named by its number."""
    row = _catalog()["xid"].get(str(code))
    if row is None:
        return XidEntry(code, f"Xid {code} (not in nodecheck's catalog)", "watch", listed=False, short="not in nodecheck's catalog")
    return XidEntry(code, row["name"], row["action"], bool(row.get("sympathetic")), True, row["resolution"],
                    row.get("short", ""), row.get("when") == "sustained")


def listed_codes() -> list[int]:
    return sorted(int(code) for code in _catalog()["xid"])


def repeat_defaults() -> tuple[int, float]:
    """(count, window in seconds) at which a watched Xid repeating on one GPU becomes an error."""
    row = _catalog()["repeat"]
    return int(row["count"]), float(row["window_s"])

