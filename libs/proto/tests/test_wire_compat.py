"""Old clients must keep working: against the committed baseline, no field, enum value
or method may disappear or change its number, type or streaming shape. Adding is fine.
(Refresh the baseline only when deliberately releasing a breaking version:
`uv run python libs/proto/gen_protos.py --update-wire-baseline`.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_protos", HERE.parent / "gen_protos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def breaking_changes(
    old: dict[str, dict[str, list[object]]], new: dict[str, dict[str, list[object]]]
) -> list[str]:
    problems = []
    for type_name, members in old.items():
        if type_name not in new:
            problems.append(f"{type_name}: removed")
            continue
        for member, shape in members.items():
            if member not in new[type_name]:
                problems.append(f"{type_name}.{member}: removed")
            elif new[type_name][member] != shape:
                problems.append(
                    f"{type_name}.{member}: changed from {shape} to {new[type_name][member]}"
                )
    return problems


def test_current_protos_are_wire_compatible_with_the_baseline() -> None:
    gen = _generator()
    baseline = json.loads(gen.WIRE_BASELINE.read_text())
    assert breaking_changes(baseline, gen.wire_snapshot()) == []


def test_the_check_catches_renumbering_removal_and_streaming_changes() -> None:
    gen = _generator()
    snap = gen.wire_snapshot()
    changed = json.loads(json.dumps(snap))
    changed["rlfleet.v1.GenerateResult"]["logprobs"][0] = 99
    del changed["rlfleet.v1.ScoreResult"]["failure_reason"]
    changed["rlfleet.v1.RolloutService"]["Generate"][3] = False
    del changed["rlfleet.v1.TensorChunk"]
    assert sorted(breaking_changes(snap, changed)) == [
        "rlfleet.v1.GenerateResult.logprobs: changed from [5, 2, '', True] to [99, 2, '', True]",
        "rlfleet.v1.RolloutService.Generate: changed from ['rlfleet.v1.GenerateRequest', "
        "'rlfleet.v1.GenerateResult', False, True] to ['rlfleet.v1.GenerateRequest', "
        "'rlfleet.v1.GenerateResult', False, False]",
        "rlfleet.v1.ScoreResult.failure_reason: removed",
        "rlfleet.v1.TensorChunk: removed",
    ]
    older = json.loads(json.dumps(snap))
    older["rlfleet.v1.ScoreResult"].pop("latency_s")  # a baseline from before a field was added
    assert breaking_changes(older, snap) == []
