"""Hugging Face ↔ Megatron-core weight conversion for the Llama/Qwen2 family (dense,
RMSNorm, SwiGLU, RoPE, grouped-query attention; Qwen2 adds q/k/v biases).

Megatron names (local layer spec) and their HF sources, with the TP split of each:

    embedding.word_embeddings.weight             model.embed_tokens.weight        rows (vocab)
    decoder.layers.i.input_layernorm.weight      ...input_layernorm.weight        replicated
    decoder.layers.i.self_attention.linear_qkv   q/k/v_proj (per query group:     rows (groups)
                                                 [q heads of the group; k; v])
    decoder.layers.i.self_attention.linear_proj  o_proj                           columns
    decoder.layers.i.pre_mlp_layernorm.weight    ...post_attention_layernorm      replicated
    decoder.layers.i.mlp.linear_fc1.weight       [gate_proj; up_proj] per rank    rows
    decoder.layers.i.mlp.linear_fc2.weight       down_proj                        columns
    decoder.final_layernorm.weight               model.norm.weight                replicated
    output_layer.weight                          lm_head.weight                   rows (vocab)

Under pipeline parallelism each stage holds an even, contiguous share of the decoder layers
(`stage_layers`, Megatron's default split), numbered from 0 in its own state dict; the
embedding lives on the first stage, the final norm and output layer on the last. A tied
embedding (SmolLM2, small Qwen2) also needs the last stage's copy: it is loaded from
`model.embed_tokens` into that stage's `output_layer.weight` (the backend keeps the two
copies equal by summing their gradients).

`hf_to_megatron(hf, dims, tp_rank, tp_size, pp_rank, pp_size)` gives one rank's shard;
`merge_pipeline_stages` joins the stages' TP-gathered states under global layer numbers and
`megatron_to_hf` takes that full state back to HF names. All are pure functions over dicts
of tensors, so the round trip is tested without a process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from rlfleet_contracts.startup import MEGATRON_MODEL_TYPES

ROW = 0
"""Partition dimension of column-parallel weights (output features split)."""
COLUMN = 1
"""Partition dimension of row-parallel weights (input features split)."""


@dataclass(frozen=True)
class ModelDims:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    qkv_bias: bool
    tied_embeddings: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    pad_token_id: int | None = None

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups

    @staticmethod
    def from_hf_config(config: Any) -> ModelDims:
        if config.model_type not in MEGATRON_MODEL_TYPES:
            raise ValueError(
                f"megatron conversion supports {' and '.join(MEGATRON_MODEL_TYPES)}, "
                f"not {config.model_type!r}"
            )
        rope = getattr(config, "rope_parameters", None) or {}
        rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        return ModelDims(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_query_groups=config.num_key_value_heads,
            head_dim=head_dim,
            ffn_hidden_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            qkv_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
            tied_embeddings=bool(config.tie_word_embeddings),
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(rope_theta),
            max_position_embeddings=config.max_position_embeddings,
            pad_token_id=getattr(config, "pad_token_id", None),
        )


def partition_dim(megatron_name: str) -> int | None:
    """The dimension a tensor is split along under TP, None if replicated."""
    if "layernorm" in megatron_name:
        return None
    if megatron_name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return COLUMN
    return ROW


def stage_layers(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """Global indices of the decoder layers held by pipeline stage `pp_rank`."""
    if num_layers % pp_size:
        raise ValueError(
            f"policy.pipeline_parallel_size={pp_size} must divide the model's {num_layers} "
            "decoder layers; pick a divisor of the layer count"
        )
    per_stage = num_layers // pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def _pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: ModelDims) -> torch.Tensor:
    """[q heads of group g; k_g; v_g] for each group g, stacked along dim 0."""
    trailing = q.shape[1:]
    q_g = q.reshape(dims.num_query_groups, dims.heads_per_group * dims.head_dim, *trailing)
    k_g = k.reshape(dims.num_query_groups, dims.head_dim, *trailing)
    v_g = v.reshape(dims.num_query_groups, dims.head_dim, *trailing)
    return torch.cat([q_g, k_g, v_g], dim=1).reshape(-1, *trailing)


def _unpack_qkv(
    qkv: torch.Tensor, dims: ModelDims
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    trailing = qkv.shape[1:]
    q_width = dims.heads_per_group * dims.head_dim
    grouped = qkv.reshape(dims.num_query_groups, q_width + 2 * dims.head_dim, *trailing)
    q, k, v = torch.split(grouped, [q_width, dims.head_dim, dims.head_dim], dim=1)
    return (
        q.reshape(-1, *trailing),
        k.reshape(-1, *trailing),
        v.reshape(-1, *trailing),
    )


def hf_to_megatron(
    hf: dict[str, torch.Tensor],
    dims: ModelDims,
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
) -> dict[str, torch.Tensor]:
    """One (TP rank, PP stage)'s Megatron state dict from a HF Llama/Qwen2 state dict."""
    if dims.num_query_groups % tp_size or dims.vocab_size % tp_size:
        raise ValueError(
            f"tensor_parallel_size {tp_size} must divide the key/value heads "
            f"({dims.num_query_groups}) and the vocabulary ({dims.vocab_size})"
        )

    def shard(name: str, tensor: torch.Tensor) -> torch.Tensor:
        dim = partition_dim(name)
        if dim is None or tp_size == 1:
            return tensor.clone()
        return tensor.chunk(tp_size, dim=dim)[tp_rank].clone()

    layers = stage_layers(dims.num_layers, pp_rank, pp_size)
    is_first, is_last = pp_rank == 0, pp_rank == pp_size - 1
    out = {}
    if is_first:
        out["embedding.word_embeddings.weight"] = hf["model.embed_tokens.weight"]
    for local, i in enumerate(layers):
        # A stage numbers its layers from 0 (Megatron adds the stage offset internally).
        src, dst = f"model.layers.{i}.", f"decoder.layers.{local}."
        attn = src + "self_attn."
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        out[dst + "self_attention.linear_qkv.weight"] = _pack_qkv(
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], dims
        )
        if dims.qkv_bias:
            out[dst + "self_attention.linear_qkv.bias"] = _pack_qkv(
                hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], dims
            )
        out[dst + "self_attention.linear_proj.weight"] = hf[attn + "o_proj.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        gate, up = hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]
        # Each rank's fc1 shard is [its gate rows; its up rows] (GLU splits in halves).
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [gate.chunk(tp_size)[tp_rank], up.chunk(tp_size)[tp_rank]]
        )
        out[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
    if is_last:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        if not dims.tied_embeddings:
            out["output_layer.weight"] = hf["lm_head.weight"]
        elif not is_first:
            out["output_layer.weight"] = hf["model.embed_tokens.weight"]  # the tied copy
    return {
        name: t.clone() if name.endswith("linear_fc1.weight") else shard(name, t)
        for name, t in out.items()
    }


def gather_fc1(shards: list[torch.Tensor]) -> torch.Tensor:
    """Full [gate; up] from per-rank [gate_r; up_r] shards."""
    gates, ups = zip(*(s.chunk(2) for s in shards), strict=True)
    return torch.cat([*gates, *ups])


def merge_pipeline_stages(
    stages: list[dict[str, torch.Tensor]], dims: ModelDims
) -> dict[str, torch.Tensor]:
    """The full Megatron state (global layer numbers) from every stage's TP-gathered state,
    in stage order. The last stage's copy of a tied embedding is dropped: it equals the
    first stage's word embedding, which is the one exported."""
    full: dict[str, torch.Tensor] = {}
    for pp_rank, stage in enumerate(stages):
        offset = stage_layers(dims.num_layers, pp_rank, len(stages)).start
        for name, tensor in stage.items():
            if name.startswith("decoder.layers."):
                local, rest = name.removeprefix("decoder.layers.").split(".", 1)
                name = f"decoder.layers.{int(local) + offset}.{rest}"
            elif name == "output_layer.weight" and dims.tied_embeddings:
                continue
            full[name] = tensor
    return full


def megatron_to_hf(full: dict[str, torch.Tensor], dims: ModelDims) -> dict[str, torch.Tensor]:
    """HF names from full Megatron tensors (TP-gathered, fc1 as [gate; up]; every stage's
    layers under global numbers, see `merge_pipeline_stages`)."""
    out = {"model.embed_tokens.weight": full["embedding.word_embeddings.weight"]}
    for i in range(dims.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        attn = dst + "self_attn."
        out[dst + "input_layernorm.weight"] = full[src + "input_layernorm.weight"]
        q, k, v = _unpack_qkv(full[src + "self_attention.linear_qkv.weight"], dims)
        out[attn + "q_proj.weight"], out[attn + "k_proj.weight"], out[attn + "v_proj.weight"] = (
            q,
            k,
            v,
        )
        if dims.qkv_bias:
            qb, kb, vb = _unpack_qkv(full[src + "self_attention.linear_qkv.bias"], dims)
            out[attn + "q_proj.bias"], out[attn + "k_proj.bias"], out[attn + "v_proj.bias"] = (
                qb,
                kb,
                vb,
            )
        out[attn + "o_proj.weight"] = full[src + "self_attention.linear_proj.weight"]
        out[dst + "post_attention_layernorm.weight"] = full[src + "pre_mlp_layernorm.weight"]
        gate, up = full[src + "mlp.linear_fc1.weight"].chunk(2)
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate, up
        out[dst + "mlp.down_proj.weight"] = full[src + "mlp.linear_fc2.weight"]
    out["model.norm.weight"] = full["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = (
        full["embedding.word_embeddings.weight"]
        if dims.tied_embeddings
        else full["output_layer.weight"]
    )
    return {name: t.contiguous() for name, t in out.items()}
