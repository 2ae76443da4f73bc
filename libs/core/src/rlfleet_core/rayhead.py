"""A service's private one-node Ray (`ray.address=local`), started in a process of its own:
`python -m rlfleet_core.rayhead '<json options>'`.

Why not `ray.init(address="local")` in the service itself: Ray starts its daemons with
`subprocess.Popen(preexec_fn=...)`, which runs Python code in the forked child before it
execs; in a service process (gRPC's threads, asyncio's worker threads) that child can
deadlock on a lock another thread held at the fork, and `Popen` then never returns. A
steady CI run saw exactly that: the rollout's pool waited out its whole start-up budget
with Ray's session folder made and no daemon started. Here the fork happens in a small
process that does nothing else, and a start that hangs anyway is a process the service
can kill and try again (a hung thread cannot be stopped).

Protocol: one line `rlfleet-ray-head {"address": ...}` on stdout once Ray is up (or
`rlfleet-ray-head-error <message>` and exit 1); then it holds Ray until its stdin closes
(the service stopped it, or died) or it gets SIGTERM/SIGINT, and shuts Ray down.
"""

from __future__ import annotations

import json
import signal
import sys
import threading

READY = "rlfleet-ray-head "
FAILED = "rlfleet-ray-head-error "


def main() -> int:
    options = json.loads(sys.argv[1])
    try:
        import ray

        ray.init(
            address="local",
            num_cpus=options.get("num_cpus"),
            object_store_memory=options.get("object_store_memory"),
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        address = ray.get_runtime_context().gcs_address
    except Exception as exc:  # the service reads this line and decides whether to retry
        print(FAILED + " ".join(str(exc).split()), flush=True)
        return 1
    print(READY + json.dumps({"address": address}), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    # stdin closes when the service stops us or dies: either way Ray goes with it.
    def wait_for_eof() -> None:
        sys.stdin.buffer.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    while not stop.wait(1.0):  # a timed wait: signal handlers run in between
        pass
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
