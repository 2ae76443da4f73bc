"""The multi-turn rollout loop over real gRPC: a scripted rollout double and the episode
double (a key-value tool world with a goal state)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from rlfleet_contracts.reward_client import RewardClient, RewardFailed
from rlfleet_core.calls import CallRetry
from rlfleet_trainer.agent.episodes import EpisodeClient
from rlfleet_trainer.agent.rollout import AgentLimits, AgentRollout
from rlfleet_trainer.agent.tool_format import HermesFormat
from rlfleet_trainer.batch import Trajectory, build_train_batch
from rlfleet_trainer.clients import RolloutClient, Sampling
from rlfleet_trainer.data import Prompt
from rlfleet_trainer.testing import serve_servicer
from rlfleet_trainer.testing_agent import DoubleEpisodes, ScriptedRollout, tool_call

SAMPLING = Sampling(temperature=1.0, top_p=1.0, top_k=0, max_tokens=200)


REACH_GOAL = [  # three tool calls, then the final answer: a = 3, b = "x"
    tool_call("set_value", key="a", value=1),
    tool_call("add", key="a", amount=2),
    tool_call("set_value", key="b", value="x"),
    "Done: a is 3.",
]
MISS_GOAL = [tool_call("set_value", key="a", value=7), "Done."]


def kv_prompt(goal: dict[str, Any] | None = None) -> Prompt:
    row = {
        "id": "kv0",
        "env": "kv",
        "responses_create_params": {"input": [{"role": "user", "content": "make a=3, b=x"}]},
        "goal": goal if goal is not None else {"a": 3, "b": "x"},
    }
    return Prompt(prompt_id="kv0@0", index=0, env="kv", row_json=json.dumps(row), token_ids=(1,))


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


class World:
    def __init__(self, agent: AgentRollout, rollout: ScriptedRollout, episodes: DoubleEpisodes):
        self.agent, self.rollout, self.episodes = agent, rollout, episodes


@contextlib.asynccontextmanager
async def world(tokenizer: Any, scripts: list[list[str]], **limits: Any) -> AsyncIterator[World]:
    scripted = ScriptedRollout(tokenizer, scripts, "<|im_end|>")
    episodes = DoubleEpisodes()  # type: ignore[abstract]
    async with (
        serve_servicer(scripted) as rollout_target,
        serve_servicer(episodes) as reward_target,
    ):
        rollout = RolloutClient(rollout_target, 30.0, CallRetry(attempts=1))
        reward = RewardClient(reward_target, 30.0, CallRetry(attempts=1))
        agent = AgentRollout(
            rollout,
            EpisodeClient(reward, 10.0),
            tokenizer,
            HermesFormat(),
            AgentLimits(
                max_turns=limits.get("max_turns", 8),
                max_tokens=limits.get("max_tokens", 4096),
                max_time_s=limits.get("max_time_s", 60.0),
            ),
            envs={"kv"},
        )
        try:
            yield World(agent, scripted, episodes)
        finally:
            await rollout.close()
            await reward.close()


def check_alignment(traj: Trajectory, tokenizer: Any, script: list[str]) -> None:
    """The mask is 1 exactly on the scripted model tokens; each has its own logprob."""
    assert traj.loss_mask is not None
    model_ids = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    expected: list[int] = []
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for response in script:
        expected += [*tokenizer.encode(response, add_special_tokens=False), stop]
    assert model_ids == expected
    for token, mask, logprob in zip(
        traj.token_ids, traj.loss_mask, traj.generation_logprobs, strict=True
    ):
        assert logprob == (pytest.approx(ScriptedRollout.token_logprob(token)) if mask else 0.0)
    # The same alignment in the train batch: position p predicts token p + 1.
    batch = build_train_batch([traj], torch.ones(1))
    predicted = batch.input_ids_NL[0, 1:]
    on = batch.mask_NT[0] > 0
    assert predicted[on].tolist() == expected
    lp = torch.tensor([ScriptedRollout.token_logprob(int(t)) for t in predicted[on]])
    assert torch.allclose(batch.generation_logprobs_NT[0][on], lp)
    assert int(on.sum()) == len(expected)


async def test_three_tool_calls_reach_the_goal_and_only_model_tokens_get_loss(
    tokenizer: Any,
) -> None:
    async with world(tokenizer, [REACH_GOAL, MISS_GOAL]) as w:
        w.rollout.bump_version_each_call = True  # a weight update between every two turns
        group = await w.agent.group(kv_prompt(), 2, SAMPLING)
    reach, miss = group
    assert (reach.reward, miss.reward) == (1.0, 0.0)
    assert not reach.truncated and not miss.truncated
    check_alignment(reach, tokenizer, REACH_GOAL)
    check_alignment(miss, tokenizer, MISS_GOAL)
    # The conversation is exactly the chat template's, tool results included.
    text = tokenizer.decode(reach.prompt_token_ids + reach.token_ids, skip_special_tokens=False)
    assert text.count("<|im_start|>tool\nok<|im_end|>") == 2
    assert "<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n" in text
    assert text.endswith("Done: a is 3.<|im_end|>")
    assert "# Tools" in text  # the tiny template ignores tools=: described in the system turn
    # Four turns of one trajectory under four versions: its age is its oldest turn's.
    assert len(reach.turn_weight_versions) == 4
    assert reach.weight_version == min(reach.turn_weight_versions)
    assert sorted(reach.turn_weight_versions) == reach.turn_weight_versions
    assert sorted(r.text for r in w.episodes.responses.values()) == ["Done.", "Done: a is 3."]
    calls = sorted([name for name, _ in e.calls] for e in w.episodes.closed.values())
    assert calls == [["set_value"], ["set_value", "add", "set_value"]]
    assert len(w.episodes.scored) == 2 and not w.episodes.abandoned and not w.episodes.episodes


async def test_a_malformed_call_is_answered_with_an_error_the_model_sees(tokenizer: Any) -> None:
    script = ["<tool_call>{oops</tool_call>", tool_call("set_value", key="a", value=3), "All set."]
    async with world(tokenizer, [script]) as w:
        [traj] = await w.agent.group(kv_prompt({"a": 3}), 1, SAMPLING)
        [calls] = [e.calls for e in w.episodes.closed.values()]
    text = tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert "<|im_start|>tool\nError: the tool call is not valid JSON" in text
    assert calls == [("set_value", '{"key": "a", "value": 3}')]  # the bad call never ran
    assert traj.reward == 1.0
    check_alignment(traj, tokenizer, script)
    # The trainer's malformed call plus the episode's own counts (agent.calls).
    assert {k: n for k, n in traj.tool_calls.items() if n} == {"malformed": 1, "ok": 1}


async def test_a_call_cut_by_the_token_limit_counts_as_malformed(tokenizer: Any) -> None:
    """A turn that ends inside `<tool_call>` (max_tokens) runs nothing, and the unclosed
    call counts as malformed: the trajectory holds a hallucinated call."""
    script = [tool_call("set_value", key="a", value=3)]
    async with world(tokenizer, [script]) as w:
        [traj] = await w.agent.group(kv_prompt({"a": 3}), 1, replace(SAMPLING, max_tokens=16))
    assert traj.truncated and traj.reward == 0.0
    assert {k: n for k, n in traj.tool_calls.items() if n} == {"malformed": 1}


async def test_the_environment_can_end_the_episode(tokenizer: Any) -> None:
    script = [tool_call("set_value", key="a", value=3) + tool_call("submit"), "never generated"]
    async with world(tokenizer, [script]) as w:
        [traj] = await w.agent.group(kv_prompt({"a": 3}), 1, SAMPLING)
    assert traj.reward == 1.0 and not traj.truncated
    assert len(traj.turn_weight_versions) == 1 and all(traj.loss_mask or [0])


@pytest.mark.parametrize(
    ("limits", "turns"),
    [
        ({"max_turns": 2}, 2),  # still calling tools on its last turn
        ({"max_tokens": 1000}, None),  # outgrows its token budget (the prompt is 861)
    ],
)
async def test_limits_end_the_trajectory_truncated_and_still_scored(
    tokenizer: Any, limits: dict[str, Any], turns: int | None
) -> None:
    async with world(tokenizer, [REACH_GOAL], **limits) as w:
        [traj] = await w.agent.group(kv_prompt(), 1, SAMPLING)
    assert traj.truncated and traj.reward == 0.0
    assert len(w.episodes.scored) == 1 and not w.episodes.abandoned
    if turns is not None:
        assert len(traj.turn_weight_versions) == turns
    else:
        assert 0 < len(traj.turn_weight_versions) < len(REACH_GOAL)
    assert len(traj.prompt_token_ids) + len(traj.token_ids) <= limits.get("max_tokens", 4096)
    # overlong filtering drops the whole trajectory's loss
    batch = build_train_batch([traj], torch.zeros(1))
    assert float(batch.mask_NT.sum()) == 0.0


async def test_wall_time_ends_the_trajectory_truncated(tokenizer: Any) -> None:
    async with world(tokenizer, [REACH_GOAL], max_time_s=0.3) as w:
        w.rollout.delay_s = 5.0
        [traj] = await w.agent.group(kv_prompt(), 1, SAMPLING)
    assert traj.truncated and traj.token_ids == []
    assert len(w.episodes.scored) == 1 and not w.episodes.episodes


async def test_a_failed_step_fails_the_group_and_abandons_every_episode(tokenizer: Any) -> None:
    async with world(tokenizer, [REACH_GOAL]) as w:
        w.episodes.step_faults = [grpc.StatusCode.INTERNAL]
        with pytest.raises(RewardFailed, match="Step ep"):
            await w.agent.group(kv_prompt(), 3, SAMPLING)
    # None left open: each one opened (a cancelled sibling may not have got that far) was
    # abandoned, none scored.
    assert not w.episodes.episodes and not w.episodes.scored
    assert sorted(w.episodes.abandoned) == sorted(w.episodes.closed) != []


async def test_a_multi_turn_group_trains_on_whole_trajectories(tokenizer: Any) -> None:
    """prepare_step: overlong filtering zeroes the truncated trajectory as a whole; the
    other keeps loss on exactly its model tokens; the buffer's checkpoint keeps the mask."""
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_trainer.replay import PromptGroup
    from rlfleet_trainer.steps import prepare_step

    async with world(tokenizer, [REACH_GOAL, REACH_GOAL], max_turns=2) as w:
        w.agent.limits = AgentLimits(max_turns=4, max_tokens=4096, max_time_s=60.0)
        done = await w.agent.group(kv_prompt(), 1, SAMPLING)
        w.agent.limits = AgentLimits(max_turns=2, max_tokens=4096, max_time_s=60.0)
        cut = await w.agent.group(kv_prompt(), 1, SAMPLING)
    cut[0].sample_index = 1
    group = PromptGroup("kv0@0", "kv", [*done, *cut])
    restored = PromptGroup.from_json(json.loads(json.dumps(group.to_json())))
    assert restored.samples[0].loss_mask == done[0].loss_mask
    recipe = RecipeConfig.model_validate({"grpo": {"overlong_filtering": True}})
    step = prepare_step([restored], recipe, current_version=0, pad_token_id=0)
    assert step.batch is not None
    model_tokens = sum(done[0].loss_mask or [])
    assert step.batch.mask_NT[0].sum() == model_tokens
    assert step.batch.mask_NT[1].sum() == 0  # truncated: filtered whole
    assert step.metrics["truncated_fraction"] == 0.5
    # lengths count the model's tokens, not the tool results and headers between them
    assert step.metrics["response_length/max"] == model_tokens < len(done[0].token_ids)
    assert (
        step.metrics["kv/gen_tokens_per_sample/mean"]
        == (model_tokens + sum(cut[0].loss_mask or [])) / 2
    )
    # both called tools; the cut one ran its 2 turns, the other one more
    assert step.metrics["multi_turn/tool_call_rate"] == 1.0
    turns = (len(done[0].turn_weight_versions) + 2) / 2
    assert len(done[0].turn_weight_versions) > 2 and step.metrics["multi_turn/turns/mean"] == turns


