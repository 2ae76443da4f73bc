"""The megatron backend gives the same logprobs, loss, gradient norm, updated weights and
published HF state dict as the torch backend on the same tiny Llama and Qwen2 weights, at
TP=1 (in process) and TP=2 (torchrun, gloo, 2 CPU processes)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from rlfleet_trainer.backends.megatron_convert import ModelDims, hf_to_megatron, megatron_to_hf
from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("megatron_parity", HERE / "megatron_parity.py")
assert spec is not None and spec.loader is not None
parity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parity)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A 2-layer Llama (hidden 64, 4 heads, 2 kv heads, vocab 256), random weights."""
    out = tmp_path_factory.mktemp("llama")
    config = LlamaConfig(
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
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


def torch_results(model: Path) -> dict[str, Any]:
    policy = TorchPolicy(
        TorchBackendConfig(model_path=model, lr=1e-3, train_micro_batch_size=3, device="cpu")
    )
    return parity.run_backend(policy, AutoConfig.from_pretrained(model).vocab_size)


def assert_parity(mega: dict[str, Any], ref: dict[str, Any]) -> None:
    mask = ref["mask"] > 0
    torch.testing.assert_close(mega["before"][mask], ref["before"][mask], atol=2e-5, rtol=0)
    for key in ("loss", "grad_norm", "clip_fraction/low", "entropy", "kl"):
        assert mega["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-4, abs=1e-6), key
    torch.testing.assert_close(mega["after"][mask], ref["after"][mask], atol=1e-4, rtol=0)
    assert set(mega["state"]) >= set(ref["state"]) - {"lm_head.weight"}
    for name, tensor in mega["state"].items():
        # One Adam step at lr 1e-3: a weight whose gradient is ~0 may move by ±lr·ε-ish
        # amounts depending on summation order, hence 1e-4 (10% of one step).
        torch.testing.assert_close(tensor, ref["state"][name], atol=1e-4, rtol=0)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_conversion_round_trip(tiny_model: Path, tp: int) -> None:
    from safetensors.torch import load_file

    hf = load_file(str(tiny_model / "model.safetensors"))
    dims = ModelDims.from_hf_config(AutoConfig.from_pretrained(tiny_model))
    if dims.num_query_groups % tp:
        with pytest.raises(ValueError, match="must divide"):
            hf_to_megatron(hf, dims, 0, tp)
        return
    shards = [hf_to_megatron(hf, dims, r, tp) for r in range(tp)]
    from rlfleet_trainer.backends.megatron_convert import gather_fc1, partition_dim

    full = {}
    for name in shards[0]:
        parts = [s[name] for s in shards]
        dim = partition_dim(name)
        full[name] = (
            gather_fc1(parts)
            if name.endswith("linear_fc1.weight")
            else parts[0]
            if dim is None
            else torch.cat(parts, dim)
        )
    back = megatron_to_hf(full, dims)
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_megatron_matches_torch_at_tp1(tiny_model: Path, tiny_llama: Path) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    os.environ["MASTER_PORT"] = str(_free_port())
    try:
        for model in (tiny_model, tiny_llama):
            assert_parity(parity.megatron_results(model, 1), torch_results(model))
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.slow
def test_megatron_matches_torch_at_tp2(tiny_model: Path, tiny_llama: Path, tmp_path: Path) -> None:
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            *torchrun,
            str(HERE / "megatron_parity.py"),
            "--tp",
            "2",
            "--out",
            str(tmp_path),
            str(tiny_model),
            str(tiny_llama),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for i, model in enumerate((tiny_model, tiny_llama)):
        assert_parity(torch.load(tmp_path / f"{i}.pt", weights_only=False), torch_results(model))
