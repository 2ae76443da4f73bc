"""The bundled safety blend (tiny-safety): generated deterministically, both categories
present, every row accepted by the reward gateway's `safety` environment (data prep's row
check), and the jailbreak rows carry their plain `goal` inside the adversarial prompt."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from rlfleet_dataprep.blends.make_bundled import BLENDS, HERE
from rlfleet_dataprep.blends.safety import safety_rows
from rlfleet_dataprep.prep import PrepOptions, prepare_rl

pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")


def test_bundled_file_is_what_the_generator_writes() -> None:
    rows = list(BLENDS["tiny-safety"])
    assert rows == safety_rows()
    random.Random(0).shuffle(rows)  # as make_bundled.main does
    lines = (HERE / "tiny-safety.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == json.loads(json.dumps(rows, sort_keys=True))


def test_rows_parse_in_the_safety_environment(tmp_path: Path) -> None:
    from rlfleet_reward.environments import get_environment

    env = get_environment("safety")
    rows = safety_rows()
    assert Counter(r["category"] for r in rows) == {"over_refusal": 18, "jailbreak": 16}
    for row in rows:
        spec = env.parse_row(row)
        assert spec.category == row["category"]
        if spec.goal:
            assert spec.goal in spec.conversation[-1][1]
    _, manifest = prepare_rl("tiny-safety", PrepOptions(out=tmp_path, val_rows=4))
    assert manifest.options["row_check"] == "reward environments"
    train = (tmp_path / "tiny-safety" / "train" / "data.jsonl").read_text().splitlines()
    assert len(train) == 30
