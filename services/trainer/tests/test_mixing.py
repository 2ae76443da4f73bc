"""Mixed-environment batches: the interleaved data order, per-environment metrics (NeMo-RL
names) and per-environment advantage normalisation."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest
import torch
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_trainer.algorithms import normalize_advantages_per_env
from rlfleet_trainer.batch import Trajectory
from rlfleet_trainer.data import PromptSource
from rlfleet_trainer.env_metrics import env_metrics
from rlfleet_trainer.mixing import EnvSchedule
from rlfleet_trainer.replay import PromptGroup
from rlfleet_trainer.steps import prepare_step


class _Tokenizer:
    """Token ids = characters of the last message (enough for the order's tests)."""

    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> list[int]:
        return [ord(c) for c in messages[-1]["content"]]


def _rows(counts: dict[str, int]) -> list[dict[str, Any]]:
    rows = [
        {"id": f"{env}-{i}", "env": env, "responses_create_params": {"input": f"{env} {i}"}}
        for env, n in counts.items()
        for i in range(n)
    ]
    random.Random(0).shuffle(rows)
    return rows


def _envs(source: PromptSource, count: int, start: int = 0) -> list[str]:
    return [source.prompt_at(i).env for i in range(start, start + count)]


def test_every_batch_holds_every_environment_in_proportion() -> None:
    rows = _rows({"math": 60, "mcqa": 60, "instruction_following": 30})
    source = PromptSource(rows, _Tokenizer(), seed=3, interleave_envs=True)
    stream = _envs(source, 3 * len(rows))
    for start in range(0, len(stream) - 5, 5):  # any 5 consecutive prompts: 2, 2, 1
        window = Counter(stream[start : start + 5])
        assert sorted(window.values()) == [1, 2, 2], (start, window)
    # Each epoch uses every row exactly once; ids name the pass, so they stay unique.
    ids = [source.prompt_at(i).prompt_id for i in range(2 * len(rows))]
    assert len(set(ids)) == len(ids)
    assert {i.split("@")[0] for i in ids[: len(rows)]} == {r["id"] for r in rows}
    assert source.issued_ids() == []
    # Three equal environments, 4 prompts a step: a plain shuffle leaves one of them out of
    # some steps; interleaved, every step has all three.
    equal = _rows({"math": 40, "mcqa": 40, "instruction_following": 40})
    plain = PromptSource(equal, _Tokenizer(), seed=3, interleave_envs=False)
    mixed = PromptSource(equal, _Tokenizer(), seed=3, interleave_envs=True)
    steps = range(2 * len(equal) // 4)
    assert any(len(Counter(_envs(plain, 4, 4 * s))) < 3 for s in steps)
    assert all(len(Counter(_envs(mixed, 4, 4 * s))) == 3 for s in steps)


def test_the_order_is_seeded_and_restored_from_the_cursor() -> None:
    rows = _rows({"a": 7, "b": 5, "c": 3})
    one = PromptSource(rows, _Tokenizer(), seed=1, interleave_envs=True)
    again = PromptSource(rows, _Tokenizer(), seed=1, interleave_envs=True)
    other = PromptSource(rows, _Tokenizer(), seed=2, interleave_envs=True)
    first = [one.next().prompt_id for _ in range(40)]
    again.cursor = 17  # a resumed run: only the cursor was saved
    assert [again.next().prompt_id for _ in range(23)] == first[17:]
    assert [other.prompt_at(i).prompt_id for i in range(40)] != first


def test_a_single_environment_keeps_the_plain_order() -> None:
    rows = _rows({"math": 9})
    mixed = PromptSource(rows, _Tokenizer(), seed=5, interleave_envs=True)
    plain = PromptSource(rows, _Tokenizer(), seed=5, interleave_envs=False)
    assert mixed.schedule is None
    assert [mixed.prompt_at(i).prompt_id for i in range(20)] == [
        plain.prompt_at(i).prompt_id for i in range(20)
    ]


def test_env_weights_set_the_shares_and_repeat_rows_with_new_ids() -> None:
    rows = _rows({"math": 10, "mcqa": 10})
    source = PromptSource(
        rows, _Tokenizer(), seed=0, interleave_envs=True, env_weights={"math": 3, "mcqa": 1}
    )
    stream = _envs(source, 40)
    assert Counter(stream) == {"math": 30, "mcqa": 10}
    for start in range(0, 40, 4):
        assert Counter(stream[start : start + 4]) == {"math": 3, "mcqa": 1}
    ids = [source.prompt_at(i).prompt_id for i in range(40)]
    assert len(set(ids)) == 40  # math's rows come round three times: @0, @1, @2
    assert sum(i.endswith("@2") for i in ids) == 10


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"math": 1, "code": 1, "mcqa": 1}, r"data\.env_weights\.code: no row"),
        ({"math": 1}, r"data\.env_weights: no weight for mcqa"),
        ({"math": -1, "mcqa": 1}, r"data\.env_weights\.math: must be >= 0"),
        ({"math": 0, "mcqa": 0}, r"at least one weight must be > 0"),
    ],
)
def test_bad_env_weights_name_the_field(weights: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EnvSchedule(["math", "mcqa", "math"], seed=0, shuffle=True, weights=weights)


def test_a_weight_of_zero_leaves_an_environment_out() -> None:
    schedule = EnvSchedule(["a", "b", "a", "b"], seed=0, shuffle=True, weights={"a": 1, "b": 0})
    assert {schedule.locate(i)[0] for i in range(8)} == {0, 2}


def test_env_weights_need_interleaving() -> None:
    with pytest.raises(ValueError, match=r"needs data\.interleave_envs"):
        PromptSource(_rows({"a": 2}), _Tokenizer(), seed=0, env_weights={"a": 1})


def test_held_out_rows_interleave_unweighted_from_the_recipe() -> None:
    recipe = RecipeConfig.model_validate(
        {"data": {"env_weights": {"math": 5, "mcqa": 1}}, "policy": {"model": "x"}}
    )
    rows = _rows({"math": 4, "mcqa": 4})
    train = PromptSource.from_recipe(recipe, rows, _Tokenizer(), shuffle=True)
    val = PromptSource.from_recipe(recipe, rows, _Tokenizer(), shuffle=False, weighted=False)
    assert Counter(_envs(train, 8)) == {"math": 6, "mcqa": 2}  # 1 each, then 6 split 5:1
    assert Counter(_envs(val, 4)) == {"math": 2, "mcqa": 2}


def _group(env: str, rewards: list[float], tokens: int = 3, truncated: bool = False) -> PromptGroup:
    samples = [
        Trajectory(
            prompt_id=f"{env}-p",
            sample_index=i,
            prompt_token_ids=[1, 2],
            token_ids=[5] * tokens,
            generation_logprobs=[-0.1] * tokens,
            truncated=truncated,
            reward=r,
            env=env,
        )
        for i, r in enumerate(rewards)
    ]
    return PromptGroup(prompt_id=f"{env}-p", env=env, samples=samples)


def test_env_metrics_use_nemo_rl_names_and_numbers() -> None:
    groups = [
        _group("math", [1.0, 0.0, 0.0, 1.0], tokens=4),
        _group("math", [1.0, 1.0, 1.0, 1.0], tokens=2, truncated=True),
        _group("instruction_following", [0.5, 1.0, 0.0, 0.5], tokens=6),
    ]
    m = env_metrics(groups)
    assert m["math/reward/mean"] == pytest.approx(0.75)
    assert m["math/reward/min"] == 0.0 and m["math/reward/max"] == 1.0
    assert m["math/reward/median"] == 1.0
    assert m["math/reward/stddev"] == pytest.approx(
        math.sqrt(1.5 / 7)
    )  # Σ(r − 0.75)² = 1.5, n − 1 = 7
    assert m["math/accuracy"] == pytest.approx(0.75)
    assert m["math/gen_tokens_per_sample/mean"] == pytest.approx(3.0)
    assert m["math/truncation_rate"] == pytest.approx(0.5)
    assert m["math/frac_reward_zero_std"] == pytest.approx(0.5)
    assert m["math/num_groups"] == 2 and m["math/num_samples"] == 8
    assert m["instruction_following/reward/mean"] == pytest.approx(0.5)
    assert m["instruction_following/accuracy"] == pytest.approx(0.25)  # only the 1.0
    assert m["instruction_following/num_groups"] == 1


def test_per_env_normalisation_gives_each_environment_unit_scale() -> None:
    # Math advantages spread ±1, instruction following ±0.1 (a graded, narrow reward).
    adv_N = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.1, -0.1, 0.1, -0.1])
    envs = ["math"] * 4 + ["if"] * 4
    out_N = normalize_advantages_per_env(adv_N, envs)
    std = math.sqrt(4 / 3)  # Bessel: Σa² = 4 over n − 1 = 3 (and 0.04 / 3 for "if")
    assert out_N[:4].tolist() == pytest.approx([1 / std, -1 / std] * 2, rel=1e-5)
    assert out_N[4:].tolist() == pytest.approx([1 / std, -1 / std] * 2, rel=1e-4)
    zero = normalize_advantages_per_env(torch.zeros(3), ["a", "a", "b"])
    assert zero.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="one env per sample"):
        normalize_advantages_per_env(adv_N, envs[:3])


