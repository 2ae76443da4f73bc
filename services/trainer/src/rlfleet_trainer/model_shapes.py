"""Model shapes (Llama/Qwen2 family) that tests and benchmarks build random-weight models
from, and the one function that writes such a model as a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal


def shape(
    hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int, **more: Any
) -> dict[str, Any]:
    """A Llama/Qwen2 config's shape fields (HF names), plus any `more` of them."""
    return dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        **more,
    )


# hidden, intermediate, layers, heads, kv heads, vocabulary
SMOLLM2_135M = shape(576, 1536, 30, 9, 3, 49152, tie_word_embeddings=True)
"""SmolLM2-135M's shape (tied embeddings, 49k vocabulary)."""
LLAMA_1B = shape(2048, 8192, 16, 32, 8, 128256, tie_word_embeddings=True)
"""Llama-3.2-1B's shape (~1.24B parameters)."""
LLAMA_3B = shape(3072, 8192, 28, 24, 8, 128256, tie_word_embeddings=True)
"""Llama-3.2-3B's shape (~3.2B parameters)."""
SMOKE = shape(128, 256, 2, 4, 2, 512, tie_word_embeddings=False)
"""A CPU-sized smoke shape for the GPU benchmarks."""
PARITY = shape(256, 512, 4, 8, 2, 512, max_position_embeddings=256)
"""The megatron GPU parity probe's models (TP 2 splits 8 heads and 2 kv heads evenly)."""
TEST_LLAMA = shape(
    64, 128, 2, 4, 2, 256, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False
)
"""A 2-layer Llama for CPU tests (hidden 64, 4 heads, 2 kv heads, vocab 256)."""
TEST_QWEN2_TIED = {**TEST_LLAMA, "num_hidden_layers": 4, "rms_norm_eps": 1e-6} | {
    "tie_word_embeddings": True
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
