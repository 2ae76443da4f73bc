#!/usr/bin/env bash
# Builds one image per service (rlfleet/<service>:<version>, also tagged :latest).
#
# usage: deploy/docker/build-images.sh [service ...]   (default: all five)
#
# No registry is needed: the base image comes from build-base.sh; Python packages come
# from PyPI at the exact versions of uv.lock (uv export), and our own packages are
# wheels built from this checkout. A wheel that PyPI does not carry (e.g. a CPU build of
# torch from a local folder named by UV_FIND_LINKS or PIP_FIND_LINKS) is copied in.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
all=(trainer rollout reward sandbox swe-runner)
services=("${@:-${all[@]}}")
"$repo/deploy/docker/build-base.sh"

declare -A package=([trainer]=rlfleet-trainer [rollout]=rlfleet-rollout [reward]=rlfleet-reward
                    [sandbox]=rlfleet-sandbox [swe-runner]=rlfleet-swe)
links="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}"

for service in "${services[@]}"; do
  pkg="${package[$service]:-}"
  [[ -n "$pkg" ]] || { echo "unknown service '$service'; choose from: ${all[*]}" >&2; exit 2; }
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  mkdir -p "$ctx/wheels"
  uv build --quiet --wheel --package rlfleet-proto -o "$ctx/wheels"
  uv build --quiet --wheel --package rlfleet-core -o "$ctx/wheels"
  uv build --quiet --wheel --package "$pkg" -o "$ctx/wheels"
  uv export --quiet --frozen --no-dev --no-hashes --no-emit-workspace --package "$pkg" \
    --format requirements-txt -o "$ctx/requirements.txt"
  # Local-only wheels (a "+local" version such as torch 2.13.0+cpu).
  { grep -o -E '^[A-Za-z0-9_.-]+==[^ ;]+\+[^ ;]+' "$ctx/requirements.txt" || true; } | while read -r req; do
    name="${req%%==*}"; ver="${req#*==}"
    found=$(ls "$links"/"${name//-/_}"-"$ver"-*.whl 2>/dev/null | head -n1 || true)
    [[ -n "$found" ]] || { echo "$req is not on PyPI and not in '$links'" >&2; exit 1; }
    cp "$found" "$ctx/wheels/"
  done
  cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/ca.pem"
  version=$(uv version --package "$pkg" --short 2>/dev/null || echo latest)
  echo "== rlfleet/$service:$version"
  docker build --quiet -f "$repo/deploy/docker/$service.Dockerfile" \
    -t "rlfleet/$service:$version" -t "rlfleet/$service:latest" "$ctx"
  rm -rf "$ctx"
  trap - EXIT
done
