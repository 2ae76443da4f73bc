"""Record NeMo-Gym's rewards for generated verify requests (the CI parity fixtures).

    RLFLEET_NEMO_GYM_PYTHON=<side python> RLFLEET_NEMO_GYM_SRC=<unpacked nemo-gym> \\
        uv run python services/reward/parity/record.py ENV [SEED [COUNT]]

writes services/reward/parity/recorded/ENV.jsonl: one line per request, `{"case", "env",
"request", "reward"}`, `reward` being what NeMo-Gym's own server gave (reference.py, run in
the side environment). Defaults: seed 0, 600 requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import GENERATORS  # noqa: E402

RECORDED = HERE / "recorded"
SIDE_ENV_VARS = ("RLFLEET_NEMO_GYM_PYTHON", "RLFLEET_NEMO_GYM_SRC")


def side_env_missing() -> str | None:
    """Why NeMo-Gym's side environment cannot be run here, or None when it can."""
    missing = [name for name in SIDE_ENV_VARS if not os.environ.get(name)]
    if missing:
        return f"{' and '.join(missing)} not set (services/reward/parity/side_env.sh builds one)"
    return None


def reference_rewards(lines: list[dict[str, Any]], timeout_s: float = 1800) -> list[float]:
    """NeMo-Gym's reward for each generated line, from its servers in the side env."""
    problem = side_env_missing()
    if problem:
        raise RuntimeError(problem)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        src.write_text(
            "".join(
                json.dumps({"server": x["server"], "request": x["request"]}) + "\n" for x in lines
            )
        )
        env = {**os.environ, "PYTHONPATH": os.environ["RLFLEET_NEMO_GYM_SRC"]}
        subprocess.run(
            [os.environ["RLFLEET_NEMO_GYM_PYTHON"], str(HERE / "reference.py"), str(src), str(dst)],
            env=env,
            check=True,
            timeout=timeout_s,
            capture_output=True,
        )
        results = [json.loads(text) for text in dst.read_text().splitlines() if text.strip()]
    if len(results) != len(lines):
        raise RuntimeError(f"reference.py scored {len(results)} of {len(lines)} requests")
    return [float(r["reward"]) for r in results]


def record(env: str, seed: int = 0, count: int = 600) -> Path:
    lines = GENERATORS[env](seed, count)
    rewards = reference_rewards(lines)
    RECORDED.mkdir(exist_ok=True)
    path = RECORDED / f"{env}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for line, reward in zip(lines, rewards, strict=True):
            entry = {"case": line["case"], "env": env, "request": line["request"], "reward": reward}
            f.write(json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n")
    return path


def main() -> None:
    env = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 600
    print(record(env, seed, count))


if __name__ == "__main__":
    main()
