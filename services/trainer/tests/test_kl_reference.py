"""KL to the frozen reference (RLHF, `grpo.kl_coef` 1e-4): the loss term and its gradient
against hand-computed numbers, the reference being the stage's starting weights (also
after a resume from a checkpoint), and the step's `kl` metric equal to the k3 estimate
of the policy's and the reference's logprobs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from rlfleet_contracts.recipe import GRPOConfig, RecipeConfig
from rlfleet_trainer.algorithms.losses import LossInputs, compute_policy_loss
from rlfleet_trainer.backends.base import BackendConfig
from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy
from rlfleet_trainer.batch import Trajectory, build_train_batch
from rlfleet_trainer.ranks import train_slice

KL = GRPOConfig(kl_coef=1e-4, kl_type="k3", force_on_policy_ratio=True, importance_sampling="none")


def test_kl_term_and_gradient_by_hand() -> None:
    """Two tokens, advantage 0 (the policy-gradient term is 0): log r = ref − lp is −0.5
    and 0, k3 = e^{log r} − 1 − log r = e^{−0.5} − 0.5 = 0.1065307 and 0; the token mean
    0.0532653; loss = 1e-4 × 0.0532653. ∂k3/∂lp = 1 − e^{log r}: 1 − e^{−0.5} = 0.3934693,
    so ∂loss/∂lp_0 = 1e-4 × 0.3934693 / 2 tokens."""
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    inputs = LossInputs(
        logprobs_BT=logprobs,
        generation_logprobs_BT=torch.tensor([[-1.0, -2.0]]),
        advantages_B=torch.tensor([0.0]),
        mask_BT=torch.ones(1, 2),
        reference_logprobs_BT=torch.tensor([[-1.5, -2.0]]),
    )
    out = compute_policy_loss(inputs, KL, global_valid_tokens=2, global_valid_sequences=1)
    k3 = math.exp(-0.5) - 0.5
    assert out.metrics["kl"] == pytest.approx(k3 / 2, rel=1e-6)
    assert float(out.loss.detach()) == pytest.approx(1e-4 * k3 / 2, rel=1e-5)
    out.loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad.tolist()[0] == pytest.approx(
        [1e-4 * (1 - math.exp(-0.5)) / 2, 0.0], rel=1e-5, abs=1e-12
    )


def test_kl_coef_keeps_a_reference_copy_of_the_starting_weights() -> None:
    """`grpo.kl_coef` > 0 (RLHF's 1e-4: the recipes are checked in libs/pipeline's
    test_rlhf_stage.py) puts the coefficient in the loss and makes the backend keep a
    frozen copy of the weights it starts from (policy.model); 0 keeps none."""
    rlhf = RecipeConfig.model_validate({"stage": "rlhf", "grpo": {"kl_coef": 1e-4}})
    assert rlhf.grpo.kl_coef == pytest.approx(1e-4)
    assert BackendConfig.recipe_values(rlhf, Path("m"))["keep_reference"] is True
    assert BackendConfig.recipe_values(RecipeConfig(), Path("m"))["keep_reference"] is False


def _batch() -> tuple[list[Trajectory], torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    trajs = [
        Trajectory(
            prompt_id=f"p{i // 2}",
            sample_index=i % 2,
            prompt_token_ids=torch.randint(3, 512, (4,), generator=gen).tolist(),
            token_ids=torch.randint(3, 512, (3 + i,), generator=gen).tolist(),
            generation_logprobs=[-6.0] * (3 + i),
            truncated=False,
            reward=float(i % 2),
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(4)
    ]
    return trajs, torch.ones(4)


def _policy(model: Path) -> TorchPolicy:
    torch.manual_seed(0)
    config = TorchBackendConfig(model_path=model, lr=1e-3, keep_reference=True, max_grad_norm=None)
    return TorchPolicy(config)


def test_reference_is_the_starting_weights_after_a_resume(tiny_model: Path, tmp_path: Path) -> None:
    """Train two steps, checkpoint, build the backend again from the stage's starting
    model and load the checkpoint (what --resume does): the policy is the checkpoint's,
    the reference still the starting weights, and the step's `kl` metric is the token
    mean of k3 between the two."""
    trajs, weights = _batch()
    batch = build_train_batch(trajs, weights)
    first = _policy(tiny_model)
    start_ref = first.logprobs(batch, reference=True)
    torch.testing.assert_close(first.logprobs(batch), start_ref)  # step 0: policy = reference
    step1, _ = train_slice(first, batch, KL)
    assert step1["kl"] == pytest.approx(0.0, abs=1e-6)  # trained on the starting weights
    train_slice(first, batch, KL)
    trained = first.logprobs(batch)
    first.save(tmp_path)

    resumed = _policy(tiny_model)
    resumed.load(tmp_path)
    torch.testing.assert_close(resumed.logprobs(batch, reference=True), start_ref)
    torch.testing.assert_close(resumed.logprobs(batch), trained)
    assert not torch.allclose(trained, start_ref)

    mask = batch.mask_NT
    log_ratio = start_ref - trained
    expected = float(((log_ratio.exp() - 1 - log_ratio) * mask).sum() / mask.sum())
    metrics, timings = train_slice(resumed, batch, KL)
    assert expected > 0
    assert metrics["kl"] == pytest.approx(expected, rel=1e-3)
    assert timings["logprobs_s"] >= 0  # the reference pass is timed with the logprobs
