from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_contracts.rows import DataError
from rlfleet_dataprep.prep import PrepOptions, bundled_blends, prepare_rl

RLFLEET = str(Path(sys.executable).parent / "rlfleet")


def arithmetic_blend(path: Path, n: int) -> Path:
    rows = [
        {
            "_placeholder": {
                "source": "reasoning_gym",
                "task": "basic_arithmetic",
                "seed": 7,
                "size": n,
                "index": i,
            },
            "agent_ref": {"name": "reasoning_gym"},
        }
        for i in range(n)
    ]
    rows.append(
        {
            "responses_create_params": {"input": "What is 2+3?"},
            "env": "math",
            "expected_answer": "5",
        }
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prep_fills_splits_and_writes_manifest(tmp_path: Path) -> None:
    blend = arithmetic_blend(tmp_path / "arith.jsonl", 12)
    out, manifest = prepare_rl(str(blend), PrepOptions(out=tmp_path / "data", val_rows=4))
    train, val = read(out / "train" / "data.jsonl"), read(out / "val" / "data.jsonl")
    assert (len(train), len(val)) == (9, 4)
    assert val[-1]["env"] == "math"  # the last rows are the held-out ones, in order
    first = train[0]
    assert first["agent_ref"] == {"name": "reasoning_gym"} and first["task"] == "basic_arithmetic"
    assert first["responses_create_params"]["input"][0]["content"] == first["question"]
    assert str(first["answer"]).lstrip("-").isdigit()
    data = json.loads((out / "manifest.json").read_text())
    assert data["splits"]["train"]["rows"] == 9 and data["options"]["placeholders_filled"] == 12
    assert data["splits"]["val"]["env_mix"] == {"math": 1, "reasoning_gym": 3}
    assert manifest.sources[str(blend)] == data["sources"][str(blend)]
    # Deterministic: the same seed gives the same content.
    again, _ = prepare_rl(str(blend), PrepOptions(out=tmp_path / "data2", val_rows=4))
    assert (again / "train" / "data.jsonl").read_text() == (
        out / "train" / "data.jsonl"
    ).read_text()


def test_prep_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    blend = arithmetic_blend(tmp_path / "arith.jsonl", 6)
    prepare_rl(str(blend), PrepOptions(out=tmp_path, val_rows=2))
    with pytest.raises(DataError, match="already prepared; pass --force"):
        prepare_rl(str(blend), PrepOptions(out=tmp_path, val_rows=2))
    prepare_rl(str(blend), PrepOptions(out=tmp_path, val_rows=2, force=True))


def test_sample_low_effort_and_generation_controls(tmp_path: Path) -> None:
    blend = arithmetic_blend(tmp_path / "arith.jsonl", 20)
    options = PrepOptions(
        out=tmp_path,
        val_rows=5,
        sample=15,
        low_effort_fraction=0.5,
        reasoning="off",
        token_budget=64,
        seed=3,
    )
    out, _ = prepare_rl(str(blend), options)
    train = read(out / "train" / "data.jsonl")
    assert len(train) == 10
    low = [r for r in train if r.get("env") == "low_effort"]
    assert len(low) == 5 and all(r["inner_env"] == "reasoning_gym" for r in low)
    normal = next(r for r in train if r.get("env") != "low_effort")
    params = normal["responses_create_params"]
    assert (
        params["chat_template_kwargs"] == {"enable_thinking": False}
        and params["max_output_tokens"] == 64
    )
    # Low effort is a reasoning mode: --reasoning off leaves its thinking on.
    for r in low:
        assert r["responses_create_params"]["chat_template_kwargs"] == {
            "enable_thinking": True,
            "low_effort": True,
        }
        assert r["responses_create_params"]["max_output_tokens"] == 64


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"_placeholder": {"source": "nope"}}, "unknown source 'nope'"),
        (
            {"_placeholder": {"source": "reasoning_gym", "task": "basic_arithmetic"}},
            "needs field 'index'",
        ),
        ({"responses_create_params": {"input": "hi"}}, "env: missing"),
        (
            {"env": "math", "responses_create_params": {"input": "hi", "max_output_tokens": -1}},
            "max_output_tokens: expected a positive integer",
        ),
        (
            {
                "env": "math",
                "responses_create_params": {"input": "hi", "chat_template_kwargs": ["on"]},
            },
            "chat_template_kwargs: expected an object",
        ),
    ],
)
def test_bad_rows_name_file_line_and_field(
    tmp_path: Path, row: dict[str, object], message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps({"responses_create_params": {"input": "ok"}, "env": "math"})
        + "\n"
        + json.dumps(row)
        + "\n"
    )
    with pytest.raises(DataError, match=rf"bad.jsonl:2: .*{message}"):
        prepare_rl(str(path), PrepOptions(out=tmp_path, val_rows=0))


def test_reasoning_switch_overrides_nemo_gym_metadata_switches(tmp_path: Path) -> None:
    """NeMo-Gym rows carry per-sample switches in `metadata.chat_template_kwargs` (a JSON
    string); --reasoning folds them into `chat_template_kwargs` and wins over them."""
    path = tmp_path / "meta.jsonl"
    meta = {"chat_template_kwargs": json.dumps({"enable_thinking": True, "x": 1}), "k": "v"}
    params = {"input": "hi", "metadata": meta}
    row = {"env": "math", "expected_answer": "1", "responses_create_params": params}
    path.write_text(json.dumps(row) + "\n")
    out, _ = prepare_rl(str(path), PrepOptions(out=tmp_path, val_rows=0, reasoning="off"))
    params = read(out / "train" / "data.jsonl")[0]["responses_create_params"]
    assert params["chat_template_kwargs"] == {"enable_thinking": False, "x": 1}
    assert params["metadata"] == {"k": "v"}


