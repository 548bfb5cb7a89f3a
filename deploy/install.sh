#!/bin/sh
# Install nodecheck system-wide from this checkout, the one way every deploy file expects it: a virtual
# environment under /opt/nodecheck and the command linked as /usr/local/bin/nodecheck (the systemd units,
# the Slurm wrapper and the container image all run that path).
#
#   sudo deploy/install.sh                 # nodecheck alone: inspect, serve, check, prolog, healthcheck
#   sudo deploy/install.sh bench,web,plot  # with extras: bench (torch), web (TLS/basic auth), plot (scale --plot)
#
# NODECHECK_PREFIX and NODECHECK_BIN move the two places (the tests install into temporary ones).
# Run it again to upgrade in place; remove with: rm -rf /opt/nodecheck /usr/local/bin/nodecheck
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
prefix=${NODECHECK_PREFIX:-/opt/nodecheck}
bin=${NODECHECK_BIN:-/usr/local/bin}
extras=${1:-}
case "$extras" in *[!a-z,]*) echo "deploy/install.sh: extras are names separated by commas, e.g. bench,web" >&2; exit 2 ;; esac

python3 -m venv "$prefix"
"$prefix/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check --upgrade "$src${extras:+[$extras]}"
mkdir -p "$bin"
ln -sfn "$prefix/bin/nodecheck" "$bin/nodecheck"
echo "installed $("$bin/nodecheck" --version) in $prefix; command: $bin/nodecheck"
