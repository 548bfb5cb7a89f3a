#!/bin/sh
# Install nodecheck system-wide from this checkout, the one way every deploy file expects it: a virtual
# environment under /opt/nodecheck and the command linked as /usr/local/bin/nodecheck (the systemd units,
# the Slurm wrapper and the container image all run that path).
#
#   sudo deploy/install.sh                 # nodecheck alone: inspect, serve, check, prolog, healthcheck
#   sudo deploy/install.sh bench,web,plot  # with extras: bench (torch), web (TLS/basic auth), plot (scale --plot)
#
# NODECHECK_PREFIX and NODECHECK_BIN move the two places (the tests install into temporary ones);
# NODECHECK_PYTHON names the interpreter (default /usr/bin/python3). As root, it checks that an unprivileged
# user, as the units run, can start what it installed.
# Run it again to upgrade in place; remove with: rm -rf /opt/nodecheck /usr/local/bin/nodecheck
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
prefix=${NODECHECK_PREFIX:-/opt/nodecheck}
bin=${NODECHECK_BIN:-/usr/local/bin}
# The system interpreter, never the first python3 on PATH: root's PATH may start with a pyenv or conda Python
# under a home only root can read, and the units, which run as an unprivileged user, could not start it.
python=${NODECHECK_PYTHON:-/usr/bin/python3}
extras=${1:-}
case "$extras" in *[!a-z,]*) echo "deploy/install.sh: extras are names separated by commas, e.g. bench,web" >&2; exit 2 ;; esac
if [ ! -x "$python" ]; then
  echo "deploy/install.sh: no $python: apt-get install python3-venv, or name an interpreter with NODECHECK_PYTHON=" >&2
  exit 2
fi

as_unit_user() {  # the units' user has no name of its own (DynamicUser): nobody, with no groups, stands in
  if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then return 0; fi  # only root can switch; nothing to check
  # the exec goes through sh: setpriv's own exec can still pass directories the new user could not
  (cd / && setpriv --reuid=65534 --regid=65534 --clear-groups -- sh -c 'exec "$@"' sh "$@" >/dev/null 2>&1)
}
unusable() {
  echo "deploy/install.sh: an unprivileged user (the systemd units' user) cannot run $1: $2" >&2
  exit 1
}

# A prefix this run made is removed again unless the install got to the end
done_=; if [ ! -e "$prefix" ]; then trap '[ -n "$done_" ] || rm -rf "$prefix"' EXIT; fi
"$python" -m venv "$prefix"
as_unit_user "$prefix/bin/python" -c pass ||
  unusable "$prefix/bin/python" "is $prefix, or $python, under a directory only root can read? Pick others with NODECHECK_PREFIX= or NODECHECK_PYTHON="
"$prefix/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check --upgrade "$src${extras:+[$extras]}"
mkdir -p "$bin"
ln -sfn "$prefix/bin/nodecheck" "$bin/nodecheck"
as_unit_user "$bin/nodecheck" -V ||
  unusable "$bin/nodecheck" "were its files installed unreadable (root's umask is $(umask))? Run: umask 022; sh deploy/install.sh"
done_=1
echo "installed $("$bin/nodecheck" --version) in $prefix with $python; command: $bin/nodecheck"
