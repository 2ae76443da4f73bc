"""Starts rlfleet services as local processes on loopback and stops them cleanly.

Used by `rlfleet up`, `rlfleet run`, `rlfleet rl` and the curriculum pass of `rlfleet data
prep`. Each service runs as its own `python -m rlfleet_<service>` (no CLI in between) in
its own process session (so Ctrl-C in the terminal reaches only the supervisor, which then
stops the services in order), logs to <run_dir>/logs/<service>.log, and is considered
up once the standard gRPC health check answers SERVING.

Authentication: unless the caller already set RLFLEET_AUTH_TOKEN_FILE or
RLFLEET_AUTH_TOKEN, the fleet writes a fresh token to <run_dir>/auth_token (0600) and sets
RLFLEET_AUTH_TOKEN_FILE in this process while it runs, so the services (which inherit it)
require it and every rlfleet client started here (the trainer, the curriculum pass,
in-process clients) sends it. `stop()` restores the variable.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
from rlfleet_contracts.run_folder import PipelineFolder
from rlfleet_core.auth import TOKEN_FILE_ENV, AuthError, token_from_env, write_token_file
from rlfleet_core.client import check_health

from rlfleet_pipeline.services import service_command

# Start order: dependencies first (the reward gateway calls the sandbox); they are stopped
# in reverse.
START_ORDER = ("sandbox", "reward", "rollout", "swe-runner", "trainer")


class FleetError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def tail_lines(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file ("" if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class ServiceProcess:
    name: str
    port: int
    http_port: int
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 15) -> str:
        return tail_lines(self.log_path, lines)


class LocalFleet:
    """`with LocalFleet(["reward", "sandbox"], run_dir) as fleet: fleet.target("reward")`."""

    def __init__(
        self,
        services: Sequence[str],
        run_dir: Path,
        overrides: dict[str, list[str]] | None = None,
        start_timeout_s: float = 600.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        unknown = [s for s in services if s not in START_ORDER]
        if unknown:
            raise FleetError(f"unknown service(s) {unknown}; choose from {', '.join(START_ORDER)}")
        self.services = sorted(set(services), key=START_ORDER.index)
        self.run_dir = run_dir
        self.overrides = overrides or {}
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.processes: dict[str, ServiceProcess] = {}
        self.token_file: Path | None = None
        """The token this fleet generated (None when the caller's token is used)."""
        self._saved_token_env: tuple[bool, str | None] = (False, None)

    def _set_up_token(self) -> None:
        try:
            if token_from_env() is not None:  # the caller's own token: the fleet uses it
                return
        except AuthError as exc:
            raise FleetError(str(exc)) from None
        path = PipelineFolder(self.run_dir).auth_token
        write_token_file(path)
        self.token_file = path.absolute()
        self._saved_token_env = (True, os.environ.get(TOKEN_FILE_ENV))
        os.environ[TOKEN_FILE_ENV] = str(self.token_file)

    def _restore_token_env(self) -> None:
        saved, previous = self._saved_token_env
        if not saved:
            return
        if previous is None:
            os.environ.pop(TOKEN_FILE_ENV, None)
        else:
            os.environ[TOKEN_FILE_ENV] = previous
        self._saved_token_env = (False, None)

    def target(self, service: str) -> str:
        return self.processes[service].target

    def _spawn(self, name: str, port: int, http_port: int, wiring: list[str]) -> ServiceProcess:
        # run_dir is a pipeline's or a stage's folder: both keep service logs in logs/.
        log_dir = PipelineFolder(self.run_dir).logs
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        cmd = [
            *service_command(name),
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            *wiring,
            *self.overrides.get(name, []),
        ]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return ServiceProcess(name, port, http_port, log_path, process)

    @staticmethod
    def _wiring(name: str, ports: dict[str, tuple[int, int]]) -> list[str]:
        """Overrides that point a service at the others of this fleet (the user's own
        overrides come after, so they win)."""
        if name == "reward" and "sandbox" in ports:
            return [f"sandbox.target=127.0.0.1:{ports['sandbox'][0]}"]
        return []

    def _wait_serving(self, proc: ServiceProcess) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            code = proc.process.poll()
            if code is not None:
                raise FleetError(
                    f"{proc.name} exited with code {code} while starting; "
                    f"last log lines ({proc.log_path}):\n{proc.log_tail()}"
                )
            try:
                last = check_health(proc.target, timeout_s=2.0)
                if last == "SERVING":
                    return
            except grpc.RpcError as exc:
                last = exc.code().name
            time.sleep(0.2)
        raise FleetError(
            f"{proc.name} not SERVING after {self.start_timeout_s:.0f}s (last: {last}); "
            f"see {proc.log_path}"
        )

    def start(self) -> None:
        """Spawn every service at once (vLLM's start dominates; the others start beside
        it), then wait for each to serve. Ports are chosen first so that the reward
        gateway is told where the sandbox listens."""
        try:
            self._set_up_token()
            ports = {name: (free_port(), free_port()) for name in self.services}
            for name in self.services:
                self.processes[name] = self._spawn(name, *ports[name], self._wiring(name, ports))
            for proc in self.processes.values():
                self._wait_serving(proc)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> dict[str, int | None]:
        """SIGTERM in reverse start order, then SIGKILL what outlives the timeout."""
        for proc in reversed(list(self.processes.values())):
            if proc.process.poll() is None:
                proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        codes: dict[str, int | None] = {}
        for name, proc in self.processes.items():
            try:
                codes[name] = proc.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.process.pid, signal.SIGKILL)
                codes[name] = proc.process.wait()
        self._restore_token_env()
        return codes

    def __enter__(self) -> LocalFleet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
