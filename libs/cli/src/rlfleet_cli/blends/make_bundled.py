"""Writes the bundled blends of placeholder rows (run from the repo root):

    uv run python libs/cli/src/rlfleet_cli/blends/make_bundled.py

Each line names a local source (see rlfleet_cli.sources), as published blends name the
data their fill script fetches; `rlfleet data prep rl <name>` fills them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Easy, learnable-by-a-small-model reasoning-gym settings for the tiny pipeline.
EASY_ARITHMETIC: dict[str, object] = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
}


def reasoning_gym(
    task: str, n: int, seed: int, config: dict[str, object] | None = None
) -> list[dict[str, object]]:
    spec = {
        "source": "reasoning_gym",
        "task": task,
        "seed": seed,
        "size": n,
        **({"config": config} if config else {}),
    }
    return [
        {"_placeholder": {**spec, "index": i}, "agent_ref": {"name": "reasoning_gym"}}
        for i in range(n)
    ]


def indexed(source: str, env: str, indices: range) -> list[dict[str, object]]:
    return [
        {"_placeholder": {"source": source, "index": i}, "agent_ref": {"name": env}}
        for i in indices
    ]


BLENDS: dict[str, list[dict[str, object]]] = {
    "tiny-mix": [
        *reasoning_gym("basic_arithmetic", 150, seed=1, config=EASY_ARITHMETIC),
        *reasoning_gym("leg_counting", 50, seed=2),
        *indexed("human_eval", "code", range(50)),
        *indexed("ifbench", "instruction_following", range(50)),
    ],
}


def main() -> None:
    for name, rows in BLENDS.items():
        # Shuffled, like published blends, so the last rows (held out) mix every source.
        rows = list(rows)
        random.Random(0).shuffle(rows)
        path = HERE / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        print(f"{path.name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
