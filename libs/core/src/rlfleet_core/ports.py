"""Ports without a race: a service binds port 0 itself and reports what it got.

Picking a free port by binding port 0, closing the socket and handing the number to a
child leaves a window in which anything else on the host may take that port (the
time-of-check/time-of-use race: rare on a laptop, routine with thousands of launches).
So launchers start a service with `--port 0 --http-port 0 --port-file F`: the bootstrap
(`rlfleet_core.server`) binds both ports, then writes `{"grpc": P, "http": H, "pid": N}`
to F atomically (temporary file + rename) *before* its heavy start-up, and the launcher
waits for F (`wait_for_port_file`).

Why a file and not fd handover (the launcher binding and passing the listening socket to
the child): grpc.aio cannot adopt a listening socket (`add_insecure_port` takes only an
address), so only the HTTP half could be handed over. A file also works through
`python -m`, a shell, srun or a container entry point, where an inherited fd would not.

`pick_free_port` stays for the cases that need a number before the process exists
(a torch rendezvous MASTER_PORT, a port compose publishes): it still has the race.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PortFileError(RuntimeError):
    """The service never reported its ports (exited, or too slow); says which."""


@dataclass(frozen=True)
class BoundPorts:
    grpc: int
    http: int | None
    pid: int


def write_port_file(path: str | Path, grpc: int, http: int | None) -> None:
    """Write the bound ports atomically: a reader sees no file or the whole file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"grpc": grpc, "http": http, "pid": os.getpid()})
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_port_file(path: str | Path) -> BoundPorts | None:
    """The ports in `path`, or None while it does not exist yet."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    http = data.get("http")
    return BoundPorts(int(data["grpc"]), None if http is None else int(http), int(data["pid"]))


def wait_for_port_file(
    path: str | Path,
    process: subprocess.Popen[Any] | None = None,
    timeout_s: float = 120.0,
    poll_s: float = 0.02,
) -> BoundPorts:
    """Wait until the service writes `path`. With `process`, the file must name its pid
    (a file left by an earlier run is not taken for this one's), and an exit while
    waiting raises at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        ports = read_port_file(path)
        if ports is not None and (process is None or ports.pid == process.pid):
            return ports
        if process is not None and process.poll() is not None:
            raise PortFileError(
                f"exited with code {process.returncode} before binding its ports ({path})"
            )
        if time.monotonic() >= deadline:
            raise PortFileError(f"did not report its ports in {path} within {timeout_s:.0f} s")
        time.sleep(poll_s)


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago. RACY: another process may bind it before the
    caller does. Only for numbers needed before the process that binds them exists
    (torch's MASTER_PORT, ports compose publishes); a service started by rlfleet binds
    port 0 itself and reports it (`wait_for_port_file`)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
