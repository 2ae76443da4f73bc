"""Every GRPO formula pinned to numbers worked out by hand (the arithmetic is in the
comments), so a refactor that changes the math fails here first."""

from __future__ import annotations

import math

import pytest
import torch
from rlfleet_contracts.recipe import GRPOConfig
from rlfleet_trainer.algorithms import (
    LossInputs,
    aggregate_loss,
    clipped_surrogate,
    compute_baseline_and_std,
    compute_grpo_advantages,
    compute_importance_weights,
    compute_kl,
    compute_policy_loss,
    dapo_overlong_penalty,
    gspo_log_ratio,
    overlong_loss_multiplier,
    sample_loss_multiplier,
    sequence_logprob_error,
    sequence_logprob_error_keep,
    zero_variance_groups,
)

SQRT_1_3 = math.sqrt(1 / 3)  # 0.57735...


def close(
    actual: torch.Tensor, expected: list[float] | list[list[float]], tol: float = 1e-5
) -> None:
    torch.testing.assert_close(
        actual.double(), torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0
    )


# --- advantages -------------------------------------------------------------------------


def test_leave_one_out_baseline_and_bessel_std() -> None:
    # r = [1, 0, 0, 1]. For i=0 the others are [0, 0, 1]: b = 1/3;
    # Bessel var = ((1/3)² + (1/3)² + (2/3)²) / 2 = (6/9) / 2 = 1/3, std = sqrt(1/3).
    # For i=1 the others are [1, 0, 1]: b = 2/3, same std.
    baseline, std = compute_baseline_and_std(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    close(baseline, [[1 / 3, 2 / 3, 2 / 3, 1 / 3]])
    close(std, [[SQRT_1_3] * 4])


def test_grpo_advantages_leave_one_out() -> None:
    # A_0 = (1 − 1/3) / (sqrt(1/3) + 1e-6) = 0.666667 / 0.577351 = 1.154698
    adv = compute_grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    a = (2 / 3) / (SQRT_1_3 + 1e-6)
    close(adv, [[a, -a, -a, a]])


def test_zero_std_leaves_advantage_unnormalised() -> None:
    # r = [1, 0, 0, 0]: for i=0 the others [0, 0, 0] have std 0, so A_0 = 1 − 0 = 1 (not
    # divided). For i=1 the others [1, 0, 0]: b = 1/3, std = sqrt(1/3),
    # A_1 = −(1/3) / sqrt(1/3) = −0.577350.
    adv = compute_grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    a = -(1 / 3) / (SQRT_1_3 + 1e-6)
    close(adv, [[1.0, a, a, a]])


def test_group_of_two_has_no_loo_std() -> None:
    # G = 2: one other sample, Bessel std undefined -> 0, A = r − r_other.
    close(compute_grpo_advantages(torch.tensor([[1.0, 0.0]])), [[1.0, -1.0]])


def test_plain_baseline_and_clip_and_no_normalisation() -> None:
    # r = [1, 0, 0, 1]: mean 0.5, Bessel std = sqrt(4·0.25/3) = sqrt(1/3); A = ±0.5/0.57735.
    adv = compute_grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), leave_one_out=False)
    a = 0.5 / (SQRT_1_3 + 1e-6)
    close(adv, [[a, -a, -a, a]])
    # clip 1.0: ±1.1547 -> ±1
    clipped = compute_grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), clip=1.0)
    close(clipped, [[1.0, -1.0, -1.0, 1.0]])
    # no normalisation: A = r − b = [2/3, −2/3, −2/3, 2/3]
    raw = compute_grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), normalize=False)
    close(raw, [[2 / 3, -2 / 3, -2 / 3, 2 / 3]])


