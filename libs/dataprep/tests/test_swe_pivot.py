"""Stage SWE1's data: the bundled agent demonstrations cut into `swe_pivot` rows (one per
turn, one instance held out), the offline pivot filter, and the rows scored by the reward
gateway's `swe_pivot` environment: each demonstrated action scores 1 as written and
rewritten equivalently, and the other turns' actions score 0."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from rlfleet_contracts.rows import DataError
from rlfleet_dataprep.swe_pivot import (
    BUNDLED_DEMOS,
    BUNDLED_INSTANCES,
    call_text,
    prepare_swe_pivot,
    read_jsonl,
)

DEMOS = read_jsonl(BUNDLED_DEMOS)


def _rows(out: Path, **kw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    out_dir, manifest = prepare_swe_pivot(out, **kw)
    train = read_jsonl(out_dir / "train" / "data.jsonl")
    val = read_jsonl(out_dir / "val" / "data.jsonl")
    return train, val, manifest


def test_bundled_demonstrations_resolve_and_cover_every_instance() -> None:
    instances = {i["instance_id"] for i in read_jsonl(BUNDLED_INSTANCES)}
    assert {d["instance_id"] for d in DEMOS} == instances
    assert all(d["resolved"] for d in DEMOS)
    assert len(DEMOS) >= 3 * len(instances)
    for demo in DEMOS:
        names = [t["action"]["name"] for t in demo["turns"]]
        assert names[-1] == "submit" and "edit" in names, demo["demo_id"]


def test_one_row_per_turn_with_the_prefix_and_a_held_out_instance(tmp_path: Path) -> None:
    train, val, manifest = _rows(tmp_path)
    assert len(train) + len(val) == sum(len(d["turns"]) for d in DEMOS)
    held = {r["instance_id"] for r in val}
    assert len(held) == 1 and not held & {r["instance_id"] for r in train}
    assert manifest.options["held_out"] == sorted(held)
    assert manifest.options["pivots"] == {"pivot": 0, "not_a_pivot": 0, "unsampled": 60}
    by_id = {d["demo_id"]: d for d in DEMOS}
    for row in train + val:
        demo_id, turn = row["id"].split("#")
        demo = by_id[demo_id]
        messages = row["responses_create_params"]["input"]
        assert row["env"] == "swe_pivot" and row["turn"] == int(turn)
        assert row["expected_action"] == demo["turns"][int(turn)]["action"]
        assert len(messages) == 2 + 2 * int(turn)
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert "<tools>" in messages[0]["content"]
        assert {t["function"]["name"] for t in row["responses_create_params"]["tools"]} == {
            "bash", "view", "edit", "submit",
        }  # fmt: skip
        for i, earlier in enumerate(demo["turns"][: int(turn)]):
            assert messages[2 + 2 * i]["content"] == call_text(earlier["action"])
            assert messages[3 + 2 * i]["role"] == "tool"
        if row["expected_action"]["name"] == "edit":
            assert row["files"] == demo["turns"][int(turn)]["files_before"]


def test_pivot_filter_keeps_mixed_and_unsampled_turns(tmp_path: Path) -> None:
    mixed, uniform = "rlfleet__slugkit-1/list-view#0", "rlfleet__slugkit-1/list-view#1"
    sampled = tmp_path / "sampled.jsonl"
    sampled.write_text(
        json.dumps({"id": mixed, "rewards": [0, 1, 0, 0]}) + "\n"
        + json.dumps({"id": uniform, "reward": 1.0}) + "\n"
        + json.dumps({"id": uniform, "reward": 1.0}) + "\n"
    )  # fmt: skip
    train, val, manifest = _rows(tmp_path / "out", sampled_path=sampled)
    ids = {r["id"] for r in train + val}
    assert mixed in ids and uniform not in ids
    assert manifest.options["pivots"] == {"pivot": 1, "not_a_pivot": 1, "unsampled": 58}
    assert manifest.dropped == {"not_a_pivot": 1}


@pytest.mark.parametrize(
    "line", ['{"id": 3, "rewards": [1]}', '{"id": "a", "rewards": ["1"]}', "[1]", "{oops"]
)
def test_bad_sampled_file_names_the_line(tmp_path: Path, line: str) -> None:
    sampled = tmp_path / "sampled.jsonl"
    sampled.write_text('{"id": "x", "rewards": [1, 0]}\n' + line + "\n")
    with pytest.raises(DataError, match=r"sampled\.jsonl:2:"):
        prepare_swe_pivot(tmp_path / "out", sampled_path=sampled)


def test_an_unresolved_demonstration_is_refused(tmp_path: Path) -> None:
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps({**DEMOS[0], "resolved": False}) + "\n")
    with pytest.raises(DataError, match="does not resolve"):
        prepare_swe_pivot(tmp_path / "out", demos_path=demos)


def _equivalent_rewrite(action: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """The same action written differently (what a policy might write instead)."""
    name, args = action["name"], dict(action["arguments"])
    if name == "bash":
        words = shlex.split(args["command"])  # other quotes, more spaces, a no-op cd
        args["command"] = "cd /testbed && " + "  ".join(f'"{w}"' if " " in w else w for w in words)
    elif name == "view":
        args["path"] = "/testbed/./" + args["path"]
    elif name == "edit":  # the whole file as it is after the edit
        before = files[args["path"]]
        args = {"path": args["path"], "old_str": "",
                "new_str": before.replace(args["old_str"], args["new_str"], 1)}  # fmt: skip
    return {"name": name, "arguments": args}


def test_every_row_scores_its_action_one_and_other_turns_zero(tmp_path: Path) -> None:
    pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")
    from rlfleet_reward.environments import get_environment
    from rlfleet_reward.types import Sample

    env = get_environment("swe_pivot")
    train, val, _ = _rows(tmp_path)
    rows = train + val
    for row in rows:
        spec = env.parse_row(row)
        own = env.score(spec, Sample(call_text(row["expected_action"])))
        assert own.reward == 1.0, (row["id"], own.info)
        rewrite = _equivalent_rewrite(row["expected_action"], row.get("files", {}))
        if rewrite != row["expected_action"]:
            again = env.score(spec, Sample("I'll do that.\n" + call_text(rewrite)))
            assert again.reward == 1.0, (row["id"], rewrite, again.info)
        for other in rows:
            if other["instance_id"] != row["instance_id"] or other["id"] == row["id"]:
                continue
            got = env.score(spec, Sample(call_text(other["expected_action"])))
            names = {other["expected_action"]["name"], row["expected_action"]["name"]}
            # Every script's edit makes the gold fix: with context lines or without, the
            # file comes out the same, so they are equivalent; any other change of action
            # is not.
            same = names == {"edit"} or other["expected_action"] == row["expected_action"]
            assert got.reward == (1.0 if same else 0.0), (row["id"], other["id"], got.info)


def test_the_command_writes_the_blend_and_refuses_bad_input(tmp_path: Path) -> None:
    import subprocess
    import sys

    command = [sys.executable, "-m", "rlfleet_dataprep.swe_pivot", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "{'train': 45, 'val': 15}" in done.stdout
    assert (tmp_path / "tiny-swe1" / "val" / "data.jsonl").is_file()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    done = subprocess.run([*command, "--sampled", str(bad)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 1 and done.stderr.strip() == f"error: {bad}:1: not JSON " + (
        "(Expecting property name enclosed in double quotes)"
    )
