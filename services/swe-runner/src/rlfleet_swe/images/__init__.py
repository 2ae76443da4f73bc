"""Builds the images of tiny SWE instances, cached by content hash.

Two levels: `rlfleet/swe-env:<hash>` (the base image + git + pytest + an unprivileged
user; env.Dockerfile) and one image per instance (its `image` field) holding the repository
at base_commit (instance.Dockerfile). An image is rebuilt only when its content hash
(Dockerfile, base image id, repository snapshot, base_commit) differs from the one in its
`rlfleet.swe.content` label, so a second run builds nothing.

    python -m rlfleet_swe.images [--instances DIR] [--base IMAGE]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlfleet_swe.instances import SweInstance, load_instances

HERE = Path(__file__).resolve().parent
CONTENT_LABEL = "rlfleet.swe.content"
BASE_IMAGE = "rlfleet/base:bookworm"
BUILD_TIMEOUT_S = 900.0
INSPECT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Built:
    image: str
    content_hash: str
    cached: bool


def bundled_instances_dir() -> Path:
    """libs/dataprep's bundled swe_tiny folder, found without importing rlfleet-dataprep
    (the swe-runner does not depend on it)."""
    spec = importlib.util.find_spec("rlfleet_dataprep")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("rlfleet-dataprep is not installed: pass --instances DIR")
    return Path(next(iter(spec.submodule_search_locations))) / "bundled" / "swe_tiny"


def _docker(args: list[str], timeout: float, docker: str = "docker") -> str:
    done = subprocess.run(
        [docker, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"docker {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout.strip()


def _label(image: str, docker: str) -> str | None:
    done = subprocess.run(
        [docker, "image", "inspect", image, "--format",
         "{{ index .Config.Labels \"" + CONTENT_LABEL + "\" }}"],
        capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S, check=False,
    )  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def _build(image: str, dockerfile: Path, files: dict[str, bytes], build_args: dict[str, str],
           content_hash: str, docker: str) -> Built:  # fmt: skip
    if _label(image, docker) == content_hash:
        return Built(image, content_hash, cached=True)
    with tempfile.TemporaryDirectory(prefix="rlfleet-swe-build-") as ctx:
        for name, data in files.items():
            (Path(ctx) / name).write_bytes(data)
        (Path(ctx) / "Dockerfile").write_bytes(dockerfile.read_bytes())
        args = ["build", "--quiet", "--label", f"{CONTENT_LABEL}={content_hash}", "-t", image]
        for key, value in build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        _docker([*args, ctx], BUILD_TIMEOUT_S, docker)
    return Built(image, content_hash, cached=False)


def _hash(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def build_env_image(base: str = BASE_IMAGE, docker: str = "docker") -> Built:
    base_id = _docker(["image", "inspect", base, "--format", "{{.Id}}"], INSPECT_TIMEOUT_S, docker)
    dockerfile = HERE / "env.Dockerfile"
    content = _hash(dockerfile.read_bytes(), base_id)
    return _build(f"rlfleet/swe-env:{content[:16]}", dockerfile, {}, {"BASE": base}, content,
                  docker)  # fmt: skip


def build_instance_image(instance: SweInstance, snapshot: bytes, env: Built,
                         docker: str = "docker") -> Built:  # fmt: skip
    if not instance.image:
        raise ValueError(f"{instance.instance_id}: no image name")
    dockerfile = HERE / "instance.Dockerfile"
    content = _hash(dockerfile.read_bytes(), env.content_hash, snapshot, instance.base_commit)
    return _build(
        instance.image, dockerfile, {"repo.patch": snapshot},
        {"ENV_IMAGE": env.image, "BASE_COMMIT": instance.base_commit}, content, docker,
    )  # fmt: skip


def build_images(instances_dir: Path | None = None, base: str = BASE_IMAGE,
                 docker: str = "docker") -> list[Built]:  # fmt: skip
    """Build (or find cached) the image of every instance in `instances_dir`
    (instances.jsonl + repos/<instance_id>.patch)."""
    folder = instances_dir or bundled_instances_dir()
    env = build_env_image(base, docker)
    built = []
    for instance in load_instances(folder / "instances.jsonl"):
        snapshot = (folder / "repos" / f"{instance.instance_id}.patch").read_bytes()
        built.append(build_instance_image(instance, snapshot, env, docker))
    return built


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlfleet_swe.images", description=__doc__)
    parser.add_argument("--instances", type=Path, default=None, help="folder (default: bundled)")
    parser.add_argument("--base", default=BASE_IMAGE, help="base image (build-base.sh)")
    args = parser.parse_args(argv)
    for item in build_images(args.instances, args.base):
        print(f"{item.image} {'cached' if item.cached else 'built'} {item.content_hash[:16]}")
    sys.stdout.flush()