def test_multi_turn_metrics_count_calls_and_skip_single_turn_samples() -> None:
    from rlfleet_trainer.steps import multi_turn_metrics

    def sample(mask: list[int] | None, turns: int) -> Trajectory:
        ids = list(range(len(mask or [1])))
        return Trajectory(
            "p",
            0,
            [1],
            ids,
            [0.0] * len(ids),
            False,
            loss_mask=mask,
            turn_weight_versions=[0] * turns,
        )

    answered_only = sample([1, 1], 1)
    called = sample([1, 0, 0, 1], 2)
    assert multi_turn_metrics([sample(None, 1)]) == {}
    assert multi_turn_metrics([answered_only, called, sample(None, 1)]) == {
        "multi_turn/turns/mean": 1.5,
        "multi_turn/tool_call_rate": 0.5,
    }


async def test_the_collector_runs_multi_turn_envs_through_the_agent(tokenizer: Any) -> None:
    """Rows of `multi_turn.envs` become multi-turn groups scored by CloseEpisode; the other
    rows stay single-turn (Generate n=G, ScoreGroup) in the same run."""
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_trainer.collector import Collector
    from rlfleet_trainer.data import PromptSource
    from rlfleet_trainer.testing import letter_rows

    recipe = RecipeConfig.model_validate(
        {
            "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2},
            "multi_turn": {"envs": ["kv"], "max_turns": 6},
            "policy": {"max_total_sequence_length": 4096},
        }
    )
    rows = [json.loads(kv_prompt().row_json), *letter_rows(1)]
    source = PromptSource(rows, tokenizer, seed=0, shuffle=False, default_env="letters")
    async with world(tokenizer, [REACH_GOAL, MISS_GOAL]) as w:
        collector = Collector.from_recipe(
            recipe,
            source,
            w.agent.rollout,
            w.agent.episodes.reward,
            lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            tokenizer,
        )
        await collector.wait_for_groups(2, current_version=0, limit=2)
        groups = {g.env: g for g in collector.take(2)}
        await collector.cancel()
    kv, letters = groups["kv"], groups["letters"]
    assert kv.rewards == [1.0, 0.0]
    check_alignment(kv.samples[0], tokenizer, REACH_GOAL)
    assert all(s.loss_mask is None for s in letters.samples)
    assert letters.samples[0].token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert collector.stats.generated_tokens > 0 and len(w.episodes.scored) == 2
    with pytest.raises(ValueError, match=r"multi_turn\.envs is set but no tokenizer"):
        Collector.from_recipe(recipe, source, w.agent.rollout, w.agent.episodes.reward, str)


