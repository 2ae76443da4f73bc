"""engine=scripted (test-only): a bad script is refused naming `script_path`; turns are
replayed in order from what the prompt already holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlfleet_core.errors import FailedPrecondition, InvalidArgument
from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.scripted import ScriptedEngine, read_script


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "engine=scripted needs script_path"),
        ('{"text": "a"}\nnot json\n', ":2: expected"),
        ('{"turn": "a"}\n', ":1: expected"),
        ('{"text": ""}\n', ":1: expected"),
    ],
)
def test_a_bad_script_names_the_setting(tmp_path: Path, content: str | None, problem: str) -> None:
    path = ""
    if content is not None:
        path = str(tmp_path / "script.jsonl")
        Path(path).write_text(content)
    with pytest.raises(InvalidArgument, match="script_path") as caught:
        read_script(path)
    assert problem in str(caught.value)
    with pytest.raises(InvalidArgument, match="cannot read"):
        read_script(str(tmp_path / "missing.jsonl"))


def test_turns_are_replayed_in_order(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text('{"text": "call A"}\n\n{"text": "call A"}\n{"text": "done"}\n')
    config = RolloutServiceConfig(engine="scripted", script_path=str(script))
    engine = ScriptedEngine(config, tmp_path)
    assert engine.next_turn("user: go") == "call A"
    assert engine.next_turn("user: go call A result") == "call A"  # a repeated turn
    assert engine.next_turn("go call A r call A r") == "done"
    with pytest.raises(FailedPrecondition, match="no turn left"):
        engine.next_turn("go call A r call A r done")
