"""A NeMo-RL GRPO config (examples/configs/grpo_*.yaml) as an rlfleet stage recipe.

NeMo-RL groups keys differently (`loss_fn.*`, `policy.optimizer.kwargs.*`,
`policy.generation.*`, `checkpointing.*`); `MAPPED` says where each one goes here.
Everything else is listed back, with its value, as not mapped: the importer never drops a
setting silently. `defaults:` (config inheritance) and `${a.b}` / `${.b}` interpolations are
resolved first; resolver calls such as `${mul:...}` are not, and their keys are listed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfleet_core.config import ConfigError, deep_merge, read_yaml

_REF = re.compile(r"\$\{(\.?[A-Za-z0-9_.]+)\}")


def _same(value: Any) -> Any:
    return value


# NeMo-RL key -> (rlfleet key, value transform). A transform returning _SKIP leaves the key
# unmapped (listed), e.g. a NeMo-RL setting rlfleet has no equivalent for.
_SKIP: Any = object()
MAPPED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "grpo.num_prompts_per_step": ("grpo.num_prompts_per_step", _same),
    "grpo.num_generations_per_prompt": ("grpo.num_generations_per_prompt", _same),
    "grpo.max_num_steps": ("grpo.max_num_steps", _same),
    "grpo.normalize_rewards": ("grpo.normalize_rewards", _same),
    "grpo.use_leave_one_out_baseline": ("grpo.use_leave_one_out_baseline", _same),
    "grpo.val_period": ("grpo.val_every_steps", _same),
    "grpo.val_at_start": ("grpo.val_at_start", _same),
    "grpo.val_at_end": ("grpo.val_at_end", _same),
    "grpo.overlong_filtering": ("grpo.overlong_filtering", _same),
    "grpo.max_val_samples": ("grpo.num_val_prompts", _same),
    "grpo.val_num_generations_per_prompt": ("grpo.val_samples_per_prompt", _same),
    "grpo.seed": ("grpo.seed", _same),
    "grpo.use_dynamic_sampling": ("grpo.dynamic_sampling", _same),
    "grpo.seq_logprob_error_threshold": ("grpo.seq_logprob_error_threshold", _same),
    "grpo.async_grpo.in_flight_weight_updates": ("grpo.in_flight_weight_updates", _same),
    "grpo.async_grpo.recompute_kv_cache_after_weight_updates": (
        "grpo.recompute_kv_cache_after_weight_updates",
        _same,
    ),
    "loss_fn.reference_policy_kl_penalty": ("grpo.kl_coef", _same),
    "loss_fn.reference_policy_kl_type": ("grpo.kl_type", _same),
    "loss_fn.kl_input_clamp_value": ("grpo.kl_input_clamp", _same),
    "loss_fn.kl_output_clamp_value": ("grpo.kl_output_clamp", _same),
    "loss_fn.ratio_clip_min": ("grpo.ratio_clip_min", _same),
    "loss_fn.ratio_clip_max": ("grpo.ratio_clip_max", _same),
    "loss_fn.ratio_clip_c": ("grpo.ratio_clip_c", _same),
    "loss_fn.use_on_policy_kl_approximation": ("grpo.use_on_policy_kl_approximation", _same),
    "loss_fn.sequence_level_importance_ratios": ("grpo.sequence_level_importance_ratios", _same),
    "loss_fn.token_level_loss": ("grpo.loss_level", lambda v: "token" if v else "sequence"),
    "loss_fn.force_on_policy_ratio": ("grpo.force_on_policy_ratio", _same),
    "loss_fn.truncated_importance_sampling_ratio": (
        "grpo.importance_weight_max",
        lambda v: _SKIP if v is None else v,
    ),
    "loss_fn.truncated_importance_sampling_ratio_min": (
        "grpo.importance_weight_min",
        lambda v: _SKIP if v is None else v,
    ),
    "policy.model_name": ("policy.model", _same),
    "policy.train_micro_batch_size": ("policy.train_micro_batch_size", _same),
    "policy.logprob_batch_size": ("policy.logprob_micro_batch_size", _same),
    "policy.max_total_sequence_length": ("policy.max_total_sequence_length", _same),
    "policy.precision": (
        "policy.dtype",
        lambda v: v if v in ("bfloat16", "float32") else _SKIP,
    ),
    "policy.max_grad_norm": ("policy.optimizer.max_grad_norm", _same),
    "policy.optimizer.name": (
        "",  # rlfleet's optimizer is AdamW: nothing to set when NeMo-RL's is too
        lambda v: None if v == "torch.optim.AdamW" else _SKIP,
    ),
    "policy.optimizer.kwargs.lr": ("grpo.lr", _same),
    "policy.optimizer.kwargs.weight_decay": ("policy.optimizer.weight_decay", _same),
    "policy.optimizer.kwargs.betas": ("policy.optimizer.betas", _same),
    "policy.optimizer.kwargs.eps": ("policy.optimizer.eps", float),
    "policy.dtensor_cfg.activation_checkpointing": ("policy.activation_checkpointing", _same),
    "policy.generation.temperature": ("generation.temperature", _same),
    "policy.generation.top_p": ("generation.top_p", _same),
    "policy.generation.top_k": ("generation.top_k", lambda v: 0 if v is None else v),
    "policy.generation.max_new_tokens": ("generation.max_new_tokens", _same),
    "policy.generation.vllm_cfg.logprobs_mode": (
        "generation.logprobs_mode",
        lambda v: {"processed_logprobs": "processed", "raw_logprobs": "raw"}.get(v, _SKIP),
    ),
    "checkpointing.checkpoint_dir": ("checkpoint.dir", _same),
    "checkpointing.save_period": ("checkpoint.save_every_steps", _same),
    "data.shuffle": ("data.shuffle", _same),
    "data.train.data_path": ("data.train_path", _same),
    "data.validation.data_path": ("data.val_path", _same),
    "data.default.env_name": ("data.default_env", _same),
    "cluster.num_nodes": ("cluster.num_nodes", _same),
    "cluster.gpus_per_node": ("cluster.gpus_per_node", _same),
}


@dataclass
class Imported:
    recipe: dict[str, Any]
    """The recipe tree (only the keys set from the NeMo-RL config; defaults stay in the
    schema)."""
    unmapped: dict[str, Any] = field(default_factory=dict)
    """NeMo-RL key -> value, for every setting that has no place in the recipe."""
    adjusted: dict[str, str] = field(default_factory=dict)
    """rlfleet key -> why its value differs from NeMo-RL's (also in `deviations`)."""
    sources: dict[str, str] = field(default_factory=dict)
    """rlfleet key -> the NeMo-RL key it came from (for error lines)."""
    mapped: set[str] = field(default_factory=set)
    """NeMo-RL keys that were read into the recipe (or need nothing there)."""


