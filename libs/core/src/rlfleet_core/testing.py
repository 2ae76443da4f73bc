"""Test helpers for services: run a service in-process on a free loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from grpc import aio

from rlfleet_core.config import load_config
from rlfleet_core.server import RunningServer, ServiceDefinition, start_service


@contextlib.asynccontextmanager
async def running_service(
    definition: ServiceDefinition, overrides: Sequence[str] = (), http: bool = False
) -> AsyncIterator[RunningServer]:
    """Start `definition` (with dotted `overrides`) on free ports; stop it on exit."""
    flags = ["server.port=0", *(["server.http_port=0"] if http else [])]
    config = load_config(definition.config_model, overrides=[*flags, *overrides])
    running = await start_service(definition, config)
    try:
        yield running
    finally:
        running.stop_event.set()
        await running.done


def add_bytes_methods(
    server: aio.Server,
    service_name: str,
    unary: Mapping[str, Callable[..., Any]],
    streams: Mapping[str, Callable[..., Any]] | None = None,
) -> None:
    """Serve raw-bytes methods (no protobuf) under `service_name`: `unary` ones answer once,
    `streams` ones yield answers (the core's server tests need no generated stubs)."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(f) for name, f in unary.items()
    }
    for name, f in (streams or {}).items():
        handlers[name] = grpc.unary_stream_rpc_method_handler(f)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))


async def count_up_to(
    request: bytes, context: aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    """A stream of "0", "1", ... up to the number the request names."""
    for i in range(int(request.decode())):
        yield str(i).encode()


@contextlib.contextmanager
def ray_cluster(
    nodes: int = 2, num_cpus: int = 1, object_store_bytes: int = 80 << 20
) -> Iterator[Any]:
    """A real Ray cluster of `nodes` nodes on this host (a head plus workers, each its own
    raylet, so each has its own node id), always torn down: only its own processes are
    stopped (never `ray stop`, which kills every Ray on the host). Its `.address` is what
    a service's `ray.address` takes; `.list_all_nodes()` gives the nodes to remove."""
    from rlfleet_core.raycluster import allow_slow_gcs_start, is_startup_timeout, no_uv_runtime_env

    no_uv_runtime_env()
    allow_slow_gcs_start(120)
    from ray.cluster_utils import Cluster

    args: dict[str, Any] = {"num_cpus": num_cpus, "object_store_memory": object_store_bytes}
    for attempt in range(3):
        cluster = Cluster()
        try:
            cluster.add_node(**args, include_dashboard=False)  # the first node is the head
            for _ in range(nodes - 1):
                cluster.add_node(**args)
            break
        except Exception as exc:
            cluster.shutdown()  # type: ignore[no-untyped-call]
            # Ray's own fixed start-up waits: a loaded host can miss them, and the next
            # try usually makes it.
            if not is_startup_timeout(exc) or attempt == 2:
                raise
    try:
        yield cluster
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]


def ray_actor_pids(node: Any, actor_class: str) -> list[int]:
    """Pids of the `actor_class` actors on `node` (a `ray_cluster` node): the raylet's
    children whose process title Ray set to `ray::<actor_class>...`."""
    import os

    from ray._private import ray_constants

    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                title = fh.read().split(b"\0")[0].decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == raylet and title.startswith(f"ray::{actor_class}"):
            found.append(int(name))
    return found
