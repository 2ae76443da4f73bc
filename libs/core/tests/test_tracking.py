"""The metrics interface without a training run: names, a missing tracker package, and a
tracker that fails mid-run (its folder removed under it) is dropped with one warning
while metrics.jsonl and the other trackers go on. The trainer run with every tracker is
libs/cli/tests/test_tracking.py."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
from rlfleet_core.tracking import (
    NEMO_RL_NAMES,
    OWN_NAMES,
    LoggerConfig,
    MetricsLogger,
    TrackingError,
    tracker_name,
)


def test_names_follow_nemo_rl_and_never_collide() -> None:
    assert tracker_name("reward/mean") == "train/reward"
    assert tracker_name("loss") == "train/loss"
    assert tracker_name("timing/step_s") == "timing/train/total_step_time"
    assert tracker_name("timing/train_s") == "timing/train/policy_training"
    assert tracker_name("timing/publish_s") == "timing/train/publish_s"
    assert tracker_name("reward/math") == "train/reward_by_env/math"
    assert tracker_name("val/reward/math") == "validation/reward_by_env/math"
    assert tracker_name("math/reward/mean") == "train/math/reward/mean"


# Checked against NVIDIA-NeMo/RL (docs/trainer.md "Trackers" names the files and commit).
NEMO_RL_CHECKED = {
    # grpo.py: the step's `metrics` dict, logged with prefix "train"
    "reward/mean": "train/reward",
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "lr": "train/lr",
    "dynamic_sampling/rounds": "train/dynamic_sampling_num_gen_batches",
    "policy_lag/mean": "train/avg_trajectory_age",
    # loss/loss_functions.py: ClippedPGLossFn's metrics, merged into the same dict
    "ratio_mean": "train/probs_ratio",
    "kl": "train/kl_penalty",
    "token_mult_prob_error": "train/token_mult_prob_error",
    "is_oob_ratio": "train/is_oob_ratio",
    # experience/rollouts.py: rollout metrics, merged into the same dict
    "response_length/mean": "train/mean_gen_tokens_per_sample",
    "response_length/max": "train/max_gen_tokens_per_sample",
    "truncated_fraction": "train/truncation_rate",
    # grpo.py: timer keys, logged with prefix "timing/train"
    "timing/step_s": "timing/train/total_step_time",
    "timing/logprobs_s": "timing/train/policy_and_reference_logprobs",
    "timing/train_s": "timing/train/policy_training",
    # grpo.py validate(): accuracy = mean reward over the rollouts, prefix "validation"
    "val/reward": "validation/accuracy",
}


@pytest.mark.parametrize(("jsonl", "tracker"), sorted(NEMO_RL_CHECKED.items()))
def test_quantities_nemo_rl_also_logs_take_its_name(jsonl: str, tracker: str) -> None:
    assert tracker_name(jsonl) == tracker


@pytest.mark.parametrize(
    ("jsonl", "tracker"),
    [
        # NeMo-RL's validation/accuracy is the mean reward; ours is the full-reward share
        ("val/accuracy", "validation/full_reward_fraction"),
        # NeMo-RL's train/advantages/{mean,min,max} are over response tokens
        ("advantages/mean", "train/advantages_per_sample/mean"),
        ("advantages/std", "train/advantages_per_sample/std"),
        ("advantages/min", "train/advantages_per_sample/min"),
        ("advantages/max", "train/advantages_per_sample/max"),
        # no NeMo-RL counterpart (its approx_entropy is a sampled estimate): the layout
        ("entropy", "train/entropy"),
        ("policy_lag/max", "train/policy_lag/max"),
    ],
)
def test_other_quantities_never_take_a_nemo_rl_name(jsonl: str, tracker: str) -> None:
    assert tracker_name(jsonl) == tracker


def test_the_tracker_names_are_distinct() -> None:
    names = [*NEMO_RL_NAMES, *OWN_NAMES]
    assert not set(NEMO_RL_NAMES) & set(OWN_NAMES)
    assert len({tracker_name(k) for k in names}) == len(names)
    own = set(OWN_NAMES.values())
    assert not own & set(NEMO_RL_NAMES.values())


def test_a_missing_tracker_package_names_the_key_and_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb → ImportError
    with pytest.raises(TrackingError) as info:
        MetricsLogger(tmp_path, LoggerConfig(wandb_enabled=True))
    message = str(info.value)
    assert "\n" not in message
    assert "logger.wandb_enabled" in message and "pip install rlfleet-core[tracking]" in message


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = LoggerConfig(tensorboard_enabled=True, mlflow_enabled=True)
    with MetricsLogger(tmp_path, config, jsonl=tmp_path / "metrics.jsonl") as log:
        log.log(1, {"reward/mean": 0.25})
        shutil.rmtree(tmp_path / "mlruns")  # the store is gone: MLflow's next write fails
        with caplog.at_level(logging.WARNING, logger="rlfleet_core.tracking"):
            for step in (2, 3):
                log.log(step, {"reward/mean": 0.25 * step})
        assert [t.name for t in log.trackers] == ["tensorboard"]
    warnings = [r for r in caplog.records if "mlflow tracker failed" in r.getMessage()]
    assert len(warnings) == 1 and "disabled" in warnings[0].getMessage()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/mean"] for r in rows] == [0.25, 0.5, 0.75]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/reward")] == [1, 2, 3]


def test_a_tracker_that_cannot_start_says_which_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "mlruns").write_text("a file where the store's folder goes")
    with pytest.raises(TrackingError) as info:
        MetricsLogger(tmp_path, LoggerConfig(tensorboard_enabled=True, mlflow_enabled=True))
    message = str(info.value)
    assert message.startswith("logger.mlflow_enabled: mlflow could not start: ")
    assert "\n" not in message
