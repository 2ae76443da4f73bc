"""The megatron policy backend: megatron-core `GPTModel` (local layer spec) with tensor and
pipeline parallelism, loaded from and published as Hugging Face weights.

Process layout: launch one process per rank (torchrun); the default process group (gloo on
CPU, NCCL on GPU) holds world = TP × PP × DP ranks. Every rank of a DP replica sees the same
samples; DP replicas see disjoint slices and their gradients are summed (the loss is
already divided by the *global* token count, so a sum is the right reduction).

Pipeline parallelism: each PP stage builds a `GPTModel` with an even share of the decoder
layers (embedding on the first stage, final norm and LM head on the last) and loads only
those weights. Megatron's own schedules are CUDA-only, so `_forward_backward` runs a small
1F1B schedule (warm-up forwards, one-forward-one-backward, cool-down backwards) and
`_Pipeline` sends [L, N, H] activations and their gradients to the neighbouring stages with
`batch_isend_irecv`, which works on gloo and NCCL alike. The loss and logprobs are computed
on the last stage and broadcast over the pipeline so every rank returns the same values. A
tied embedding is held twice (first stage: input embedding, last stage: output layer) and
kept equal by summing the two gradients over Megatron's embedding group.

CPU recipe (ENVIRONMENT.md): `use_cpu_initialization`, every fusion off, the RNG tracker
re-initialised, `torch.cuda.current_device` routed to the CPU, a plain torch AdamW (Megatron's
optimizer wrapper is CUDA-only). On GPU the same code runs with NCCL; parameters stay
float32 and the forward runs under bf16 autocast.

Not implemented here (clear errors at start-up): context parallelism (needs Transformer
Engine attention) and expert parallelism (needs an MoE model; the Llama/Qwen2 family is
dense).

Shape legend: N = samples, L = sequence length, T = L − 1, V = vocabulary, H = hidden size.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
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
    merge_pipeline_stages,
    partition_dim,
    stage_layers,
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


def check_parallel_sizes(config: MegatronBackendConfig, dims: ModelDims) -> None:
    """Refuse what this backend cannot run, before any process group exists."""
    if config.context_parallel_size != 1:
        raise NotImplementedError(
            f"policy.context_parallel_size={config.context_parallel_size}: context "
            "parallelism needs Transformer Engine attention, which the megatron backend does "
            "not use (local layer spec); set it to 1"
        )
    if config.expert_parallel_size != 1:
        raise NotImplementedError(
            f"policy.expert_parallel_size={config.expert_parallel_size}: expert parallelism "
            "needs an MoE model and the supported Llama/Qwen2 family is dense; set it to 1"
        )
    stage_layers(dims.num_layers, 0, config.pipeline_parallel_size)  # raises if uneven


def init_megatron(config: MegatronBackendConfig) -> None:
    """Default process group (from torchrun's env, or a world of 1), Megatron's parallel
    state and RNG tracker."""
    import os

    if torch.cuda.is_available():
        # One GPU per local rank (NCCL refuses two ranks on one device).
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        # Megatron asks for the current CUDA device in a few places; on CPU there is none.
        torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(
            backend,
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
        )
    from megatron.core import parallel_state  # type: ignore[import-untyped]
    from megatron.core.tensor_parallel.random import initialize_rng_tracker  # type: ignore[import-untyped]

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    model_parallel = config.tensor_parallel_size * config.pipeline_parallel_size
    if dist.get_world_size() % model_parallel:
        raise ValueError(
            f"world size {dist.get_world_size()} is not a multiple of "
            f"policy.tensor_parallel_size × policy.pipeline_parallel_size ({model_parallel}); "
            "launch TP × PP × DP processes"
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


class _Pipeline:
    """This rank's pipeline stage: where it sits, its neighbours, and the exchange of
    activations [L, N, H] (forward) and their gradients (backward) with them.

    Each exchange posts all of its sends and receives in one `batch_isend_irecv` and waits for
    all of them, so two neighbours that send to each other in the same step (1F1B's steady
    state) cannot deadlock. Activations travel as float32 whatever the autocast dtype."""

    def __init__(self, ps: Any, hidden_size: int, device: torch.device) -> None:
        self.rank = ps.get_pipeline_model_parallel_rank()
        self.size = ps.get_pipeline_model_parallel_world_size()
        self.group = ps.get_pipeline_model_parallel_group()
        self.is_first = self.rank == 0
        self.is_last = self.rank == self.size - 1
        self.prev = None if self.is_first else ps.get_pipeline_model_parallel_prev_rank()
        self.next = None if self.is_last else ps.get_pipeline_model_parallel_next_rank()
        self.last_rank = ps.get_pipeline_model_parallel_last_rank()
        self.hidden_size = hidden_size
        self.device = device

    def shape(self, batch: TrainBatch) -> tuple[int, int, int]:
        """The activation one micro-batch sends between stages (sequence-first)."""
        num, length = batch.input_ids_NL.shape
        return (length, num, self.hidden_size)

    def exchange(
        self,
        *,
        send_next: torch.Tensor | None = None,
        send_prev: torch.Tensor | None = None,
        recv_prev: tuple[int, ...] | None = None,
        recv_next: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Send to / receive from the neighbours (a missing neighbour makes that part a
        no-op); returns (from prev, from next)."""
        ops, got_prev, got_next = [], None, None
        if recv_prev is not None and self.prev is not None:
            got_prev = torch.empty(recv_prev, dtype=torch.float32, device=self.device)
            ops.append(dist.P2POp(dist.irecv, got_prev, self.prev))
        if recv_next is not None and self.next is not None:
            got_next = torch.empty(recv_next, dtype=torch.float32, device=self.device)
            ops.append(dist.P2POp(dist.irecv, got_next, self.next))
        if send_next is not None and self.next is not None:
            ops.append(dist.P2POp(dist.isend, _wire(send_next), self.next))
        if send_prev is not None and self.prev is not None:
            ops.append(dist.P2POp(dist.isend, _wire(send_prev), self.prev))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return got_prev, got_next

    def from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """The last stage's value of `tensor` on every stage (same shape everywhere)."""
        if self.size == 1:
            return tensor
        on_device = tensor.to(self.device)
        dist.broadcast(on_device, src=self.last_rank, group=self.group)
        return on_device.to(tensor.device)

    def objects_from_last_stage(self, value: Any) -> Any:
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self.last_rank, group=self.group)
        return box[0]


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().float().contiguous()


