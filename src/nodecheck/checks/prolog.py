"""What only the Slurm prolog and health check judge: a check that timed out or failed under their budget, and
the proximity of the job's peer nodes (slurm/prolog.py, slurm/proximity.py). Declared here with the other checks;
a Report says nothing of them."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind

CHECK_TIMED_OUT = Kind("check_timed_out", "bandwidth", "{subject} timed out after {expected}",
    doc=(
        ("error; `[proximity] severity` for `proximity`",
         "prolog/healthcheck: a check (`node`, `proximity`, `bench`) did not finish within `[prolog] timeout_s`, or peers were "
         "left unexamined when it ran out (a check whose findings are warnings cannot drain a node by running late)"),
    ))
CHECK_FAILED = Kind("check_failed", "bandwidth", "{head}",
    doc=(
        ("error",
         "prolog/healthcheck: a check could not run (e.g. a node list that cannot be expanded)"),
    ))
PEER_UNREACHABLE = Kind("peer_unreachable", "fabric", "{subject} unreachable",
    doc=(
        ("`[proximity] severity` (warning)",
         "a peer of the job does not resolve, has no route, or does not answer a TCP connect"),
    ))
PEER_OUTSIDE_SUBNET = Kind("peer_outside_subnet", "fabric", "{subject} {measured} outside {expected}",
    doc=(
        ("`[proximity] severity` (warning)",
         "a peer is not on-link in this node's subnet on the traffic interface (subject `peer:NAME`)"),
    ))
PEER_SLOW = Kind("peer_slow", "fabric", "{subject} round trip {measured}, peers' median {expected}",
    doc=(
        ("`[proximity] severity` (warning)",
         "a peer's TCP-connect round trip is > `rtt_factor` x the peers' median and > `rtt_floor_ms` above it"),
    ))

CHECK = Check((CHECK_TIMED_OUT, CHECK_FAILED, PEER_UNREACHABLE, PEER_OUTSIDE_SUBNET, PEER_SLOW),
              made_by="`nodecheck prolog`/`healthcheck`")
