#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine: installs what the tests need, then runs them.
# As root it installs the apt packages (hwloc's lstopo; pciutils' lspci for ACS; buildah and debootstrap to build
# the container image; iproute2 and util-linux for network namespaces; prometheus, promtool and Alertmanager;
# systemd-analyze; slurm-wlm and munge for a real one-node Slurm), without starting or leaving enabled any
# daemon they bring: the tests start their own. Otherwise the tests that need them skip and say why.
# `bash tests/run.sh -m gpu` (on a GPU node) installs only what the gpu tests need and keeps the node's CUDA torch.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

gpu_only=false
case " $* " in *" -m gpu "*) gpu_only=true ;; esac
if $gpu_only; then
  APT_PACKAGES=(hwloc-nox pciutils python3-venv)
else
  APT_PACKAGES=(hwloc-nox pciutils python3-venv buildah debootstrap iproute2 util-linux prometheus prometheus-alertmanager
                systemd slurm-wlm munge procps)
fi

enabled_units() { systemctl list-unit-files --state=enabled --no-legend 2>/dev/null | awk '{print $1}' | sort || true; }

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  before=$(enabled_units)
  # Packages start their daemons on install unless policy-rc.d says no (101: action forbidden)
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\n# tests/run.sh: install daemons without starting them\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
  if grep -q '^# tests/run.sh' /usr/sbin/policy-rc.d 2>/dev/null; then rm -f /usr/sbin/policy-rc.d; fi
  trap - EXIT
  # ... and enable them to start at boot: undo that for every unit this install enabled
  for unit in $(comm -13 <(echo "$before") <(enabled_units)); do
    systemctl disable --quiet "$unit" 2>/dev/null || echo "tests/run.sh: could not disable $unit" >&2
  done
  export NODECHECK_UNITS_ENABLED_BEFORE="$before"  # tests/system/test_deploy.py checks none was left enabled
else
  echo "tests/run.sh: not root (or no apt-get): not installing ${APT_PACKAGES[*]}; tests needing them will skip" >&2
fi

if $gpu_only; then
  # the node's own CUDA torch when it has one; else PyPI's default build, which is the CUDA one
  python3 -m venv --system-site-packages .venv
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q --disable-pip-version-check torch numpy
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,bench]'
else
  python3 -m venv .venv
  # torch CPU 2.13.0 first (a local wheel on the CI machine): asked for as a range, pip would fetch a CUDA build
  .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 numpy
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,bench,web,plot]'
fi
# lint first (pyflakes, bugbear, import order, bandit's security rules; pyproject.toml [tool.ruff])
.venv/bin/ruff check src tests benchmarks
exec .venv/bin/python -m pytest -ra "$@"
