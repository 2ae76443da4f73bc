"""The megatron policy backend: megatron-core `GPTModel` (local layer spec) with tensor and
pipeline parallelism, loaded from and published as Hugging Face weights.

Process layout: launch one process per rank (torchrun); the default process group (gloo on
CPU, NCCL on GPU; made by the trainer entry, or by `init_process_group` on an in-memory
store for a world of one) holds world = TP × PP × DP ranks. Every rank of a DP replica sees
the same samples; DP replicas see disjoint slices and their gradients and metrics are
summed (the loss is already divided by the *global* token count, so a sum is the right
reduction). Weights are gathered once, to global rank 0; checkpoints hold one shard per
(TP, PP) rank. The rank contract is `backends/base.py`'s.

Pipeline parallelism: each PP stage builds a `GPTModel` with an even share of the decoder
layers (embedding on the first stage, final norm and LM head on the last) and loads only
those weights. Megatron's own schedules are CUDA-only, so `one_forward_one_backward` runs a
small 1F1B schedule (warm-up forwards, one-forward-one-backward, cool-down backwards) and
`Pipeline` sends [L, N, H] activations and their gradients to the neighbouring stages with
`batch_isend_irecv`, which works on gloo and NCCL alike. The loss and logprobs are computed
on the last stage and broadcast over the pipeline so every rank returns the same values. A
tied embedding is held twice (first stage: input embedding, last stage: output layer) and
kept equal by summing the two gradients over Megatron's embedding group.

CPU recipe (megatron_setup): `use_cpu_initialization`, every fusion off, the RNG tracker
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlfleet_contracts.recipe import RecipeConfig

from rlfleet_trainer.algorithms.dpo import TrainLoss
from rlfleet_trainer.backends.base import BackendConfig
from rlfleet_trainer.backends.megatron_convert import (
    ModelDims,
    gather_fc1,
    hf_to_megatron,
    megatron_to_hf,
    merge_pipeline_stages,
    partition_dim,
)
from rlfleet_trainer.backends.megatron_schedule import Pipeline, one_forward_one_backward
from rlfleet_trainer.backends.megatron_setup import (
    MegatronBackendConfig,
    build_gpt_model,
    check_parallel_sizes,
    freeze_padding_row,
    init_megatron,
    load_hf_state,
    load_megatron_state,
)
from rlfleet_trainer.backends.microbatch import (
    global_counts,
    linear_warmup,
    micro_batch_loss,
    score_micro_batches,
    token_logprobs_and_entropy,
    train_micro_batches,
)
from rlfleet_trainer.backends.torch_backend import export_hf_folder
from rlfleet_trainer.batch import TrainBatch

logger = logging.getLogger(__name__)

# Inside the policy folder of a checkpoint: the TP/PP sizes it was written at, its HF export.
PARALLEL_SIZES_FILE = "megatron.json"
HF_SUBDIR = "hf"


class MegatronPolicy:
    """`PolicyBackend` over a megatron-core GPTModel."""

    def __init__(self, config: MegatronBackendConfig) -> None:
        from safetensors.torch import load_file
        from transformers import AutoConfig

        self.config = config
        self.dims = ModelDims.from_hf_config(AutoConfig.from_pretrained(config.model_path))
        check_parallel_sizes(config, self.dims)  # before the slow megatron import
        from megatron.core import parallel_state  # type: ignore[import-untyped]

        init_megatron(config)
        self.ps = parallel_state
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_size = config.tensor_parallel_size
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.pp_size = config.pipeline_parallel_size
        self.dp_group = parallel_state.get_data_parallel_group()
        self.data_parallel_rank: int = parallel_state.get_data_parallel_rank()
        self.data_parallel_size: int = parallel_state.get_data_parallel_world_size()
        self.dp_size = self.data_parallel_size
        if torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.autocast = self.device.type == "cuda"
        self.pipe = Pipeline(parallel_state, self.dims.hidden_size, self.device)
        # The last stage's output layer is a copy of the first stage's embedding.
        self.tied_copies = self.dims.tied_embeddings and self.pp_size > 1
        hf_state = load_hf_state(config.model_path, load_file)
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
            self.optimizer, linear_warmup(config.warmup_steps)
        )

    @classmethod
    def from_recipe(cls, recipe: RecipeConfig, model_path: Path) -> MegatronPolicy:
        p = recipe.policy
        return cls(
            MegatronBackendConfig(
                **BackendConfig.recipe_values(recipe, model_path),
                tensor_parallel_size=p.tensor_parallel_size,
                pipeline_parallel_size=p.pipeline_parallel_size,
                context_parallel_size=p.context_parallel_size,
                expert_parallel_size=p.expert_parallel_size,
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
        if self.pipe.is_first and self.dims.pad_token_id is not None:
            freeze_padding_row(model, self.dims.pad_token_id)
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

        def score(part: TrainBatch) -> torch.Tensor | None:
            input_LNH, _ = self.pipe.exchange(recv_prev=self.pipe.shape(part))
            out = self._stage_forward(model, part, input_LNH)
            if self.pipe.is_last:
                return self._token_scores(out, part)[0]
            self.pipe.exchange(send_next=out)
            return None

        out_NT = score_micro_batches(batch, self.config.logprob_micro_batch_size, score)
        return self.pipe.from_last_stage(out_NT)

    # --- training -------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch, loss_config: TrainLoss) -> dict[str, float]:
        """Same loss as the torch backend; `batch` is this DP replica's slice (every TP/PP
        rank of the replica gets the same one). The loss is divided by the valid tokens of
        all slices and the gradients are summed over DP, so the step equals one process's
        on the whole batch; so do the returned metrics, on every rank."""
        self.model.train()
        counts = global_counts(batch, self.device, self.dp_group, reduce=self.dp_size > 1)
        metrics: dict[str, float] = {}

        def stage_forward(part: TrainBatch, input_LNH: torch.Tensor | None) -> torch.Tensor:
            out = self._stage_forward(self.model, part, input_LNH)
            if not self.pipe.is_last:
                return out
            logprobs_NT, entropy_NT = self._token_scores(out, part)
            return micro_batch_loss(part, logprobs_NT, entropy_NT, loss_config, counts, metrics)

        parts = train_micro_batches(batch, self.config.train_micro_batch_size, loss_config)
        one_forward_one_backward(self.pipe, parts, stage_forward)
        if self.dp_size > 1:
            for param in self.model.parameters():
                if param.grad is None:  # the same collectives on every replica
                    param.grad = torch.zeros_like(param)
                dist.all_reduce(param.grad, group=self.dp_group)
        if self.tied_copies:
            self._sum_tied_embedding_grads()
        metrics = self.pipe.objects_from_last_stage(metrics)
        if self.dp_size > 1:  # each replica's sums are over its slice: add them up
            slices: list[Any] = [None] * self.dp_size
            dist.all_gather_object(slices, metrics, group=self.dp_group)
            keys = dict.fromkeys(k for part in slices for k in part)  # an empty slice has none
            metrics = {k: sum(part.get(k, 0.0) for part in slices) for k in keys}
        # The rate this update uses, read before the scheduler steps (NeMo-RL's `lr`).
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["grad_norm"] = self._clip_and_step()
        return metrics

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

    def _stage_state(self) -> dict[str, torch.Tensor] | None:
        """This stage's tensors gathered over the TP group to its TP rank 0 (collective: all
        TP ranks call it), on CPU, under the stage's local layer numbers; None elsewhere."""
        full = {}
        for name, tensor in self.model.state_dict().items():
            if not isinstance(tensor, torch.Tensor) or name.endswith("_extra_state"):
                continue
            tensor = tensor.detach()
            dim = partition_dim(name)
            if self.tp_size > 1 and dim is not None:
                tensor = tensor.contiguous()
                parts = [torch.empty_like(tensor) for _ in range(self.tp_size)]
                dist.gather(
                    tensor, parts if self.tp_rank == 0 else None, group=self.tp_group, group_dst=0
                )
                tensor = (
                    gather_fc1(parts)
                    if name.endswith("linear_fc1.weight")
                    else torch.cat(parts, dim)
                )
            full[name] = tensor.cpu()
        return full if self.tp_rank == 0 else None

    def _full_megatron_state(self) -> dict[str, torch.Tensor] | None:
        """Every tensor of the model on global rank 0 (None on the other ranks): each stage
        of DP replica 0 is gathered over TP, then its TP rank 0 sends it to rank 0 over the
        pipeline group (collective: every rank calls it; other replicas hold the same
        weights and take no part)."""
        if self.data_parallel_rank != 0:
            return None
        own = self._stage_state()
        if own is None or self.pp_size == 1:
            return own
        if not self.pipe.is_first:
            self._send_state(own)
            return None
        stages = [own, *(self._recv_state(stage) for stage in range(1, self.pp_size))]
        return merge_pipeline_stages(stages, self.dims)

    def _send_state(self, state: dict[str, torch.Tensor]) -> None:
        """`state` to the first stage: names, shapes and dtypes as one object, then each
        tensor as a device tensor (NCCL sends no CPU tensors)."""
        meta = [[(k, v.shape, v.dtype) for k, v in state.items()]]
        dist.send_object_list(meta, group=self.pipe.group, group_dst=0, device=self.device)
        for tensor in state.values():
            dist.send(tensor.to(self.device), group=self.pipe.group, group_dst=0)

    def _recv_state(self, stage: int) -> dict[str, torch.Tensor]:
        meta: list[Any] = [None]
        dist.recv_object_list(meta, group=self.pipe.group, group_src=stage, device=self.device)
        out = {}
        for name, shape, dtype in meta[0]:
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
            dist.recv(tensor, group=self.pipe.group, group_src=stage)
            out[name] = tensor.cpu()
        return out

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective: every rank calls it. The full HF-named weights, gathered once over
        TP and PP, on global rank 0; an empty iterator on every other rank. The gather runs
        at the call, not lazily, so a rank that never iterates still takes part."""
        full = self._full_megatron_state()
        return iter(() if full is None else megatron_to_hf(full, self.dims).items())

    def _shard_file(self, path: Path) -> Path:
        """This rank's (TP, PP) shard: DP replicas hold the same weights and optimizer
        state, so one file per model-parallel rank, and a resume may change the DP size."""
        return path / f"megatron_tp{self.tp_rank:02d}_pp{self.pipe.rank:02d}.pt"

    def save(self, path: Path) -> None:
        """Collective. DP replica 0's ranks each write their model + optimizer + scheduler
        shard; global rank 0 writes the parallel sizes and the HF export under HF_SUBDIR
        (so a checkpoint is also a HF folder). Returns when every shard is on disk."""
        path.mkdir(parents=True, exist_ok=True)
        if self.data_parallel_rank == 0:
            model = {
                k: v for k, v in self.model.state_dict().items() if not k.endswith("_extra_state")
            }
            torch.save(
                {
                    "model": model,
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                },
                self._shard_file(path),
            )
        hf = dict(self.hf_state_dict())
        if dist.get_rank() == 0:
            sizes = {"tensor_parallel_size": self.tp_size, "pipeline_parallel_size": self.pp_size}
            (path / PARALLEL_SIZES_FILE).write_text(json.dumps(sizes))
            export_hf_folder(hf, self.config.model_path, path / HF_SUBDIR)
        dist.barrier()

    def load(self, path: Path) -> None:
        """Collective: each rank reads its (TP, PP) shard; the TP and PP sizes must be the
        ones it was written at, the DP size may differ."""
        saved = json.loads((path / PARALLEL_SIZES_FILE).read_text())
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
        shard = self._shard_file(path)
        if not shard.exists():
            raise FileNotFoundError(
                f"checkpoint {path} has no {shard.name} (written before shards were named by "
                "TP/PP rank?); start from its hf/ folder instead"
            )
        state = torch.load(shard, map_location=self.device, weights_only=True)
        load_megatron_state(self.model, state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def export_hf(self, path: Path) -> None:
        """Collective; global rank 0 writes the folder."""
        hf = dict(self.hf_state_dict())
        if dist.get_rank() == 0:
            export_hf_folder(hf, self.config.model_path, path)
