"""The bundled tiny-rlhf blend: the generators' rows, and it passes the reward gateway's
row check (`prepare_rl`).

The RLHF stage itself (the policy's rollout, the reward gateway and a second rollout
serving the judge, GRPO with KL to the starting weights, the judge's throughput per step)
runs end to end in tests/test_six_stages.py, with every other stage; its own run here
(SmolLM2 as policy through `rlfleet rl rlhf`, ~240 s beside the other workers) was folded
into that one in session 18. The fleet's judge wiring has unit tests in
libs/pipeline/tests/test_rlhf_stage.py; `rlfleet rl rlhf` through compose with a judge
container runs in tests/test_compose_rlhf.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_rollout", reason="the rollout package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")


def test_bundled_blend_is_the_generators_and_passes_the_row_check(tmp_path: Path) -> None:
    import random

    from rlfleet_dataprep.blends.make_bundled import BLENDS, HERE
    from rlfleet_dataprep.blends.rlhf import rlhf_rows
    from rlfleet_dataprep.prep import PrepOptions, prepare_rl

    assert rlhf_rows(128, seed=17) == list(BLENDS["tiny-rlhf"])
    rows = list(BLENDS["tiny-rlhf"])
    random.Random(0).shuffle(rows)  # as make_bundled.main does
    bundled = [json.loads(line) for line in (HERE / "tiny-rlhf.jsonl").read_text().splitlines()]
    assert bundled == json.loads(json.dumps(rows, sort_keys=True))
    _, manifest = prepare_rl("tiny-rlhf", PrepOptions(out=tmp_path, val_rows=16))
    assert manifest.options["row_check"] == "reward environments"
    assert (manifest.splits["train"]["rows"], manifest.splits["val"]["rows"]) == (112, 16)
    for row in bundled:
        assert row["agent_ref"] == {"name": "genrm_compare"} and len(row["principles"]) == 2
