"""Reasoning control reaches the trainer: chat-template switches from the recipe and the
row, a row's cap on generated tokens in the Generate request, and the low-effort schedule
(deterministic from the seed and the prompt index, so a resume issues the same prompts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rlfleet_contracts.reasoning import LowEffortConfig
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.reward_client import RewardClient
from rlfleet_contracts.rows import DataError
from rlfleet_core.config import ConfigError, load_config
from rlfleet_trainer.clients import RolloutClient
from rlfleet_trainer.collector import Collector
from rlfleet_trainer.data import PromptSource
from rlfleet_trainer.reasoning import LowEffortSchedule
from rlfleet_trainer.testing import serve_doubles
from transformers import AutoTokenizer

# A template that reads the switches the way Nemotron 3's does: thinking on unless
# enable_thinking is false (then an empty think block is prefilled), low_effort off unless
# set. The bundled tiny and SmolLM2 templates read neither.
THINKING_TEMPLATE = (
    "{%- set enable_thinking = enable_thinking if enable_thinking is defined else true -%}"
    "{%- set low_effort = low_effort if low_effort is defined else false -%}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{% if not enable_thinking %}<think></think>"
    "{%- elif low_effort %}[low effort]<think>"
    "{%- else %}<think>{%- endif -%}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = THINKING_TEMPLATE
    return tok


def row(i: int, env: str = "math", **params: Any) -> dict[str, Any]:
    return {
        "id": f"{env}{i}",
        "env": env,
        "expected_answer": "4",
        "responses_create_params": {"input": [{"role": "user", "content": "2+2?"}], **params},
    }


def rendered(tokenizer: Any, source: PromptSource, index: int) -> str:
    text: str = tokenizer.decode(list(source.prompt_at(index).token_ids))
    return text.split("<|im_start|>assistant\n", 1)[1]


def test_template_switches_come_from_the_recipe_and_the_row(tokenizer: Any) -> None:
    rows = [
        row(0),
        row(1, chat_template_kwargs={"enable_thinking": False}),
        row(2, chat_template_kwargs={"low_effort": True}),
    ]
    plain = PromptSource(rows, tokenizer, seed=0, shuffle=False)
    assert [rendered(tokenizer, plain, i) for i in range(3)] == [
        "<think>",
        "<think></think>",
        "[low effort]<think>",
    ]
    # The recipe's default (reasoning off) applies where the row says nothing.
    off = PromptSource(
        rows, tokenizer, seed=0, shuffle=False, template_kwargs={"enable_thinking": False}
    )
    assert [rendered(tokenizer, off, i) for i in range(3)] == [
        "<think></think>",
        "<think></think>",
        "<think></think>",
    ]
    on = PromptSource(
        [row(0, chat_template_kwargs={"enable_thinking": True})],
        tokenizer,
        seed=0,
        template_kwargs={"enable_thinking": False},
    )
    assert rendered(tokenizer, on, 0) == "<think>"  # the row wins over the recipe
    # NeMo-Gym's per-sample switches (metadata, a JSON string) win over the row's own.
    meta = row(
        0,
        chat_template_kwargs={"enable_thinking": True},
        metadata={"chat_template_kwargs": '{"enable_thinking": false}'},
    )
    assert rendered(tokenizer, PromptSource([meta], tokenizer, seed=0), 0) == "<think></think>"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"chat_template_kwargs": "on"}, r"row math0: .*chat_template_kwargs: expected an object"),
        ({"chat_template_kwargs": {"tokenize": False}}, r"chat_template_kwargs\.tokenize: is an"),
        (
            {"metadata": {"chat_template_kwargs": "{oops"}},
            r"metadata\.chat_template_kwargs: invalid",
        ),
        (
            {"metadata": {"chat_template_kwargs": "[1]"}},
            r"metadata\.chat_template_kwargs: expected",
        ),
        ({"max_output_tokens": 0}, r"max_output_tokens: expected a positive integer, got 0"),
        ({"max_tokens": "64"}, r"max_tokens: expected a positive integer, got '64'"),
        ({"max_completion_tokens": True}, r"max_completion_tokens: expected a positive"),
    ],
)
def test_bad_row_controls_are_refused_at_start_naming_the_field(
    tokenizer: Any, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataError, match=message):
        PromptSource([row(0, **params)], tokenizer, seed=0)


def test_row_cap_is_the_least_of_its_spellings(tokenizer: Any) -> None:
    rows = [row(0, max_output_tokens=9), row(1, max_output_tokens=9, max_tokens=5), row(2)]
    source = PromptSource(rows, tokenizer, seed=0, shuffle=False)
    assert [source.prompt_at(i).max_tokens for i in range(3)] == [9, 5, None]


def test_recipe_refuses_bad_reasoning_settings() -> None:
    with pytest.raises(ConfigError, match=r"^reasoning\.chat_template_kwargs: 'tokenize' is an"):
        load_config(RecipeConfig, overrides=["reasoning.chat_template_kwargs={tokenize: true}"])
    with pytest.raises(
        ConfigError,
        match=r"^reasoning\.low_effort: phases: from_step values \[5, 2\] must increase",
    ):
        load_config(
            RecipeConfig,
            overrides=[
                "reasoning.low_effort.phases=[{from_step: 5, fraction: 0.1}, "
                "{from_step: 2, fraction: 0.1}]"
            ],
        )
    with pytest.raises(ConfigError, match=r"^reasoning\.low_effort\.phases\.0\.fraction: input"):
        load_config(RecipeConfig, overrides=["reasoning.low_effort.phases=[{fraction: 1.5}]"])
    with pytest.raises(ConfigError, match=r"phases\.0\.env: unknown key; did you mean .*\.envs\?"):
        load_config(
            RecipeConfig, overrides=["reasoning.low_effort.phases=[{fraction: 0.1, env: []}]"]
        )


def mixed_rows() -> list[dict[str, Any]]:
    """40% math, 20% mcqa, 20% code, 20% other, in a fixed interleaving."""
    envs = ["math", "mcqa", "math", "code", "other"]
    return [row(i, envs[i % 5]) for i in range(500)]


def schedule_recipe(*overrides: str) -> RecipeConfig:
    return load_config(
        RecipeConfig,
        overrides=[
            "grpo.num_prompts_per_step=100",
            "grpo.seed=7",
            "reasoning.low_effort.token_budget=64",
            "reasoning.low_effort.phases=[{from_step: 1, fraction: 0.1, envs: [math, mcqa, code]},"
            " {from_step: 11, fraction: 0.05, envs: [math, mcqa]}]",
            *overrides,
        ],
    )


def test_low_effort_schedule_follows_the_phases(tokenizer: Any) -> None:
    recipe = schedule_recipe()
    source = PromptSource.from_recipe(recipe, mixed_rows(), tokenizer, True, training=True)
    early = [source.next() for _ in range(1000)]  # steps 1-10
    late = [source.next() for _ in range(1000)]  # steps 11-20
    low_early = [p for p in early if p.env == "low_effort"]
    low_late = [p for p in late if p.env == "low_effort"]
    # Expected shares 10% and 5% of all prompts (binomial, sd ≈ 0.95% and 0.7%); the
    # draws are fixed by the seed, so these bounds hold on every run.
    assert 0.07 <= len(low_early) / 1000 <= 0.13
    assert 0.03 <= len(low_late) / 1000 <= 0.07
    inner = lambda ps: {json.loads(p.row_json)["inner_env"] for p in ps}  # noqa: E731
    assert inner(low_early) == {"math", "mcqa", "code"}
    assert inner(low_late) == {"math", "mcqa"}
    converted = json.loads(low_early[0].row_json)
    assert converted["token_budget"] == 64 and converted["expected_answer"] == "4"
    assert converted["responses_create_params"]["chat_template_kwargs"] == {
        "enable_thinking": True,
        "low_effort": True,
    }
    text = tokenizer.decode(list(low_early[0].token_ids))
    assert text.endswith("[low effort]<think>")
    # Held-out prompts are never converted.
    held_out = PromptSource.from_recipe(recipe, mixed_rows(), tokenizer, False)
    assert all(held_out.prompt_at(i).env != "low_effort" for i in range(500))


def test_low_effort_schedule_is_the_same_after_a_resume(tokenizer: Any) -> None:
    recipe = schedule_recipe()
    straight = PromptSource.from_recipe(recipe, mixed_rows(), tokenizer, True, training=True)
    issued = [straight.next() for _ in range(1200)]
    resumed = PromptSource.from_recipe(recipe, mixed_rows(), tokenizer, True, training=True)
    resumed.cursor = 700  # what a checkpoint restores
    again = [resumed.next() for _ in range(500)]
    assert again == issued[700:]
    assert [resumed.prompt_at(i) for i in (3, 250, 1101)] == [issued[i] for i in (3, 250, 1101)]
    # Another seed draws other prompts.
    other = PromptSource.from_recipe(
        schedule_recipe("grpo.seed=8"), mixed_rows(), tokenizer, True, training=True
    )
    other_low = {p.index for p in (other.next() for _ in range(1200)) if p.env == "low_effort"}
    assert other_low != {p.index for p in issued if p.env == "low_effort"}


def test_schedule_refuses_envs_it_cannot_serve() -> None:
    rows = mixed_rows()
    config = LowEffortConfig.model_validate({"phases": [{"fraction": 0.1, "envs": ["stem"]}]})
    with pytest.raises(ValueError, match=r"phases\[0\]\.envs \['stem'\]: no training row"):
        LowEffortSchedule.build(config, rows, "math", 0, 10)
    config = LowEffortConfig.model_validate({"phases": [{"fraction": 0.3, "envs": ["code"]}]})
    with pytest.raises(ValueError, match=r"phases\[0\]\.fraction \(0\.3\) exceeds .* \(0\.2000\)"):
        LowEffortSchedule.build(config, rows, "math", 0, 10)


async def test_row_cap_reaches_the_generate_request(tiny_model: Path, tokenizer: Any) -> None:
    rows = [row(0, "letters", max_output_tokens=3), row(1, "letters")]
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, rollout, _):
        recipe = load_config(
            RecipeConfig,
            overrides=[
                "generation.max_new_tokens=12",
                "grpo.num_prompts_per_step=2",
                "grpo.num_generations_per_prompt=2",
                "data.shuffle=false",
            ],
        )
        source = PromptSource.from_recipe(recipe, rows, tokenizer, False, training=True)
        rollout_client = RolloutClient(rollout_target, 60.0)
        reward_client = RewardClient(reward_target, 60.0)
        collector = Collector.from_recipe(
            recipe, source, rollout_client, reward_client, tokenizer.decode
        )
        try:
            await collector.wait_for_groups(2, current_version=0, limit=2)
            groups = {g.prompt_id: g for g in collector.take(2)}
        finally:
            await rollout_client.close()
            await reward_client.close()
    assert rollout.max_tokens == {"letters0@0": 3, "letters1@0": 12}
    assert all(len(s.token_ids) <= 3 for s in groups["letters0@0"].samples)


def test_low_effort_form_overrides_the_rows_own_switches(tokenizer: Any) -> None:
    from rlfleet_contracts.reasoning import LOW_EFFORT_TEMPLATE_KWARGS, to_low_effort

    off = row(0, metadata={"chat_template_kwargs": '{"enable_thinking": false}', "k": 1})
    low = to_low_effort(off, 32, dict(LOW_EFFORT_TEMPLATE_KWARGS))
    assert low["responses_create_params"]["metadata"] == {"k": 1}
    assert (low["env"], low["inner_env"], low["token_budget"]) == ("low_effort", "math", 32)
    assert rendered(tokenizer, PromptSource([low], tokenizer, seed=0), 0) == "[low effort]<think>"
    assert to_low_effort(low, 99, {}) is low  # already low effort: unchanged


async def test_a_resumed_run_issues_the_same_low_effort_prompts(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Sync GRPO, 4 steps straight vs 2 steps + resume to 4: the same prompts are scored
    as low effort, and the ledger still accounts for every prompt exactly once."""
    from rlfleet_trainer.context import build_context
    from rlfleet_trainer.ledger import Ledger, verify_ledger
    from rlfleet_trainer.run import run_stage
    from rlfleet_trainer.testing import letter_rows

    def recipe(rollout: str, reward: str, steps: int) -> RecipeConfig:
        return load_config(
            RecipeConfig,
            overrides=[
                f"policy.model={tiny_model}",
                "policy.max_total_sequence_length=128",
                "policy.train_micro_batch_size=6",
                "generation.max_new_tokens=8",
                "grpo.num_prompts_per_step=3",
                "grpo.num_generations_per_prompt=2",
                "grpo.max_trajectory_age_steps=0",
                f"grpo.max_num_steps={steps}",
                "checkpoint.save_every_steps=1",
                "checkpoint.export_hf=false",
                "reasoning.low_effort.phases=[{fraction: 0.5}]",
                f"services.rollout={rollout}",
                f"services.reward={reward}",
            ],
        )

    low: list[set[str]] = []
    for split in (False, True):
        run_dir = tmp_path / ("split" if split else "straight")
        async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, reward):
            if split:
                await run_stage(
                    recipe(rollout_target, reward_target, 2), run_dir, rows=letter_rows()
                )
            final = recipe(rollout_target, reward_target, 4)
            state = await run_stage(final, run_dir, rows=letter_rows(), resume=split)
        low.append({rid for rid, env in reward.envs.items() if env == "low_effort"})
        ctx = build_context(final, tmp_path / "probe", rows=letter_rows())
        ctx.source.cursor = state.data_cursor
        entries = Ledger(run_dir / "ledger.jsonl").entries()
        assert verify_ledger(entries, ctx.source.issued_ids())["trained"] == 12
    assert low[0] == low[1] and 0 < len(low[0]) < 12
