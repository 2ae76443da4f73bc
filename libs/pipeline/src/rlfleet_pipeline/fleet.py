"""Starts rlfleet services as local processes on loopback and stops them cleanly.

Used by `rlfleet up`, `rlfleet run`, `rlfleet rl` and the curriculum pass of `rlfleet data
prep`. Each service runs as its own `python -m rlfleet_<service>` (no CLI in between) in
its own process session (so Ctrl-C in the terminal reaches only the supervisor, which then
stops the services in order), logs to <run_dir>/logs/<service>.log, and is considered
up once the standard gRPC health check answers SERVING.

Ports: each service binds port 0 itself and writes the ports it got to
<run_dir>/logs/<service>.ports.json before its heavy start-up (`--port-file`,
`rlfleet_core.ports`), so no port is ever picked by one process and bound by another.

Start-up: every service starts at once, except that one needing another's address (the
reward gateway: `sandbox.target`, `swe.target`, `judge.base_url` of the `judge` rollout)
starts as soon as that one has reported its port; it need not wait for SERVING, since the
gateway's sandbox channel and judge client connect lazily and the fleet hands out no
address before all are SERVING. The times of each (spawned, ports
bound, SERVING) go to <run_dir>/startup.json and to `say` (stderr by default). A service
that exits or times out while starting is named with its log tail, and the others are
stopped.

Authentication: unless the caller already set RLFLEET_AUTH_TOKEN_FILE or
RLFLEET_AUTH_TOKEN, the fleet writes a fresh token to <run_dir>/auth_token (0600) and sets
RLFLEET_AUTH_TOKEN_FILE in this process while it runs, so the services (which inherit it)
require it and every rlfleet client started here (the trainer, the curriculum pass,
in-process clients) sends it. `stop()` restores the variable.

Caches: with RLFLEET_CACHE_DIR set, the cache variables derived from it
(`rlfleet_pipeline.caches`) are set in this process while the fleet runs, likewise.

A pipeline changes the running fleet between stages (`change`): services that stay as
they were keep running, others stop, start or restart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
from rlfleet_contracts.run_folder import PipelineFolder
from rlfleet_core.auth import TOKEN_FILE_ENV, AuthError, token_from_env, write_token_file
from rlfleet_core.client import check_health
from rlfleet_core.ports import read_port_file

from rlfleet_pipeline.caches import cache_env
from rlfleet_pipeline.services import service_command
from rlfleet_pipeline.startup_times import StartupTimes

# Dependencies first (the reward gateway calls the sandbox); stopped in reverse. `judge` is
# a second rollout service serving the judge model (services.SERVICE_INSTANCES).
START_ORDER = ("sandbox", "judge", "reward", "rollout", "swe-runner", "trainer")
DEPENDS_ON = {"reward": ("sandbox", "swe-runner", "judge")}
"""A service starts once these (when in the fleet) have reported their ports."""


OMP_WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


class FleetError(RuntimeError):
    pass


class _Cancelled(Exception):
    """Another service failed (or Ctrl-C): this one's start-up is abandoned."""


