"""A stage's lineage manifest, <stage>/lineage.json: what its weights come from and what
made them, so that any export can be traced back to the data, recipe, input checkpoint
and code that produced it.

- `recipe`: the recipe's name and the sha256 of the exact recipe the trainer ran;
- `data`: the blend, its prepared files (sha256 of the train/val splits and the manifest)
  and the manifest's sources and splits;
- `parent_model` / `parent_model_path` / `parent_stage`: the input checkpoint (the
  previous stage's export inside a pipeline) and the sha256 of its weights;
- `code`: the git commit and the rlfleet package versions;
- `output`: where the stage writes its export and checkpoints.

Written before the trainer starts, by `rlfleet run` and `rlfleet rl` alike.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.run_folder import BLEND_MANIFEST, StageFolder
from rlfleet_core.config import dump_yaml
from rlfleet_core.versions import git_commit, package_version

PACKAGES = (
    "rlfleet",
    "rlfleet-pipeline",
    "rlfleet-contracts",
    "rlfleet-core",
    "rlfleet-dataprep",
    "rlfleet-proto",
    "rlfleet-weights",
    "rlfleet-trainer",
    "rlfleet-rollout",
    "rlfleet-reward",
    "rlfleet-sandbox",
    "rlfleet-swe",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def weights_sha256(folder: Path) -> str | None:
    """One digest over a HF folder's weight files (name and content, in name order);
    None for a folder without any (a name the hub resolves later)."""
    files = sorted(p for p in folder.glob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}:{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def code_versions() -> dict[str, Any]:
    return {
        "git_commit": git_commit() or None,
        "packages": {p: package_version(p) for p in PACKAGES},
    }


def _data(recipe: RecipeConfig) -> dict[str, Any]:
    data: dict[str, Any] = {"train_path": recipe.data.train_path, "val_path": recipe.data.val_path}
    for key in ("train_path", "val_path"):
        path = getattr(recipe.data, key)
        if path and Path(path).is_file():
            data[key.replace("_path", "_sha256")] = sha256_file(Path(path))
    if recipe.data.train_path:  # a prepared blend: <blend>/train/data.jsonl + manifest
        manifest = Path(recipe.data.train_path).parent.parent / BLEND_MANIFEST
        if manifest.is_file():
            prepared = json.loads(manifest.read_text())
            data |= {
                "dir": str(manifest.parent),
                "manifest_sha256": sha256_file(manifest),
                "sources": prepared.get("sources", {}),
                "splits": prepared.get("splits", {}),
            }
    return data


def stage_lineage(recipe: RecipeConfig, recipe_name: str, stage_dir: Path) -> dict[str, Any]:
    """The manifest (module docstring) of a stage about to train in `stage_dir`."""
    folder = StageFolder(stage_dir)
    parent = Path(recipe.policy.model).expanduser()
    return {
        "stage": recipe.stage,
        "recipe": recipe_name,
        "recipe_sha256": hashlib.sha256(dump_yaml(recipe).encode()).hexdigest(),
        "parent_model": recipe.policy.model,
        "parent_model_path": str(parent.resolve()) if parent.is_dir() else None,
        "parent_weights_sha256": weights_sha256(parent) if parent.is_dir() else None,
        "data": _data(recipe),
        "code": code_versions(),
        "output": {"hf": str(folder.hf), "checkpoints": str(folder.checkpoints())},
    }


def write_lineage(
    stage_dir: Path, recipe: RecipeConfig, recipe_name: str, **extra: str | None
) -> None:
    """<stage_dir>/lineage.json: stage_lineage, plus `extra` (a pipeline's stage, blend
    and parent stage names)."""
    lineage = {**stage_lineage(recipe, recipe_name, stage_dir), **extra}
    StageFolder(stage_dir).lineage.write_text(json.dumps(lineage, indent=2) + "\n")
