"""The `policy` section of a recipe: the model, its backend and parallelism, the
optimizer, and the mixture-of-experts options."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from rlfleet_core.config import ConfigModel
from rlfleet_core.models import check_model_reference


class MoEConfig(ConfigModel):
    """Mixture-of-experts layers (Nemotron-H, DeepSeek-style routers with an expert bias).
    Expert load statistics are logged for every MoE model, on or off."""

    router_bias_update_rate: float = Field(0.0, ge=0, le=1)
    """DeepSeek-V3's aux-loss-free load balancing: after every optimizer step each MoE
    layer's per-expert bias moves by this much toward even load (+rate for an expert that
    got fewer than the layer's mean number of tokens in the step, -rate for more). The bias
    steers only which experts are chosen, not how their outputs are mixed. 0 = off;
    Nemotron 3 and DeepSeek-V3 use 1e-3 (Megatron's `--moe-router-bias-update-rate`)."""


class OptimizerConfig(ConfigModel):
    """AdamW of the policy (the learning rate is `grpo.lr`)."""

    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; None = off."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up of the learning rate over this many optimizer steps."""


class PolicyConfig(ConfigModel):
    model: str = "smollm2-135m-instruct"
    """A bundled model name (smollm2-135m-instruct, tiny), a local HF folder, or a Hugging
    Face id (`HuggingFaceTB/SmolLM2-135M-Instruct`: from the HF cache, downloaded into it
    first when the Hub can be reached; HF_HUB_OFFLINE=1 = the cache only)."""
    _model_form = field_validator("model")(check_model_reference)

    backend: Literal["torch", "megatron"] = "torch"
    """`torch`: HF transformers model (CPU, one GPU, FSDP2 for several); `megatron`:
    megatron-core GPTModel with TP/PP/CP/EP."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Parameter/compute dtype: auto = bfloat16 on GPU, float32 on CPU."""
    max_total_sequence_length: int = Field(1024, ge=16)
    """Prompt + generation tokens per sample."""
    train_micro_batch_size: int = Field(4, ge=1)
    """Samples per forward/backward; gradients accumulate to the global batch
    (num_prompts_per_step × num_generations_per_prompt samples per optimizer step)."""
    logprob_micro_batch_size: int = Field(8, ge=1)
    """Samples per no-grad forward when scoring prev/reference logprobs."""
    train_top_layers: int | None = Field(None, ge=1)
    """Train only the top N decoder layers and the final norm, freezing the embeddings,
    LM head and lower layers (backward stops at layer −N): a compute budget knob for CPU
    runs and quick experiments (torch backend). None = train the whole model."""
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    context_parallel_size: int = Field(1, ge=1)
    expert_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    """torch backend: FSDP2 shards over this many ranks; > 1 makes `rlfleet rl` launch the
    trainer with torchrun (one process per rank; rank 0 talks to the services). Must divide
    grpo.num_prompts_per_step × grpo.num_generations_per_prompt."""
    max_restarts: int = Field(2, ge=0)
    """With several ranks: how often torchrun restarts all ranks after one dies; each
    restart resumes from the latest checkpoint."""
    activation_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    optimizer: OptimizerConfig = OptimizerConfig()
    moe: MoEConfig = MoEConfig()

    @property
    def world_size(self) -> int:
        """Trainer processes a stage launches: TP × PP × CP × DP (EP is carved out of DP)."""
        return (
            self.tensor_parallel_size
            * self.pipeline_parallel_size
            * self.context_parallel_size
            * self.data_parallel_size
        )
