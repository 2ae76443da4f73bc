"""What a stage's trainer checks before it loads a model, shared with `rlfleet rl --dry-run`.

A dry-run that passes while the start fails is a lie. So the checks that refuse a stage
at start live here, once: the trainer calls `check_start` before it resolves the model
(and its megatron backend calls `check_parallelism` instead of keeping its own copy), and
the dry-run calls the same functions on the same recipe. Either both pass or both fail
with the same one-line message.

Order (the trainer's): settings the backend cannot honour, the model, the data rows, the
model's shape against TP/PP (megatron), then the number of trainer ranks the launcher
starts against the model-parallel sizes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlfleet_core.hub import ModelNotFound, looks_like_path, resolve_hub_model
from rlfleet_core.models import BUNDLED_MODELS

from rlfleet_contracts.recipe import DataConfig, RecipeConfig


class StartupError(ValueError, NotImplementedError):
    """A stage that cannot start; the message is one line naming the setting and the fix.
    Also a NotImplementedError: what the megatron backend raised for these before."""


def parallelism_problem(context_parallel_size: int, expert_parallel_size: int) -> str | None:
    """Why the megatron backend cannot run these sizes, or None. (The torch backend's
    refusal of any model parallelism is a recipe rule: rlfleet_contracts.recipe.)"""
    if context_parallel_size != 1:
        # megatron-core 0.16 transformer/dot_product_attention.py asserts CP == 1: only
        # TEDotProductAttention splits the sequence, and Transformer Engine is not used.
        return (
            f"policy.context_parallel_size={context_parallel_size}: context parallelism "
            "needs Transformer Engine attention, which the megatron backend does not use "
            "(local layer spec); set it to 1"
        )
    if expert_parallel_size != 1:
        return (
            f"policy.expert_parallel_size={expert_parallel_size}: expert parallelism needs "
            "an MoE model and the supported Llama/Qwen2 family is dense; set it to 1"
        )
    return None


def check_parallelism(context_parallel_size: int, expert_parallel_size: int) -> None:
    problem = parallelism_problem(context_parallel_size, expert_parallel_size)
    if problem is not None:
        raise StartupError(problem)


def world_size_problem(
    tensor_parallel_size: int, pipeline_parallel_size: int, world_size: int
) -> str | None:
    """Why `world_size` trainer ranks cannot hold TP x PP model-parallel groups, or None."""
    model_parallel = tensor_parallel_size * pipeline_parallel_size
    if world_size % model_parallel:
        return (
            f"world size {world_size} is not a multiple of policy.tensor_parallel_size × "
            f"policy.pipeline_parallel_size ({model_parallel}); launch TP × PP × DP processes"
        )
    return None


def check_world_size(
    tensor_parallel_size: int, pipeline_parallel_size: int, world_size: int
) -> None:
    problem = world_size_problem(tensor_parallel_size, pipeline_parallel_size, world_size)
    if problem is not None:
        raise StartupError(problem)


MEGATRON_MODEL_TYPES = ("llama", "qwen2")
"""The HF families the megatron backend builds and converts (backends/megatron_convert.py)."""


def model_shape_problem(
    num_attention_heads: int,
    num_key_value_heads: int,
    num_hidden_layers: int,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
) -> str | None:
    """Why the megatron backend cannot split this model over TP x PP, or None: tensor
    parallelism divides the query heads and the key/value groups, pipeline stages divide
    the decoder layers evenly (no uneven splits)."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    if num_attention_heads % tp or num_key_value_heads % tp:
        return (
            f"policy.tensor_parallel_size={tp} must divide the model's {num_attention_heads} "
            f"attention heads and {num_key_value_heads} key/value heads; pick a common divisor"
        )
    if num_hidden_layers % pp:
        return (
            f"policy.pipeline_parallel_size={pp} must divide the model's {num_hidden_layers} "
            "decoder layers; pick a divisor of the layer count"
        )
    return None


def check_model_shape(
    num_attention_heads: int,
    num_key_value_heads: int,
    num_hidden_layers: int,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
) -> None:
    problem = model_shape_problem(
        num_attention_heads,
        num_key_value_heads,
        num_hidden_layers,
        tensor_parallel_size,
        pipeline_parallel_size,
    )
    if problem is not None:
        raise StartupError(problem)


def local_model_config(model: str) -> dict[str, Any] | None:
    """The model's config.json when it can be read here without a download (a local
    folder, a bundled model, the Hugging Face cache); None otherwise."""
    from rlfleet_core.models import resolve_model

    try:
        path = resolve_model(model, download=False)
        config: dict[str, Any] = json.loads((path / "config.json").read_text())
    except Exception:  # not resolvable offline: the start resolves and checks it
        return None
    return config