async def test_a_prompt_with_no_room_left_fails_loudly(tokenizer: Any) -> None:
    from rlfleet_trainer.clients import GenerationFailed

    async with world(tokenizer, [REACH_GOAL], max_tokens=500) as w:  # the prompt is 861
        with pytest.raises(GenerationFailed, match=r"no room under multi_turn\.max_trajectory"):
            await w.agent.group(kv_prompt(), 2, SAMPLING)
    assert not w.episodes.episodes and not w.episodes.scored
    assert sorted(w.episodes.abandoned) == sorted(w.episodes.closed) != []
    assert not w.rollout.requests


async def test_the_lag_rule_judges_a_trajectory_by_its_oldest_turn(tokenizer: Any) -> None:
    """Turns generated under versions 0, 1, 2, 3: at version 3 with max age 1 the group is
    stale (its oldest turn is 3 behind), though its newest turn is current."""
    from rlfleet_trainer.replay import PromptGroup, ReplayBuffer

    async with world(tokenizer, [REACH_GOAL]) as w:
        w.rollout.bump_version_each_call = True
        [traj] = await w.agent.group(kv_prompt(), 1, SAMPLING)
    assert traj.turn_weight_versions == [0, 1, 2, 3] and traj.weight_version == 0
    buffer = ReplayBuffer(max_age_steps=1)
    buffer.add(PromptGroup("kv0@0", "kv", [traj]))
    assert buffer.evict_stale(current_version=1) == []
    assert len(buffer.evict_stale(current_version=3)) == 1


async def test_a_call_inside_the_reasoning_is_not_made(tokenizer: Any) -> None:
    thinking = f"<think>I could {tool_call('set_value', key='a', value=3)}</think>No tools needed."
    async with world(tokenizer, [[thinking]]) as w:
        [traj] = await w.agent.group(kv_prompt({}), 1, SAMPLING)
    [episode] = w.episodes.closed.values()
    [response] = w.episodes.responses.values()
    assert episode.calls == [] and traj.reward == 1.0  # the goal {} is the untouched store
    assert response.text == "No tools needed." and response.reasoning_text.startswith("I could")
    assert len(traj.turn_weight_versions) == 1
