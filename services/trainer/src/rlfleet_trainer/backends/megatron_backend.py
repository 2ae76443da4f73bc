"""The megatron policy backend: megatron-core `GPTModel` (local layer spec) with tensor
parallelism, loaded from and published as Hugging Face weights.

Process layout: launch one process per rank (torchrun); the default process group (gloo on
CPU, NCCL on GPU) holds world = TP × DP ranks. Every TP rank of a DP replica sees the same
samples; DP replicas see disjoint slices and their gradients are summed (the loss is
already divided by the *global* token count, so a sum is the right reduction).

CPU recipe (ENVIRONMENT.md): `use_cpu_initialization`, every fusion off, the RNG tracker
re-initialised, `torch.cuda.current_device` routed to the CPU, a plain torch AdamW (Megatron's
optimizer wrapper and pipeline schedules are CUDA-only). On GPU the same code runs with
NCCL; parameters stay float32 and the forward runs under bf16 autocast.

Not implemented here (clear errors at start-up): pipeline parallelism (needs Megatron's
CUDA pipeline schedules), context parallelism (needs Transformer Engine attention) and
expert parallelism (the Llama/Qwen2 family is dense).

Shape legend: N = samples, L = sequence length, T = L − 1, V = vocabulary.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlfleet_trainer.algorithms.losses import LossConfig, LossInputs, compute_policy_loss
from rlfleet_trainer.backends.megatron_convert import (
    ModelDims,
    gather_fc1,
    hf_to_megatron,
    megatron_to_hf,
    partition_dim,
)
from rlfleet_trainer.backends.torch_backend import (
    _linear_warmup,
    export_hf_folder,
    token_logprobs_and_entropy,
)
from rlfleet_trainer.batch import TrainBatch

logger = logging.getLogger(__name__)


@dataclass
class MegatronBackendConfig:
    model_path: Path
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_parallel_size: int = 1
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    warmup_steps: int = 0
    train_micro_batch_size: int = 4
    logprob_micro_batch_size: int = 8
    temperature: float = 1.0
    keep_reference: bool = False
    seed: int = 0


def init_megatron(config: MegatronBackendConfig) -> None:
    """Default process group (from torchrun's env, or a world of 1), Megatron's parallel
    state and RNG tracker."""
    for name, size in (
        ("pipeline_parallel_size", config.pipeline_parallel_size),
        ("context_parallel_size", config.context_parallel_size),
        ("expert_parallel_size", config.expert_parallel_size),
    ):
        if size != 1:
            raise NotImplementedError(
                f"policy.{name}={size}: the megatron backend runs tensor and data "
                "parallelism only (pipeline schedules need CUDA, context parallelism needs "
                "Transformer Engine, experts need an MoE model); set it to 1"
            )
    if not dist.is_initialized():
        import os

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(
            backend,
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
        )
    if not torch.cuda.is_available():
        # Megatron asks for the current CUDA device in a few places; on CPU there is none.
        torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    from megatron.core import parallel_state  # type: ignore[import-untyped]
    from megatron.core.tensor_parallel.random import initialize_rng_tracker  # type: ignore[import-untyped]

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.get_world_size() % config.tensor_parallel_size:
        raise ValueError(
            f"world size {dist.get_world_size()} is not a multiple of "
            f"policy.tensor_parallel_size ({config.tensor_parallel_size})"
        )
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=config.tensor_parallel_size)
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    torch.manual_seed(config.seed)


def build_gpt_model(dims: ModelDims, tp_size: int) -> torch.nn.Module:
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel  # type: ignore[import-untyped]
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # type: ignore[import-untyped]
    from megatron.core.transformer.transformer_config import TransformerConfig  # type: ignore[import-untyped]

    config = TransformerConfig(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        num_attention_heads=dims.num_heads,
        num_query_groups=dims.num_query_groups,
        kv_channels=dims.head_dim,
        ffn_hidden_size=dims.ffn_hidden_size,
        tensor_model_parallel_size=tp_size,
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
    model: torch.nn.Module = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=dims.vocab_size,
        max_sequence_length=dims.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=int(dims.rope_theta),
        share_embeddings_and_output_weights=dims.tied_embeddings,
        parallel_output=False,  # full-vocab logits: the loss code is shared with torch
    )
    return model


class MegatronPolicy:
    """`PolicyBackend` over a megatron-core GPTModel."""

    def __init__(self, config: MegatronBackendConfig) -> None:
        from megatron.core import parallel_state
        from safetensors.torch import load_file
        from transformers import AutoConfig

        self.config = config
        init_megatron(config)
        self.ps = parallel_state
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_size = config.tensor_parallel_size
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.autocast = self.device.type == "cuda"
        self.dims = ModelDims.from_hf_config(AutoConfig.from_pretrained(config.model_path))
        hf_state = _load_hf_state(config.model_path, load_file)
        self.model = self._build_and_load(hf_state)
        self.reference = self._build_and_load(hf_state).eval() if config.keep_reference else None
        if self.reference is not None:
            self.reference.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _linear_warmup(config.warmup_steps)
        )

    @classmethod
    def from_recipe(cls, recipe: Any, model_path: Path) -> MegatronPolicy:
        from rlfleet_trainer.run import logprob_temperature

        p = recipe.policy
        return cls(
            MegatronBackendConfig(
                model_path=model_path,
                tensor_parallel_size=p.tensor_parallel_size,
                pipeline_parallel_size=p.pipeline_parallel_size,
                context_parallel_size=p.context_parallel_size,
                expert_parallel_size=p.expert_parallel_size,
                lr=recipe.grpo.lr,
                weight_decay=p.optimizer.weight_decay,
                betas=p.optimizer.betas,
                eps=p.optimizer.eps,
                max_grad_norm=p.optimizer.max_grad_norm,
                warmup_steps=p.optimizer.warmup_steps,
                train_micro_batch_size=p.train_micro_batch_size,
                logprob_micro_batch_size=p.logprob_micro_batch_size,
                temperature=logprob_temperature(recipe),
                keep_reference=recipe.grpo.kl_coef > 0,
                seed=recipe.grpo.seed,
            )
        )

    def _build_and_load(self, hf_state: dict[str, torch.Tensor]) -> torch.nn.Module:
        model = build_gpt_model(self.dims, self.tp_size).to(self.device)
        shard = hf_to_megatron(hf_state, self.dims, self.tp_rank, self.tp_size)
        load_megatron_state(model, shard)
        return model

    # --- scoring --------------------------------------------------------------------------

    def _forward(
        self, model: torch.nn.Module, batch: TrainBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids_NL = batch.input_ids_NL.to(self.device)
        length = input_ids_NL.shape[1]
        position_ids_NL = torch.arange(length, device=self.device).expand_as(input_ids_NL)
        # Right padding + a causal mask: real tokens never see padding (True = masked).
        causal_11LL = torch.triu(
            torch.ones(length, length, dtype=torch.bool, device=self.device), diagonal=1
        )[None, None]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            logits_NLV = model(input_ids_NL, position_ids_NL, causal_11LL)
        return token_logprobs_and_entropy(
            logits_NLV[:, :-1], input_ids_NL[:, 1:], self.config.temperature
        )

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, *, reference: bool = False) -> torch.Tensor:
        model = self.reference if reference else self.model
        if model is None:
            raise RuntimeError("reference logprobs need keep_reference=True (grpo.kl_coef > 0)")
        model.eval()
        out_NT = torch.zeros_like(batch.generation_logprobs_NT)
        step = self.config.logprob_micro_batch_size
        for start in range(0, batch.size, step):
            part = batch.slice(start, min(start + step, batch.size))
            logprobs_NT, _ = self._forward(model, part)
            out_NT[start : start + part.size, : logprobs_NT.shape[1]] = logprobs_NT.float().cpu()
        return out_NT

    # --- training -------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch, loss_config: LossConfig) -> dict[str, float]:
        """Same loss as the torch backend; `batch` is this DP replica's slice."""
        self.model.train()
        counts = torch.tensor(
            [batch.global_valid_tokens(), batch.global_valid_sequences()], dtype=torch.float64
        )
        if self.dp_size > 1:
            dist.all_reduce(counts, group=self.dp_group)
        metrics: dict[str, float] = {}
        step = self.config.train_micro_batch_size
        for start in range(0, batch.size, step):
            part = batch.slice(start, min(start + step, batch.size))
            logprobs_NT, entropy_NT = self._forward(self.model, part)
            out = compute_policy_loss(
                LossInputs(
                    logprobs_BT=logprobs_NT,
                    generation_logprobs_BT=part.generation_logprobs_NT.to(self.device),
                    advantages_B=part.advantages_N.to(self.device),
                    mask_BT=part.mask_NT.to(self.device),
                    prev_logprobs_BT=_to(part.prev_logprobs_NT, self.device),
                    reference_logprobs_BT=_to(part.reference_logprobs_NT, self.device),
                    entropy_BT=entropy_NT,
                ),
                loss_config,
                float(counts[0]),
                float(counts[1]),
            )
            out.loss.backward()  # type: ignore[no-untyped-call]
            for key, value in out.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
        if self.dp_size > 1:
            for param in self.model.parameters():
                if param.grad is not None:
                    dist.all_reduce(param.grad, group=self.dp_group)
        metrics["grad_norm"] = self._clip_and_step()
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        return metrics

    def _grad_norm(self) -> float:
        """‖g‖₂ over the *full* model: TP-sharded grads summed over TP ranks, replicated
        grads (norms) counted once."""
        total = torch.zeros((), dtype=torch.float64)
        for param in self.model.parameters():
            if param.grad is None:
                continue
            sharded = bool(getattr(param, "tensor_model_parallel", False))
            if sharded or self.tp_rank == 0:
                total += param.grad.detach().double().square().sum().cpu()
        if self.tp_size > 1:
            dist.all_reduce(total, group=self.tp_group)
        return float(total.sqrt())

    def _clip_and_step(self) -> float:
        grad_norm = self._grad_norm()
        max_norm = self.config.max_grad_norm or math.inf
        coefficient = max_norm / (grad_norm + 1e-6)  # torch.nn.utils.clip_grad_norm_'s rule
        if coefficient < 1.0:
            for param in self.model.parameters():
                if param.grad is not None:
                    param.grad.mul_(coefficient)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # --- weights --------------------------------------------------------------------------

    def _full_megatron_state(self) -> dict[str, torch.Tensor]:
        """Every tensor gathered over the TP group (collective: all TP ranks call it)."""
        full = {}
        for name, tensor in self.model.state_dict().items():
            if not isinstance(tensor, torch.Tensor) or name.endswith("_extra_state"):
                continue
            tensor = tensor.detach().cpu()
            dim = partition_dim(name)
            if self.tp_size > 1 and dim is not None:
                parts = [torch.empty_like(tensor) for _ in range(self.tp_size)]
                dist.all_gather(parts, tensor.contiguous(), group=self.tp_group)
                tensor = (
                    gather_fc1(parts)
                    if name.endswith("linear_fc1.weight")
                    else torch.cat(parts, dim)
                )
            full[name] = tensor
        return full

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from megatron_to_hf(self._full_megatron_state(), self.dims).items()

    def save(self, path: Path) -> None:
        """Per-rank shard + optimizer (a resume needs the same TP size); rank 0 adds the
        HF export under hf/ so a checkpoint is also a HF folder."""
        rank = dist.get_rank()
        torch.save(
            {
                "model": {
                    k: v
                    for k, v in self.model.state_dict().items()
                    if not k.endswith("_extra_state")
                },
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
            },
            path / f"megatron_rank{rank:03d}.pt",
        )
        hf = dict(self.hf_state_dict())
        if rank == 0:
            (path / "megatron.json").write_text(json.dumps({"tensor_parallel_size": self.tp_size}))
            export_hf_folder(hf, self.config.model_path, path / "hf")

    def load(self, path: Path) -> None:
        saved = json.loads((path / "megatron.json").read_text())
        if saved["tensor_parallel_size"] != self.tp_size:
            raise ValueError(
                f"checkpoint {path} was written at tensor_parallel_size "
                f"{saved['tensor_parallel_size']}, this run uses {self.tp_size}; start from its "
                "hf/ folder instead (policy.model=<checkpoint>/policy/hf)"
            )
        state = torch.load(path / f"megatron_rank{dist.get_rank():03d}.pt", weights_only=False)
        load_megatron_state(self.model, state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def export_hf(self, path: Path) -> None:
        hf = dict(self.hf_state_dict())
        if dist.get_rank() == 0:
            export_hf_folder(hf, self.config.model_path, path)


def load_megatron_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"megatron state mismatch: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )


def _load_hf_state(model_path: Path, load_file: Any) -> dict[str, torch.Tensor]:
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def _to(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device)
