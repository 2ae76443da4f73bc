"""Cross-service: the trainer's GRPO loop against the real rollout service (hf engine,
bundled tiny model) and the real reward gateway (reasoning-gym environment), each in its
own process on loopback. Checks the wire contract end to end: token ids and raw logprobs
from the engine agree with the trainer's (token_mult_prob_error ≈ 1 on-policy), weights are
published by StreamWeights and by a gloo broadcast, every prompt lands in the ledger, the
rewards are the gateway's (reasoning-gym scorer), and the run resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlfleet_core.client import check_health
from support import spawn_bound

pytest.importorskip("rlfleet_rollout", reason="the rollout service package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward service package is not installed")
reasoning_gym = pytest.importorskip("reasoning_gym")


def _start(module: str, args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    process, ports = spawn_bound(
        [sys.executable, "-m", module, *args],
        log.with_suffix(".ports.json"),
        timeout_s=240,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    return process, f"127.0.0.1:{ports.grpc}"


def _wait(process: subprocess.Popen[bytes], target: str, log: Path) -> None:
    import time

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{target} exited: {log.read_text()[-2000:]}")
        try:
            if check_health(target, timeout_s=2.0) == "SERVING":
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{target} not serving: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    from rlfleet_core.models import resolve_model

    model = resolve_model("tiny")
    logs = tmp_path_factory.mktemp("logs")
    rollout, rollout_target = _start(
        "rlfleet_rollout", ["engine=hf", f"model={model}"], logs / "rollout.log"
    )
    reward, reward_target = _start(
        "rlfleet_reward", ["environments=[reasoning_gym]", "pool.workers=1"], logs / "reward.log"
    )
    try:
        _wait(rollout, rollout_target, logs / "rollout.log")
        _wait(reward, reward_target, logs / "reward.log")
        yield rollout_target, reward_target, model
    finally:
        for process in (rollout, reward):
            process.send_signal(signal.SIGTERM)
        for process in (rollout, reward):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def _rows(count: int = 10) -> list[dict[str, object]]:
    data = reasoning_gym.create_dataset("basic_arithmetic", size=count, seed=3)
    return [
        {
            "id": f"arith{i}",
            "responses_create_params": {"input": [{"role": "user", "content": entry["question"]}]},
            "env": "reasoning_gym",
            "answer": entry["answer"],
            "metadata": entry["metadata"],
        }
        for i, entry in enumerate(data)
    ]


def _recipe(model: Path, rollout: str, reward: str, *extra: str):  # type: ignore[no-untyped-def]
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_core.config import load_config

    return load_config(
        RecipeConfig,
        overrides=[
            f"policy.model={model}",
            "policy.max_total_sequence_length=256",
            "policy.train_micro_batch_size=8",
            "generation.max_new_tokens=16",
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=4",
            "grpo.max_num_steps=2",
            "grpo.lr=1e-3",
            "checkpoint.export_hf=false",
            f"services.rollout={rollout}",
            f"services.reward={reward}",
            *extra,
        ],
    )


def _ledger_ok(run_dir: Path, recipe: object, rows: list[dict[str, object]]) -> dict[str, int]:
    from rlfleet_trainer.ledger import Ledger, verify_ledger
    from rlfleet_trainer.run import build_context

    summary = json.loads((run_dir / "summary.json").read_text())
    ctx = build_context(recipe, run_dir / "probe", rows=rows)  # type: ignore[arg-type]
    ctx.source.cursor = summary["data_cursor"]
    return verify_ledger(Ledger(run_dir / "ledger.jsonl").entries(), ctx.source.issued_ids())


@pytest.mark.slow
async def test_sync_grpo_against_real_rollout_and_reward(
    services: tuple[str, str, Path], tmp_path: Path
) -> None:
    from rlfleet_trainer.run import run_stage

    rollout, reward, model = services
    rows = _rows()
    recipe = _recipe(model, rollout, reward, "grpo.max_trajectory_age_steps=0")
    state = await run_stage(recipe, tmp_path, rows=rows)
    assert state.step == 2
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        # the engine's raw logprobs and the trainer's agree on the same float32 weights
        assert m["token_mult_prob_error"] == pytest.approx(1.0, abs=2e-3)
        assert m["policy_lag/max"] == 0 and 0.0 <= m["reward/reasoning_gym"] <= 1.0
    assert _ledger_ok(tmp_path, recipe, rows)["trained"] == 4
    # resume adds steps on the same rollout (whose version is already 2)
    longer = _recipe(
        model, rollout, reward, "grpo.max_trajectory_age_steps=0", "grpo.max_num_steps=3"
    )
    assert (await run_stage(longer, tmp_path, rows=rows, resume=True)).step == 3
    assert _ledger_ok(tmp_path, longer, rows)["trained"] == 6


@pytest.mark.slow
async def test_async_grpo_with_gloo_weight_broadcast(
    services: tuple[str, str, Path], tmp_path: Path
) -> None:
    from rlfleet_core.client import connect
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
    from rlfleet_trainer.run import run_stage

    rollout, reward, model = services
    rows = _rows()
    async with connect(rollout) as channel:
        before = await rollout_pb2_grpc.RolloutServiceStub(channel).GetStatus(
            rollout_pb2.GetStatusRequest()
        )
    recipe = _recipe(
        model, rollout, reward, "grpo.max_trajectory_age_steps=1", "services.weight_transport=gloo"
    )
    state = await run_stage(recipe, tmp_path, rows=rows)
    async with connect(rollout) as channel:
        after = await rollout_pb2_grpc.RolloutServiceStub(channel).GetStatus(
            rollout_pb2.GetStatusRequest()
        )
    assert after.weight_version == state.weight_version > before.weight_version
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(m["policy_lag/max"] for m in metrics) <= 1
    assert _ledger_ok(tmp_path, recipe, rows)["trained"] == 4
