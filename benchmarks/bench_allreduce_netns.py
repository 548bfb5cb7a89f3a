"""A real gloo all-reduce across N "nodes" (network namespaces on a bridge, every link shaped with tc
tbf), as `nodecheck bench --tests allreduce --quick` launched like torchrun on each node: healthy,
then with one node's link at half rate, then with rank 0's link at half rate. Prints busbw, the ratio
to spec (healthy goal >= 0.9), the pair exchanges that name the slow node, the finding, and the wall
time of the whole job per node count (the pairing takes two rounds whatever N).
Needs root, iproute2, util-linux and torch.
Run: .venv/bin/python benchmarks/bench_allreduce_netns.py [--nodes 3,4,8]"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from netns_cluster import Cluster  # noqa: E402
from test_allreduce_cluster import finish, launch  # noqa: E402


def run(cluster: Cluster, size: int, config: Path, port: int, label: str) -> None:
    started = time.perf_counter()
    results = finish(launch(cluster, list(range(size)), size, str(config), port), timeout=600)
    wall = time.perf_counter() - started
    report = results[0][1]
    m = next(m for m in report["measurements"] if m["test"] == "allreduce")
    print(f"  {label}: exit codes {[r[0] for r in results]}, wall {wall:.1f} s for the whole job, "
          f"busbw {m['bytes_per_second'] * 8 / 1e9:.2f} Gbit/s, spec {m['spec_bytes_per_second'] * 8 / 1e9:g} Gbit/s, "
          f"ratio {m['ratio']:.3f} (healthy goal >= 0.9; the suite asserts no ratio)")
    for e in m["details"]["pair_exchanges"]:
        print(f"    round {e['round']}: rank {e['a']} <-> rank {e['b']}: {e['a_to_b'] * 8 / 1e9:.2f} / "
              f"{e['b_to_a'] * 8 / 1e9:.2f} Gbit/s")
    for f in report["findings"]:
        print(f"    finding [{f['severity']}] {f['subject']}: {f['message']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="3,4,8", help="node counts to run, comma-separated")
    parser.add_argument("--rate", default="1gbit", help="tbf rate of every link")
    parser.add_argument("--slow-rate", default="500mbit", help="the slow node's link rate")
    parser.add_argument("--expected-mbps", type=int, default=1000, help="the NIC speed the config states")
    args = parser.parse_args()
    port = 32100
    for size in (int(n) for n in args.nodes.split(",")):
        print(f"{size} nodes, links {args.rate}, config {args.expected_mbps} Mb/s")
        with tempfile.TemporaryDirectory() as tmp, Cluster(size) as cluster:
            config = Path(tmp) / "node.toml"
            config.write_text(f"[nics.eth0]\nspeed_mbps = {args.expected_mbps}\n")
            for i in range(size):
                cluster.shape(i, args.rate)
            run(cluster, size, config, port, "healthy")
            cluster.shape(size - 1, args.slow_rate)
            run(cluster, size, config, port + 1, f"node{size - 1} at {args.slow_rate}")
            cluster.shape(size - 1, args.rate)
            cluster.shape(0, args.slow_rate)
            run(cluster, size, config, port + 2, f"node0 (rank 0) at {args.slow_rate}")
        port += 3


if __name__ == "__main__":
    main()
