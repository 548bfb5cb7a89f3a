#!/usr/bin/env bash
# On a GPU node: every GPU path of nodecheck, each step printed with its command, exit status and wall
# time, into DIR/log.txt (DIR = $OUT, else ./gpu-node-run). Used for the "Measured on" table of README.md.
#   bash benchmarks/gpu_node.sh [steps...]     steps: facts install gpu inspect one bench h2d nccl prolog nvlink itself topofile suite multi
# (multi is not in the default list: it is for a node with several GPUs, and takes up to an hour; suite is not
# either: the whole suite needs the test extra, which an offline node lacks, and CI runs it)
# Offline nodes (the lent GPU machine): run benchmarks/gpu_carry.sh here first and carry .whl, .hw and .shared.
# A lease's calls are limited to 10 minutes each: run the steps in groups, e.g. "facts install gpu", then
# "install inspect one", then "install bench h2d nccl prolog" (docs/measured-on-gpu.md).
# nodecheck is installed into the Python that holds the node's CUDA torch (NODECHECK_PY, default python3).
# Offline nodes: wheels in .whl/ are installed with --no-index; hwloc's and pciutils' .deb files in .hw/ are
# unpacked under /tmp/hw when lstopo is missing; iproute2's in .hw/ip/ under /tmp/ip when `ip` is missing, its
# libraries seen by `ip` and `tc` alone (wrappers in /tmp/ip-bin), not by every program.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${OUT:-$PWD/gpu-node-run}
mkdir -p "$DIR"
LOG=$DIR/log.txt
PY=$(command -v "${NODECHECK_PY:-python3}")
export PYTHONUNBUFFERED=1
[ -d .shared ] && export NODECHECK_SHARED=$PWD/.shared  # ../shared, carried in when it cannot travel

step() {  # step TIMEOUT CMD...: run, log command, status and seconds
  local limit=$1; shift
  echo "### \$ $*" >>"$LOG"
  local t0; t0=$(date +%s%N)
  timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$? ms=$((($(date +%s%N) - t0) / 1000000))
  echo "### rc=$rc wall=$((ms / 1000)).$(printf %03d $((ms % 1000))) s" >>"$LOG"
  echo >>"$LOG"
}

facts() {
  step 30 nvidia-smi
  step 30 nvidia-smi topo -m
  step 30 nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.gen.current,pcie.link.width.current,pcie.link.width.max --format=csv
  step 30 python3 -c "import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.nccl.version())"
  step 10 uname -r
  step 10 nproc
}