def shape_problem(recipe: RecipeConfig) -> str | None:
    """The megatron backend's model family and TP/PP split, checked from config.json."""
    config = local_model_config(recipe.policy.model)
    if config is None:
        return None
    family = config.get("model_type")
    if family is not None and family not in MEGATRON_MODEL_TYPES:
        return (
            f"policy.backend=megatron converts {' and '.join(MEGATRON_MODEL_TYPES)} models, not "
            f"{family!r} (policy.model={recipe.policy.model}); use policy.backend=torch"
        )
    if "num_attention_heads" not in config:
        return None
    heads = int(config["num_attention_heads"])
    return model_shape_problem(
        heads,
        int(config.get("num_key_value_heads") or heads),
        int(config.get("num_hidden_layers", 1)),
        recipe.policy.tensor_parallel_size,
        recipe.policy.pipeline_parallel_size,
    )


def model_problem(model: str, *, download: bool = True) -> str | None:
    """Why `policy.model` cannot resolve here, or None, without loading or downloading it.

    Bundled names are built offline on first use; a local folder must exist and hold a
    config.json; a Hugging Face id must be in the cache unless a download may fetch it
    (`download` and HF_HUB_OFFLINE unset), which only the start itself can tell."""
    if model in BUNDLED_MODELS:
        return None
    path = Path(model).expanduser()
    if looks_like_path(model) or path.is_dir():
        if not path.is_dir():
            hint = (
                "; it is an earlier stage's export (<run dir>/hf): run that stage first"
                if path.name == "hf"
                else ""
            )
            return f"policy.model={model}: no such folder{hint}"
        if not (path / "config.json").is_file():
            return f"policy.model={model}: a model folder needs a config.json (HF layout)"
        return None
    if download and os.environ.get("HF_HUB_OFFLINE", "") not in ("1", "true", "True"):
        return None
    try:
        resolve_hub_model(model, download=False)
    except ModelNotFound as exc:
        return f"policy.model={model}: {exc}"
    return None


def data_problem(data: DataConfig) -> str | None:
    """Why the stage's rows cannot be read, or None."""
    if not data.train_path:
        return "data.train_path is not set: give the training rows (JSONL)"
    for key, value in (("data.train_path", data.train_path), ("data.val_path", data.val_path)):
        if value and not Path(value).is_file():
            return (
                f"{key}={value}: no such file; prepare the blend with "
                "`rlfleet data prep rl <blend>` or point it at a JSONL file"
            )
    return None


def nemotron_h_with_moe(config: dict[str, Any]) -> bool:
    """A Nemotron-H config.json with mixture-of-experts layers (`layers_block_type` as
    transformers 5 writes it, or the published `hybrid_override_pattern`)."""
    kinds = config.get("layers_block_type") or list(config.get("hybrid_override_pattern", ""))
    return config.get("model_type") == "nemotron_h" and any(k in ("moe", "E") for k in kinds)


def moe_problem(recipe: RecipeConfig) -> str | None:
    """Aux-loss-free balancing asked of a model with no DeepSeek-style router (read from
    its config.json when it is here: Nemotron-H with MoE layers, or a config naming
    `n_routed_experts`, as DeepSeek-V3's does)."""
    rate = recipe.policy.moe.router_bias_update_rate
    config = local_model_config(recipe.policy.model) if rate > 0 else None
    if config is None:
        return None
    if config.get("model_type") == "nemotron_h":
        routed = nemotron_h_with_moe(config)
    else:
        routed = bool(config.get("n_routed_experts"))
    if routed:
        return None
    return (
        f"policy.moe.router_bias_update_rate={rate}: policy.model={recipe.policy.model} "
        f"({config.get('model_type')}) has no mixture-of-experts router with an expert bias; "
        "set it to 0"
    )


def start_problem(
    recipe: RecipeConfig, world_size: int | None = None, *, download: bool = True
) -> str | None:
    """The first reason this stage's trainer would refuse to start, or None, in the order
    the trainer meets them. `world_size`: the trainer ranks the launcher starts (None: not
    known here; the megatron backend checks it once its process group exists)."""
    p = recipe.policy
    megatron = p.backend == "megatron"
    problem = (
        (parallelism_problem(p.context_parallel_size, p.expert_parallel_size) if megatron else None)
        or model_problem(p.model, download=download)
        or data_problem(recipe.data)
    )
    if problem is None and megatron:
        problem = shape_problem(recipe)
    if problem is None and megatron and world_size is not None:
        problem = world_size_problem(p.tensor_parallel_size, p.pipeline_parallel_size, world_size)
    if problem is None:
        problem = moe_problem(recipe) or dpo_problem(recipe)
    return problem


def dpo_problem(recipe: RecipeConfig) -> str | None:
    """A dpo stage samples tool-use episodes and trains in one process."""
    if recipe.kind != "dpo":
        return None
    if not recipe.multi_turn.envs:
        return (
            f"stage {recipe.stage}: a dpo stage samples multi-turn tool-use trajectories; "
            "set multi_turn.envs (e.g. [tool_use])"
        )
    if recipe.policy.world_size != 1:
        return (
            f"stage {recipe.stage}: policy.world_size is {recipe.policy.world_size}; a dpo "
            "stage trains in one process: set the parallel sizes to 1"
        )
    return None


def check_start(
    recipe: RecipeConfig, world_size: int | None = None, *, download: bool = True
) -> None:
    """Raise StartupError with the first reason this stage cannot start."""
    problem = start_problem(recipe, world_size, download=download)
    if problem is not None:
        raise StartupError(problem)
