#!/bin/sh
# Build nodecheck's image (deploy/container/Containerfile) as nodecheck:VERSION with buildah, on a Debian
# bookworm base that debootstrap makes from Debian's packages (the mirror this machine's apt uses): no
# image registry is needed. Needs root, buildah and debootstrap (apt-get install buildah debootstrap).
#   deploy/container/build.sh            # builds localhost/nodecheck-base:bookworm once, then the image
# NODECHECK_IMAGE: another name for the image (default nodecheck:VERSION, the name the DaemonSet runs).
# BUILDAH_ISOLATION: chroot (default; works where no OCI runtime can start, e.g. inside another sandbox),
# or oci.
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$src/pyproject.toml" | head -1)
tag=${NODECHECK_IMAGE:-nodecheck:$version}
base=localhost/nodecheck-base:bookworm
isolation=${BUILDAH_ISOLATION:-chroot}

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then  # the first Debian archive apt is set up with (deb822 or one-line sources)
    mirror=$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
    [ -n "$mirror" ] || mirror=$(sed -n 's/^deb  *\(\[[^]]*\] *\)\{0,1\}\([^ ]*\/debian\)  *.*/\2/p' /etc/apt/sources.list 2>/dev/null | head -1)
fi
[ -n "$mirror" ] || { echo "build.sh: no Debian mirror found in apt's sources: set DEBIAN_MIRROR" >&2; exit 2; }

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase bookworm "$rootfs/root" "$mirror" >"$rootfs/debootstrap.log" 2>&1 \
        || { tail -20 "$rootfs/debootstrap.log" >&2; exit 1; }
    tar -C "$rootfs/root" -cf "$rootfs/root.tar" .
    container=$(buildah from scratch)
    buildah add "$container" "$rootfs/root.tar" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$container"
    buildah commit --rm "$container" "$base" >/dev/null
fi
# the build host's CA bundle, lent to the build's steps (never stored in the image): where a proxy re-signs
# TLS, pip inside the build trusts what this machine trusts
set -- --build-arg BASE="$base"
[ -r /etc/ssl/certs/ca-certificates.crt ] && set -- "$@" --volume /etc/ssl/certs/ca-certificates.crt:/run/build-ca.crt:ro
buildah bud --isolation "$isolation" --ulimit nofile=4096:4096 "$@" -t "$tag" -f "$src/deploy/container/Containerfile" "$src"
echo "built $tag"
