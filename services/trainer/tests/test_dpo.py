"""DPO: the preference losses against hand-worked numbers, pairs from scored tool-use
samples, and DPO steps on the same policy backends as GRPO (torch on SmolLM2-135M-Instruct:
the loss on the pairs goes down; megatron at TP=1: the same loss and gradient as torch)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from rlfleet_contracts.preference import DPOConfig, parse_preference_pair
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.models import resolve_model
from rlfleet_core.ports import pick_free_port
from rlfleet_trainer.algorithms.dpo import compute_dpo_loss, sequence_logprobs
from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy
from rlfleet_trainer.dpo import (
    TokenizedPair,
    attach_reference_logprobs,
    build_pair_batch,
    dpo_step,
    tokenize_pair,
    tool_use_pairs,
    train_on_pairs,
)

# One pair, padded to T = 4; row 0 = chosen (2 tokens), row 1 = rejected (3 tokens).
LOGPROBS_BT = torch.tensor([[-1.0, -2.0, 0.0, 0.0], [-1.5, -2.5, -1.0, 0.0]])
REF_BT = torch.tensor([[-1.2, -2.3, 0.0, 0.0], [-1.0, -2.0, -1.0, 0.0]])
MASK_BT = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])


def _loss(config: DPOConfig, ref: torch.Tensor | None = REF_BT) -> float:
    return compute_dpo_loss(LOGPROBS_BT, MASK_BT, ref, config, 1.0).metrics["loss"]


def test_dpo_losses_match_hand_computed_values() -> None:
    """Sequence logprobs (summed over the mask):
        s(chosen) = −1.0 − 2.0 = −3.0          s_ref(chosen) = −1.2 − 2.3 = −3.5
        s(rejected) = −1.5 − 2.5 − 1.0 = −5.0  s_ref(rejected) = −1.0 − 2.0 − 1.0 = −4.0
        Δ(chosen) = −3.0 − (−3.5) = 0.5,  Δ(rejected) = −5.0 − (−4.0) = −1.0,  h = 1.5

    sigmoid, β = 0.1:  z = 0.1 · 1.5 = 0.15
        L = −log σ(0.15) = log(1 + e^−0.15) = log(1 + 0.8607080) = 0.6209570
    label smoothing ε = 0.1:
        L = 0.9 · 0.6209570 + 0.1 · log(1 + e^0.15) = 0.9 · 0.6209570 + 0.1 · 0.7709570
          = 0.5588613 + 0.0770957 = 0.6359570
    IPO, β = 0.1:  L = (h − 1/(2β))² = (1.5 − 5)² = 12.25
    SimPO, β = 2, γ = 0.5 (means, no reference):
        s̄(chosen) = −3/2 = −1.5,  s̄(rejected) = −5/3 = −1.6667
        z = 2 · (−1.5 + 1.6667) − 0.5 = −0.1667;  L = log(1 + e^0.1667) = 0.7799487
    reference-free sigmoid, β = 0.1:  z = 0.1 · (−3 − (−5)) = 0.2
        L = log(1 + e^−0.2) = 0.5981389
    """
    assert _loss(DPOConfig(beta=0.1)) == pytest.approx(0.6209570, abs=1e-6)
    assert _loss(DPOConfig(beta=0.1, label_smoothing=0.1)) == pytest.approx(0.6359570, abs=1e-6)
    assert _loss(DPOConfig(beta=0.1, loss_type="ipo")) == pytest.approx(12.25, abs=1e-5)
    simpo = DPOConfig(beta=2.0, loss_type="simpo", simpo_gamma=0.5)
    assert _loss(simpo) == pytest.approx(0.7799487, abs=1e-6)
    assert _loss(simpo, ref=None) == _loss(simpo)  # SimPO never reads the reference
    assert _loss(DPOConfig(beta=0.1), ref=None) == pytest.approx(0.5981389, abs=1e-6)
    # Cross-check the closed forms with the standard library.
    assert math.log1p(math.exp(-0.15)) == pytest.approx(0.6209570, abs=1e-6)


def test_dpo_metrics_and_global_normaliser() -> None:
    """Implicit rewards β·Δ: chosen 0.1 · 0.5 = 0.05, rejected 0.1 · (−1) = −0.1, margin
    0.15, accuracy 1. A zero-mask pair (rank padding) adds nothing; normalising by the
    global count of 2 pairs halves the value, so micro-batches add up."""
    out = compute_dpo_loss(LOGPROBS_BT, MASK_BT, REF_BT, DPOConfig(beta=0.1), 1.0)
    assert out.metrics["rewards/chosen"] == pytest.approx(0.05, abs=1e-6)
    assert out.metrics["rewards/rejected"] == pytest.approx(-0.1, abs=1e-6)
    assert out.metrics["rewards/margin"] == pytest.approx(0.15, abs=1e-6)
    assert out.metrics["rewards/accuracy"] == 1.0
    assert out.metrics["logps/chosen"] == pytest.approx(-3.0)
    padded = compute_dpo_loss(
        torch.cat([LOGPROBS_BT, torch.randn(2, 4)]),
        torch.cat([MASK_BT, torch.zeros(2, 4)]),
        torch.cat([REF_BT, torch.randn(2, 4)]),
        DPOConfig(beta=0.1),
        2.0,
    )
    assert padded.metrics["loss"] == pytest.approx(0.6209570 / 2, abs=1e-6)
    assert sequence_logprobs(LOGPROBS_BT, MASK_BT, average=True).tolist() == pytest.approx(
        [-1.5, -5 / 3]
    )


def test_dpo_gradient_raises_chosen_and_lowers_rejected() -> None:
    logprobs = LOGPROBS_BT.clone().requires_grad_(True)
    compute_dpo_loss(logprobs, MASK_BT, REF_BT, DPOConfig(), 1.0).loss.backward()
    assert logprobs.grad is not None
    assert (logprobs.grad[0][MASK_BT[0] > 0] < 0).all()  # descent raises chosen logprobs
    assert (logprobs.grad[1][MASK_BT[1] > 0] > 0).all()
    assert (logprobs.grad[MASK_BT == 0] == 0).all()


def test_dpo_config_refusals() -> None:
    with pytest.raises(ValueError, match="loss_type"):
        DPOConfig.model_validate({"loss_type": "kto"})
    with pytest.raises(ValueError, match="row pairs; got 3 rows"):
        compute_dpo_loss(torch.zeros(3, 2), torch.ones(3, 2), None, DPOConfig(), 1.0)
    # A rank slice [c2, padding] (6 rows over 4 ranks): loud, not a silently dropped pair.
    split_mask = torch.cat([MASK_BT, torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0]])])
    with pytest.raises(ValueError, match=r"rows 2 and 3 are not a \(chosen, rejected\) pair"):
        compute_dpo_loss(torch.zeros(4, 4), split_mask, None, DPOConfig(), 2.0)
    recipe = RecipeConfig.model_validate({"dpo": {"beta": 0.2, "loss_type": "ipo"}})
    # The loss reads the recipe's own section: IPO at β = 0.2, h = 1.5 (above): (1.5 − 2.5)².
    assert _loss(recipe.dpo) == pytest.approx(1.0, abs=1e-5)


def test_tool_use_pairs_prefer_correct_calls_over_hallucinated_ones() -> None:
    prompt = [{"role": "user", "content": "weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    samples = [
        ("call get_weather(Paris)", 1.0, {"verdict": "correct"}),
        ("call get_forecast(Paris)", 0.0, {"verdict": "wrong_name"}),
        ("call get_weather(city=7)", 0.0, {"verdict": "wrong_arguments"}),
        ("call get_weather(city=7)", 0.0, {"verdict": "wrong_arguments"}),  # duplicate
        ("It is sunny.", 0.0, {"verdict": "no_call"}),  # a miss, not a hallucination
    ]
    pairs = tool_use_pairs(prompt, tools, samples, metadata={"prompt_id": "p1"})
    assert [(p.chosen[0]["content"], p.rejected[0]["content"]) for p in pairs] == [
        ("call get_weather(Paris)", "call get_forecast(Paris)"),
        ("call get_weather(Paris)", "call get_weather(city=7)"),
    ]
    assert pairs[0].metadata == {
        "prompt_id": "p1",
        "chosen_reward": 1.0,
        "rejected_reward": 0.0,
        "rejected_verdict": "wrong_name",
    }
    assert tool_use_pairs(prompt, tools, samples, max_pairs=1)[0].rejected == pairs[0].rejected
    assert tool_use_pairs(prompt, tools, samples[1:]) == []  # nothing correct to prefer


def _smollm_pairs(tokenizer: object) -> list[TokenizedPair]:
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is the weather in {city}?"}],
            "tools": tools,
            "chosen": f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}'
            "</tool_call>",
            "rejected": f'<tool_call>{{"name": "lookup_climate", "arguments": {{"place": '
            f'"{city}"}}}}</tool_call>',
        }
        for city in ("Paris", "Oslo", "Lima")
    ]
    return [tokenize_pair(tokenizer, parse_preference_pair(row), 256) for row in rows]


def test_tokenize_pair_keeps_the_template_and_fits_max_length() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    pair = _smollm_pairs(tokenizer)[0]
    prompt = tokenizer.decode(pair.prompt_ids)
    assert prompt.endswith("What is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.decode(pair.chosen_ids) == (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>\n'
    )
    row = parse_preference_pair(
        {"prompt": [{"role": "user", "content": "hi"}], "chosen": "a b c d e f", "rejected": "no"}
    )
    full = tokenize_pair(tokenizer, row, 256)
    assert len(full.chosen_ids) > 2
    short = tokenize_pair(tokenizer, row, len(full.prompt_ids) + 2)
    assert short.chosen_ids == full.chosen_ids[:2] and short.rejected_ids == full.rejected_ids[:2]
    with pytest.raises(ValueError, match=r"prompt: .* tokens leave no room for a response"):
        tokenize_pair(tokenizer, row, 5)


@pytest.mark.slow
def test_torch_backend_dpo_lowers_the_loss_on_smollm2() -> None:
    from transformers import AutoTokenizer

    model = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(model)
    batch = build_pair_batch(_smollm_pairs(tokenizer), tokenizer.pad_token_id)
    # The top 2 of 30 layers train (embeddings frozen): a step costs seconds on 2 cores.
    policy = TorchPolicy(
        TorchBackendConfig(
            model_path=model, lr=5e-5, train_micro_batch_size=6, train_top_layers=2, device="cpu"
        )
    )
    attach_reference_logprobs(policy, batch, "precomputed")
    steps = [dpo_step(policy, batch, DPOConfig(beta=0.1)) for _ in range(3)]
    losses = [step["loss"] for step in steps]
    # Step 0 is at the reference weights: z = 0, L = log 2 exactly.
    assert losses[0] == pytest.approx(math.log(2), abs=1e-4)
    assert losses[2] < losses[1] < losses[0] - 0.02, losses
    assert steps[2]["rewards/margin"] > 0
    assert steps[2]["rewards/accuracy"] == pytest.approx(1.0)


def _tiny_pairs(vocab: int) -> list[TokenizedPair]:
    gen = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    return [TokenizedPair(ids(4 + i), ids(3 + i), ids(5 - i)) for i in range(3)]


def test_reference_copy_equals_precomputed(tiny_model: Path) -> None:
    batch = build_pair_batch(_tiny_pairs(512))
    policy = TorchPolicy(TorchBackendConfig(model_path=tiny_model, keep_reference=True))
    attach_reference_logprobs(policy, batch, "precomputed")
    precomputed = batch.reference_logprobs_NT
    dpo_step(policy, batch, DPOConfig())  # the policy moves, the copy does not
    attach_reference_logprobs(policy, batch, "copy")
    assert precomputed is not None and batch.reference_logprobs_NT is not None
    torch.testing.assert_close(batch.reference_logprobs_NT, precomputed)
    with pytest.raises(ValueError, match=r"dpo\.reference: unknown mode 'frozen'"):
        attach_reference_logprobs(policy, batch, "frozen")


def test_train_on_pairs_references_the_starting_weights(tiny_model: Path) -> None:
    """Two batches over two epochs: precomputed references (all scored before step 1) give
    the same steps as a frozen copy scoring each batch when it comes up; scoring the second
    batch only after the first step would not."""
    pairs = _tiny_pairs(512) + _tiny_pairs(512)[:1]
    runs = {}
    for mode in ("precomputed", "copy"):
        torch.manual_seed(0)
        policy = TorchPolicy(
            TorchBackendConfig(model_path=tiny_model, lr=1e-3, keep_reference=mode == "copy")
        )
        runs[mode] = train_on_pairs(
            policy, pairs, DPOConfig(beta=0.5), reference=mode, pairs_per_step=2, epochs=2
        )
    assert len(runs["precomputed"]) == 4
    for got, want in zip(runs["precomputed"], runs["copy"], strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["rewards/margin"] == pytest.approx(want["rewards/margin"], rel=1e-4, abs=1e-6)
    # Step 1 is at the reference (log 2); step 2's batch was scored by the starting weights
    # but trains after step 1 moved them, so it is not at log 2 (scored late, it would be).
    losses = [step["loss"] for step in runs["precomputed"]]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-5)
    assert abs(losses[1] - math.log(2)) > 1e-3
    assert losses[2] < losses[0]  # the first batch again, after two steps


@pytest.mark.slow
def test_megatron_dpo_step_matches_torch(tiny_model: Path) -> None:
    """DPO and GRPO share the backends: at TP=1 the megatron backend's DPO step gives the
    torch backend's loss, rewards and gradient norm on the same pairs (micro-batch 3 is
    rounded up to 4 so no pair is split)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from rlfleet_trainer.backends.megatron_backend import MegatronPolicy
    from rlfleet_trainer.backends.megatron_setup import MegatronBackendConfig

    loss = DPOConfig(beta=0.5, label_smoothing=0.1)
    results = []
    os.environ["MASTER_PORT"] = str(pick_free_port())
    try:
        for policy in (
            TorchPolicy(TorchBackendConfig(model_path=tiny_model, lr=1e-3, device="cpu")),
            MegatronPolicy(MegatronBackendConfig(model_path=tiny_model, lr=1e-3)),
        ):
            policy.config.train_micro_batch_size = 3
            batch = build_pair_batch(_tiny_pairs(512))
            attach_reference_logprobs(policy, batch, "precomputed")
            assert batch.reference_logprobs_NT is not None
            batch.reference_logprobs_NT += 0.05 * batch.mask_NT  # Δ ≠ 0 from the first step
            first = dpo_step(policy, batch, loss)
            results.append((first, dpo_step(policy, batch, loss)))
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    (torch_1, torch_2), (mega_1, mega_2) = results
    for key in ("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "logps/chosen"):
        assert mega_1[key] == pytest.approx(torch_1[key], rel=1e-4, abs=1e-6), key
        assert mega_2[key] == pytest.approx(torch_2[key], rel=1e-3, abs=1e-5), key
    assert torch_2["loss"] < torch_1["loss"]


@pytest.mark.slow
def test_fsdp2_two_ranks_dpo_step_matches_one_process(tiny_model: Path, tmp_path: Path) -> None:
    """torchrun, 2 gloo ranks with 2 of 4 pairs each (FSDP2): the loss, rewards, grad norm
    and weights after a DPO step equal one process on all 4 pairs (the pair count that
    normalises the loss is the global one)."""
    import subprocess
    import sys

    probe = Path(__file__).parent / "fsdp_parity.py"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(pick_free_port()),
        str(probe), "--dpo", "--out", str(tmp_path), str(tiny_model),
    ]  # fmt: skip
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    plain_run = [sys.executable, str(probe), "--dpo", "--plain", "--out", str(tmp_path)]
    proc = subprocess.run(
        [*plain_run, str(tiny_model)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    sharded = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    plain = torch.load(tmp_path / "plain.pt", weights_only=False)
    for key in ("loss", "grad_norm", "rewards/margin", "rewards/accuracy", "logps/rejected"):
        assert sharded["metrics"][key] == pytest.approx(plain["metrics"][key], rel=1e-5), key
    assert plain["metrics"]["loss"] > 0.1  # a real loss, not an empty batch
    for name, tensor in plain["state"].items():
        torch.testing.assert_close(sharded["state"][name], tensor, atol=1e-4, rtol=0)
