#!/usr/bin/env bash
# Builds one image per service (rlfleet/<service>:<version>, also tagged :latest).
#
# usage: deploy/docker/build-images.sh [service ...]   (default: all five)
# env:   NO_CACHE=1  build without Docker's layer cache; REBUILD=1  rebuild the base image too
#
# No registry is needed: the base image comes from build-base.sh; Python packages come
# from PyPI at the exact versions of uv.lock (uv export), and our own packages are
# wheels built from this checkout. A wheel that PyPI does not carry (e.g. a CPU build of
# torch from a local folder named by UV_FIND_LINKS or PIP_FIND_LINKS) is copied in.
#
# Build context: requirements.txt, wheels/ (local-only third-party wheels), rlfleet/ (our
# wheels), ca.pem. The Dockerfiles install requirements.txt + wheels/ in one layer and
# rlfleet/ in a later one, so a code change rebuilds only that last, small layer.
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
  mkdir -p "$ctx/wheels" "$ctx/rlfleet"
  # The service and every workspace library it depends on, as the lock says (a hand-kept
  # list went stale when the reward service started to use rlfleet-contracts).
  members=$(uv export --quiet --frozen --no-dev --no-hashes --no-header --package "$pkg" \
    --format requirements-txt | sed -n 's|^-e \./||p')
  for member in $members; do
    uv build --quiet --wheel "$repo/$member" -o "$ctx/rlfleet"
  done
  # --no-header: the header names the (random) output path, which would defeat the layer cache.
  uv export --quiet --frozen --no-dev --no-hashes --no-header --no-emit-workspace --package "$pkg" \
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
  docker build --quiet ${NO_CACHE:+--no-cache} -f "$repo/deploy/docker/$service.Dockerfile" \
    -t "rlfleet/$service:$version" -t "rlfleet/$service:latest" "$ctx"
  rm -rf "$ctx"
  trap - EXIT
done
