"""Setting up a megatron-core policy: its config, the checks that refuse what the backend
cannot run, the process groups, and each pipeline stage's `GPTModel` loaded from HF weights.

Megatron on CPU needs `use_cpu_initialization`, every fusion off, the RNG tracker
re-initialised and `torch.cuda.current_device` routed to the CPU; all of that happens here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlfleet_contracts.policy import PolicyConfig
from rlfleet_contracts.startup import check_model_shape, check_parallelism, check_world_size

from rlfleet_trainer.backends.base import BackendConfig
from rlfleet_trainer.backends.megatron_convert import ModelDims, stage_layers

_POLICY = PolicyConfig()


@dataclass
class MegatronBackendConfig(BackendConfig):
    tensor_parallel_size: int = _POLICY.tensor_parallel_size
    pipeline_parallel_size: int = _POLICY.pipeline_parallel_size
    context_parallel_size: int = _POLICY.context_parallel_size
    expert_parallel_size: int = _POLICY.expert_parallel_size
    seed: int = 0


def check_parallel_sizes(config: MegatronBackendConfig, dims: ModelDims) -> None:
    """Refuse what this backend cannot run, before any process group exists."""
    check_parallelism(config.context_parallel_size, config.expert_parallel_size)
    check_model_shape(
        dims.num_heads,
        dims.num_query_groups,
        dims.num_layers,
        config.tensor_parallel_size,
        config.pipeline_parallel_size,
    )


def init_process_group() -> None:
    """The default process group, unless the trainer entry made it already (a multi-rank
    stage does, from torchrun's or srun's env). A world of one needs no rendezvous: an
    in-memory store, so no port is taken (two single-rank trainers on one machine cannot
    collide). A larger world meets at the MASTER_ADDR/MASTER_PORT its launcher set."""
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        return
    missing = [key for key in ("RANK", "MASTER_ADDR", "MASTER_PORT") if key not in os.environ]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={world} but {', '.join(missing)} unset: start the trainer ranks "
            "with torchrun or srun, which set the rendezvous address and port"
        )
    dist.init_process_group(
        backend, init_method="env://", rank=int(os.environ["RANK"]), world_size=world
    )


def init_megatron(config: MegatronBackendConfig) -> None:
    """Default process group (see `init_process_group`), Megatron's parallel state over it
    (TP × PP × DP = its world) and the RNG tracker."""
    if torch.cuda.is_available():
        # One GPU per local rank (NCCL refuses two ranks on one device).
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        # Megatron asks for the current CUDA device in a few places; on CPU there is none.
        torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    init_process_group()
    from megatron.core import parallel_state  # type: ignore[import-untyped]
    from megatron.core.tensor_parallel.random import initialize_rng_tracker  # type: ignore[import-untyped]

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    check_world_size(
        config.tensor_parallel_size, config.pipeline_parallel_size, dist.get_world_size()
    )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=config.tensor_parallel_size,
        pipeline_model_parallel_size=config.pipeline_parallel_size,
    )
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    torch.manual_seed(config.seed)


def build_gpt_model(
    dims: ModelDims, tp_size: int, pp_size: int = 1, pp_rank: int = 0
) -> torch.nn.Module:
    """This stage's `GPTModel`: its share of the layers, the embedding if first, the final
    norm and output layer if last (Megatron reads the PP rank from parallel_state)."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel  # type: ignore[import-untyped]
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # type: ignore[import-untyped]
    from megatron.core.transformer.transformer_config import TransformerConfig  # type: ignore[import-untyped]
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset  # type: ignore[import-untyped]

    config = TransformerConfig(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        num_attention_heads=dims.num_heads,
        num_query_groups=dims.num_query_groups,
        kv_channels=dims.head_dim,
        ffn_hidden_size=dims.ffn_hidden_size,
        tensor_model_parallel_size=tp_size,
        pipeline_model_parallel_size=pp_size,
        pipeline_dtype=torch.float32,  # required by Megatron when PP > 1; our p2p sends fp32
        normalization="RMSNorm",
        layernorm_epsilon=dims.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=dims.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        params_dtype=torch.float32,
    )
    layers = stage_layers(dims.num_layers, pp_rank, pp_size)
    if pp_size > 1 and get_transformer_layer_offset(config, pp_rank=pp_rank) != layers.start:
        raise RuntimeError(
            "megatron-core splits the layers differently from megatron_convert.stage_layers; "
            "the HF weights would land on the wrong layers"
        )
    model: torch.nn.Module = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=dims.vocab_size,
        max_sequence_length=dims.max_position_embeddings,
        pre_process=pp_rank == 0,
        post_process=pp_rank == pp_size - 1,
        position_embedding_type="rope",
        rotary_base=int(dims.rope_theta),
        # Across stages a tied embedding is two parameters that we keep equal ourselves:
        # Megatron's own set-up of the shared copy moves it to CUDA.
        share_embeddings_and_output_weights=dims.tied_embeddings and pp_size == 1,
        parallel_output=False,  # full-vocab logits: the loss code is shared with torch
    )
    return model


def freeze_padding_row(model: torch.nn.Module, pad_token_id: int) -> None:
    """HF builds its embedding with `padding_idx=pad_token_id`, so the lookup never trains
    that row (the torch backend); Megatron's embedding has no such option. The same here by
    detaching the lookup where the input is the pad token (values unchanged). Found by a
    TP=2 GRPO stage whose tiny model generated token 0 = its pad token."""
    embedding: Any = model
    word_embeddings = embedding.embedding.word_embeddings

    def hook(module: torch.nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        pad_NL1 = (args[0] == pad_token_id).unsqueeze(-1)
        return torch.where(pad_NL1, out.detach(), out)

    word_embeddings.register_forward_hook(hook)


def load_megatron_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"megatron state mismatch: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )


def load_hf_state(model_path: Path, load_file: Any) -> dict[str, torch.Tensor]:
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state
