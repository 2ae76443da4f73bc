"""Joining a Ray cluster from a service, and spreading its workers over the nodes.

Shared by the services whose workers can outgrow one node (the reward gateway's verifier
workers, the sandbox's pool): each keeps its own actor code and only borrows the start-up
rules here, which are the same everywhere and easy to get wrong:

- every wait has a deadline (`start_timeout_s` for joining and for placing the workers);
- Ray's workers run on the service's interpreter, never re-run through `uv run`;
- a `ray.init` that runs out of Ray's own fixed 30 s raylet registration wait (a loaded
  2-core host) is tried again while `start_timeout_s` lasts.

Ray itself is imported lazily: a service in its default (`process`) mode never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any, Literal

from pydantic import Field

from rlfleet_core.config import ConfigModel

logger = logging.getLogger(__name__)

Strategy = Literal["spread", "strict_spread", "pack"]


class RayConfig(ConfigModel):
    """Where a service's Ray workers run (`ray.*`), used when its backend is `ray`."""

    address: str = "local"
    """`local`: the service starts a private one-node Ray in a child process of its own
    (`rlfleet_core.rayhead`; killed and started again when it hangs), joins it, and stops
    it on exit. `auto`: the cluster that `ray start` runs on this node (a SLURM job starts
    `ray start --head` on one node and `ray start --address <head>:<port>` on the others).
    `host:port`: that cluster's GCS address."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of the private Ray (`address=local` only); None: every core of this host."""
    object_store_memory_bytes: int | None = Field(None, ge=75 << 20)
    """Object store of the private Ray (`address=local` only); None: Ray's default (30% of RAM)."""
    workers: int = Field(2, ge=1, le=1024)
    """Ray actors (one per node at most with `strategy=strict_spread`)."""
    cpus_per_worker: float = Field(1.0, gt=0)
    """CPUs each actor reserves: the scheduler places actors where these are free."""
    strategy: Strategy = "spread"
    """How the actors' placement group lays them out: `spread` over as many nodes as
    possible (several per node when there are more actors than nodes), `strict_spread`
    one per node (start-up fails when there are fewer nodes), `pack` as few nodes as
    possible."""
    start_timeout_s: float = Field(300.0, gt=0)
    """Joining (or starting) Ray, placing the actors and starting them, all together."""
    call_timeout_s: float = Field(30.0, gt=0)
    """Added to a call's own budget as its deadline on a remote actor (transfer, a busy
    node); past it the call fails or moves to another actor, never hangs."""


def allow_slow_gcs_start(seconds: float) -> None:
    """Ray waits only 30 s for the GCS server it starts to write its port file, a hidden
    deadline tighter than ours on a loaded host: give it `seconds` instead. An operator's
    own `RAY_gcs_server_port_wait_time_s` is kept."""
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(int(seconds)))


def is_startup_timeout(exc: BaseException) -> bool:
    """Whether Ray's start failed on one of its own fixed waits: "timed out during startup"
    (a raylet's registration) or "Timed out waiting for file ...gcs_server_port..." (the
    GCS, seen under a busy loop per core). Both are load, and worth another try."""
    return "timed out" in str(exc).lower()


async def connect(config: RayConfig) -> bool:
    """Join (or start) Ray within `config.start_timeout_s`; True when this call started it
    (the caller then shuts it down), False when Ray was already up in this process."""
    no_uv_runtime_env()
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "Ray is not installed: the ray backend needs it (install the service's `ray` "
            "extra, e.g. `pip install 'rlfleet-reward[ray]'`, or `pip install ray`)"
        ) from None

    if ray.is_initialized():
        return False
    deadline = time.monotonic() + config.start_timeout_s
    address = config.address
    if address == "local":
        # Ray turns token auth on by default for a cluster it starts, but a process that
        # joins one by address assumes it off: say it once, for the head and for us (an
        # operator's own RAY_AUTH_MODE is kept). Ray reads it into its config at import,
        # so the config is read again.
        if "RAY_AUTH_MODE" not in os.environ:
            os.environ["RAY_AUTH_MODE"] = "token"
            from ray._raylet import Config  # type: ignore[attr-defined]

            Config.initialize("")
        address = await _start_private_head(config, deadline)
    try:
        await _join(ray, address, config, deadline)
    except BaseException:
        await _stop_private_head()
        raise
    return True


