"""Model shapes (Llama/Qwen2 family) that tests and benchmarks build random-weight models
from, and the one function that writes such a model as a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

SMOLLM2_135M: dict[str, Any] = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
)
"""SmolLM2-135M's shape (tied embeddings, 49k vocabulary)."""

LLAMA_1B: dict[str, Any] = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    tie_word_embeddings=True,
)
"""Llama-3.2-1B's shape (~1.24B parameters)."""

LLAMA_3B: dict[str, Any] = dict(
    hidden_size=3072,
    intermediate_size=8192,
    num_hidden_layers=28,
    num_attention_heads=24,
    num_key_value_heads=8,
    vocab_size=128256,
    tie_word_embeddings=True,
)
"""Llama-3.2-3B's shape (~3.2B parameters)."""

SMOKE: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    tie_word_embeddings=False,
)
"""A CPU-sized smoke shape for the GPU benchmarks."""

PARITY: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
"""The megatron GPU parity probe's models (TP 2 splits 8 heads and 2 kv heads evenly)."""

TEST_LLAMA: dict[str, Any] = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
"""A 2-layer Llama for CPU tests (hidden 64, 4 heads, 2 kv heads, vocab 256)."""

TEST_QWEN2_TIED: dict[str, Any] = {
    **TEST_LLAMA,
    "num_hidden_layers": 4,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
"""A 4-layer Qwen2 with tied embeddings (the LM head is the word embedding, as in SmolLM2
and small Qwen2s) for CPU tests: pipeline stages must keep the two copies equal."""


def random_model(
    family: Literal["llama", "qwen2"], seed: int, device: str = "cpu", **config: Any
) -> Any:
    """A `*ForCausalLM` of that family with random (seeded) weights, built on `device`."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            (LlamaConfig if family == "llama" else Qwen2Config)(**config)
        )


def save_random_model(
    path: Path, family: Literal["llama", "qwen2"], seed: int, **config: Any
) -> Path:
    """`random_model` saved as a HF folder at `path`."""
    random_model(family, seed, **config).save_pretrained(path)
    return path