def test_equal_graded_rewards_are_not_sharpened() -> None:
    # Graded rewards. For the 1.0 sample the others are all 0.3: std 0, A = 1 − 0.3. The
    # moment form Σr² − n·b² used to leave a std of ~1e-9 from rounding here and return
    # A ≈ 7e5.
    adv = compute_grpo_advantages(torch.tensor([[0.3, 0.3, 0.3, 1.0]], dtype=torch.float64))
    assert abs(float(adv[0, 3]) - 0.7) < 1e-6
    # the others see [0.3, 0.3, 1]: b = 1.6/3, std = sqrt((2·(0.7/3)² + (1.4/3)²) / 2)
    a = (0.3 - 1.6 / 3) / (math.sqrt((2 * (0.7 / 3) ** 2 + (1.4 / 3) ** 2) / 2) + 1e-6)
    close(adv[:, :3], [[a, a, a]])


def test_rewards_equal_up_to_rounding_count_as_zero_variance() -> None:
    near = [0.3, 0.1 + 0.2, 0.3]  # sums in another order differ in the last bit
    assert len(set(near)) == 2
    assert zero_variance_groups(torch.tensor([near], dtype=torch.float64)).tolist() == [True]
    adv = compute_grpo_advantages(torch.tensor([[*near, 1.0]], dtype=torch.float64))
    assert abs(float(adv[0, 3]) - 0.7) < 1e-6


def test_advantages_need_groups() -> None:
    with pytest.raises(ValueError, match="G >= 2"):
        compute_grpo_advantages(torch.tensor([[1.0]]))


