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
import logging
import os
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
    """`local`: the service starts a private one-node Ray in its own process tree (and stops
    it on exit). `auto`: the cluster that `ray start` runs on this node (a SLURM job starts
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
    if config.address == "local":
        allow_slow_gcs_start(config.start_timeout_s)
        kwargs: dict[str, Any] = {
            # Said outright: with no address, ray.init joins whatever cluster RAY_ADDRESS or
            # this machine's last `ray start` names (another test's, another job's), and then
            # refuses num_cpus. `local` always starts this service's own instance.
            "address": "local",
            "num_cpus": config.num_cpus,
            "object_store_memory": config.object_store_memory_bytes,
            "include_dashboard": False,
        }
    else:
        kwargs = {"address": config.address}
    deadline = time.monotonic() + config.start_timeout_s
    attempt = 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        try:
            await asyncio.wait_for(
                asyncio.to_thread(ray.init, log_to_driver=False, configure_logging=False, **kwargs),
                max(left, 1.0),
            )
            return True
        except TimeoutError:
            raise RuntimeError(
                f"Ray at ray.address={config.address!r} did not come up within "
                f"ray.start_timeout_s={config.start_timeout_s:g}s"
            ) from None
        except Exception as exc:
            await asyncio.to_thread(ray.shutdown)
            left = deadline - time.monotonic()
            if not is_startup_timeout(exc) or left < 10:
                raise RuntimeError(
                    f"cannot join Ray at ray.address={config.address!r}: {exc}"
                ) from exc
            logger.warning(
                "ray.init attempt %d failed (%s); trying again (%.0f s left)", attempt, exc, left
            )


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
    if owned:
        import ray

        await asyncio.to_thread(ray.shutdown)


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
