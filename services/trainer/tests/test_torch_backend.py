"""The torch backend on the tiny model: logprob alignment, gradient accumulation that
equals one big batch, learning direction, save/load, HF export, FSDP2 at world size 1 and
2; the last three also on the hybrid Mamba-2 / attention / MoE tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from rlfleet_contracts.recipe import GRPOConfig
from rlfleet_core.ports import pick_free_port
from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy
from rlfleet_trainer.testing import random_batch
from rlfleet_weights.names import checkpoint_named
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

LOSS = GRPOConfig(importance_sampling="tis", force_on_policy_ratio=True)


def _policy(model: Path, **kw: object) -> TorchPolicy:
    torch.manual_seed(0)
    return TorchPolicy(TorchBackendConfig(model_path=model, lr=1e-3, **kw))  # type: ignore[arg-type]


def test_logprobs_align_with_generated_tokens(tiny_models: Path) -> None:
    trajs, batch = random_batch()
    policy = _policy(tiny_models, logprob_micro_batch_size=3)
    logprobs_NT = policy.logprobs(batch)
    model = AutoModelForCausalLM.from_pretrained(tiny_models).eval()
    for i, traj in enumerate(trajs):
        ids = torch.tensor([traj.prompt_token_ids + traj.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].log_softmax(-1)
        p = len(traj.prompt_token_ids)
        expected = [float(logits[p - 1 + k, tok]) for k, tok in enumerate(traj.token_ids)]
        got = logprobs_NT[i][batch.mask_NT[i] > 0].tolist()
        assert got == pytest.approx(expected, abs=1e-4)


def test_gradient_accumulation_equals_fullrandom_batch(tiny_models: Path) -> None:
    _, batch = random_batch(n=6)
    results = []
    for micro in (1, 4, 6):
        policy = _policy(tiny_models, train_micro_batch_size=micro, max_grad_norm=None)
        metrics = policy.train_step(batch, LOSS)
        results.append((metrics["loss"], metrics["grad_norm"], next(policy.model.parameters())))
    for loss, grad_norm, param in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-5)
        assert grad_norm == pytest.approx(results[0][1], rel=1e-4)
        # Adam divides by |g|: elements with g ≈ 0 may differ by rounding, so atol 1e-5 (lr 1e-3).
        torch.testing.assert_close(param, results[0][2], atol=1e-5, rtol=0)


def test_positive_advantage_samples_become_likelier(tiny_model: Path) -> None:
    trajs, batch = random_batch()
    policy = _policy(tiny_model)
    before = (policy.logprobs(batch) * batch.mask_NT).sum(1)
    for _ in range(3):
        metrics = policy.train_step(batch, LOSS)
    after = (policy.logprobs(batch) * batch.mask_NT).sum(1)
    for i, traj in enumerate(trajs):
        assert (after[i] > before[i]) == (traj.advantage > 0)
    assert metrics["entropy"] > 0 and metrics["lr"] == pytest.approx(1e-3)
    assert 0.0 <= metrics["clip_fraction/low"] <= 1.0


def test_reference_logprobs_stay_frozen(tiny_model: Path) -> None:
    _, batch = random_batch()
    policy = _policy(tiny_model, keep_reference=True)
    ref_before = policy.logprobs(batch, reference=True)
    policy.train_step(batch, LOSS)
    torch.testing.assert_close(policy.logprobs(batch, reference=True), ref_before)
    assert not torch.allclose(policy.logprobs(batch), ref_before)
    with pytest.raises(RuntimeError, match="keep_reference"):
        _policy(tiny_model).logprobs(batch, reference=True)


def test_save_load_roundtrip_and_hf_export(tiny_models: Path, tmp_path: Path) -> None:
    _, batch = random_batch()
    policy = _policy(tiny_models)
    policy.train_step(batch, LOSS)
    (tmp_path / "ckpt").mkdir()
    policy.save(tmp_path / "ckpt")
    saved = {k: v.clone() for k, v in policy.hf_state_dict()}
    after_save = policy.train_step(batch, LOSS)
    policy.load(tmp_path / "ckpt")
    for name, tensor in policy.hf_state_dict():
        torch.testing.assert_close(tensor, saved[name])
    # the optimizer state came back too: the same next step gives the same metrics
    again = policy.train_step(batch, LOSS)
    assert again["loss"] == pytest.approx(after_save["loss"], rel=1e-6)
    assert again["grad_norm"] == pytest.approx(after_save["grad_norm"], rel=1e-5)

    policy.export_hf(tmp_path / "hf")
    # The export holds the checkpoint's own names (Nemotron-H: one tensor per expert).
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(exported) == set(load_file(str(tiny_models / "model.safetensors")))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    weights = dict(policy.hf_state_dict())
    for name, tensor in checkpoint_named(loaded, loaded.state_dict()).items():
        torch.testing.assert_close(tensor, weights[name])
    assert (tmp_path / "hf" / "tokenizer.json").exists()


def test_fsdp2_world_size_one_matches_plain(tiny_models: Path) -> None:
    _, batch = random_batch()
    plain = _policy(tiny_models, max_grad_norm=None)
    plain_metrics = plain.train_step(batch, LOSS)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{pick_free_port()}", rank=0, world_size=1
    )
    try:
        sharded = _policy(tiny_models, max_grad_norm=None, fsdp=True)
        metrics = sharded.train_step(batch, LOSS)
        assert metrics["loss"] == pytest.approx(plain_metrics["loss"], rel=1e-5)
        assert metrics["grad_norm"] == pytest.approx(plain_metrics["grad_norm"], rel=1e-4)
        full = dict(sharded.hf_state_dict())
        for name, tensor in plain.hf_state_dict():
            torch.testing.assert_close(full[name], tensor, atol=1e-6, rtol=0)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_two_ranks_match_one_process_on_the_wholerandom_batch(
    tiny_models: Path, tmp_path: Path
) -> None:
    """torchrun, 2 gloo ranks, each on half of the batch: the summed loss, the grad norm
    and every weight after the step equal one unsharded process on the whole batch (the
    loss is normalised by the global token count, so rank gradients must be summed)."""
    import os
    import subprocess
    import sys

    probe = Path(__file__).parent / "fsdp_parity.py"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(pick_free_port()),
        str(probe), "--out", str(tmp_path), str(tiny_models),
    ]  # fmt: skip
    # The hybrid model also moves its routers' biases (aux-loss-free balancing): from the
    # load summed over both ranks, so both equal the one process's.
    moe = ["--router-bias-rate", "0.01"] if "nemotron" in tiny_models.name else []
    command[-1:-1] = moe
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sharded = torch.load(tmp_path / "fsdp.pt", weights_only=False)

    # The reference: the same probe, one process, the whole batch.
    plain_run = [sys.executable, str(probe), "--plain", "--out", str(tmp_path), *moe]
    plain_run.append(str(tiny_models))
    proc = subprocess.run(plain_run, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    plain = torch.load(tmp_path / "plain.pt", weights_only=False)
    assert sharded["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert sharded["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
    # One Adam step at lr 1e-3 moves a weight by up to lr whatever its gradient's size; for
    # a gradient near Adam's eps the move depends on summation order: the probe's eps 1e-6
    # bounds that, and 1e-4 is 10% of a step (as in the megatron parity tests). A halved
    # gradient would still show in the grad norm above.
    for key, value in plain["metrics"].items():
        if key.startswith("moe/"):
            assert sharded["metrics"][key] == pytest.approx(value), key
    assert bool(moe) == any(k.endswith(".e_score_correction_bias") for k in plain["state"])
    assert set(sharded["state"]) == set(plain["state"])
    for name, tensor in plain["state"].items():
        torch.testing.assert_close(sharded["state"][name], tensor, atol=1e-4, rtol=0)


def test_checkpoint_of_tied_embeddings(tiny_model: Path, tmp_path: Path) -> None:
    """SmolLM2 ties its LM head to the embeddings (shared storage, which safetensors
    refuses): save, load and export must still work and keep the tie."""
    from transformers import AutoConfig

    tied = tmp_path / "tied"
    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tied)
    for item in tiny_model.iterdir():
        if item.name.startswith("tokenizer") or item.name == "special_tokens_map.json":
            (tied / item.name).write_bytes(item.read_bytes())
    _, batch = random_batch()
    policy = _policy(tied)
    assert (
        policy.model.lm_head.weight.data_ptr() == policy.model.model.embed_tokens.weight.data_ptr()
    )
    policy.train_step(batch, LOSS)
    (tmp_path / "ckpt").mkdir()
    policy.save(tmp_path / "ckpt")
    saved = {k: v.clone() for k, v in policy.hf_state_dict()}
    policy.train_step(batch, LOSS)
    policy.load(tmp_path / "ckpt")
    for name, tensor in policy.hf_state_dict():
        torch.testing.assert_close(tensor, saved[name])
    assert (
        policy.model.lm_head.weight.data_ptr() == policy.model.model.embed_tokens.weight.data_ptr()
    )
    policy.export_hf(tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(loaded.lm_head.weight, saved["model.embed_tokens.weight"])


def test_train_top_layers_freezes_the_rest(tiny_model: Path) -> None:
    _, batch = random_batch()
    policy = _policy(tiny_model, train_top_layers=1)
    before = {k: v.clone() for k, v in policy.hf_state_dict()}
    policy.train_step(batch, LOSS)
    after = dict(policy.hf_state_dict())
    top = len(policy.model.model.layers) - 1
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "nothing trained"
    assert all(k.startswith((f"model.layers.{top}.", "model.norm.")) for k in changed), changed
    deeper = _policy(tiny_model, train_top_layers=99)  # more than the model has: all layers
    trainable = {n for n, p in deeper.model.named_parameters() if p.requires_grad}
    assert all(n.startswith(("model.layers.", "model.norm.")) for n in trainable)
    assert {f"model.layers.{i}.mlp.up_proj.weight" for i in range(top + 1)} <= trainable


def test_logits_only_from_the_first_response_position(tiny_model: Path) -> None:
    """Skipping the LM head on prompt positions changes nothing the loss sees."""
    _, batch = random_batch()
    policy = _policy(tiny_model)
    assert batch.response_start > 0
    fast = policy.logprobs(batch)
    batch.response_start = 0
    full = policy.logprobs(batch)
    mask = batch.mask_NT > 0
    torch.testing.assert_close(fast[mask], full[mask], rtol=1e-5, atol=1e-5)
