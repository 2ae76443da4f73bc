"""Record NeMo-Gym's rewards for the generated mcqa / instruction_following / reasoning_gym
cases (the CI parity tests replay them through rlfleet's gateway).

    RLFLEET_NEMO_GYM_PYTHON=... RLFLEET_NEMO_GYM_SRC=... \\
        python services/reward/parity/record_mir.py mcqa [instruction_following reasoning_gym]

writes `recorded/<env>.jsonl`: one `{"category", "request", "reward", "extracted"}` per case,
in generator order. Cases NeMo-Gym refuses or crashes on are dropped (and counted).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "recorded"
GENERATORS = {
    "mcqa": "cases_mcqa",
    "instruction_following": "cases_instruction_following",
    "reasoning_gym": "cases_reasoning_gym",
}


def generate(env: str) -> list[dict[str, Any]]:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    cases: list[dict[str, Any]] = importlib.import_module(GENERATORS[env]).generate()
    return cases


def reference_results(cases: list[dict[str, Any]], timeout_s: float = 600) -> list[dict[str, Any]]:
    """NeMo-Gym's result for every case's `reference`, from the side environment."""
    python = os.environ["RLFLEET_NEMO_GYM_PYTHON"]
    src = os.environ["RLFLEET_NEMO_GYM_SRC"]
    with tempfile.TemporaryDirectory() as tmp:
        src_file, dst_file = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        src_file.write_text("".join(json.dumps(c["reference"]) + "\n" for c in cases))
        subprocess.run(
            [python, str(HERE / "reference.py"), str(src_file), str(dst_file)],
            env={**os.environ, "PYTHONPATH": src},
            cwd=tmp,  # nltk refuses imports from inside the working directory
            check=True,
            timeout=timeout_s,
            stdout=subprocess.DEVNULL,
        )
        return [json.loads(line) for line in dst_file.read_text().splitlines()]


def record(env: str) -> tuple[int, int]:
    """(cases recorded, cases dropped because NeMo-Gym refused them)."""
    cases = generate(env)
    results = reference_results(cases)
    kept = [
        {
            "category": case["category"],
            "request": case["request"],
            "reward": result["reward"],
            "extracted": result.get("extracted"),
        }
        for case, result in zip(cases, results, strict=True)
        if result["reward"] is not None
    ]
    RECORDED.mkdir(exist_ok=True)
    with (RECORDED / f"{env}.jsonl").open("w", encoding="utf-8") as f:
        for line in kept:
            f.write(json.dumps(line, sort_keys=True, default=str) + "\n")
    return len(kept), len(cases) - len(kept)


def main() -> None:
    for env in sys.argv[1:] or list(GENERATORS):
        kept, dropped = record(env)
        print(f"{env}: recorded {kept} cases ({dropped} refused by NeMo-Gym)")


if __name__ == "__main__":
    main()