def test_bundled_blend_is_listed_and_cli_reports_errors(tmp_path: Path) -> None:
    assert "tiny-mix" in bundled_blends()
    result = subprocess.run(
        [RLFLEET, "data", "prep", "rl", "no-such-blend", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert (
        "blend 'no-such-blend': no such file or directory" in result.stderr
        and "tiny-mix" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_every_bad_row_is_reported_against_its_environment(tmp_path: Path) -> None:
    """The reward service's own row check (found through the rlfleet.services entry point,
    run in this process) judges each row; every bad one is listed by file:line, up to
    MAX_LISTED_PROBLEMS, then counted."""
    from rlfleet_dataprep.prep import MAX_LISTED_PROBLEMS

    good = {"responses_create_params": {"input": "q"}, "env": "math", "expected_answer": "1"}
    rows = [good] * 3
    rows.append({**good, "expected_answer": None})  # line 4: math needs it
    rows.append({**good, "env": "structured_outputs", "schema_str": "{not json"})  # line 5
    rows.append({"responses_create_params": {"input": "q"}, "agent_ref": {"name": "nope_agent"}})
    rows += [{**good, "expected_answer": None}] * (MAX_LISTED_PROBLEMS + 2)
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as info:
        prepare_rl(str(path), PrepOptions(out=tmp_path / "out", val_rows=1))
    lines = str(info.value).splitlines()
    assert lines[0] == f"{MAX_LISTED_PROBLEMS + 5} problem(s) in the blend's rows:"
    assert lines[1] == f"{path}:4: expected_answer: required, but missing"
    assert lines[2].startswith(f"{path}:5: schema_str:")
    assert lines[3].startswith(f"{path}:6: agent_ref.name: 'nope_agent' is neither")
    assert lines[-1] == "... and 5 more"
    assert len(lines) == MAX_LISTED_PROBLEMS + 2
    assert not (tmp_path / "out").exists()  # nothing written


def test_default_env_routes_rows_that_name_none(tmp_path: Path) -> None:
    row = {"responses_create_params": {"input": "q"}, "expected_answer": "1"}
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=r"raw.jsonl:1: env: missing"):
        prepare_rl(str(path), PrepOptions(out=tmp_path / "a", val_rows=1))
    out, manifest = prepare_rl(
        str(path), PrepOptions(out=tmp_path / "b", val_rows=1, default_env="math")
    )
    assert manifest.splits["train"]["env_mix"] == {"math": 1}
    assert read(out / "train" / "data.jsonl")[0]["env"] == "math"
    with pytest.raises(DataError, match=r"raw.jsonl:1: env: unknown environment 'maths'"):
        prepare_rl(str(path), PrepOptions(out=tmp_path / "c", val_rows=1, default_env="maths"))
    flags = ["--out", str(tmp_path / "d"), "--val-rows", "1", "--default-env", "math"]
    done = subprocess.run(
        [RLFLEET, "data", "prep", "rl", str(path), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "math 1" in done.stdout


def test_bundled_mixed_blend_passes_the_row_check(tmp_path: Path) -> None:
    # It used to ship 28 IFBench rows whose instruction ids the gateway refuses.
    _, manifest = prepare_rl("tiny-mix", PrepOptions(out=tmp_path))
    assert manifest.options["row_check"] == "reward environments"
    mix = manifest.splits["train"]["env_mix"]
    assert sum(manifest.splits[s]["rows"] for s in ("train", "val")) == 300
    assert set(mix) == {"code", "instruction_following", "reasoning_gym"}


@pytest.mark.parametrize("blend", ["tiny-rlvr1", "tiny-rlvr2", "tiny-rlvr3"])
def test_tiny_stage_blends_mix_environments(tmp_path: Path, blend: str) -> None:
    """Each tiny RLVR stage trains on three environments; its bare-answer math rows opt
    into the math environment's lenient extraction (it is strict by default)."""
    from rlfleet_contracts.rows import LENIENT_EXTRACTION, MATH_EXTRACTION_FIELD, env_of

    manifest = prepare_rl(blend, PrepOptions(out=tmp_path))
    rows = [
        json.loads(line)
        for split in ("train", "val")
        for line in (tmp_path / blend / split / "data.jsonl").read_text().splitlines()
    ]
    counts: dict[str, int] = {}
    for row in rows:
        counts[env_of(row)] = counts.get(env_of(row), 0) + 1
    assert counts == {"math": 100, "structured_outputs": 100, "instruction_following": 100}, (
        manifest
    )
    math_rows = [r for r in rows if env_of(r) == "math"]
    assert all(r[MATH_EXTRACTION_FIELD] == LENIENT_EXTRACTION for r in math_rows)
    assert all("only the answer" in r["question"] for r in math_rows)
    val_envs = json.loads((tmp_path / blend / "manifest.json").read_text())["splits"]["val"]
    assert len(val_envs["env_mix"]) == 3  # the held-out rows cover every environment
