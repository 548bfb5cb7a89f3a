"""What nodecheck asks of Slurm, through scontrol (bounded, never a shell): this node's state and
drain reason, drain, resume. parse_node() is pure; the rest runs scontrol.

Slurm's prolog and HealthCheckProgram environments are sparse (measured on 22.05: the health check
gets SLURMD_NODENAME and nothing else, no PATH, no SLURM_CONF), so slurm_env() supplies both.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from nodecheck.core.errors import NodecheckError, ParseError
from nodecheck.host.commands import run_command
from nodecheck.report.findings import one_line

REASON_PREFIX = "nodecheck:"  # nodecheck resumes only nodes drained with a reason that starts so
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONF_CANDIDATES = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf")
MAX_REASON = 200  # a reason is read by people in `sinfo -R`; the rest is in the prolog's output
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"(?:^|\s)Reason=")
_REASON_BY = re.compile(r"\[[^\]\s]*@[^\]\s]*\]")  # the "[user@time]" Slurm appends


@dataclass
class NodeState:
    name: str
    states: list[str] = field(default_factory=list)  # IDLE, DRAIN, ALLOCATED, DOWN, NOT_RESPONDING ...
    reason: str | None = None  # without Slurm's "[user@time]" suffix

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.states or "DRAINED" in self.states or "DRAINING" in self.states

    @property
    def idle(self) -> bool:
        """Running no job, nor finishing one (a completing job's processes may still be exiting)."""
        return "IDLE" in self.states and not {"COMPLETING", "ALLOCATED", "MIXED"} & set(self.states)

    @property
    def drained_by_nodecheck(self) -> bool:
        return self.drained and (self.reason or "").startswith(REASON_PREFIX)


def parse_node(name: str, text: str) -> NodeState:
    """`scontrol show node NAME --oneliner`: State=IDLE+DRAIN ... Reason=text [user@time] (Reason comes last)."""
    line = next((l for l in text.splitlines() if l.startswith(f"NodeName={name} ")), None)
    state = _STATE.search(line or "")
    if line is None or state is None:
        raise ParseError(f"scontrol printed no state for node {name}: {text.strip()[:200]!r}")
    reason = _REASON.search(line)
    return NodeState(name, state[1].rstrip("*$~#!%@^-").split("+"), _reason_text(line[reason.end():]) if reason else None)


def _reason_text(rest: str) -> str:
    """The reason without the "[user@time]" Slurm appends. Cut with rfind and strip, not a pattern of lazy text
    before optional spaces: that is quadratic in a run of spaces (50,000 took 7.8 s)."""
    rest = rest.rstrip()
    opening = rest.rfind("[")
    if rest.endswith("]") and opening > 0 and rest[opening - 1].isspace() and _REASON_BY.fullmatch(rest, opening):
        rest = rest[:opening]
    return rest.strip()


def slurm_env(conf: str | None) -> dict[str, str]:
    """This process's environment with a PATH and a SLURM_CONF scontrol can use."""
    env = dict(os.environ)
    env.setdefault("PATH", DEFAULT_PATH)
    if "SLURM_CONF" not in env:
        found = conf or next((c for c in CONF_CANDIDATES if Path(c).is_file()), None)
        if found:
            env["SLURM_CONF"] = found
    return env


def node_name(configured: str | None, recorded: str | None = None) -> str:
    """The Slurm node judged: the config's, else slurmd's, else the snapshot's recorded host, else this machine."""
    return (configured or os.environ.get("SLURMD_NODENAME") or (recorded or "").split(".")[0]
            or socket.gethostname().split(".")[0])


class Scontrol:
    def __init__(self, conf: str | None, timeout: float) -> None:
        self.env = slurm_env(conf)
        self.timeout = timeout

    def _run(self, *args: str) -> str:
        try:
            return run_command(["scontrol", *args], self.timeout, env=self.env, what=f"scontrol {args[0]} {args[1]}")
        except NodecheckError as error:
            where = self.env.get("SLURM_CONF", "no SLURM_CONF; set [slurm] conf")
            raise NodecheckError(f"{error} ({where})") from None

    def node(self, name: str) -> NodeState:
        return parse_node(name, self._run("show", "node", name, "--oneliner"))

    def drain(self, name: str, reason: str) -> None:
        self._run("update", f"nodename={name}", "state=drain", f"reason={one_line(reason)}")

    def resume(self, name: str) -> None:
        self._run("update", f"nodename={name}", "state=resume")
