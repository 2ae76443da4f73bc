#!/usr/bin/env bash
# Converts the locally built service images (deploy/docker/build-images.sh) into the
# files a SLURM cluster runs: enroot squashfs (.sqsh, for pyxis' --container-image) or
# Apptainer images (.sif). Run it where Docker and enroot/apptainer both exist, with OUT
# on the cluster's shared filesystem; then point env.toml's `images` at the results.
#
# usage: deploy/slurm/import-images.sh {enroot|apptainer} OUT_DIR [service ...]
# env:   TAG=latest (default) | latest-cuda  the CUDA variants of trainer and rollout
#        (IMAGE_TORCH=cuda build-images.sh), written as rlfleet-<service>-cuda.{sqsh,sif}
set -euo pipefail
tag="${TAG:-latest}"
suffix="${tag#latest}"
runtime="${1:?usage: import-images.sh {enroot|apptainer} OUT_DIR [service ...]}"
out="${2:?usage: import-images.sh {enroot|apptainer} OUT_DIR [service ...]}"
shift 2
services=("${@:-trainer rollout reward sandbox swe-runner}")
mkdir -p "$out"
for service in ${services[@]}; do
  case "$runtime" in
    enroot)    enroot import --output "$out/rlfleet-$service$suffix.sqsh" "dockerd://rlfleet/$service:$tag" ;;
    apptainer) apptainer build --force "$out/rlfleet-$service$suffix.sif" "docker-daemon://rlfleet/$service:$tag" ;;
    *) echo "unknown runtime '$runtime' (enroot or apptainer)" >&2; exit 2 ;;
  esac
done