class MegatronPolicy:
    """`PolicyBackend` over a megatron-core GPTModel."""

    def __init__(self, config: MegatronBackendConfig) -> None:
        from safetensors.torch import load_file
        from transformers import AutoConfig

        self.config = config
        self.dims = ModelDims.from_hf_config(AutoConfig.from_pretrained(config.model_path))
        check_parallel_sizes(config, self.dims)  # before the slow megatron import
        from megatron.core import parallel_state

        init_megatron(config)
        self.ps = parallel_state
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_size = config.tensor_parallel_size
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.pp_size = config.pipeline_parallel_size
        self.dp_group = parallel_state.get_data_parallel_group()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        if torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.autocast = self.device.type == "cuda"
        self.pipe = _Pipeline(parallel_state, self.dims.hidden_size, self.device)
        # The last stage's output layer is a copy of the first stage's embedding.
        self.tied_copies = self.dims.tied_embeddings and self.pp_size > 1
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
        model = build_gpt_model(self.dims, self.tp_size, self.pp_size, self.pipe.rank)
        model = model.to(self.device)
        shard = hf_to_megatron(
            hf_state, self.dims, self.tp_rank, self.tp_size, self.pipe.rank, self.pp_size
        )
        load_megatron_state(model, shard)
        return model

    # --- scoring --------------------------------------------------------------------------

    def _stage_forward(
        self, model: torch.nn.Module, batch: TrainBatch, input_LNH: torch.Tensor | None
    ) -> torch.Tensor:
        """This stage's forward: logits [N, L, V] on the last stage, hidden states [L, N, H]
        elsewhere; `input_LNH` is the previous stage's output (None on the first)."""
        input_ids_NL = batch.input_ids_NL.to(self.device)
        length = input_ids_NL.shape[1]
        position_ids_NL = torch.arange(length, device=self.device).expand_as(input_ids_NL)
        # Right padding + a causal mask: real tokens never see padding (True = masked).
        causal_11LL = torch.triu(
            torch.ones(length, length, dtype=torch.bool, device=self.device), diagonal=1
        )[None, None]
        if not self.pipe.is_first:
            model.set_input_tensor(input_LNH)  # type: ignore[operator]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out: torch.Tensor = model(input_ids_NL, position_ids_NL, causal_11LL)
        return out

    def _token_scores(
        self, logits_NLV: torch.Tensor, batch: TrainBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        targets_NT = batch.input_ids_NL[:, 1:].to(self.device)
        return token_logprobs_and_entropy(logits_NLV[:, :-1], targets_NT, self.config.temperature)

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
            input_LNH, _ = self.pipe.exchange(recv_prev=self.pipe.shape(part))
            out = self._stage_forward(model, part, input_LNH)
            if self.pipe.is_last:
                logprobs_NT, _ = self._token_scores(out, part)
                out_NT[start : start + part.size, : logprobs_NT.shape[1]] = (
                    logprobs_NT.float().cpu()
                )
            else:
                self.pipe.exchange(send_next=out)
        return self.pipe.from_last_stage(out_NT)

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

        def loss_fn(logits_NLV: torch.Tensor, part: TrainBatch) -> torch.Tensor:
            logprobs_NT, entropy_NT = self._token_scores(logits_NLV, part)
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
            for key, value in out.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
            return out.loss

        step = self.config.train_micro_batch_size
        parts = [
            batch.slice(start, min(start + step, batch.size))
            for start in range(0, batch.size, step)
        ]
        self._forward_backward(parts, loss_fn)
        if self.dp_size > 1:
            for param in self.model.parameters():
                if param.grad is not None:
                    dist.all_reduce(param.grad, group=self.dp_group)
        if self.tied_copies:
            self._sum_tied_embedding_grads()
        metrics = self.pipe.objects_from_last_stage(metrics)
        metrics["grad_norm"] = self._clip_and_step()
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        return metrics

    def _forward_backward(
        self,
        parts: list[TrainBatch],
        loss_fn: Callable[[torch.Tensor, TrainBatch], torch.Tensor],
    ) -> None:
        """Gradients of every micro-batch, accumulated in `.grad`, by a 1F1B schedule.

        Stage r first runs `size − r − 1` forwards (the pipeline fills), then alternates one
        forward and one backward, then drains the remaining backwards; so a stage holds the
        activations of at most `size − r` micro-batches. With one stage this is plain
        forward/backward per micro-batch."""
        pipe = self.pipe
        pending: deque[tuple[torch.Tensor | None, torch.Tensor]] = deque()

        def forward(i: int, input_LNH: torch.Tensor | None) -> torch.Tensor:
            if input_LNH is not None:
                input_LNH.requires_grad_(True)  # its .grad is what we send back
            out = self._stage_forward(self.model, parts[i], input_LNH)
            if pipe.is_last:
                out = loss_fn(out, parts[i])
            pending.append((input_LNH, out))
            return out

        def backward(grad_out: torch.Tensor | None) -> torch.Tensor | None:
            input_LNH, out = pending.popleft()
            if grad_out is not None:
                grad_out = grad_out.to(out.dtype)
            torch.autograd.backward(out, grad_tensors=grad_out)
            return None if input_LNH is None else input_LNH.grad

        num = len(parts)
        warmup = min(pipe.size - pipe.rank - 1, num)
        for i in range(warmup):
            input_LNH, _ = pipe.exchange(recv_prev=pipe.shape(parts[i]))
            pipe.exchange(send_next=forward(i, input_LNH))
        input_LNH = None
        if warmup < num:
            input_LNH, _ = pipe.exchange(recv_prev=pipe.shape(parts[warmup]))
        for k in range(num - warmup):  # steady state: forward i, backward k
            i = warmup + k
            out = forward(i, input_LNH)
            _, grad_out = pipe.exchange(send_next=out, recv_next=pipe.shape(parts[k]))
            grad_in = backward(grad_out)
            more = i + 1 < num
            input_LNH, _ = pipe.exchange(
                send_prev=grad_in, recv_prev=pipe.shape(parts[i + 1]) if more else None
            )
        for k in range(num - warmup, num):  # cool-down
            _, grad_out = pipe.exchange(recv_next=pipe.shape(parts[k]))
            pipe.exchange(send_prev=backward(grad_out))

    def _tied_weights(self) -> list[torch.nn.Parameter]:
        """This stage's copy of a tied embedding (none on middle stages)."""
        model: Any = self.model
        weights = []
        if self.pipe.is_first:
            weights.append(model.embedding.word_embeddings.weight)
        if self.pipe.is_last:
            weights.append(model.output_layer.weight)
        return weights

    def _sum_tied_embedding_grads(self) -> None:
        """Both copies get the summed gradient, so identical AdamW updates keep them equal
        (the group is {first, last stage} of this TP rank's pipeline)."""
        if not self.ps.is_rank_in_embedding_group():
            return
        for weight in self._tied_weights():
            if weight.grad is None:
                weight.grad = torch.zeros_like(weight)
            dist.all_reduce(weight.grad, group=self.ps.get_embedding_group())

    def _grad_norm(self) -> float:
        """‖g‖₂ over the *full* model: TP-sharded grads summed over TP ranks, replicated
        grads (norms) counted once, stages summed over the pipeline, a tied embedding
        counted once (its first-stage copy)."""
        model: Any = self.model
        skip = {id(model.output_layer.weight)} if self.tied_copies and self.pipe.is_last else set()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for param in self.model.parameters():
            if param.grad is None or id(param) in skip:
                continue
            sharded = bool(getattr(param, "tensor_model_parallel", False))
            if sharded or self.tp_rank == 0:
                total += param.grad.detach().double().square().sum()
        if self.tp_size > 1:
            dist.all_reduce(total, group=self.tp_group)
        if self.pp_size > 1:
            dist.all_reduce(total, group=self.pipe.group)
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

    def _stage_state(self) -> dict[str, torch.Tensor]:
        """This stage's tensors gathered over the TP group (collective: all TP ranks call
        it), on CPU, under the stage's local layer numbers."""
        full = {}
        for name, tensor in self.model.state_dict().items():
            if not isinstance(tensor, torch.Tensor) or name.endswith("_extra_state"):
                continue
            tensor = tensor.detach()
            dim = partition_dim(name)
            if self.tp_size > 1 and dim is not None:
                tensor = tensor.contiguous()
                parts = [torch.empty_like(tensor) for _ in range(self.tp_size)]
                dist.all_gather(parts, tensor, group=self.tp_group)
                tensor = (
                    gather_fc1(parts)
                    if name.endswith("linear_fc1.weight")
                    else torch.cat(parts, dim)
                )
            full[name] = tensor.cpu()
        return full

    def _full_megatron_state(self) -> dict[str, torch.Tensor]:
        """Every tensor of the model, TP-gathered then collected from every pipeline stage,
        on every rank (collective: all ranks call it)."""
        own = self._stage_state()
        if self.pp_size == 1:
            return own
        stages = []
        for stage in range(self.pp_size):
            src = dist.get_global_rank(self.pipe.group, stage)
            stages.append(self._broadcast_state(own if stage == self.pipe.rank else None, src))
        return merge_pipeline_stages(stages, self.dims)

    def _broadcast_state(
        self, state: dict[str, torch.Tensor] | None, src: int
    ) -> dict[str, torch.Tensor]:
        """`state` from global rank `src` to its pipeline group: names, shapes and dtypes as
        one object, then each tensor as a device tensor (NCCL cannot send CPU tensors)."""
        box: list[Any] = [
            None if state is None else [(k, v.shape, v.dtype) for k, v in state.items()]
        ]
        dist.broadcast_object_list(box, src=src, group=self.pipe.group)
        out = {}
        for name, shape, dtype in box[0]:
            if state is not None:
                tensor = state[name].to(self.device)
            else:
                tensor = torch.empty(shape, dtype=dtype, device=self.device)
            dist.broadcast(tensor, src=src, group=self.pipe.group)
            out[name] = tensor.cpu()
        return out

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from megatron_to_hf(self._full_megatron_state(), self.dims).items()

    def save(self, path: Path) -> None:
        """Per-rank shard + optimizer (a resume needs the same TP and PP sizes); rank 0 adds
        the HF export under hf/ so a checkpoint is also a HF folder."""
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
            sizes = {"tensor_parallel_size": self.tp_size, "pipeline_parallel_size": self.pp_size}
            (path / "megatron.json").write_text(json.dumps(sizes))
            export_hf_folder(hf, self.config.model_path, path / "hf")

    def load(self, path: Path) -> None:
        saved = json.loads((path / "megatron.json").read_text())
        for key, ours in (
            ("tensor_parallel_size", self.tp_size),
            ("pipeline_parallel_size", self.pp_size),
        ):
            theirs = saved.get(key, 1)  # checkpoints from before PP recorded TP only
            if theirs != ours:
                raise ValueError(
                    f"checkpoint {path} was written at {key} {theirs}, this run uses {ours}; "
                    "start from its hf/ folder instead (policy.model=<checkpoint>/policy/hf)"
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
