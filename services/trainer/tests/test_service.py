"""The trainer service under the shared bootstrap: health, GetStatus while idle and while
training a tiny stage against the test doubles, SaveCheckpoint at a step boundary."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlfleet_core.client import connect
from rlfleet_core.testing import running_service
from rlfleet_core.versions import git_commit
from rlfleet_proto.v1 import trainer_pb2, trainer_pb2_grpc
from rlfleet_trainer.service import SERVICE
from rlfleet_trainer.testing import serve_doubles


async def test_idle_service_reports_status_and_refuses_checkpoint() -> None:
    async with (
        running_service(SERVICE) as running,
        connect(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(
            health_pb2.HealthCheckRequest(service="rlfleet.v1.TrainerService")
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        status = await stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
        assert status.phase == "idle" and status.stage == "" and status.build.service == "trainer"
        assert status.build.git_commit == git_commit()  # this checkout's HEAD ("" without git)
        with pytest.raises(aio.AioRpcError) as info:
            await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest())
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "autostart=true" in (info.value.details() or "")


async def test_service_trains_a_stage_and_saves_on_request(
    tiny_model: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            f'{{"id": "r{i}", "responses_create_params": {{"input": "say e {i}"}}, "env": "x"}}\n'
            for i in range(6)
        )
    )
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, _):
        overrides = [
            "autostart=true",
            f"run_dir={tmp_path / 'run'}",
            f"recipe.policy.model={tiny_model}",
            "recipe.policy.max_total_sequence_length=96",
            "recipe.policy.train_micro_batch_size=4",
            "recipe.generation.max_new_tokens=8",
            "recipe.grpo.num_prompts_per_step=2",
            "recipe.grpo.num_generations_per_prompt=2",
            "recipe.grpo.max_num_steps=6",
            "recipe.grpo.lr=1e-3",
            f"recipe.data.train_path={rows}",
            f"recipe.services.rollout={rollout_target}",
            f"recipe.services.reward={reward_target}",
        ]
        async with (
            running_service(SERVICE, overrides) as running,
            connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=120) as channel,
        ):
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            saved = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest())
            assert 1 <= saved.step < 6 and Path(saved.path).name == f"step_{saved.step}"
            for _ in range(600):
                status = await stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
                if status.phase in ("done", "failed"):
                    break
                await asyncio.sleep(0.1)
            assert status.phase == "done"
            assert status.step == 6 and status.total_steps == 6 and status.weight_version == 6
            assert "reward/mean" in status.metrics and "loss" in status.metrics
    assert (tmp_path / "run" / "hf" / "model.safetensors").exists()