def test_prepare_step_normalises_per_env_only_when_asked() -> None:
    groups = [_group("math", [1.0, 0.0, 1.0, 0.0]), _group("if", [0.2, 0.0, 0.2, 0.0])]
    recipe = RecipeConfig.model_validate(
        {"grpo": {"normalize_rewards": False}, "policy": {"model": "x"}}
    )
    off = prepare_step(groups, recipe, 0, 0).batch
    on_recipe = recipe.model_copy(
        update={"grpo": recipe.grpo.model_copy(update={"normalize_advantages_per_env": True})}
    )
    on = prepare_step(groups, on_recipe, 0, 0).batch
    assert off is not None and on is not None
    # Off: instruction following's advantages are a fifth of math's; on: the same scale.
    off_math, off_if = (
        float(off.advantages_N[:4].abs().max()),
        float(off.advantages_N[4:].abs().max()),
    )
    on_math, on_if = float(on.advantages_N[:4].abs().max()), float(on.advantages_N[4:].abs().max())
    assert off_if == pytest.approx(off_math / 5, rel=1e-4)
    assert on_if == pytest.approx(on_math, rel=1e-4)


def test_held_out_details_per_environment() -> None:
    from rlfleet_trainer.validation import _PromptResult, _summarise

    results = [
        _PromptResult("math", 1.0, 0, accuracy=1.0, gen_tokens=4),
        _PromptResult("math", 0.5, 0, accuracy=0.5, gen_tokens=6),
        _PromptResult("if", 0.25, 0, accuracy=0.0, gen_tokens=10),
        _PromptResult("if", None, 2),  # failed: left out
    ]
    v = _summarise(results, fraction=0.5, tag="val")
    assert v.rewards == {"reward": pytest.approx(1.75 / 3), "reward/if": 0.25, "reward/math": 0.75}
    assert v.details == {
        "accuracy": pytest.approx(0.5),
        "if/accuracy": 0.0,
        "if/gen_tokens_per_sample/mean": 10.0,
        "if/num_prompts": 1.0,
        "math/accuracy": 0.75,
        "math/gen_tokens_per_sample/mean": 5.0,
        "math/num_prompts": 2.0,
    }
    assert v.metrics["math/accuracy"] == 0.75 and v.metrics["failed_prompts"] == 1.0
