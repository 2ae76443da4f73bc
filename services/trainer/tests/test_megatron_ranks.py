"""The megatron backend as one rank of a multi-rank GRPO stage (the contract in
backends/base.py): no port of its own, data-parallel slices whose summed gradient equals
one process's, HF weights gathered once to global rank 0, per-rank checkpoints that
survive kill -9 and resume bit for bit."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from rlfleet_trainer.model_shapes import TEST_LLAMA, save_random_model

pytestmark = pytest.mark.budget(180, "megatron under torchrun, killed and resumed")

# A world of one builds the backend, says it is up, then holds it until its twin is up
# too (so both hold their process group at the same time).
_HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rlfleet_trainer.backends.megatron_backend import MegatronPolicy
    from rlfleet_trainer.backends.megatron_setup import MegatronBackendConfig

    model, ready, me, other = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    policy = MegatronPolicy(MegatronBackendConfig(model_path=model))
    (ready / me).touch()
    deadline = time.monotonic() + 240
    while not (ready / other).exists():
        if time.monotonic() > deadline:
            sys.exit("the other backend never came up")
        time.sleep(0.2)
    print("ranks", policy.data_parallel_rank, policy.data_parallel_size)
    """
)

HERE = Path(__file__).parent


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


parity = _load("megatron_parity")
reference = _load("test_megatron")  # torch_results, assert_parity: the existing tolerances


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama (hidden 64, 4 heads, 2 kv heads, vocab 256), random weights."""
    return save_random_model(tmp_path_factory.mktemp("llama"), "llama", 1, **TEST_LLAMA)


def _torchrun(nproc: int, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The probe under torchrun; `--standalone` rendezvouses on a port torchrun picks and
    holds, so parallel tests cannot race for one."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        str(HERE / "megatron_parity.py"),
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_data_parallel_2_matches_one_process(tiny_llama: Path, tmp_path: Path) -> None:
    """TP=1 PP=1 on 2 ranks is DP=2: each rank trains its half of the batch, and the step
    equals the torch backend's on the whole batch (loss, grad norm and the other metrics on
    every rank, logprobs of each half, updated weights); the HF weights reach rank 0 only."""
    _ok(_torchrun(2, ["--out", str(tmp_path), str(tiny_llama)], 400))
    ref = reference.torch_results(tiny_llama)
    ranks = [torch.load(tmp_path / f"0.rank{r}.pt", weights_only=False) for r in (0, 1)]
    for r, mega in enumerate(ranks):
        assert mega["dp"] == (r, 2)
        half = parity.dp_slice(parity.parity_batch(256), r, 2)
        rows, width = slice(2 * r, 2 * r + 2), half.mask_NT.shape[1]
        mine = {
            "before": ref["before"][rows, :width],
            "after": ref["after"][rows, :width],
            "mask": ref["mask"][rows, :width],
            "metrics": ref["metrics"],
            "state": ref["state"] if r == 0 else {},
        }
        assert (r == 0) == bool(mega["state"]), "only global rank 0 gets the published weights"
        reference.assert_parity(mega, mine)


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "nproc"), [(2, 2), (1, 2)], ids=["tp2", "dp2"])
def test_resume_after_kill_is_exact(tiny_llama: Path, tmp_path: Path, tp: int, nproc: int) -> None:
    """One step, save, a second step, kill -9 of every rank; fresh ranks load the
    checkpoint and take the same second step: metrics, logprobs and weights bit for bit."""
    ckpt = tmp_path / "ckpt"
    common = ["--tp", str(tp), "--resume", str(ckpt), str(tiny_llama)]
    killed = _torchrun(nproc, ["--out", str(tmp_path / "a"), "--phase", "save", *common], 400)
    assert killed.returncode != 0  # the ranks killed themselves after saving
    _ok(_torchrun(nproc, ["--out", str(tmp_path / "b"), "--phase", "load", *common], 400))
    for r in range(nproc):
        before = torch.load(tmp_path / "a" / f"0.rank{r}.pt", weights_only=False)["second"]
        after = torch.load(tmp_path / "b" / f"0.rank{r}.pt", weights_only=False)["second"]
        assert after["metrics"] == before["metrics"]
        assert torch.equal(after["after"], before["after"])
        assert after["state"].keys() == before["state"].keys()
        assert (r == 0) == bool(after["state"])
        for name, tensor in after["state"].items():
            assert torch.equal(tensor, before["state"][name]), name
    shards = sorted(p.name for p in ckpt.glob("megatron_*.pt"))
    assert shards == [f"megatron_tp{t:02d}_pp00.pt" for t in range(tp)]  # DP replica 0 only


@pytest.mark.slow
def test_resume_at_another_data_parallel_size(tiny_llama: Path, tmp_path: Path) -> None:
    """A checkpoint of one rank resumed by 2 DP ranks (a stage that grows): each reads the
    one model-parallel shard, and their step equals the one rank's within the parity
    tolerances (the DP sum adds the same gradients in another order)."""
    ckpt = tmp_path / "ckpt"
    common = ["--resume", str(ckpt), str(tiny_llama)]
    killed = _torchrun(1, ["--out", str(tmp_path / "a"), "--phase", "save", *common], 400)
    assert killed.returncode != 0
    _ok(_torchrun(2, ["--out", str(tmp_path / "b"), "--phase", "load", *common], 400))
    one = torch.load(tmp_path / "a" / "0.rank0.pt", weights_only=False)["second"]
    for r in (0, 1):
        two = torch.load(tmp_path / "b" / f"0.rank{r}.pt", weights_only=False)["second"]
        for key in ("loss", "grad_norm", "entropy", "kl"):
            assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6)
        mask = parity.dp_slice(parity.parity_batch(256), r, 2).mask_NT > 0
        mine = one["after"][2 * r : 2 * r + 2, : mask.shape[1]]
        torch.testing.assert_close(two["after"][mask], mine[mask], atol=1e-4, rtol=0)
    state = torch.load(tmp_path / "b" / "0.rank0.pt", weights_only=False)["second"]["state"]
    for name, tensor in state.items():
        torch.testing.assert_close(tensor, one["state"][name], atol=1e-4, rtol=0)


_LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.mark.slow
def test_two_single_rank_backends_on_one_machine_take_no_port(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Two trainers of world size 1 at the same time on one machine (two recipes, or a
    test beside a run): each builds its process group without a TCP rendezvous, so
    neither can take the other's port (megatron_setup used a fixed 29511)."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV}
    env["OMP_NUM_THREADS"] = "1"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(tiny_model), str(tmp_path), me, other],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me, other in (("a", "b"), ("b", "a"))
    ]
    try:
        # The first failure ends the test (its twin would wait for it until its deadline).
        deadline = time.monotonic() + 400
        while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
            if any(proc.poll() not in (None, 0) for proc in procs):
                break
            time.sleep(0.5)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err[-3000:]
            assert "ranks 0 1" in out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