def read_nemo_rl(path: Path) -> dict[str, Any]:
    """The config with its `defaults:` chain merged (parents first) and references resolved
    (after the merge, so a child's value reaches the parent's `${...}`)."""
    return _resolve(_read_chain(path))


def _read_chain(path: Path, depth: int = 0) -> dict[str, Any]:
    data = read_yaml(path)
    parents = data.pop("defaults", None)
    if depth > 20:
        raise ConfigError([f"{path}: defaults: the chain is deeper than 20 files (a cycle?)"])
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents or []:
        merged = deep_merge(merged, _read_chain(path.parent / str(parent), depth + 1))
    return deep_merge(merged, data)


def _resolve(root: dict[str, Any]) -> dict[str, Any]:
    def lookup(ref: str, here: list[str]) -> Any:
        parts = [*here, *ref[1:].split(".")] if ref.startswith(".") else ref.split(".")
        node: Any = root
        for part in parts:
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(ref)
            node = node[part]
        return node

    def walk(node: Any, here: list[str], depth: int = 0) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, [*here, k], depth) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, here, depth) for v in node]
        match = _REF.fullmatch(node) if isinstance(node, str) else None
        if match is None or depth > 10:
            return node  # a literal, a resolver call such as ${mul:...}, or a cycle
        try:
            return walk(lookup(match.group(1), here[:-1]), here, depth + 1)
        except KeyError:
            return node

    resolved: dict[str, Any] = walk(root, [])
    return resolved


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def import_grpo(config: Mapping[str, Any]) -> Imported:
    """Map a NeMo-RL GRPO config onto a recipe tree (not yet validated)."""
    result = Imported(recipe={"stage": "rlvr"})
    leaves = _leaves(dict(config))
    handled = _special_cases(config, leaves, result)
    result.mapped |= handled
    megatron = (config.get("policy", {}).get("megatron_cfg") or {}).get("enabled") is True
    for key, value in leaves.items():
        if key in handled:
            continue
        target, transform = MAPPED.get(key, ("", None))
        if megatron and key.startswith(_DTENSOR_ONLY):
            transform = None  # megatron trains: its own optimizer settings were read
        converted = _SKIP if transform is None else transform(value)
        if converted is _SKIP or (isinstance(value, str) and "${" in value):
            result.unmapped[key] = value
        else:
            result.mapped.add(key)
            if target:
                _set(result.recipe, target, converted)
                result.sources[target] = key
    return result


