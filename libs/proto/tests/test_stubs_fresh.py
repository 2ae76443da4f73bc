"""The committed stubs must be exactly what gen_protos.py produces from protos/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import rlfleet_proto
from rlfleet_proto.v1 import reward_pb2, rollout_pb2

HERE = Path(__file__).resolve().parent
GEN = HERE.parent / "gen_protos.py"


def _load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_protos", GEN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_protos(tmp_path: Path) -> None:
    gen = _load_generator()
    gen.check_generator_versions()
    fresh = {p.name: p.read_text() for p in gen.generate(tmp_path)}
    committed = {p.name: p.read_text() for p in gen.PACKAGE_DIR.iterdir() if p.is_file()}
    assert sorted(fresh) == sorted(committed), "stub files added or removed: run gen_protos.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale stubs {stale}: run `uv run python libs/proto/gen_protos.py`"


def test_every_proto_has_stubs() -> None:
    protos = {p.stem for p in (HERE.parents[2] / "protos" / "rlfleet" / "v1").glob("*.proto")}
    generated = {
        p.name.removesuffix("_pb2.py")
        for p in (HERE.parent / "src" / "rlfleet_proto" / "v1").glob("*_pb2.py")
    }
    assert protos == generated


def test_wire_package_is_rlfleet_v1() -> None:
    # The Python module moved to rlfleet_proto; the wire names must not.
    assert rollout_pb2.DESCRIPTOR.package == "rlfleet.v1"
    assert (
        rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
        == rlfleet_proto.ROLLOUT_SERVICE
    )
    assert (
        reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name
        == rlfleet_proto.REWARD_SERVICE
    )


def test_messages_round_trip() -> None:
    result = rollout_pb2.GenerateResult(
        request_id="r1",
        token_ids=[5, 6],
        logprobs=[-0.5, -1.25],
        finish_reason=rollout_pb2.FINISH_REASON_LENGTH,
        weight_version_first=3,
        weight_version_last=4,
    )
    back = rollout_pb2.GenerateResult.FromString(result.SerializeToString())
    assert list(back.token_ids) == [5, 6]
    assert list(back.logprobs) == [-0.5, -1.25]
    assert back.finish_reason == rollout_pb2.FINISH_REASON_LENGTH
    assert (back.weight_version_first, back.weight_version_last) == (3, 4)
