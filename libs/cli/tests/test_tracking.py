"""Experiment tracking end to end: a real tiny `rlfleet rl` stage (local services, the
hf engine, the tiny model, 2 steps) with TensorBoard, W&B (offline, no network) and
MLflow (local file store) all enabled in the recipe's `logger` section. Each tracker's
output is read back with its own reader and holds the reward curve, one value per step,
under NeMo-RL's name (train/reward); metrics.jsonl keeps rlfleet's names. Then
`rlfleet report` on that stage folder."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_dataprep.prep import PrepOptions, prepare_rl

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_rollout", reason="the rollout package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")

STEPS = 2
COMMAND = [sys.executable, "-m", "rlfleet_cli.main", "rl", "rlvr", "--engine", "hf"]
TINY = [
    *("-c", "tiny/rlvr1", "policy.model=tiny", f"grpo.max_num_steps={STEPS}"),
    *("grpo.num_val_prompts=4", "generation.max_new_tokens=8", "checkpoint.save_every_steps=0"),
]
TRACKERS = [
    *("logger.tensorboard_enabled=true", "logger.wandb_enabled=true"),
    *("logger.mlflow_enabled=true", "logger.wandb.project=tiny"),
    "logger.mlflow.experiment_name=tiny",
]


def test_a_tracker_without_its_package_stops_the_start_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlfleet_pipeline.preflight import tracker_problem
    from rlfleet_pipeline.recipes import load_recipe

    recipe = load_recipe("test", ["logger.mlflow_enabled=true", "logger.wandb_enabled=true"])
    assert tracker_problem(recipe.logger) is None  # both installed here
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    assert tracker_problem(recipe.logger) == (
        "logger.wandb_enabled=true needs the wandb package: pip install rlfleet-core[tracking]"
    )


@pytest.mark.budget(240, "a tiny stage with its services, every tracker writing")
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiny_stage_writes_every_tracker_and_reports(tmp_path: Path) -> None:
    prepare_rl("tiny-rlvr1", PrepOptions(out=tmp_path / "data", val_rows=8, force=True))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    env.pop("WANDB_MODE", None)  # the recipe's logger.wandb.mode (offline) decides
    run = subprocess.run(
        [*COMMAND, *TINY, *TRACKERS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=800,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    stage = tmp_path / "runs" / "rlvr1"
    rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    rewards = [r["reward/mean"] for r in rows]  # JSONL keeps rlfleet's names

    tb = tensorboard_scalars(stage / "tensorboard", "train/reward")
    assert [s for s, _ in tb] == [1, 2]
    assert [v for _, v in tb] == pytest.approx(rewards, abs=1e-6)

    history = [h for h in wandb_history(stage / "wandb") if "train/reward" in h]
    assert [h["_step"] for h in history] == [1, 2]
    assert [h["train/reward"] for h in history] == pytest.approx(rewards)

    name, mlflow = mlflow_history(stage / "mlruns", "tiny", "train/reward")
    assert name == "rlvr1"
    assert mlflow == [(1, pytest.approx(rewards[0])), (2, pytest.approx(rewards[1]))]

    report = subprocess.run(
        [sys.executable, "-m", "rlfleet_cli.main", "report", str(stage), "--html"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stdout + report.stderr
    assert "![rlvr1_reward](plots/rlvr1_reward.png)" in (stage / "report.md").read_text()
    assert 'src="data:image/png;base64,' in (stage / "report.html").read_text()


# --- readers -------------------------------------------------------------------------
# Read back what each tracker wrote to a run folder, with the trackers' own readers where
# they have one: TensorBoard's EventAccumulator, MLflow's MlflowClient on the file store.
# wandb 0.31 ships no Python reader of its offline `.wandb` file (wandb-core, in Go, syncs
# it), so `wandb_history` reads its record log: a LevelDB-style log (32 KiB blocks, records
# split into FULL/FIRST/MIDDLE/LAST chunks behind a 7-byte header) after a 7-byte `:W&B`
# file header; each record is a wandb_internal_pb2.Record.

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def mlflow_history(store: Path, experiment: str, key: str) -> tuple[str, list[tuple[int, float]]]:
    """(run name, [(step, value)]) of the experiment's only run."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} in {store}"
    (run,) = client.search_runs([found.experiment_id])
    history = client.get_metric_history(run.info.run_id, key)
    return run.info.run_name, sorted((m.step, m.value) for m in history)


def _records(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", "not a .wandb file"
    pos, out, partial = 7, [], b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            partial = chunk
        elif kind == MIDDLE:
            partial += chunk
        elif kind == LAST:
            out.append(partial + chunk)
        else:
            break  # zero padding at the end of the file
    return out


def wandb_history(wandb_dir: Path) -> list[dict[str, object]]:
    """The history rows (one per logged step) of the offline run under wandb_dir."""
    from wandb.proto import wandb_internal_pb2

    (path,) = wandb_dir.glob("offline-run-*/run-*.wandb")
    rows = []
    for raw in _records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows
