"""NVIDIA's Xid catalog, the rows nodecheck acts on (src/nodecheck/core/data/xid.toml, each from its source): what an
Xid is called and whether it drains the node now or is watched for repeats. And the NVSwitch SXid catalog of
NVIDIA's Fabric Manager guide (src/nodecheck/core/data/sxid.toml): what an SXid is called and how fatal the guide says it is."""

from __future__ import annotations

from dataclasses import dataclass

from nodecheck.core.shipped import shipped_table

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
    severity_in_line: bool = False  # the driver's Fatal/Nonfatal in each line decides (NVLink 5: 144-150)
    path: str = ""  # the GPU traffic it sits on: "nvlink", "c2c"; "" all of it

    def action_of(self, driver_word: str | None) -> str:
        """The row's action for one event (driver_word: its XidEvent.driver_word): where the driver writes the
        severity into the line (NVLink 5), a Nonfatal event is corrected or contained: watched, an error when it
        repeats; a Fatal one, or one whose line does not say, takes the row's action."""
        return "watch" if self.severity_in_line and driver_word == "non-fatal" else self.action

    def drains_now(self, driver_words: list[str | None]) -> bool:
        """Whether these events drain the node now, repeats aside: one of them does by its action, and the row is
        not one that drains only when sustained."""
        return not self.sustained and any(self.action_of(word) == "drain" for word in driver_words)

    @property
    def label(self) -> str:
        return self.short or self.name

    def advice(self, subject: str) -> str:
        """What NVIDIA's catalog says to do, in words."""
        index = subject[3:] if subject.startswith("gpu") else None
        reset = f"reset the GPU (`nvidia-smi -r -i {index}`)" if index else "reset the GPU"
        return {"RESET_GPU": f"{reset} when idle, or reboot", "RESTART_BM": "reboot the node (power-cycle if it does not come back)",
                "RESTART_APP": "the application must restart; repeated, check the GPU", "IGNORE": "informational on its own",
                "CHECK_MECHANICALS": "check the GPU board's auxiliary power cables and its seating",
                "RESTART_VM": "restart the VM (the GPU's confidential-computing key rotation failed)",
                }.get(self.resolution, f"follow NVIDIA's {self.resolution} in the Xid catalog")


SXID_CLASSES = ("non-fatal", "fatal", "always-fatal", "notable")


@dataclass(frozen=True)
class SxidEntry:
    code: int
    name: str  # the guide's name; "" for an SXid nodecheck has no row for
    klass: str  # one of SXID_CLASSES; "unlisted"
    drains: bool = False  # a non-fatal row whose impact stalls NVLink traffic (sxid.toml `action = "drain"`)
    why: str = ""  # that impact, in words

    @property
    def listed(self) -> bool:
        return self.klass != "unlisted"

    def fatal(self, driver_word: str | None) -> bool:
        """Whether one event is fatal. Always-fatal and the drain rows are, whatever the line says; otherwise the
        driver's own word ("fatal", "non-fatal": it knows the instance), and where the line carries none (a
        "Severity"/"Data" line whose first line was lost) the guide's class."""
        if self.klass == "always-fatal" or self.drains:
            return True
        if driver_word is not None:
            return driver_word == "fatal"
        return self.klass == "fatal"

    def advice(self, fatal: bool) -> str:
        """What the guide says to do, in words."""
        if self.klass == "always-fatal":
            return ("the whole NVLink fabric is down: restart the host (or reset every GPU and NVSwitch with the "
                    "fabric manager stopped)")
        if self.drains:
            return f"{self.why}: reset the GPUs and NVSwitches or restart the host"
        if fatal:
            return ("jobs whose NVLink traffic crosses this port fail: reset the GPUs and NVSwitches or restart the host; "
                    "if it comes back after that, have the switch tray inspected")
        return "not fatal on its own (corrected, or confined to one port): watch whether it repeats or a fatal one follows"


def sxid_entry(code: int) -> SxidEntry:
    """The guide's row for an SXid; one nodecheck has no row for is "unlisted", judged by the driver's word."""
    row = shipped_table("sxid.toml")["sxid"].get(str(code))
    if row is None:
        return SxidEntry(code, "", "unlisted")
    return SxidEntry(code, row["name"], row["class"], row.get("action") == "drain", row.get("why", ""))


def sxid_source() -> dict[str, str]:
    return dict(shipped_table("sxid.toml")["source"])


def listed_sxids() -> list[int]:
    return sorted(int(code) for code in shipped_table("sxid.toml")["sxid"])


def source() -> dict[str, str]:
    return dict(shipped_table("xid.toml")["source"])


def catalog_revision() -> str:
    """When the copy of NVIDIA's Xid catalog nodecheck's rows come from was generated ("2025-10-29")."""
    return str(shipped_table("xid.toml")["source"]["revision"])


def xid_entry(code: int) -> XidEntry:
    """The catalog's row for an Xid; one nodecheck has no row for is watched, named by its number and the catalog's
    revision (an Xid newer than it)."""
    row = shipped_table("xid.toml")["xid"].get(str(code))
    if row is None:
        return XidEntry(code, f"Xid {code} (not in nodecheck's catalog of {catalog_revision()})", "watch", listed=False,
                        short="not in nodecheck's catalog")
    return XidEntry(code, row["name"], row["action"], bool(row.get("sympathetic")), True, row["resolution"],
                    row.get("short", ""), row.get("when") == "sustained", row.get("severity") == "in-line", row.get("path", ""))


def listed_codes() -> list[int]:
    return sorted(int(code) for code in shipped_table("xid.toml")["xid"])


def repeat_defaults() -> tuple[int, float]:
    """(count, window in seconds) at which a watched Xid repeating on one GPU becomes an error."""
    row = shipped_table("xid.toml")["repeat"]
    return int(row["count"]), float(row["window_s"])

