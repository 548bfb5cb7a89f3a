#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine: installs what the tests need, then runs them.
# As root it installs the apt packages (hwloc's lstopo; pciutils' lspci for ACS; buildah and debootstrap to build
# the container image; iproute2 and util-linux for network namespaces;
# prometheus, promtool and Alertmanager; systemd-analyze; slurm-wlm and munge for a real one-node
# Slurm); otherwise
# the tests that need them skip and say why. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(hwloc-nox pciutils buildah debootstrap iproute2 util-linux prometheus prometheus-alertmanager systemd slurm-wlm munge procps)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
else
  echo "tests/run.sh: not root (or no apt-get): not installing ${APT_PACKAGES[*]}; tests needing them will skip" >&2
fi

python3 -m venv .venv
# torch CPU 2.13.0 first (a local wheel on the CI machine): asked for as a range, pip would fetch a CUDA build
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 numpy
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,bench,web,plot]'
# lint first (pyflakes, bugbear, import order, bandit's security rules; pyproject.toml [tool.ruff])
.venv/bin/ruff check agent probes exporters tests benchmarks
exec .venv/bin/python -m pytest -ra "$@"
