"""The megatron backend gives the same logprobs, loss, gradient norm, updated weights and
published HF state dict as the torch backend on the same tiny Llama and Qwen2 weights, at
TP=1 (in process), TP=2 and PP=2 (torchrun, gloo, 2 CPU processes) and TP=2 × PP=2 (4
processes); PP=2 also round-trips a checkpoint. Unsupported sizes fail at start-up."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from rlfleet_core.ports import pick_free_port
from rlfleet_trainer.backends.megatron_backend import MegatronPolicy
from rlfleet_trainer.backends.megatron_convert import (
    ModelDims,
    gather_fc1,
    hf_to_megatron,
    megatron_to_hf,
    merge_pipeline_stages,
    partition_dim,
)
from rlfleet_trainer.backends.megatron_setup import MegatronBackendConfig
from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy
from rlfleet_trainer.model_shapes import TEST_LLAMA, TEST_QWEN2_TIED, save_random_model
from transformers import AutoConfig

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("megatron_parity", HERE / "megatron_parity.py")
assert spec is not None and spec.loader is not None
parity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parity)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A 2-layer Llama (hidden 64, 4 heads, 2 kv heads, vocab 256), random weights."""
    return save_random_model(tmp_path_factory.mktemp("llama"), "llama", 1, **TEST_LLAMA)


@pytest.fixture(scope="module")
def tiny_qwen_tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer Qwen2 with tied embeddings (SmolLM2/small-Qwen2 style: the LM head is the
    word embedding), hidden 64, vocab 256, random weights."""
    return save_random_model(tmp_path_factory.mktemp("qwen_tied"), "qwen2", 2, **TEST_QWEN2_TIED)


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


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("tied", [False, True])
def test_conversion_round_trip(
    tiny_model: Path, tiny_qwen_tied: Path, tp: int, pp: int, tied: bool
) -> None:
    from safetensors.torch import load_file

    model = tiny_qwen_tied if tied else tiny_model
    hf = load_file(str(model / "model.safetensors"))
    dims = ModelDims.from_hf_config(AutoConfig.from_pretrained(model))
    if dims.num_query_groups % tp:
        with pytest.raises(ValueError, match="must divide"):
            hf_to_megatron(hf, dims, 0, tp)
        return
    stages = []
    for stage in range(pp):
        shards = [hf_to_megatron(hf, dims, r, tp, stage, pp) for r in range(tp)]
        gathered = {}
        for name in shards[0]:
            parts = [s[name] for s in shards]
            dim = partition_dim(name)
            gathered[name] = (
                gather_fc1(parts)
                if name.endswith("linear_fc1.weight")
                else parts[0]
                if dim is None
                else torch.cat(parts, dim)
            )
        stages.append(gathered)
    if tied and pp > 1:  # the last stage holds its own copy of the tied embedding
        assert torch.equal(stages[-1]["output_layer.weight"], hf["model.embed_tokens.weight"])
    back = megatron_to_hf(merge_pipeline_stages(stages, dims), dims)
    assert set(back) == set(hf) | {"lm_head.weight"}
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_pipeline_size_must_divide_layers(tiny_llama: Path) -> None:
    config = MegatronBackendConfig(model_path=tiny_llama, pipeline_parallel_size=3)
    with pytest.raises(ValueError) as info:
        MegatronPolicy(config)  # refused before any process group is created
    message = str(info.value)
    assert "\n" not in message
    assert "policy.pipeline_parallel_size=3" in message and "2 decoder layers" in message


@pytest.mark.parametrize(
    ("field", "reason"),
    [("context_parallel_size", "Transformer Engine"), ("expert_parallel_size", "MoE")],
)
def test_context_and_expert_parallel_refused(tiny_llama: Path, field: str, reason: str) -> None:
    config = MegatronBackendConfig(model_path=tiny_llama, **{field: 2})  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError) as info:
        MegatronPolicy(config)
    message = str(info.value)
    assert "\n" not in message
    assert f"policy.{field}=2" in message and reason in message and "set it to 1" in message


@pytest.mark.slow
def test_megatron_matches_torch_at_tp1(tiny_model: Path, tiny_llama: Path) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    os.environ["MASTER_PORT"] = str(pick_free_port())
    try:
        for model in (tiny_model, tiny_llama):
            assert_parity(parity.megatron_results(model, 1), torch_results(model))
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _torchrun(nproc: int, args: list[str], timeout: float) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(pick_free_port()),
        str(HERE / "megatron_parity.py"),
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_megatron_matches_torch_at_tp2(tiny_model: Path, tiny_llama: Path, tmp_path: Path) -> None:
    _torchrun(2, ["--tp", "2", "--out", str(tmp_path), str(tiny_model), str(tiny_llama)], 280)
    for i, model in enumerate((tiny_model, tiny_llama)):
        assert_parity(torch.load(tmp_path / f"{i}.pt", weights_only=False), torch_results(model))


@pytest.mark.slow
def test_megatron_matches_torch_at_pp2(
    tiny_llama: Path, tiny_qwen_tied: Path, tmp_path: Path
) -> None:
    """Two stages (Llama: 1 layer each; tied Qwen2: 2 each, the embedding on both ends),
    micro-batches of 1 so the 1F1B schedule fills and drains; then save → load into a
    fresh PP=2 policy (same logprobs, bit for bit) and into a PP=1 one (refused)."""
    models = (tiny_llama, tiny_qwen_tied)
    _torchrun(2, ["--pp", "2", "--save-load", "--out", str(tmp_path), *map(str, models)], 400)
    for i, model in enumerate(models):
        mega = torch.load(tmp_path / f"{i}.pt", weights_only=False)
        assert_parity(mega, torch_results(model))
        assert torch.equal(mega["reloaded"], mega["after"])
        assert mega["mismatch"] is not None and "\n" not in mega["mismatch"]
        assert "pipeline_parallel_size 2, this run uses 1" in mega["mismatch"]
        saved = (tmp_path / f"ckpt{i}" / "megatron.json").read_text()
        assert '"pipeline_parallel_size": 2' in saved and '"tensor_parallel_size": 1' in saved


@pytest.mark.budget(180, "four gloo ranks of megatron on two cores")
@pytest.mark.slow
def test_megatron_matches_torch_at_tp2_pp2(tiny_qwen_tied: Path, tmp_path: Path) -> None:
    _torchrun(4, ["--tp", "2", "--pp", "2", "--out", str(tmp_path), str(tiny_qwen_tied)], 500)
    assert_parity(torch.load(tmp_path / "0.pt", weights_only=False), torch_results(tiny_qwen_tied))
