#!/usr/bin/env bash
# Builds the images of the bundled tiny SWE instances (or of the instances in DIR): first
# rlfleet's base image (build-base.sh), then rlfleet/swe-env:<hash> (base + git + pytest)
# and one image per instance, each rebuilt only when its content hash changes
# (rlfleet_swe/images/: env.Dockerfile, instance.Dockerfile).
#
# usage: deploy/docker/build-swe-instances.sh [--instances DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/docker/build-base.sh
uv run --no-sync python -m rlfleet_swe.images "$@"
