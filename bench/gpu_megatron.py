"""The megatron backend's CUDA path (NCCL, bf16 autocast) at TP=2 and PP=2 against TP=1 PP=1
on the same GPU machine, through the same parity probe the CPU tests use
(services/trainer/tests/megatron_parity.py): logprobs before and after one train step,
loss, grad norm and the published HF weights. On CPU the tests compare against the torch
backend at float32 tolerances; here every run uses bf16 autocast, so the comparison is
between parallel layouts of the same numerics and the tolerances are bf16's.

    OUT=<dir> python bench/gpu_megatron.py     (needs 2 CUDA devices, megatron-core, triton)

On a bare GPU machine: `source bench/gpu_env.sh .whl/grpo .whl/mega` first, where .whl/mega
holds the megatron-core 0.19.2 cp312 wheel (2.3 MB; `pip download --python-version 3.12
--only-binary=:all: --platform manylinux_2_28_x86_64 --no-deps megatron-core==0.19.2`).

Writes <OUT>/megatron-gpu.jsonl (one line per layout and model) and prints a table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rlfleet_core.bench import BenchResult

DESCRIPTION = "megatron backend on 2 GPUs (NCCL): TP=2 and PP=2 vs TP=1 PP=1, same probe"
REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "services/trainer/tests/megatron_parity.py"
LAYOUTS = {"tp1pp1": (1, 1, 1), "tp2": (2, 2, 1), "pp2": (2, 1, 2)}  # procs, tp, pp


def make_models(root: Path) -> list[Path]:
    from rlfleet_trainer.model_shapes import PARITY, save_random_model

    return [
        save_random_model(root / "llama", "llama", 1, **PARITY, tie_word_embeddings=False),
        save_random_model(root / "qwen2-tied", "qwen2", 1, **PARITY, tie_word_embeddings=True),
    ]


def run_layout(name: str, models: list[Path], out: Path) -> float:
    procs, tp, pp = LAYOUTS[name]
    (out / name).mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
        "--master_port", str(29600 + procs * 10 + pp), str(PROBE),
        "--tp", str(tp), "--pp", str(pp), "--out", str(out / name), *map(str, models),
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(command, check=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "4"})
    return time.monotonic() - started


def compare(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, float]:
    mask = ref["mask"] > 0
    state_gap = max(
        float((got["state"][k].float() - v.float()).abs().max())
        for k, v in ref["state"].items()
        if k in got["state"]
    )
    return {
        "logprobs_before_max_abs": float((got["before"] - ref["before"])[mask].abs().max()),
        "logprobs_after_max_abs": float((got["after"] - ref["after"])[mask].abs().max()),
        "loss": float(got["metrics"]["loss"]),
        "loss_ref": float(ref["metrics"]["loss"]),
        "grad_norm": float(got["metrics"]["grad_norm"]),
        "grad_norm_ref": float(ref["metrics"]["grad_norm"]),
        "hf_state_max_abs": state_gap,
        "hf_state_names_match": float(set(got["state"]) == set(ref["state"])),
    }


def measure(out: Path) -> list[dict[str, Any]]:
    """Runs the three layouts; one line per (model, layout other than the reference)."""
    work = out / "megatron-work"
    models = make_models(work / "models")
    seconds = {name: run_layout(name, models, work) for name in LAYOUTS}
    device = (
        f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
        if torch.cuda.is_available()
        else "cpu (gloo, float32)"
    )
    lines = []
    for i, model in enumerate(models):
        ref = torch.load(work / "tp1pp1" / f"{i}.pt", weights_only=False)
        for name in ("tp2", "pp2"):
            got = torch.load(work / name / f"{i}.pt", weights_only=False)
            lines.append(
                {
                    "name": "gpu_megatron",
                    "model": model.name,
                    "layout": name,
                    "against": "tp1pp1",
                    "device": device,
                    "compute": "bf16 autocast, fp32 params",
                    "wall_s": round(seconds[name], 1),
                    **{k: round(v, 7) for k, v in compare(ref, got).items()},
                    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            )
    return lines


def run(quick: bool = False) -> list[BenchResult]:
    """For `rlfleet bench gpu-megatron`: the loss of each layout against TP=1 PP=1's (ratio
    ~1 is the point; every other number is in `extra`)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        lines = measure(Path(tmp))
    return [
        BenchResult(
            name="gpu-megatron",
            metric=f"loss_{line['layout']}_{line['model']}",
            value=line["loss"],
            unit="loss",
            baseline=line["loss_ref"],
            device=line["device"],
            extra={k: v for k, v in line.items() if k not in ("name", "device")},
        )
        for line in lines
    ]


def main() -> None:
    out = Path(os.environ.get("OUT", "bench/results"))
    lines = measure(out)
    with (out / "megatron-gpu.jsonl").open("a") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