async def _join(ray: Any, address: str, config: RayConfig, deadline: float) -> None:
    attempt = 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        try:
            await asyncio.wait_for(
                asyncio.to_thread(
                    ray.init, address=address, log_to_driver=False, configure_logging=False
                ),
                max(left, 1.0),
            )
            return
        except TimeoutError:
            raise RuntimeError(
                f"Ray at ray.address={config.address!r} did not come up within "
                f"ray.start_timeout_s={config.start_timeout_s:g}s"
            ) from None
        except Exception as exc:
            await asyncio.to_thread(ray.shutdown)
            left = deadline - time.monotonic()
            if not is_startup_timeout(exc) or left < RETRY_MIN_LEFT_S:
                raise RuntimeError(
                    f"cannot join Ray at ray.address={config.address!r}: {exc}"
                ) from exc
            logger.warning(
                "ray.init attempt %d failed (%s); trying again (%.0f s left)", attempt, exc, left
            )


HEAD_COMMAND = [sys.executable, "-m", "rlfleet_core.rayhead"]
"""How the private Ray head is started (tests put a stand-in here)."""
HEAD_ATTEMPT_MIN_S = 60.0
"""The shortest time one start of the private head gets before it is killed and tried
again (a normal start takes 5-20 s on a loaded 2-core host)."""
RETRY_MIN_LEFT_S = 10.0
"""No new try of a start with less of the budget left than this."""
_head: asyncio.subprocess.Process | None = None
_head_drain: asyncio.Future[str] | None = None


async def _start_private_head(config: RayConfig, deadline: float) -> str:
    """Start this process's private Ray in a process of its own (rlfleet_core.rayhead says
    why) and return its GCS address. A start that fails on one of Ray's own fixed waits, or
    that has not answered within half the budget (at least HEAD_ATTEMPT_MIN_S), is stopped
    and tried again while `start_timeout_s` lasts."""
    from rlfleet_core import rayhead

    options = json.dumps(
        {"num_cpus": config.num_cpus, "object_store_memory": config.object_store_memory_bytes}
    )
    attempt_s = max(HEAD_ATTEMPT_MIN_S, config.start_timeout_s / 2)
    attempt = 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        limit = min(left, attempt_s)
        allow_slow_gcs_start(limit)
        global _head
        # Its own session: stopping it can take its daemons along (`_stop_private_head`).
        _head = await asyncio.create_subprocess_exec(
            *HEAD_COMMAND, options,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        grace_s = 30.0
        try:
            line = await asyncio.wait_for(_head_answer(_head), max(limit, 1.0))
        except TimeoutError:  # hung: no use asking it to stop
            line, grace_s = f"{rayhead.FAILED}no answer within {limit:.0f} s (timed out)", 0.0
        if line.startswith(rayhead.READY):
            global _head_drain  # a full stdout pipe would stall the head: keep reading it
            _head_drain = asyncio.ensure_future(_head_answer(_head))
            return str(json.loads(line[len(rayhead.READY) :])["address"])
        await _stop_private_head(grace_s)
        error = line[len(rayhead.FAILED) :] if line.startswith(rayhead.FAILED) else line
        left = deadline - time.monotonic()
        if not is_startup_timeout(Exception(error)) or left < RETRY_MIN_LEFT_S:
            raise RuntimeError(
                f"cannot start a private Ray (ray.address='local') within "
                f"ray.start_timeout_s={config.start_timeout_s:g}s: {error}"
            )
        logger.warning(
            "private Ray start %d failed (%s); trying again (%.0f s left)", attempt, error, left
        )


async def _head_answer(head: asyncio.subprocess.Process) -> str:
    """The head's first protocol line; Ray's own chatter on stdout goes to the log."""
    from rlfleet_core import rayhead

    assert head.stdout is not None
    while raw := await head.stdout.readline():
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith((rayhead.READY, rayhead.FAILED)):
            return line
        logger.info("ray head: %s", line)
    return f"{rayhead.FAILED}it exited (status {await head.wait()}) before Ray was up"


async def _stop_private_head(grace_s: float = 30.0) -> None:
    """Close the head's stdin (it shuts Ray down and exits); past `grace_s`, kill its
    process group (the head and the daemons it started)."""
    global _head, _head_drain
    head, _head = _head, None
    if _head_drain is not None:
        _head_drain.cancel()
        _head_drain = None
    if head is None:
        return
    if head.stdin is not None:
        head.stdin.close()
    try:
        await asyncio.wait_for(head.wait(), max(grace_s, 0.001))
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        await head.wait()


async def place(config: RayConfig, timeout_s: float) -> Any:
    """A placement group of `config.workers` bundles of `cpus_per_worker` CPUs laid out by
    `config.strategy`, ready within `timeout_s`; otherwise it is removed and the error says
    what the cluster has."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{"CPU": config.cpus_per_worker} for _ in range(config.workers)]
    group = placement_group(bundles, strategy=config.strategy.upper())
    try:
        await asyncio.wait_for(as_future(group.ready()), timeout_s)
    except (TimeoutError, Exception) as exc:
        remove_placement_group(group)
        nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        cpus = [n.get("Resources", {}).get("CPU", 0) for n in nodes]
        raise RuntimeError(
            f"cannot place ray.workers={config.workers} actors of "
            f"ray.cpus_per_worker={config.cpus_per_worker:g} CPUs with "
            f"ray.strategy={config.strategy} within {timeout_s:.0f}s: the cluster has "
            f"{len(nodes)} nodes with {cpus} CPUs ({type(exc).__name__})"
        ) from None
    return group


def actor_options(config: RayConfig, group: Any, index: int) -> dict[str, Any]:
    """`.options(...)` of the actor on bundle `index` of `group`: it reserves that bundle's
    CPUs, is not restarted by Ray (the service decides what a lost actor means), and runs
    calls concurrently (async actor)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "num_cpus": config.cpus_per_worker,
        "max_restarts": 0,
        "max_concurrency": 1000,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        ),
    }


