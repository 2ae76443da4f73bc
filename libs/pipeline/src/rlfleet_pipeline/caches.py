"""One shared cache folder for every process a launcher starts: `RLFLEET_CACHE_DIR`.

Unset (the default), nothing changes: each tool keeps its own default cache. Set, it is
the root of every cache that is slow to refill, so that the services, the trainer and
later runs (or other nodes, on a shared filesystem) reuse one copy:

    $RLFLEET_CACHE_DIR/models        rlfleet's converted models (rlfleet_core.models)
    $RLFLEET_CACHE_DIR/huggingface   HF_HOME: hub downloads (model weights), datasets
    $RLFLEET_CACHE_DIR/torchinductor TORCHINDUCTOR_CACHE_DIR: torch.compile kernels
    $RLFLEET_CACHE_DIR/triton        TRITON_CACHE_DIR: compiled Triton kernels
    $RLFLEET_CACHE_DIR/vllm          VLLM_CACHE_ROOT: vLLM's compile cache
    $RLFLEET_CACHE_DIR/uv            UV_CACHE_DIR: uv's wheel cache

A variable the caller set explicitly wins over the derived one (HF_HOME=/fast/hf with
RLFLEET_CACHE_DIR=/shared keeps the hub cache on /fast/hf). The same folder can come from
the run profile (`cache_dir` in env.toml's [local] / [compose] table; `use_cache_dir`);
RLFLEET_CACHE_DIR in the environment wins over it.

Who passes it on: the local fleet sets these variables in its own process while it runs,
so its services and the trainer started beside them inherit them; `ComposeStack` passes
them to `docker compose` (for compose.yaml to mount); a SLURM profile's `cache_dir` makes
the job script export them before any `srun` (launch/slurm.py; the folder must be on a
shared filesystem, mounted at the same path in the containers).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

CACHE_DIR_ENV = "RLFLEET_CACHE_DIR"

CACHE_SUBDIRS = {
    "HF_HOME": "huggingface",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "VLLM_CACHE_ROOT": "vllm",
    "UV_CACHE_DIR": "uv",
}
"""Variable -> folder under RLFLEET_CACHE_DIR."""


def cache_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `env` so that its processes share RLFLEET_CACHE_DIR's
    caches: {} when RLFLEET_CACHE_DIR is unset or empty; never a variable `env` has."""
    root = env.get(CACHE_DIR_ENV, "").strip()
    if not root:
        return {}
    base = Path(root).expanduser().absolute()
    added = {CACHE_DIR_ENV: str(base)}
    for var, sub in CACHE_SUBDIRS.items():
        if not env.get(var, "").strip():
            added[var] = str(base / sub)
    return added


def use_cache_dir(cache_dir: str | None, env: MutableMapping[str, str] = os.environ) -> None:
    """Make a profile's `cache_dir` this run's RLFLEET_CACHE_DIR, unless one is set."""
    if cache_dir and not env.get(CACHE_DIR_ENV, "").strip():
        env[CACHE_DIR_ENV] = str(Path(cache_dir).expanduser().absolute())