def test_dynamic_sampling_finds_zero_variance_groups() -> None:
    mask = zero_variance_groups(torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert mask.tolist() == [True, False, True]


# --- clipped loss -----------------------------------------------------------------------


def test_clip_higher_surrogate() -> None:
    # ε_low 0.2, ε_high 0.28: clip range [0.8, 1.28]; L = max(−A·r, −A·clip(r)).
    # r=0.5,A=+1: max(−0.5, −0.8) = −0.5    r=0.9,A=−1: max(0.9, 0.9) = 0.9
    # r=1.5,A=+1: max(−1.5, −1.28) = −1.28  r=0.5,A=−1: max(0.5, 0.8) = 0.8
    ratio = torch.tensor([[0.5, 0.9, 1.5, 0.5]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    close(clipped_surrogate(ratio, adv, 0.2, 0.28), [[-0.5, 0.9, -1.28, 0.8]])


def test_dual_clip() -> None:
    # r=4, A=−1: PPO gives max(4, 1.28) = 4; dual clip c=3 caps it at −A·c = 3.
    # r=4, A=+1: max(−4, −1.28) = −1.28, untouched by the dual clip (A > 0).
    ratio = torch.tensor([[4.0, 4.0]])
    adv = torch.tensor([[-1.0, 1.0]])
    close(clipped_surrogate(ratio, adv, 0.2, 0.28, dual_clip_c=3.0), [[3.0, -1.28]])
    close(clipped_surrogate(ratio, adv, 0.2, 0.28), [[4.0, -1.28]])


def test_token_and_sequence_normalisation() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # token: (1+2+3+4+5)/5 = 3; with a global count of 10 tokens: 15/10 = 1.5
    close(aggregate_loss(loss, mask, "token", 5, 2), 3.0)
    close(aggregate_loss(loss, mask, "token", 10, 4), 1.5)
    # sequence: means 6/3 = 2 and 9/2 = 4.5; (2 + 4.5)/2 = 3.25
    close(aggregate_loss(loss, mask, "sequence", 5, 2), 3.25)
    with pytest.raises(ValueError, match="token, sequence"):
        aggregate_loss(loss, mask, "bogus", 5, 2)


def test_gspo_sequence_ratio_and_gradient() -> None:
    # log r_b = mean(0.2, 0.4) = 0.3, r = exp(0.3) = 1.349859 on both tokens.
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    prev = torch.tensor([[-1.2, -2.4]])
    mask = torch.ones(1, 2)
    close(gspo_log_ratio(logprobs, prev, mask), [[0.3, 0.3]])
    # A = −1: L_t = max(1.349859, 1.28) = 1.349859; token mean over 2 tokens = 1.349859.
    # dL/dx_t = (1/2)·Σ_t' r·(1/2) = r/2 = 0.674929 for both tokens.
    config = GRPOConfig(sequence_level_importance_ratios=True, importance_sampling="none")
    out = compute_policy_loss(
        LossInputs(logprobs, prev, torch.tensor([-1.0]), mask, prev_logprobs_BT=prev), config, 2, 1
    )
    close(out.loss, math.exp(0.3))
    out.loss.backward()
    assert logprobs.grad is not None
    close(logprobs.grad, [[math.exp(0.3) / 2] * 2])


def test_policy_loss_on_policy_token_and_sequence_level() -> None:
    # r = 1, w = 1, A = [+1, −1]; mask [[1,1],[1,0]].
    # token: L = (−1 −1 +1)/3 = −1/3; dL/dlogπ = −A/3 on valid tokens.
    # sequence: means −1 and +1 -> (−1 + 1)/2 = 0.
    logprobs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    inputs = LossInputs(logprobs, logprobs.detach().clone(), torch.tensor([1.0, -1.0]), mask)
    out = compute_policy_loss(inputs, GRPOConfig(force_on_policy_ratio=True), 3, 2)
    close(out.loss, -1 / 3)
    out.loss.backward()
    assert logprobs.grad is not None
    close(logprobs.grad, [[-1 / 3, -1 / 3], [1 / 3, 0.0]])
    seq = compute_policy_loss(inputs, GRPOConfig(loss_level="sequence"), 3, 2)
    close(seq.loss, 0.0)


def test_force_on_policy_ignores_prev_logprobs() -> None:
    # prev differs by 0.5, so r would be exp(0.5) = 1.6487 (clipped at 1.28 for A>0:
    # L = −1.28); forcing the ratio makes r = 1 and L = −1.
    logprobs = torch.tensor([[-1.0]])
    prev = torch.tensor([[-1.5]])
    inputs = LossInputs(logprobs, logprobs, torch.tensor([1.0]), torch.ones(1, 1), prev)
    forced = GRPOConfig(force_on_policy_ratio=True, importance_sampling="none")
    close(compute_policy_loss(inputs, forced, 1, 1).loss, -1.0)
    off = GRPOConfig(importance_sampling="none")
    close(compute_policy_loss(inputs, off, 1, 1).loss, -1.28)


def test_loss_applies_truncated_importance_weights() -> None:
    # prev = −1, gen = [−1.5, −3]: w = [e^0.5, e^2] = [1.648721, 7.389056] -> tis max 5:
    # [1.648721, 5]. r = 1, A = 1: L = mean(−1.648721, −5) = −3.324361.
    prev = torch.tensor([[-1.0, -1.0]])
    gen = torch.tensor([[-1.5, -3.0]])
    inputs = LossInputs(prev.clone(), gen, torch.tensor([1.0]), torch.ones(1, 2), prev)
    out = compute_policy_loss(inputs, GRPOConfig(importance_sampling="tis"), 2, 1)
    close(out.loss, -(math.exp(0.5) + 5) / 2)
    # one of two tokens out of bounds; token_mult_prob_error = (e^0.5 + e^2)/2 = 4.518889
    assert out.metrics["is_oob_ratio"] == pytest.approx(0.5)
    assert out.metrics["token_mult_prob_error"] == pytest.approx((math.exp(0.5) + math.exp(2)) / 2)


def test_loss_with_kl_penalty_and_on_policy_approximation() -> None:
    # A = 0 so only KL remains: log r = −2 − (−1) = −1, k3 = e^−1 − 1 + 1 = 0.367879;
    # β = 0.1: L = 0.0367879.
    lp = torch.tensor([[-1.0]])
    inputs = LossInputs(lp, lp, torch.tensor([0.0]), torch.ones(1, 1), lp, torch.tensor([[-2.0]]))
    out = compute_policy_loss(inputs, GRPOConfig(kl_coef=0.1, kl_type="k3"), 1, 1)
    close(out.loss, 0.1 * math.exp(-1))
    assert out.metrics["kl"] == pytest.approx(math.exp(-1))
    # On-policy approximation weights KL by exp(logπ_θ − logπ_gen) = exp(−1 − (−1.5)) = e^0.5
    inputs.generation_logprobs_BT = torch.tensor([[-1.5]])
    cfg = GRPOConfig(kl_coef=0.1, use_on_policy_kl_approximation=True, importance_sampling="none")
    close(compute_policy_loss(inputs, cfg, 1, 1).loss, 0.1 * math.exp(-1) * math.exp(0.5))


def test_seq_logprob_error_masks_whole_sample_in_loss() -> None:
    # Sample 0: prev = gen -> error 1.0, kept. Sample 1: |Δ| = 2 on its token ->
    # error e^2 = 7.389 > 2 -> masked. A = [1, 1], r = 1, w = 1 (mode none):
    # L = (−1 + 0)/2 = −0.5.
    prev = torch.tensor([[-1.0], [-1.0]])
    gen = torch.tensor([[-1.0], [-3.0]])
    inputs = LossInputs(prev.clone(), gen, torch.tensor([1.0, 1.0]), torch.ones(2, 1), prev)
    cfg = GRPOConfig(importance_sampling="none", seq_logprob_error_threshold=2.0)
    out = compute_policy_loss(inputs, cfg, 2, 2)
    close(out.loss, -0.5)
    assert out.metrics["masked_sequence_fraction"] == pytest.approx(0.5)


# --- importance sampling ----------------------------------------------------------------


def _is_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # w = exp(prev − gen) = [e^0.5, e^2] = [1.648721, 7.389056]
    return torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.5, -3.0]]), torch.ones(1, 2)


