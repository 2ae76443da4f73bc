"""Rank 0 of a gloo weight group, in a process of its own so that a test can kill it
midway through an update (`weight_testlib.Sender` starts it).

    python weight_sender.py PORT WORLD_SIZE SEED BUCKET_BYTES TIMEOUT_S MODEL THEN

Says "ready", joins the group, broadcasts the first half of the buckets of the model's
weights plus seeded noise and says "half". THEN is "hang" (wait to be killed) or
"finish" (on a line on stdin, broadcast the rest and say "done", then wait to be killed).
"""

from __future__ import annotations

import sys
import time

from rlfleet_weights.collective import GroupSpec, WeightGroup
from rlfleet_weights.plan import pack_bucket, plan_buckets, specs_of
from weight_testlib import noisy_weights, pretrained_weights


def main(argv: list[str]) -> None:
    port, world_size, seed, bucket_bytes, timeout_s, model, then = argv
    weights = noisy_weights(pretrained_weights(model), int(seed))
    print("ready", flush=True)
    spec = GroupSpec("127.0.0.1", int(port), int(world_size), 0, "gloo", float(timeout_s))
    group = WeightGroup(spec)
    plan = plan_buckets(specs_of(weights), int(bucket_bytes))
    assert len(plan.buckets) >= 4, len(plan.buckets)  # half an update is really partial
    half = len(plan.buckets) // 2
    for bucket in plan.buckets[:half]:
        group.broadcast(pack_bucket(bucket, weights))
    print("half", flush=True)
    if then == "finish":
        sys.stdin.readline()
        for bucket in plan.buckets[half:]:
            group.broadcast(pack_bucket(bucket, weights))
        print("done", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1:])