def tail_lines(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file ("" if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class ServiceProcess:
    name: str
    log_path: Path
    port_file: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    port: int = 0
    """gRPC port, once the service reported it (0 before)."""
    http_port: int = 0
    times: StartupTimes = field(default_factory=StartupTimes)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 15) -> str:
        return tail_lines(self.log_path, lines)


def wiring(
    name: str,
    services: Sequence[str],
    target: Callable[[str], str],
    http: Callable[[str], str] | None = None,
) -> list[str]:
    """Overrides that point service `name` at the others of a fleet of `services` (the
    user's own overrides come after, so they win); `target(other)` is its gRPC address,
    `http(other)` its HTTP one (default: `target`)."""
    wired = []
    if name == "reward" and "judge" in services:  # the judge model's OpenAI face, which
        # checks the fleet's token like every service of the fleet
        wired += [f"judge.base_url=http://{(http or target)('judge')}/v1", "judge.fleet_token=true"]
    if name == "reward" and "sandbox" in services:
        wired.append(f"sandbox.target={target('sandbox')}")
    if name == "reward" and "swe-runner" in services:  # the swe_agent episodes' runner
        wired.append(f"swe.target={target('swe-runner')}")
    return wired


class LocalFleet:
    """`with LocalFleet(["reward", "sandbox"], run_dir) as fleet: fleet.target("reward")`."""

    def __init__(
        self,
        services: Sequence[str],
        run_dir: Path,
        overrides: dict[str, list[str]] | None = None,
        start_timeout_s: float = 600.0,
        stop_timeout_s: float = 15.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        unknown = [s for s in services if s not in START_ORDER]
        if unknown:
            raise FleetError(f"unknown service(s) {unknown}; choose from {', '.join(START_ORDER)}")
        self.services = sorted(set(services), key=START_ORDER.index)
        self.run_dir = run_dir
        self.overrides = overrides or {}
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.say = say if say is not None else _to_stderr
        """Where the start-up report goes (stderr by default)."""
        self.processes: dict[str, ServiceProcess] = {}
        """Spawned services, in start order once `start` returned."""
        self.token_file: Path | None = None
        """The token this fleet generated (None when the caller's token is used)."""
        self.startup_s: float | None = None
        """Seconds until every service was SERVING (None before, or when start failed)."""
        self._saved_env: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._bound = {name: threading.Event() for name in self.services}
        self._cancel = threading.Event()

    def _set_env(self, name: str, value: str) -> None:
        """Set `name` in this process (inherited by every child) until `stop`."""
        self._saved_env.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def _set_up_token(self) -> None:
        try:
            if token_from_env() is not None:  # the caller's own token: the fleet uses it
                return
        except AuthError as exc:
            raise FleetError(str(exc)) from None
        path = PipelineFolder(self.run_dir).auth_token
        write_token_file(path)
        self.token_file = path.absolute()
        self._set_env(TOKEN_FILE_ENV, str(self.token_file))

    def _set_up_caches(self) -> None:
        for name, value in cache_env(os.environ).items():
            self._set_env(name, value)

    def _set_up_threads(self) -> None:
        # A local fleet's services and the trainer beside them share this machine's cores.
        # OpenMP threads spin while they wait for work and take the CPU from the threads
        # that have some: two 2-thread torch loops side by side on 2 cores took 21.4 s
        # each, 11.5 s with PASSIVE (docs/development.md, "Spinning threads"). An
        # operator's own setting is kept.
        if not os.environ.get(OMP_WAIT_POLICY_ENV, "").strip():
            self._set_env(OMP_WAIT_POLICY_ENV, "PASSIVE")

    def _restore_env(self) -> None:
        for name, previous in self._saved_env.items():
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous
        self._saved_env = {}

    def target(self, service: str) -> str:
        return self.processes[service].target

    def _spawn(self, name: str, wiring: list[str]) -> ServiceProcess:
        # run_dir is a pipeline's or a stage's folder: both keep service logs in logs/.
        log_dir = PipelineFolder(self.run_dir).logs
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        port_file = log_dir / f"{name}.ports.json"
        port_file.unlink(missing_ok=True)
        cmd = [
            *service_command(name),
            "--port",
            "0",
            "--http-port",
            "0",
            "--port-file",
            str(port_file.absolute()),
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
        return ServiceProcess(name, log_path, port_file, process)

    def _wiring(self, name: str) -> list[str]:
        return wiring(
            name,
            self.services,
            lambda other: self.processes[other].target,
            lambda other: f"127.0.0.1:{self.processes[other].http_port}",
        )

    def _start_one(self, name: str, started: float) -> None:
        """Wait for the dependencies' ports, spawn, wait for the ports, wait for SERVING."""
        for dep in DEPENDS_ON.get(name, ()):
            if dep in self._bound and dep in self.services:
                while not self._bound[dep].wait(0.05):
                    if self._cancel.is_set():
                        raise _Cancelled
        with self._lock:
            if self._cancel.is_set():
                raise _Cancelled
            proc = self.processes[name] = self._spawn(name, self._wiring(name))
        proc.times.spawned_s = time.monotonic() - started
        deadline = time.monotonic() + self.start_timeout_s
        last = "no ports reported"
        while time.monotonic() < deadline:
            if self._cancel.is_set():
                raise _Cancelled
            code = proc.process.poll()
            if code is not None:
                raise FleetError(
                    f"{name} exited with code {code} while starting; "
                    f"last log lines ({proc.log_path}):\n{proc.log_tail()}"
                )
            if not self._bound[name].is_set():
                ports = read_port_file(proc.port_file)
                if ports is not None and ports.pid == proc.process.pid:
                    proc.port, proc.http_port = ports.grpc, ports.http or 0
                    proc.times.bound_s = time.monotonic() - started
                    self._bound[name].set()
                    continue
            else:
                try:
                    last = check_health(proc.target, timeout_s=2.0)
                    if last == "SERVING":
                        proc.times.serving_s = time.monotonic() - started
                        return
                except grpc.RpcError as exc:
                    last = exc.code().name
            time.sleep(0.05)
        raise FleetError(
            f"{name} not SERVING after {self.start_timeout_s:.0f}s (last: {last}); "
            f"last log lines ({proc.log_path}):\n{proc.log_tail()}"
        )

    def start(self) -> None:
        """Start every service in parallel (see the module docstring), then write and
        report the start-up times. On any failure the services started are stopped."""
        try:
            self._set_up_token()
            self._set_up_caches()
            self._set_up_threads()
            self._start_services(self.services)
        except BaseException:
            self.stop()
            raise
        for line in self.report_lines():
            self.say(line)

    def _start_services(self, names: Sequence[str]) -> None:
        """Start `names` in parallel (the others of self.services already run), wait for
        SERVING, write the start-up report. Raises the first real failure."""
        started = time.monotonic()
        self._cancel.clear()
        for name in names:
            self._bound[name] = threading.Event()
        pool = ThreadPoolExecutor(max_workers=max(len(names), 1), thread_name_prefix="fleet")
        try:
            futures = {pool.submit(self._start_one, n, started): n for n in names}
            done, _ = wait_futures(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                self._cancel.set()
                pool.shutdown(wait=True)
                # The first real failure, not a start-up abandoned because of it.
                errors = [e for f in futures if (e := f.exception()) is not None]
                raise next(e for e in errors if not isinstance(e, _Cancelled)) from None
            self.startup_s = time.monotonic() - started
            self.processes = {n: self.processes[n] for n in self.services}
        except BaseException:
            self._cancel.set()
            pool.shutdown(wait=True)
            self._write_report()
            raise
        pool.shutdown(wait=True)
        self._write_report()

    def change(self, services: Sequence[str], overrides: dict[str, list[str]]) -> list[str]:
        """Make the running fleet `services` with `overrides` (a pipeline's next stage):
        stop what is no longer needed, restart what is given other overrides or wired to
        a service that changed (the reward gateway, when a judge or swe-runner comes or
        goes), start what is new; services left as they were keep serving (the rollout
        keeps its engine loaded). Returns what was (re)started. On a failure the whole
        fleet is stopped, as in `start`."""
        unknown = [s for s in services if s not in START_ORDER]
        if unknown:
            raise FleetError(f"unknown service(s) {unknown}; choose from {', '.join(START_ORDER)}")
        wanted = sorted(set(services), key=START_ORDER.index)
        restart = {
            n
            for n in self.processes
            if n not in wanted or self.overrides.get(n, []) != overrides.get(n, [])
        }
        for name in wanted:  # a dependency that changes (or comes, or goes) rewires `name`
            deps = DEPENDS_ON.get(name, ())
            before = {d for d in deps if d in self.processes}
            if {d for d in deps if d in wanted} != before or before & restart:
                restart.add(name)
        stopping = [self.processes[n] for n in self.services if n in restart]
        self._stop_processes(stopping)
        for proc in stopping:
            del self.processes[proc.name]
        self.services, self.overrides = wanted, dict(overrides)
        new = [n for n in wanted if n not in self.processes]
        if stopping or new:
            self.say(
                f"fleet: stopped {', '.join(p.name for p in stopping) or 'none'}, "
                f"starting {', '.join(new) or 'none'}"
            )
        try:
            self._start_services(new)
        except BaseException:
            self.stop()
            raise
        if new:
            for line in self.report_lines():
                self.say(line)
        return new

    def exited(self) -> str | None:
        """A line naming the first service that is no longer running (its exit code and
        log tail), or None while every one runs: a pipeline stops its stage on it."""
        for name, proc in self.processes.items():
            code = proc.process.poll()
            if code is not None:
                return f"{name} exited with code {code}; last log lines ({proc.log_path}):\n{proc.log_tail()}"
        return None

    def report(self) -> dict[str, object]:
        """The start-up report: seconds from the fleet's start, per service."""
        return {
            "total_s": None if self.startup_s is None else round(self.startup_s, 3),
            "services": {
                name: {
                    **proc.times.row(),
                    "after": [d for d in DEPENDS_ON.get(name, ()) if d in self.services],
                    "grpc_port": proc.port or None,
                    "http_port": proc.http_port or None,
                }
                for name, proc in self.processes.items()
            },
        }

    def _write_report(self) -> None:
        path = PipelineFolder(self.run_dir).startup
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.report(), indent=2) + "\n")

    def report_lines(self) -> list[str]:
        """The start-up report as text (what `say` is given)."""
        total = f"{self.startup_s:.1f} s" if self.startup_s is not None else "-"
        lines = [
            f"services SERVING in {total} ({PipelineFolder(self.run_dir).startup}); "
            "seconds from the start:",
            f"  {'service':<11} {'spawned':>8} {'bound':>8} {'SERVING':>8} {'load':>8}",
        ]

        def cell(value: float | None) -> str:
            return f"{value:8.2f}" if value is not None else f"{'-':>8}"

        for name, proc in self.processes.items():
            row = proc.times.row()
            lines.append(
                f"  {name:<11} {cell(row['spawned_s'])} {cell(row['bound_s'])} "
                f"{cell(row['serving_s'])} {cell(row['load_s'])}"
            )
        return lines

    def stop(self) -> dict[str, int | None]:
        """SIGTERM in reverse start order, then SIGKILL what outlives the timeout."""
        codes = self._stop_processes(
            [self.processes[n] for n in self.services if n in self.processes]
        )
        self._restore_env()
        return codes

    def _stop_processes(self, ordered: list[ServiceProcess]) -> dict[str, int | None]:
        for proc in reversed(ordered):
            if proc.process.poll() is None:
                proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        codes: dict[str, int | None] = {}
        for proc in ordered:
            try:
                codes[proc.name] = proc.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.process.pid, signal.SIGKILL)
                codes[proc.name] = proc.process.wait()
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


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
