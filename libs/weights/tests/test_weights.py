"""rlfleet_weights: packing, in-place buckets (`home_buckets`) and receiving
straight into a model's tensors over a gloo group (both ranks in this process)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from rlfleet_core.ports import pick_free_port

torch = pytest.importorskip("torch")

from rlfleet_weights.collective import GroupSpec, WeightGroup, receive_weights_into, send_weights  # noqa: E402
from rlfleet_weights.plan import (  # noqa: E402
    direct_view,
    home_buckets,
    pack_bucket,
    plan_buckets,
    specs_of,
    unpack_bucket,
)


def _state(seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "norm": torch.randn(6, generator=gen),  # 24 bytes: packed with the next ones
        "half": torch.randn(3, generator=gen).to(torch.bfloat16),  # 6 bytes: padding after
        "k": torch.randn(4, 4, generator=gen),
        "big": torch.randn(64, 64, generator=gen),  # a bucket of its own
        "ids": torch.arange(5, dtype=torch.int64),
        "v": torch.randn(2, 4, generator=gen),
    }


def test_pack_round_trips_with_and_without_gaps() -> None:
    state = _state(0)
    plan = plan_buckets(specs_of(state), 256)
    reused = torch.full((1 << 15,), 7, dtype=torch.uint8)
    for bucket in plan.buckets:
        for out in (None, reused):
            flat = pack_bucket(bucket, state, out=out)
            assert flat.numel() == bucket.nbytes
            for name, view in unpack_bucket(bucket, flat):
                assert torch.equal(view, state[name]), name
    with pytest.raises(ValueError, match="out"):
        pack_bucket(plan.buckets[0], state, out=torch.empty(8, dtype=torch.uint8))
    # A non-contiguous source is packed too.
    t = torch.randn(4, 4).t()
    plan = plan_buckets(specs_of({"t": t, "u": t}), 1024)
    flat = pack_bucket(plan.buckets[0], {"t": t, "u": t})
    assert all(torch.equal(v, t) for _, v in unpack_bucket(plan.buckets[0], flat))


def test_home_buckets_lays_packed_buckets_out_in_place() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    targets = dict(model.named_parameters())
    before = {k: v.detach().clone() for k, v in targets.items()}
    plan = plan_buckets(specs_of(targets), 1 << 20)
    assert len(plan.buckets) == 1 and len(plan.buckets[0].slots) == 4
    assert direct_view(plan.buckets[0], targets, "cpu") is None
    assert home_buckets(plan, targets) == 1
    assert home_buckets(plan, targets) == 0  # already in place
    # Same Parameter objects (the module still uses them), same values, new memory.
    assert all(a is b for a, b in zip(targets.values(), model.parameters(), strict=True))
    for name, value in targets.items():
        assert torch.equal(value, before[name])
    flat = direct_view(plan.buckets[0], targets, "cpu")
    assert flat is not None and flat.numel() == plan.buckets[0].nbytes
    # Writing the bucket writes the model.
    with torch.no_grad():
        flat.copy_(pack_bucket(plan.buckets[0], {k: v + 1 for k, v in before.items()}))
    for name, value in targets.items():
        assert torch.equal(value, before[name] + 1)
    out = model(torch.ones(2, 4))
    assert out.shape == (2, 3)


def test_home_buckets_skips_tied_and_view_targets() -> None:
    shared = torch.randn(3)
    fused = torch.randn(8)
    targets = {"a": shared, "b": torch.randn(2), "c": shared, "q": fused[:4], "k": fused[4:]}
    plan = plan_buckets(specs_of(targets), 1 << 20)
    assert home_buckets(plan, targets) == 0
    assert targets["q"].data_ptr() == fused.data_ptr()


@pytest.mark.parametrize("home", [False, True])
def test_receive_into_targets_matches_sender(home: bool) -> None:
    """Two updates (reused staging buffers, direct and packed buckets, a tied tensor)."""
    port = pick_free_port()
    names = ["norm", "half", "k", "big", "ids", "v"]
    targets = {k: torch.zeros_like(v) for k, v in _state(0).items()}
    targets["tied"] = targets["big"]
    box: dict[str, Any] = {}
    joiner = threading.Thread(
        target=lambda: box.update(rx=WeightGroup(GroupSpec("127.0.0.1", port, 2, 1, "gloo", 30)))
    )
    joiner.start()
    tx = WeightGroup(GroupSpec("127.0.0.1", port, 2, 0, "gloo", 30))
    joiner.join()
    rx = box["rx"]
    for seed in (1, 2):
        state = _state(seed)
        state["tied"] = state["big"]
        plan = plan_buckets(specs_of(state), 64)
        if home:  # the first time moves the packed buckets; after that they are in place
            assert (home_buckets(plan, targets) > 0) == (seed == 1)
        receiver = threading.Thread(
            target=lambda plan=plan: box.update(result=receive_weights_into(rx, plan, targets))
        )
        receiver.start()
        send_weights(tx, state, 64)
        receiver.join(30)
        assert not receiver.is_alive()
        assert box["result"][0] == plan.total_bytes
        for name in [*names, "tied"]:
            assert torch.equal(targets[name], state[name]), (seed, name)
    tx.close()
    rx.close()