def test_tis_truncates() -> None:
    prev, gen, mask = _is_case()
    out = compute_importance_weights(prev, gen, mask, "tis", 0.0, 5.0)
    close(out.weights_BT, [[math.exp(0.5), 5.0]])
    close(out.out_of_bounds_BT, [[0.0, 1.0]])


def test_icepop_zeroes_out_of_range_tokens() -> None:
    prev, gen, mask = _is_case()
    out = compute_importance_weights(prev, gen, mask, "icepop", 0.5, 5.0)
    close(out.weights_BT, [[math.exp(0.5), 0.0]])
    close(out.out_of_bounds_BT, [[0.0, 1.0]])


def test_seq_mask_tis_uses_geometric_mean() -> None:
    # geometric mean = exp((0.5 + 2)/2) = exp(1.25) = 3.490343: inside [0, 5] -> kept with
    # the untruncated token weights; inside [0, 3]? no -> the whole sequence is masked.
    prev, gen, mask = _is_case()
    kept = compute_importance_weights(prev, gen, mask, "seq-mask-tis", 0.0, 5.0)
    close(kept.sequence_keep_B, [1.0])
    close(kept.weights_BT, [[math.exp(0.5), math.exp(2.0)]])
    dropped = compute_importance_weights(prev, gen, mask, "seq-mask-tis", 0.0, 3.0)
    close(dropped.sequence_keep_B, [0.0])
    close(dropped.out_of_bounds_BT, [[1.0, 1.0]])


def test_importance_weights_none_and_unknown() -> None:
    prev, gen, mask = _is_case()
    close(compute_importance_weights(prev, gen, mask, "none").weights_BT, [[1.0, 1.0]])
    with pytest.raises(ValueError, match="tis, icepop, seq-mask-tis"):
        compute_importance_weights(prev, gen, mask, "bogus")