class SpreadActors:
    """Actors of one class spread over a Ray cluster by one placement group (the reward's
    verifier nodes, the sandbox's nodes): joined, placed and started together within
    `ray.start_timeout_s`, stopped together. Each actor class has async `start()`, which
    returns its node id, and `stop()`."""

    def __init__(self, config: RayConfig) -> None:
        self.config = config
        self.actors: list[Any] = []
        self.node_ids: list[str] = []
        """The node of each actor, as its `start()` returned it."""
        self._group: Any = None
        self._owns_ray = False

    async def start(self, actor_class: type, *args: Any, what: str) -> None:
        """`config.workers` actors of `actor_class(*args)`; on any failure everything
        started so far is stopped and the error raised (`what` names them in it)."""
        limit = self.config.start_timeout_s
        deadline = time.monotonic() + limit
        try:
            self._owns_ray = await connect(self.config)
            self._group = await place(self.config, deadline - time.monotonic())
            import ray

            remote: Any = ray.remote(actor_class)
            self.actors = [
                remote.options(**actor_options(self.config, self._group, i)).remote(*args)
                for i in range(self.config.workers)
            ]
            starts = [as_future(a.start.remote()) for a in self.actors]
            left = max(1.0, deadline - time.monotonic())
            try:
                self.node_ids = list(await asyncio.wait_for(asyncio.gather(*starts), left))
            except TimeoutError:
                raise RuntimeError(
                    f"{what} did not start within ray.start_timeout_s={limit:g}s"
                ) from None
        except BaseException:
            await self.stop()
            raise

    async def stop(self, lost: set[int] | frozenset[int] = frozenset()) -> None:
        """Ask every actor not `lost` to stop (each within `ray.call_timeout_s`), kill
        them all, remove the placement group and shut down the Ray this set started."""
        import ray

        if self.actors:
            await asyncio.gather(
                *(
                    asyncio.wait_for(as_future(a.stop.remote()), self.config.call_timeout_s)
                    for i, a in enumerate(self.actors)
                    if i not in lost
                ),
                return_exceptions=True,
            )
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._group = None
        await shutdown(self._owns_ray)
        self._owns_ray = False


def node_id() -> str:
    """This process's Ray node id (inside an actor)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


def as_future(ref: Any) -> asyncio.Future[Any]:
    """A Ray ObjectRef as an asyncio future, so that `asyncio.wait_for` can bound it."""
    return asyncio.wrap_future(ref.future())


def is_actor_lost(exc: BaseException) -> bool:
    """Whether `exc` says the actor (or its node) is gone, so the call may go elsewhere."""
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(exc, RayActorError | ActorUnavailableError)


async def shutdown(owned: bool) -> None:
    """Leave Ray, and stop the private Ray `connect` started (when `owned`)."""
    if owned:
        import ray

        await asyncio.to_thread(ray.shutdown)
        await _stop_private_head()


def no_uv_runtime_env() -> None:
    """Keep Ray from re-running its workers through `uv run`: under a `uv run` driver, Ray
    >= 2.43 makes every worker `uv run` (which syncs the environment, and stalled start-up
    for minutes on a loaded host; see rlfleet_rollout.engines.pool). The service already
    runs in the right environment. An explicit `RAY_ENABLE_UV_RUN_RUNTIME_ENV` is kept."""
    if "RAY_ENABLE_UV_RUN_RUNTIME_ENV" in os.environ:
        return
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray imported already: its constant was read at import
        constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False  # type: ignore[attr-defined]
