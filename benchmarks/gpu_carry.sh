#!/usr/bin/env bash
# Here, before a lease of the GPU machine (which reaches no network): what benchmarks/gpu_node.sh needs there and
# its image lacks, into folders git ignores, to be named in the device run's `carry`:
#   .whl/     wheels for CPython 3.12 on x86-64 Linux: nodecheck's dependencies the image does not hold
#             (its torch, numpy, click, rich, prometheus-client, nvidia-ml-py, pytest and PyYAML are used as they are)
#   .hw/      Debian's hwloc (lstopo) and pciutils (lspci) packages, and libkmod2 (lspci links it; the image lacks it),
#             unpacked there by gpu_node.sh when missing;
#             .hw/ip/ iproute2 (ip, tc: the network-namespace tests) and the libraries it links, unpacked apart
#   .shared/  ../shared (the captures the tests read), which does not travel by itself
# Usage: bash benchmarks/gpu_carry.sh      then carry [".whl", ".hw", ".shared"]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=(pyroute2 "typer>=0.12,<0.29" bcrypt)  # pyproject.toml's dependencies and the web extra, less the image's
SDIST_ONLY=(python-hostlist)                   # no wheel on PyPI: built here (pure Python)
PLATFORMS=(manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64 any)

rm -rf .whl .hw .shared
mkdir -p .whl .hw
args=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl)
for p in "${PLATFORMS[@]}"; do args+=(--platform "$p"); done
for wheel in "${WHEELS[@]}"; do timeout 300 "$PY" -m pip download -q "${args[@]}" "$wheel"; done
timeout 300 "$PY" -m pip wheel -q --no-deps -w .whl "${SDIST_ONLY[@]}"
(cd .hw && timeout 300 apt-get download hwloc-nox libhwloc15 libhwloc-plugins pciutils libpci3 libkmod2 2>/dev/null)
mkdir -p .hw/ip  # the first GPU runs skipped the namespace tests: the image has no `ip`
(cd .hw/ip && timeout 300 apt-get download iproute2 libbpf1 libelf1 libmnl0 libxtables12 libcap2 libbsd0 libmd0 \
  libtirpc3 libdb5.3 2>/dev/null)
if [ -d ../shared ]; then cp -r ../shared .shared; fi
du -sh .whl .hw .shared 2>/dev/null
ls .whl .hw