install() {
  if ! command -v lstopo-no-graphics >/dev/null && ls .hw/*.deb >/dev/null 2>&1; then
    for f in .hw/*.deb; do dpkg -x "$f" /tmp/hw; done
  fi
  hwloc_path
  if ! command -v ip >/dev/null && ls .hw/ip/*.deb >/dev/null 2>&1; then
    for f in .hw/ip/*.deb; do dpkg -x "$f" /tmp/ip; done
    mkdir -p /tmp/ip-bin  # not /tmp/ip/bin: the packages unpack their own programs there
    for tool in ip tc; do
      printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/ip/usr/lib/x86_64-linux-gnu:/tmp/ip/lib/x86_64-linux-gnu exec %s "$@"\n' \
        "$(ls /tmp/ip/sbin/$tool /tmp/ip/usr/sbin/$tool /tmp/ip/bin/$tool 2>/dev/null | head -1)" > /tmp/ip-bin/$tool
      chmod +x /tmp/ip-bin/$tool
    done
  fi
  hwloc_path
  if [ -d .whl ]; then  # offline (benchmarks/gpu_carry.sh made .whl): what the GPU steps need, the image's torch kept
    step 300 "$PY" -m pip install -q --disable-pip-version-check --no-index --find-links .whl --no-build-isolation '.[bench,web]'
  else
    step 300 "$PY" -m pip install -q --disable-pip-version-check '.[test,bench,web,plot]'
  fi
}

hwloc_path() {  # hwloc and iproute2 unpacked by install()
  if [ -d /tmp/hw/usr/bin ]; then
    export PATH=/tmp/hw/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/hw/usr/lib/x86_64-linux-gnu
    export HWLOC_PLUGINS_PATH=/tmp/hw/usr/lib/x86_64-linux-gnu/hwloc
  fi
  if [ -x /tmp/ip-bin/ip ]; then export PATH=/tmp/ip-bin:$PATH; fi
}
hwloc_path

# the files that hold gpu tests (collecting every file would need the test extra's packages); -s: the figures they print
gpu() { step 540 "$PY" -m pytest -m gpu -ra -v -s -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_bench_gpu.py tests/gpu/test_nccl_on_one_gpu.py; }

TMP=$(mktemp -d)  # what the log shows but need not come back as a file
trap 'rm -rf "$TMP"' EXIT

inspect() {
  step 60 lstopo-no-graphics --version
  step 60 "$PY" -m nodecheck inspect
  step 60 sh -c "$PY -m nodecheck inspect --json > $DIR/inspect.json"
  step 120 "$PY" -m nodecheck snapshot "$DIR/snapshot.tar.gz"
  step 60 sh -c "$PY -m nodecheck inspect --json --from $DIR/snapshot.tar.gz > $TMP/replayed.json"
  step 30 "$PY" -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); print('keys that differ, replayed vs live:', [k for k in sorted(set(a)|set(b)) if a.get(k)!=b.get(k)])" "$DIR/inspect.json" "$TMP/replayed.json"
  step 60 "$PY" -m nodecheck check --textfile-dir "$DIR"
}

bench() {
  step 120 sh -c "$PY -m nodecheck bench --quick --json > $DIR/bench-quick.json"
  step 120 "$PY" -m nodecheck bench --quick
  step 300 sh -c "$PY -m nodecheck bench --full --json > $DIR/bench-full.json"
  step 300 "$PY" -m nodecheck bench --full
}

h2d() { step 300 "$PY" benchmarks/bench_h2d.py; }

nccl() {
  # a world of one rank: NCCL completes, no figure
  step 120 "$PY" -m torch.distributed.run --nproc-per-node 1 -m nodecheck bench --tests allreduce
  # two ranks, one GPU: the rank without a GPU of its own is named
  step 180 "$PY" -m torch.distributed.run --nproc-per-node 2 -m nodecheck bench --tests allreduce --quick
  # two ranks both on GPU 0 (each the first of its "node"): NCCL's "Duplicate GPU" named
  local dup="WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 $PY -m nodecheck bench --tests allreduce --quick --json"
  step 180 sh -c "RANK=1 $dup > $TMP/dup1.json & RANK=0 $dup; wait"
  # a worker given a GPU that is not there: named in its result
  step 60 sh -c "$PY -m nodecheck.bench.gpu_worker copy --device 7 --pci 0000:ff:00.0 --sizes 1048576 --out $TMP/wrong.json; cat $TMP/wrong.json"
}

prolog() {
  printf '[prolog]\nbench = ["h2d"]\ntimeout_s = 30\n' >"$TMP/prolog.toml"
  step 60 "$PY" -m nodecheck prolog --dry-run --json --config "$TMP/prolog.toml"
}

# NVLink as NVML gives it on this GPU (issue 47, item 14): each slot's state and per-link field state, NVML's speed
# field, the P2P status, the architecture (nvml_nvlink_check.py beside `nvidia-smi nvlink -s`), kept as the snapshot's
# nvml.json; then `inspect` and `prolog --dry-run` on it: a GPU whose NVLink peers are outside the machine (a one-GPU
# slice of an SXM board) must not be drained for them
nvlink() {
  step 60 nvidia-smi nvlink -s
  step 60 nvidia-smi topo -p2p r
  step 60 "$PY" benchmarks/nvml_nvlink_check.py
  step 120 "$PY" -m nodecheck snapshot "$DIR/nvlink-snapshot.tar.gz"
  step 60 sh -c "$PY -m nodecheck inspect --json --from $DIR/nvlink-snapshot.tar.gz > $DIR/nvlink-inspect.json"
  step 60 "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print([(g['index'], g.get('nvlink_speed_mbps'), g.get('nvlinks_wired'), g.get('p2p_read'), [(l['link'], l['active']) for l in g['nvlinks']]) for g in r['gpus']]); print([f['kind'] for f in r['findings'] if f['kind'].startswith('nvlink')])" "$DIR/nvlink-inspect.json"
  step 60 "$PY" -m nodecheck prolog --dry-run --json
}

# the GPU itself: hbm and gemm beside plain torch loops timed in the same run, against the model's spec
itself() {
  step 120 "$PY" -m nodecheck inspect
  step 300 "$PY" benchmarks/bench_gpu_itself.py
  step 300 "$PY" benchmarks/bench_gpu_itself.py --full
}

# NCCL's topology (issue 51, item 5): a file `nccl-topo --write` (and `--install`) made for this flattened VM, loaded by
# NCCL in an all-reduce of two NET/Socket "nodes" on this GPU; its new dump holds the GPU under the file's bridge (as root)
topofile() {
  step 300 "$PY" -m pytest -m gpu -ra -v -s -p no:cacheprovider tests/gpu/test_nccl_on_one_gpu.py -k written_topology_file
}

suite() { step 330 "$PY" -m pytest -ra -q -p no:cacheprovider --timeout 120; }

# a one-GPU node (issue 26, items 2-4): every figure beside what it is checked against; the run's folder as one
# archive (a lease brings back at most 8 files)
one() {
  step 540 "$PY" benchmarks/one_gpu_node.py --out "$TMP/one"
  tar czf "$DIR/one-gpu.tar.gz" -C "$TMP" one
}

# the first multi-GPU node (issue 26, item 5): every figure beside its reference, outputs kept in DIR/multi
multi() { step 3600 "$PY" benchmarks/multi_gpu_node.py --out "$DIR/multi"; }

for s in "${@:-facts install gpu inspect one bench h2d nccl prolog}"; do
  for one in $s; do echo "===== $one" >>"$LOG"; "$one"; done
done
echo "log: $LOG"
