"""Cross-service: reasoning control from the recipe and the rows reaches generation and the
reward. The trainer's collector issues prompts on the schedule of
`reasoning.low_effort`, asks the rollout (test double, real gRPC) for at most each row's
`max_output_tokens`, and the real reward gateway (a subprocess) scores the low-effort
prompts by correctness and the generated token count the trainer sends.

The decoded text is fixed to the right answer so that the reward depends on length only:
reward = 1 − λ·min(1, n/B) for a sample of n generated tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support import start_service, stop_service

pytest.importorskip("rlfleet_reward", reason="the reward service package is not installed")


@pytest.fixture(scope="module")
def reward_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("logs") / "reward.log"
    process, target = start_service(
        "rlfleet_reward",
        ["environments=[math,low_effort]", "pool.workers=1"],
        log,
        env={"OMP_NUM_THREADS": "1"},
    )
    try:
        yield target
    finally:
        stop_service(process)


async def test_low_effort_prompts_are_scored_by_generated_tokens(reward_target: str) -> None:
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_contracts.reward_client import RewardClient
    from rlfleet_core.config import load_config
    from rlfleet_core.models import resolve_model
    from rlfleet_trainer.clients import RolloutClient
    from rlfleet_trainer.collector import Collector
    from rlfleet_trainer.data import PromptSource
    from rlfleet_trainer.testing import serve_doubles
    from transformers import AutoTokenizer

    model = resolve_model("tiny")
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [
        {
            "id": f"q{i}",
            "env": "math",
            "expected_answer": "4",
            "responses_create_params": {
                "input": [{"role": "user", "content": f"2+2? ({i})"}],
                **({"max_output_tokens": 4} if i % 2 else {}),
            },
        }
        for i in range(4)
    ]
    recipe = load_config(
        RecipeConfig,
        overrides=[
            "generation.max_new_tokens=12",
            "grpo.num_prompts_per_step=4",
            "grpo.num_generations_per_prompt=3",
            "data.shuffle=false",
            "reasoning.low_effort.token_budget=24",
            "reasoning.low_effort.length_penalty=0.5",
            "reasoning.low_effort.phases=[{fraction: 1.0, envs: [math]}]",
        ],
    )
    source = PromptSource.from_recipe(recipe, rows, tokenizer, False, training=True)
    async with serve_doubles(model) as (rollout_target, _, rollout, _):
        rollout_client = RolloutClient(rollout_target, 60.0)
        reward_client = RewardClient(reward_target, 60.0)
        collector = Collector.from_recipe(
            recipe, source, rollout_client, reward_client, lambda ids: r"\boxed{4}"
        )
        try:
            await collector.wait_for_groups(4, current_version=0, limit=4)
            groups = collector.take(4)
        finally:
            await rollout_client.close()
            await reward_client.close()
    assert rollout.max_tokens == {"q0@0": 12, "q1@0": 4, "q2@0": 12, "q3@0": 4}
    assert sorted(g.env for g in groups) == ["low_effort"] * 4
    lengths = []
    for group in groups:
        cap = 4 if group.prompt_id in ("q1@0", "q3@0") else 12
        for sample in group.samples:
            n = len(sample.token_ids)
            assert 1 <= n <= cap
            assert sample.reward == pytest.approx(1 - 0.5 * min(1.0, n / 24), abs=1e-9)
            lengths.append(n)
    # The capped prompts' shorter answers earn more.
    assert min(lengths) <= 4 < max(lengths)
    row = json.loads(source.prompt_at(0).row_json)
    assert row["inner_env"] == "math" and row["token_budget"] == 24