def _special_cases(config: Mapping[str, Any], leaves: dict[str, Any], out: Imported) -> set[str]:
    """Keys whose meaning depends on others; returns the keys handled here."""
    grpo, loss = config.get("grpo", {}), config.get("loss_fn", {})
    policy = config.get("policy", {})
    handled: set[str] = set()

    async_cfg = grpo.get("async_grpo", {})
    if "enabled" in async_cfg:
        age = async_cfg.get("max_trajectory_age_steps", 1) if async_cfg["enabled"] else 0
        _set(out.recipe, "grpo.max_trajectory_age_steps", age)
        out.sources["grpo.max_trajectory_age_steps"] = "grpo.async_grpo.enabled"
        handled |= {"grpo.async_grpo.enabled", "grpo.async_grpo.max_trajectory_age_steps"}

    low, high = grpo.get("advantage_clip_low"), grpo.get("advantage_clip_high")
    if (low is None and high is None) or (low is not None and high is not None and -low == high):
        if high is not None:
            _set(out.recipe, "grpo.advantage_clip", high)
        handled |= {"grpo.advantage_clip_low", "grpo.advantage_clip_high"}

    if "use_importance_sampling_correction" in loss:
        kind = loss.get("truncated_importance_sampling_type")
        if not loss["use_importance_sampling_correction"]:
            _set(out.recipe, "grpo.importance_sampling", "none")
        elif kind in ("tis", "icepop", "seq-mask-tis"):
            _set(out.recipe, "grpo.importance_sampling", kind)
        if not loss["use_importance_sampling_correction"] or kind is not None:
            handled |= {
                "loss_fn.use_importance_sampling_correction",
                "loss_fn.truncated_importance_sampling_type",
            }

    total = policy.get("max_total_sequence_length")
    new = policy.get("generation", {}).get("max_new_tokens")
    if isinstance(total, int) and isinstance(new, int) and new >= total:
        # NeMo-RL lets generation fill what the prompt leaves; rlfleet's cap is per sample
        # and must leave room for the prompt.
        _set(out.recipe, "generation.max_new_tokens", total // 2)
        why = (
            f"NeMo-RL policy.generation.max_new_tokens={new} fills the context "
            f"({total}); rlfleet's cap must leave room for the prompt: set to {total // 2}"
        )
        out.adjusted["generation.max_new_tokens"] = why
        out.recipe.setdefault("deviations", {})["generation.max_new_tokens"] = why
        handled.add("policy.generation.max_new_tokens")

    global_batch = policy.get("train_global_batch_size")
    if global_batch is not None and global_batch == grpo.get("num_prompts_per_step", 0) * grpo.get(
        "num_generations_per_prompt", 0
    ):
        handled.add("policy.train_global_batch_size")  # one optimizer step per batch: as here

    handled |= _backend(policy, leaves, out)
    colocated = policy.get("generation", {}).get("colocated", {})
    if colocated.get("enabled") is True:
        _set(out.recipe, "cluster.generation_nodes", 0)
        handled |= {k for k in leaves if k.startswith("policy.generation.colocated.")}
    return handled


_DTENSOR_ONLY = ("policy.optimizer.", "policy.dtensor_cfg.", "policy.max_grad_norm")

# megatron_cfg key -> recipe key, read only when megatron_cfg.enabled is true.
_MEGATRON = {
    "tensor_model_parallel_size": "policy.tensor_parallel_size",
    "pipeline_model_parallel_size": "policy.pipeline_parallel_size",
    "context_parallel_size": "policy.context_parallel_size",
    "expert_model_parallel_size": "policy.expert_parallel_size",
    "activation_checkpointing": "policy.activation_checkpointing",
    "optimizer.lr": "grpo.lr",
    "optimizer.weight_decay": "policy.optimizer.weight_decay",
    "optimizer.adam_eps": "policy.optimizer.eps",
    "optimizer.clip_grad": "policy.optimizer.max_grad_norm",
}


def _backend(policy: Mapping[str, Any], leaves: dict[str, Any], out: Imported) -> set[str]:
    """`policy.megatron_cfg.enabled` picks rlfleet's megatron backend and its parallelism;
    with DTensor (the torch backend here) only sizes of 1 carry over."""
    handled: set[str] = set()
    megatron = policy.get("megatron_cfg") or {}
    dtensor = policy.get("dtensor_cfg") or {}
    if megatron.get("enabled") is True:
        _set(out.recipe, "policy.backend", "megatron")
        handled.add("policy.megatron_cfg.enabled")
        for key, target in _MEGATRON.items():
            nemo_key = f"policy.megatron_cfg.{key}"
            if nemo_key not in leaves:
                continue
            value: Any = leaves[nemo_key]
            if not (isinstance(value, str) and "${" in value):
                _set(out.recipe, target, float(value) if key == "optimizer.adam_eps" else value)
                out.sources[target] = nemo_key
                handled.add(nemo_key)
        beta1 = leaves.get("policy.megatron_cfg.optimizer.adam_beta1")
        beta2 = leaves.get("policy.megatron_cfg.optimizer.adam_beta2")
        if beta1 is not None and beta2 is not None:
            _set(out.recipe, "policy.optimizer.betas", [beta1, beta2])
            handled |= {f"policy.megatron_cfg.optimizer.adam_beta{i}" for i in (1, 2)}
        # The DTensor section is not read when megatron trains: its keys stay listed.
        return handled
    if megatron.get("enabled") is False:
        handled.add("policy.megatron_cfg.enabled")
    if dtensor.get("enabled") is True:
        handled.add("policy.dtensor_cfg.enabled")
        for key in ("tensor_parallel_size", "context_parallel_size"):
            if dtensor.get(key) == 1:
                handled.add(f"policy.dtensor_cfg.{key}")
    return handled


def load_imported(imported: Imported) -> Any:
    """Validate the recipe; ConfigError lines name the rlfleet key and its NeMo-RL source."""
    from pydantic import ValidationError
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_core.config import format_validation_error

    try:
        return RecipeConfig.model_validate(imported.recipe)
    except ValidationError as exc:
        lines = format_validation_error(exc, RecipeConfig)
        named = []
        for line in lines:
            key = line.partition(":")[0]
            source = imported.sources.get(key)
            named.append(f"{line} (from NeMo-RL {source})" if source else line)
        raise ConfigError(named) from None
