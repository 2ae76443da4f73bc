#!/usr/bin/env bash
# Builds rlfleet's base image (Debian bookworm + Python 3.11) without any container
# registry: mmdebstrap writes a minimal root filesystem to stdout and `docker import`
# turns it into an image. Every service Dockerfile starts FROM it.
#
# usage: deploy/docker/build-base.sh [image-name]   (default rlfleet/base:bookworm)
# env:   DEBIAN_MIRROR  mirror URL (default: the first one in this machine's apt sources,
#                       else http://deb.debian.org/debian)
set -euo pipefail
image="${1:-rlfleet/base:bookworm}"

if docker image inspect "$image" >/dev/null 2>&1 && [[ "${REBUILD:-0}" != 1 ]]; then
  echo "$image exists (REBUILD=1 to rebuild)"
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "needs mmdebstrap: apt-get install -y mmdebstrap" >&2; exit 1; }

mirror="${DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  # Active (uncommented) deb822 "URIs:" or one-line "deb" entries, security suite excluded.
  mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
           | grep -E '^(URIs:|deb )' | grep -o -E 'https?://[^ ]+' | grep -v -- '-security' \
           | head -n1 || true)
  mirror="${mirror:-http://deb.debian.org/debian}"
fi

echo "building $image from $mirror"
rootfs=$(mktemp --suffix=.tar)
trap 'rm -f "$rootfs"' EXIT
# To a file first: a failed bootstrap must not leave a half-empty image behind.
mmdebstrap --variant=apt \
  --include=python3,python3-venv,ca-certificates,libstdc++6,libgomp1 \
  bookworm "$rootfs" "$mirror"
docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$rootfs" "$image"
docker image inspect "$image" --format '{{.Id}} {{.Size}}'
