"""A real gloo all-reduce across 3 "nodes" (network namespaces on a bridge, every link shaped with tc
tbf), as `nodecheck bench --tests allreduce --quick` launched like torchrun on each node: healthy,
then with one node's link at half rate. Prints busbw, ratio to spec, wall time and the finding.
Needs root, iproute2, util-linux and torch. Run: .venv/bin/python benchmarks/bench_allreduce_netns.py"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from netns_cluster import Cluster  # noqa: E402
from test_allreduce_cluster import finish, launch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", default="2gbit", help="tbf rate of every link")
    parser.add_argument("--slow-rate", default="1gbit", help="rate of node 2's link in the second run")
    parser.add_argument("--expected-mbps", type=int, default=2000, help="the NIC speed the config states")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Cluster(3) as cluster:
        config = Path(tmp) / "node.toml"
        config.write_text(f"[nics.eth0]\nspeed_mbps = {args.expected_mbps}\n")
        for i in range(3):
            cluster.shape(i, args.rate)
        for label, port in ((f"all links {args.rate}", 32100), (f"node2 at {args.slow_rate}", 32101)):
            if port == 32101:
                cluster.shape(2, args.slow_rate)
            started = time.perf_counter()
            results = finish(launch(cluster, [0, 1, 2], 3, str(config), port))
            wall = time.perf_counter() - started
            report = results[0][1]
            m = next(m for m in report["measurements"] if m["test"] == "allreduce")
            print(f"{label}: exit codes {[r[0] for r in results]}, wall {wall:.1f} s for the whole job, "
                  f"busbw {m['bytes_per_second'] * 8 / 1e9:.2f} Gbit/s, spec {m['spec_bytes_per_second'] * 8 / 1e9:g} Gbit/s, "
                  f"ratio {m['ratio']:.3f} (healthy goal >= 0.9; the suite asserts no ratio), payload {m['payload_bytes'] >> 20} MiB")
            for rank, rates in sorted(m["details"]["pairs_with_rank0"].items()):
                print(f"  rank {rank} <-> rank 0: {rates['to_rank0'] / 1e6:.0f} / {rates['from_rank0'] / 1e6:.0f} MB/s")
            for f in report["findings"]:
                print(f"  finding [{f['severity']}] {f['subject']}: {f['message']}")


if __name__ == "__main__":
    main()
