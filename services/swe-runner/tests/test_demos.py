"""The bundled SWE1 demonstrations are what the scripted agent records through the real
service and docker today: every script on every bundled instance runs its calls in the
instance's container without a tool error, its submitted patch resolves the instance
under Evaluate, and the calls, the edited files' contents and the patches equal the
bundled `demonstrations.jsonl` (tool outputs such as pytest's timings are not compared)."""

from __future__ import annotations

import json

from rlfleet_proto.v1 import swe_pb2_grpc
from rlfleet_swe.demos import SCRIPTS, record_all
from rlfleet_swe.images import bundled_instances_dir
from swe_testlib import instances


def _essence(demo: dict[str, object]) -> dict[str, object]:
    turns = demo["turns"]
    assert isinstance(turns, list)
    return {
        "demo_id": demo["demo_id"],
        "calls": [(t["action"], t.get("files_before")) for t in turns],
        "patch": demo["patch"],
        "resolved": demo["resolved"],
    }


async def test_recorded_demonstrations_resolve_and_match_the_bundled_ones(
    stub: swe_pb2_grpc.SweRunnerServiceStub,
) -> None:
    bundled = [
        json.loads(line)
        for line in (bundled_instances_dir() / "demonstrations.jsonl").read_text().splitlines()
    ]
    demos = await record_all(stub, instances())
    assert len(demos) == len(SCRIPTS) * len(instances())
    assert all(d["resolved"] for d in demos), [d["demo_id"] for d in demos if not d["resolved"]]
    for demo in demos:
        assert all(not t["result"]["error"] for t in demo["turns"]), demo["demo_id"]
    assert [_essence(d) for d in demos] == [_essence(d) for d in bundled]
