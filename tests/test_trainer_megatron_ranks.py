"""Cross-service: a GRPO stage with the megatron backend at TP=2 (2 gloo ranks under
torchrun, launched as `rlfleet rl` launches it) against the real rollout service (hf
engine, tiny model) and reward gateway, compared with the torch backend in one plain
process on the same seeded samples (see test_trainer_ranks for why the data are the same).
The two backends agree to the megatron parity tolerances, not to the last bit: TP splits
the matmuls, so float summation order differs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_trainer_ranks import PROMPTS, _ledger_counts, _steps, _weights, services, stage_command

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

__all__ = ["services"]  # the module-scoped rollout + reward fixture, shared

STEPS = 2


def _stage(
    services: tuple[str, str, Path], run_dir: Path, policy: list[str], ranks: int
) -> subprocess.CompletedProcess[str]:
    command = stage_command(services, run_dir, [*policy, "policy.max_restarts=0"], STEPS)
    assert ("torch.distributed.run" in command) == (ranks > 1)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


@pytest.mark.budget(240, "a megatron TP=2 stage and a torch stage, each with its services")
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_megatron_tp2_stage_matches_the_torch_backend(
    services: tuple[str, str, Path], tmp_path: Path
) -> None:
    mega = tmp_path / "megatron"
    out = _stage(
        services, mega, ["policy.backend=megatron", "policy.tensor_parallel_size=2"], ranks=2
    )
    assert "follower done" in out.stderr  # rank 1 followed rank 0's commands
    one = tmp_path / "torch"
    _stage(services, one, [], ranks=1)
    a, b = _steps(one), _steps(mega)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    print({s: (a[s]["loss"], b[s]["loss"], a[s]["grad_norm"], b[s]["grad_norm"]) for s in a})
    for step in a:
        assert a[step]["reward/mean"] == b[step]["reward/mean"]  # the same samples
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], rel=1e-4, abs=1e-6), step
        assert b[step]["grad_norm"] == pytest.approx(a[step]["grad_norm"], rel=1e-4), step
    assert (one / "ledger.jsonl").read_bytes() == (mega / "ledger.jsonl").read_bytes()
    assert _ledger_counts(mega)["trained"] == STEPS * PROMPTS
    w1, w2 = _weights(one), _weights(mega)
    assert w1.keys() == w2.keys()
    for name in w1:
        diff = float((w1[name] - w2[name]).abs().max())  # type: ignore[operator]
        assert diff <= 1e-4, (name, diff)
    # one shard per TP rank, written by DP replica 0, plus the HF export
    ckpt = mega / "checkpoints" / f"step_{STEPS}" / "policy"
    shards = sorted(p.name for p in ckpt.glob("megatron_*.pt"))
    assert shards == ["megatron_tp00_pp00.pt", "megatron_tp01_pp00.pt"]
    assert (ckpt / "hf" / "model.safetensors").is_file()
