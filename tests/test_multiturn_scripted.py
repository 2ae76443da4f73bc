"""Multi-turn through the REAL rollout service: `engine=scripted` (test-only) replays a
policy that makes three tool calls and answers; the trainer's agent loop drives it over
gRPC against the episode double (a key-value tool world with a goal state). The mask
covers exactly the model's tokens and the reward is the goal state's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from rlfleet_core.client import check_health
from support import spawn_bound

pytest.importorskip("rlfleet_rollout", reason="the rollout service package is not installed")

from rlfleet_contracts.reward_client import RewardClient
from rlfleet_core.calls import CallRetry
from rlfleet_trainer.agent.episodes import EpisodeClient
from rlfleet_trainer.agent.rollout import AgentLimits, AgentRollout
from rlfleet_trainer.agent.tool_format import HermesFormat
from rlfleet_trainer.batch import build_train_batch
from rlfleet_trainer.clients import RolloutClient, Sampling
from rlfleet_trainer.data import Prompt
from rlfleet_trainer.testing import serve_servicer
from rlfleet_trainer.testing_agent import DoubleEpisodes


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


SCRIPT = [
    call("set_value", key="a", value=1),
    call("add", key="a", amount=2),
    call("set_value", key="b", value="x"),
    "Done: a is 3 and b is x.",
]


def _serving(target: str) -> bool:
    try:
        return check_health(target, timeout_s=2.0) == "SERVING"
    except Exception:  # still starting: the port may not answer yet
        return False


@contextmanager
def scripted_rollout_service(folder: Path, turns: list[str]) -> Iterator[str]:
    """The real rollout service replaying `turns` (engine=scripted); yields its target."""
    from rlfleet_core.models import resolve_model

    script = folder / "script.jsonl"
    script.write_text("".join(json.dumps({"text": t}) + "\n" for t in turns))
    log = folder / "rollout.log"
    process, ports = spawn_bound(
        [
            sys.executable,
            "-m",
            "rlfleet_rollout",
            "engine=scripted",
            f"script_path={script}",
            f"model={resolve_model('tiny')}",
            "engine_config.max_model_len=4096",  # the tools' description alone is ~860 tokens
        ],
        log.with_suffix(".ports.json"),
        timeout_s=240,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
    )
    target = f"127.0.0.1:{ports.grpc}"
    try:
        deadline = time.monotonic() + 240
        while not _serving(target):
            assert process.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
        yield target
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="module")
def scripted_rollout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with scripted_rollout_service(tmp_path_factory.mktemp("scripted"), SCRIPT) as target:
        yield target


def kv_prompt(goal: dict[str, Any]) -> Prompt:
    row = {
        "id": "kv",
        "env": "kv",
        "responses_create_params": {"input": [{"role": "user", "content": "set a=3, b=x"}]},
        "goal": goal,
    }
    return Prompt(prompt_id="kv@0", index=0, env="kv", row_json=json.dumps(row), token_ids=(1,))


@pytest.mark.parametrize(("goal", "reward"), [({"a": 3, "b": "x"}, 1.0), ({"a": 4}, 0.0)])
async def test_three_tool_calls_through_the_real_rollout_service(
    scripted_rollout: str, goal: dict[str, Any], reward: float
) -> None:
    from rlfleet_core.models import resolve_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    episodes = DoubleEpisodes()  # type: ignore[abstract]
    async with serve_servicer(episodes) as reward_target:
        rollout = RolloutClient(scripted_rollout, 30.0, CallRetry(attempts=1))
        rewards = RewardClient(reward_target, 30.0, CallRetry(attempts=1))
        agent = AgentRollout(
            rollout,
            EpisodeClient(rewards, 10.0),
            tokenizer,
            HermesFormat(),
            AgentLimits(max_turns=8, max_tokens=4096, max_time_s=120.0),
            envs={"kv"},
        )
        try:
            sampling = Sampling(temperature=1.0, top_p=1.0, top_k=0, max_tokens=200)
            group = await agent.group(kv_prompt(goal), 2, sampling)
        finally:
            await rollout.close()
            await rewards.close()
    assert [(t.truncated, t.reward) for t in group] == [(False, reward)] * 2
    assert len(episodes.scored) == 2 and not episodes.abandoned and not episodes.episodes
    for episode in episodes.closed.values():
        assert [name for name, _ in episode.calls] == ["set_value", "add", "set_value"]
        assert episode.store == {"a": 3, "b": "x"}
    eos = tokenizer.eos_token_id
    expected = [t for turn in SCRIPT for t in [*tokenizer.encode(turn), eos]]
    for traj in group:
        assert not traj.truncated and traj.loss_mask is not None
        assert len(traj.turn_weight_versions) == len(SCRIPT)
        model = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
        assert model == expected  # the mask covers exactly the model's tokens
        environment = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if not m]
        text = tokenizer.decode(environment, skip_special_tokens=False)
        assert text.count("<|im_start|>tool\n") == 3 and "<|im_start|>tool\n3<|im_end|>" in text
        batch = build_train_batch([traj], torch.ones(1))
        on = batch.mask_NT[0] > 0
        assert batch.input_ids_NL[0, 1:][on].tolist() == expected
        assert torch.all(batch.generation_logprobs_NT[0][on] == 0.0)  # the engine's logprobs