def test_sequence_logprob_error_and_threshold() -> None:
    # mean(exp(0.5), exp(2)) = (1.648721 + 7.389056)/2 = 4.518889; padding ignored.
    prev = torch.tensor([[-1.0, -1.0, 0.0]])
    gen = torch.tensor([[-1.5, -3.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    close(sequence_logprob_error(prev, gen, mask), [4.518889])
    close(sequence_logprob_error_keep(prev, gen, mask, 2.0), [0.0])
    close(sequence_logprob_error_keep(prev, gen, mask, 5.0), [1.0])
    close(sequence_logprob_error_keep(prev, gen, mask, None), [1.0])


# --- KL ---------------------------------------------------------------------------------


def test_kl_estimators() -> None:
    # log r = ref − θ = −2 − (−1) = −1: k1 = 1, k2 = 0.5, k3 = e^−1 − 1 + 1 = 0.367879
    lp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    close(compute_kl(lp, ref, "k1"), [1.0])
    close(compute_kl(lp, ref, "k2"), [0.5])
    close(compute_kl(lp, ref, "k3"), [math.exp(-1)])
    with pytest.raises(ValueError, match="k1, k2, k3"):
        compute_kl(lp, ref, "k4")


def test_kl_clamps() -> None:
    # log r = −30 clamps to −20: k1 = 20 -> output clamp 10; k2 = 200 -> 10;
    # k3 = e^−20 − 1 + 20 ≈ 19 -> 10. Without clamps k1 = 30.
    lp, ref = torch.tensor([0.0]), torch.tensor([-30.0])
    for kind in ("k1", "k2", "k3"):
        close(compute_kl(lp, ref, kind), [10.0])
    close(compute_kl(lp, ref, "k1", input_clamp=None, output_clamp=None), [30.0])
    close(compute_kl(lp, ref, "k3", output_clamp=None), [math.exp(-20) + 19])


# --- metrics ----------------------------------------------------------------------------


def test_clip_fraction_metrics() -> None:
    # ratios 0.5 (A<0: low clip), 1.5 (A>0: high clip), 1.0 (none), 5 (A<0: dual clip at c=3)
    logprobs = torch.log(torch.tensor([[0.5, 1.5, 1.0, 5.0]]))
    prev = torch.zeros(1, 4)
    # four one-token sequences, so each token gets its own advantage
    inputs = LossInputs(
        logprobs.T.contiguous(),
        prev.T.contiguous(),
        torch.tensor([-1.0, 1.0, 1.0, -1.0]),
        torch.ones(4, 1),
        prev.T.contiguous(),
        entropy_BT=torch.tensor([[1.0], [2.0], [3.0], [4.0]]),
    )
    cfg = GRPOConfig(importance_sampling="none", ratio_clip_c=3.0)
    m = compute_policy_loss(inputs, cfg, 4, 4).metrics
    assert m["clip_fraction/low"] == pytest.approx(0.25)
    assert m["clip_fraction/high"] == pytest.approx(0.25)
    assert m["clip_fraction/dual"] == pytest.approx(0.25)
    assert m["ratio_mean"] == pytest.approx((0.5 + 1.5 + 1.0 + 5.0) / 4)
    assert m["entropy"] == pytest.approx(2.5)


def test_unknown_loss_level_rejected() -> None:
    with pytest.raises(ValueError, match="loss_level"):
        GRPOConfig.model_validate({"loss_level": "bogus"})
    one = torch.ones(1, 1)
    with pytest.raises(ValueError, match="unknown loss_level 'bogus'"):
        aggregate_loss(one, one, "bogus", 1, 1)


# --- filters ----------------------------------------------------------------------------


def test_overlong_filtering_and_sample_multiplier() -> None:
    truncated = torch.tensor([True, False, False])
    close(overlong_loss_multiplier(truncated, True), [0.0, 1.0, 1.0])
    close(overlong_loss_multiplier(truncated, False), [1.0, 1.0, 1.0])
    masked = torch.tensor([False, True, False])
    close(sample_loss_multiplier(truncated, masked, True), [0.0, 0.0, 1.0])
    close(sample_loss_multiplier(truncated, masked, False), [1.0, 0.0, 1.0])


def test_dapo_overlong_penalty() -> None:
    # max 10, buffer 4: free up to 6; L=8 -> −2/4 = −0.5; L=12 -> −6/4 -> clamp −1.
    close(dapo_overlong_penalty(torch.tensor([5, 8, 12]), 10, 4), [0.0, -0.5, -1.0])
