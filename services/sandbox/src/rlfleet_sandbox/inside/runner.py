"""The program that runs *inside* every sandbox (stdlib only; never imported by the service
at run time — its source is handed to `python3 -I -c` inside bubblewrap).

Why a resident runner: starting an interpreter costs ~15 ms of CPU, more than most
snippets. The runner starts once per sandbox ahead of demand (the warm pool) and then:

* one-shot mode (`oneshot`): for each request it forks a child that becomes the program
  (Python code is exec'd in the already-initialised interpreter; bash is exec'd), waits
  for it with a wall-clock deadline, kills every other process of the sandbox, wipes the
  writable places and reports. The runner itself never sees the program's code, files,
  stdin or output: the child reads its payload from a pipe the service passes with
  SCM_RIGHTS, so a later child forked from the same runner cannot find an earlier
  program's data in its copy of the runner's memory.
* session mode (`session`): cells run in the runner process itself, in one persistent
  namespace, so variables survive between calls (an ipython-like kernel). Processes a
  cell started are killed when it ends; a watchdog thread holds the session to
  `cpu_time_s` (+1 s) of CPU per cell, its threads and children included, and the
  runner with a cell's children together to the session's `memory_bytes`.

Before it says ready, the runner finishes the sandbox (see `harden`): it mounts /tmp and
/dev/shm afresh with an inode limit (bwrap cannot set one), drops the two capabilities it
was started with for that, and installs the service's seccomp filter. Any failure there
ends the runner before `ready`, so the sandbox never serves half-built.

Wire protocol on the control socket (AF_UNIX SOCK_SEQPACKET, one JSON object per
message): runner → service `{"op": "ready"}` once, then one `{"op": "done", ...}` per
run; service → runner `{"op": "run", ...}` carrying the fds [payload, stdin, stdout,
stderr], or `{"op": "kill"}` to stop the current run (one-shot mode only).
"""

from __future__ import annotations

import ast
import atexit
import base64
import contextlib
import ctypes
import gc
import json
import math
import os
import resource
import select
import signal
import socket
import sys
import threading
import time
import traceback
import types
from typing import Any, NoReturn

WORK_DIR = "/tmp/work"
"""The program's cwd and HOME; recreated empty for every one-shot run."""
SCRATCH_DIRS = ("/tmp", "/dev/shm")
"""Writable places that are wiped after every one-shot run."""
MAX_MESSAGE_BYTES = 1 << 16
PR_SET_DUMPABLE = 4
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5
SYS_KEYCTL = 250  # x86-64
IPC_RMID = 0
CLONE_NEWNS = 0x00020000
MS_NOSUID = 2
MS_NODEV = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
WATCH_INTERVAL_S = 0.1
IDLE_WATCH_INTERVAL_S = 1.0
"""Between cells the watchdog looks less often: its own CPU counts against the runner's
RLIMIT_CPU (which also stands behind it, see `run_cell`)."""
CPU_GRACE_S = 1.0
"""A session cell is stopped this much CPU past its limit (as RLIMIT_CPU's hard limit)."""
RUN_WATCH_FIRST_S = 0.01
RUN_WATCH_INTERVAL_S = 0.025
"""How often a one-shot run's whole process tree is measured (memory, CPU): the first
look soon (a short run ends before it and costs nothing more), then every 25 ms, so a
run can overshoot its memory budget by what it allocates in ~25 ms before it is killed
(bounded by the per-process RLIMIT_AS too)."""
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

_libc = ctypes.CDLL(None, use_errno=True)


class CellTimeout(BaseException):
    """Raised inside a session cell when its wall-clock limit passes (state is kept)."""


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def apply_limits(limits: dict[str, Any], session: bool = False) -> None:
    """rlimits for the program. A forked one-shot child starts with zero CPU used: soft
    limit = SIGXCPU, hard = SIGKILL a second later. A session's runner lives on, so its
    CPU hard limit stays open and each cell moves the soft limit (see `run_cell`)."""
    cpu = math.ceil(limits["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY if session else cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    # The runner (the sandbox's init) runs under the same uid and counts too.
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"] + 1,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_size_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # No POSIX message queues: they would outlive the program inside a reused sandbox.
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))


def write_files(files: list[dict[str, Any]]) -> None:
    for item in files:
        path = os.path.join(WORK_DIR, item["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(item["content"]))
        if item.get("executable"):
            os.chmod(path, 0o755)


def compile_cell(code: str, interactive: bool) -> list[types.CodeType]:
    """Code objects for `code`; with `interactive`, a trailing expression is compiled in
    'single' mode so its value is echoed like IPython's Out[] (via sys.displayhook)."""
    if not interactive:
        return [compile(code, "<string>", "exec")]
    tree = ast.parse(code, "<cell>", "exec")
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Interactive(body=[tree.body.pop()])
        return [compile(tree, "<cell>", "exec"), compile(last, "<cell>", "single")]
    return [compile(tree, "<cell>", "exec")]


def run_python(code: str, namespace: dict[str, Any], interactive: bool) -> tuple[int, str]:
    """Exec `code` as `python -c` would. Returns (exit code, kind of uncaught error:
    "" for none or an ordinary exception, "memory" or "timeout")."""
    try:
        for obj in compile_cell(code, interactive):
            exec(obj, namespace)
    except SystemExit as exc:
        if exc.code is None:
            return 0, ""
        if isinstance(exc.code, int):
            return exc.code, ""
        print(exc.code, file=sys.stderr)
        return 1, ""
    except BaseException as exc:  # the program's own error: show it as Python would
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        with contextlib.suppress(OSError, ValueError):  # stderr may be closed (output cap)
            traceback.print_exception(type(exc), exc, tb)
        kind = "memory" if isinstance(exc, MemoryError) else ""
        return 1, "timeout" if isinstance(exc, CellTimeout) else kind
    return 0, ""


def become_program(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """In the forked child: set up fds, work dir and limits, then run the program; never
    returns (bash replaces the process, Python ends in `exit_program`)."""
    payload_fd, stdin_fd, stdout_fd, stderr_fd = fds
    os.setsid()
    for target, fd in ((0, stdin_fd), (1, stdout_fd), (2, stderr_fd)):
        os.dup2(fd, target)
    payload = json.loads(read_all(payload_fd))
    # No fd of the runner stays open in the program: it could forge what the runner
    # reads there (a "memory" note once turned an OK run into MEMORY).
    close_fds_except(-1)
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the runner ignores it
    os.chdir(WORK_DIR)
    try:
        write_files(payload["files"])
    except OSError as exc:
        print(f"sandbox: cannot write input file: {exc}", file=sys.stderr)
        exit_program(1)
    apply_limits(request["limits"])
    # Forked from the non-dumpable runner, the program would be non-dumpable too, and the
    # runner (without capabilities) could not read its /proc/<pid>/smaps_rollup to count
    # its memory by PSS. It holds nothing of the runner's worth hiding (the runner never
    # sees a program's data), so it may be dumpable; one that turns that off again is
    # counted by its whole RSS (see `pss_bytes`).
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    if request["language"] == "bash":
        # A deleted file of the run's /tmp (memfd_create is denied: its pages would not
        # be metered); bash reads it through the fd, its bytes count against the run.
        path = f"/tmp/.sandbox-script-{os.getpid()}"
        script = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(path)
        os.write(script, payload["code"].encode())
        os.lseek(script, 0, os.SEEK_SET)
        os.set_inheritable(script, True)
        os.execve("/bin/bash", ["bash", f"/proc/self/fd/{script}"], dict(os.environ))
    sys.argv = ["-c"]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    # A MemoryError shows in the traceback on stderr, which `classify` reads.
    exit_code, _kind = run_python(payload["code"], main.__dict__, interactive=False)
    exit_program(exit_code)


def exit_program(exit_code: int) -> NoReturn:
    """End the forked program as the interpreter would (join non-daemon threads, run
    atexit, flush) but skip finalisation: tearing down every module of a forked
    interpreter touches its copy-on-write pages and costs ~25 ms of CPU, more than the
    typical program."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            exit_code = exit_code or 120  # what CPython returns when the final flush fails
    os._exit(exit_code & 0xFF)


def close_fds_except(keep: int) -> None:
    """Close every fd above 2 but `keep` (listing them: closing all 65536 numbers one
    by one costs ~15 ms)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def kill_all() -> None:
    """SIGKILL every process of the sandbox but the runner (as init, it is exempt)."""
    with contextlib.suppress(ProcessLookupError):  # nothing left to kill
        os.kill(-1, signal.SIGKILL)


KILL_WAIT_S = 5.0
"""How long kill_others may take: SIGKILLed processes still exiting, or dead ones not yet
reaped, on a loaded machine."""


def kill_others() -> None:
    """Kill every process in this sandbox but the runner (its init, pid 1) and wait until
    they are gone from /proc; retried because a fork bomb forks between our kill and our
    look at /proc. As init, the runner inherits every orphan, so reaping here clears their
    zombies too: a zombie left behind would show in the next cell's /proc (a session's
    cell once listed the killed processes of the cell before it)."""
    me = os.getpid()
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            return
        alive = []
        for pid_s in others:
            try:
                with open(f"/proc/{pid_s}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid_s)
            except OSError:
                pass
        if time.monotonic() > deadline:
            if not alive:
                return  # dead, not yet reaped by whoever is init (not this runner)
            raise RuntimeError("could not kill the program's processes")
        time.sleep(0.001)


def wipe(path: str) -> None:
    """Empty `path`, however deep its tree: a loop walking by relative chdir (no
    recursion, which a 1,300-deep tree overflowed; no full paths, which pass PATH_MAX).
    Safe because every process of the sandbox is dead by now: nothing renames meanwhile."""
    os.chdir(path)
    below: list[str] = []
    while True:
        subdir = None
        with os.scandir(".") as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subdir = entry.name
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name)
        if subdir is not None:
            os.chmod(subdir, 0o700)
            os.chdir(subdir)
            below.append(subdir)
        elif below:
            os.chdir("..")
            os.rmdir(below.pop())
        else:
            break
    os.chdir("/")


def clear_ipc() -> None:
    """Remove SysV IPC objects and keyring contents the program left: both outlive
    processes and would be visible to the next program in this sandbox."""
    for kind, ctl in (("shm", "shmctl"), ("msg", "msgctl"), ("sem", "semctl")):
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            ipc_id = int(row.split()[1])
            if kind == "sem":
                getattr(_libc, ctl)(ipc_id, 0, IPC_RMID, 0)
            else:
                getattr(_libc, ctl)(ipc_id, IPC_RMID, None)
    for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        _libc.syscall(SYS_KEYCTL, KEYCTL_CLEAR, keyring)


def scrub(baseline_limits: list[tuple[int, int]]) -> bool:
    """Make the sandbox as the next program expects it; False if it cannot be trusted
    (e.g. the program lowered the runner's own rlimits with prlimit)."""
    kill_others()
    for path in SCRATCH_DIRS:
        wipe(path)
    clear_ipc()
    os.mkdir(WORK_DIR, 0o755)
    return current_limits() == baseline_limits


def current_limits() -> list[tuple[int, int]]:
    return [
        resource.getrlimit(getattr(resource, name))
        for name in dir(resource)
        if name.startswith("RLIMIT_")
    ]


def supervise(sock: socket.socket, child: int, timeout_s: float, meter: RunMeter) -> dict[str, Any]:
    """Wait for the child with a wall-clock deadline, or until the service asks to kill,
    measuring the run's process tree meanwhile (`meter`); kills everything when a budget
    is exceeded. Orphans (reparented to the runner, as init) are reaped as they die, so
    their CPU is counted exactly and their zombies do not hold process slots."""
    pidfd = os.pidfd_open(child)
    start = time.monotonic()
    deadline = start + timeout_s
    next_look = start + RUN_WATCH_FIRST_S
    timed_out = killed = over = False
    status: int | None = None
    usage: Any = None
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(sock, select.POLLIN)
    while True:
        now = time.monotonic()
        wait_ms = max(0, math.ceil((min(deadline, next_look) - now) * 1000))
        events = dict(poller.poll(wait_ms))
        if pidfd in events:
            break
        if sock.fileno() in events:
            message = sock.recv(MAX_MESSAGE_BYTES)
            if not message:  # the service is gone
                kill_all()
                sys.exit(0)
            killed = True
        elif time.monotonic() >= deadline:
            timed_out = True
        elif time.monotonic() >= next_look:
            reaped = reap_orphans(child)
            if reaped is not None:
                status, usage = reaped
                break
            over = meter.over()
            next_look = time.monotonic() + RUN_WATCH_INTERVAL_S
        if killed or timed_out or over:
            kill_all()
            break
    if not (killed or timed_out or over):
        # The program ended; what it left running is measured once more before it dies.
        meter.over()
    if status is None:
        _pid, status, usage = os.wait4(child, 0)
    os.close(pidfd)
    return {
        "wall_s": time.monotonic() - start,
        "max_rss_kb": usage.ru_maxrss,
        "exit_code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else -1,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
        "timed_out": timed_out,
        "killed": killed,
    }


def reap_orphans(child: int) -> tuple[int, Any] | None:
    """Reap every dead process the runner is parent of; the program's own wait status and
    rusage if it was among them."""
    found = None
    while True:
        try:
            pid, wait_status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == child:
            found = (wait_status, usage)


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    try:
        message, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE_BYTES, 8)
    except ConnectionResetError:
        return None
    if not message:
        return None
    return json.loads(message), fds


def serve_oneshot(sock: socket.socket) -> None:
    """Runner loop of a pooled sandbox; returns when the service hangs up (the forked
    children never return here)."""
    baseline = current_limits()
    while (received := receive(sock)) is not None:
        request, fds = received
        if request["op"] != "run":
            continue
        child = os.fork()
        if child == 0:
            sock.close()
            become_program(request, fds)
        for fd in fds:
            os.close(fd)
        meter = RunMeter(request["limits"])
        result = supervise(sock, child, request["timeout_s"], meter)
        result["reusable"] = scrub(baseline)
        # After scrub's kill_others: every process of the run is reaped, its CPU counted.
        result["cpu_s"] = meter.finish()
        result["memory_error"] = meter.memory_exceeded
        result["cpu_exceeded"] = meter.cpu_exceeded
        result["memory_peak_bytes"] = meter.memory_peak
        send(sock, {"op": "done", **result})
        if not result["reusable"]:
            return


def run_cell(request: dict[str, Any], fds: list[int], namespace: dict[str, Any]) -> dict[str, Any]:
    """One session cell, in this process: fds 0-2 point at the call's pipes meanwhile."""
    payload_fd, stdin_fd, stdout_fd, stderr_fd = fds
    payload = json.loads(read_all(payload_fd))
    os.close(payload_fd)
    for target, fd in ((0, stdin_fd), (1, stdout_fd), (2, stderr_fd)):
        os.dup2(fd, target)
        os.close(fd)
    # Fresh stdio objects per cell: nothing buffered by an earlier cell (stdin read ahead,
    # output that could not be flushed into a closed pipe) leaks into this one.
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(  # noqa: SIM115
        2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False
    )
    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = sandbox_cpu_s()
    resource.setrlimit(
        resource.RLIMIT_CPU,
        (
            # Behind the watchdog (which reports properly): SIGXCPU still stops a cell
            # that starves it by holding the GIL, unless the cell ignores SIGXCPU.
            math.ceil(before.ru_utime + before.ru_stime + request["limits"]["cpu_time_s"] + 1)
            + int(CPU_GRACE_S),
            resource.RLIM_INFINITY,
        ),
    )
    watchdog.start_cell(cpu_before, request["limits"]["cpu_time_s"])

    def on_alarm(signum: int, frame: Any) -> None:
        raise CellTimeout(f"cell exceeded its {request['timeout_s']} s wall-clock limit")

    start = time.monotonic()
    exit_code, kind = 1, ""
    try:
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, request["timeout_s"])
        try:
            write_files(payload["files"])
            exit_code, kind = run_python(payload["code"], namespace, interactive=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except CellTimeout:  # fired between the cell's end and the timer's reset
        kind = "timeout"
    wall_s = time.monotonic() - start
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        # Deliver what can be delivered, then point the fd at /dev/null and flush again:
        # what could not be written (pipe closed at the output cap) is dropped now instead
        # of surfacing in a later cell's output when the stream object is collected.
        stream = (sys.stdin, sys.stdout, sys.stderr)[target]
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
        os.dup2(null, target)
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os.close(null)
    # What the cell started ends with it (a background child once outlived its cell and,
    # with the session's open hard limit, its CPU limit too).
    kill_others()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "wall_s": wall_s,
        "cpu_s": sandbox_cpu_s() - cpu_before,
        "max_rss_kb": after.ru_maxrss,
        "exit_code": exit_code,
        "signal": 0,
        "timed_out": kind == "timeout",
        "killed": False,
        "memory_error": kind == "memory",
        "reusable": True,
    }


def sandbox_cpu_s() -> float:
    """CPU seconds used by every process of this sandbox, living or reaped: the runner's
    own and its reaped children's (rusage), plus each other process's own and its reaped
    children's (/proc/<pid>/stat fields 14-17)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    ticks = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1":
            try:
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            ticks += sum(int(f) for f in fields[11:15])
    return total + ticks / os.sysconf("SC_CLK_TCK")


def program_pids() -> list[int]:
    """Every process of this sandbox but the runner (pid 1): /proc is the sandbox's own
    PID namespace, so no process of the run can be missing from it (a process cannot
    leave the namespace or remove its /proc entry)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and name != "1"]


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds of the live (or zombie) processes `pids`, each with its reaped children
    (/proc/<pid>/stat utime, stime, cutime, cstime: readable even for a non-dumpable
    process). Add the runner's RUSAGE_CHILDREN for the processes it reaped itself."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            ticks += sum(int(f) for f in fields[11:15])
        except (OSError, IndexError, ValueError):
            continue
    return ticks / CLOCK_TICKS


def reaped_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (/proc/<pid>/statm; readable for every process)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process: each page shared by N processes counts 1/N,
    so children forked from one parent (sharing its pages copy-on-write) are not counted
    once each as RSS would. A process that made itself non-dumpable hides its smaps from
    the runner: it is counted by its full RSS instead (it cannot lower its count so)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return rss_bytes(pid)


def scratch_bytes() -> int:
    """Bytes held in the run's tmpfs mounts (files, deleted-but-open files included) and
    in SysV shared memory: memory of the host the run holds without any process's RSS."""
    total = 0
    for path in SCRATCH_DIRS:
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        total += (st.f_blocks - st.f_bfree) * st.f_frsize
    try:
        with open("/proc/sysvipc/shm") as fh:
            rows = fh.read().splitlines()[1:]
        for row in rows:
            total += int(row.split()[14])  # rss
    except (OSError, IndexError, ValueError):
        pass
    return total


def tree_memory_bytes(pids: list[int], budget: int) -> int:
    """Memory the run holds: its processes' PSS plus its tmpfs and SysV shm bytes. RSS
    first (cheap; PSS <= RSS), PSS only when the RSS sum is over the budget."""
    base = scratch_bytes()
    rss = [rss_bytes(pid) for pid in pids]
    total = base + sum(rss)
    if total <= budget:
        return total
    return base + sum(pss_bytes(pid) if r else 0 for pid, r in zip(pids, rss, strict=True))


class RunMeter:
    """Holds a whole one-shot run (every process of the sandbox but the runner) to its
    memory budget and its CPU budget, which the per-process rlimits only hold one process
    at a time to (64 forked children could hold 64 x memory_bytes)."""

    def __init__(self, limits: dict[str, Any]) -> None:
        self.memory_budget = int(limits["memory_bytes"])
        self.cpu_budget = float(math.ceil(limits["cpu_time_s"]))
        self.cpu_start = reaped_cpu_s()
        self.memory_peak = 0
        self.memory_exceeded = False
        self.cpu_exceeded = False
        self.cpu_over_looks = 0

    def cpu_used(self, pids: list[int]) -> float:
        return reaped_cpu_s() - self.cpu_start + tree_cpu_s(pids)

    def over(self) -> bool:
        """Measure once; True once either budget is exceeded."""
        pids = program_pids()
        memory = tree_memory_bytes(pids, self.memory_budget)
        self.memory_peak = max(self.memory_peak, memory)
        if memory > self.memory_budget:
            self.memory_exceeded = True
        # Over on two looks in a row: one walk of /proc can count a process twice, when
        # its parent reaps it (and adds its CPU to its own cutime) during the walk.
        self.cpu_over_looks = (
            self.cpu_over_looks + 1 if self.cpu_used(pids) > self.cpu_budget else 0
        )
        if self.cpu_over_looks >= 2:
            self.cpu_exceeded = True
        return self.memory_exceeded or self.cpu_exceeded

    def finish(self) -> float:
        """After every process of the run is dead and reaped (kill_others): the run's
        exact CPU (each process's CPU reaches the runner's RUSAGE_CHILDREN through its
        reapers), checked against the budget even when the run ended between looks."""
        used = reaped_cpu_s() - self.cpu_start
        if used > self.cpu_budget:
            self.cpu_exceeded = True
        return used


class CpuWatchdog:
    """Holds a session to `cpu_time_s` + CPU_GRACE_S of CPU per cell, counted from the
    start of one cell to the start of the next (threads a cell leaves running spend the
    same budget). The session runner's own hard RLIMIT_CPU must stay open (it could never
    be raised again for the next cell), so this thread plays the hard limit: past the
    budget it kills every process, reports the cell as killed and ends the runner (the
    session is reset). A cell that keeps the GIL starves it; the wall clock, enforced from
    outside by the service, still holds then."""

    def __init__(self, sock: socket.socket, memory_budget: int = 0) -> None:
        self.sock = sock
        self.memory_budget = memory_budget
        """The session's memory_bytes over the runner and every process a cell started
        (0: not checked); past it the cell is stopped as with the CPU budget (MEMORY)."""
        self.lock = threading.Lock()
        self.budget: tuple[float, float, float, float] | None = None
        self.reported = False
        self.in_cell = False
        self.own_cpu_s = 0.0
        """This thread's own CPU so far (it is not the cell's to pay)."""

    def start_cell(self, cpu_now: float, limit_s: float) -> None:
        with self.lock:
            allowed = math.ceil(limit_s) + CPU_GRACE_S
            self.budget = (cpu_now, allowed, time.monotonic(), self.own_cpu_s)
            self.in_cell = True

    def report(self, result: dict[str, Any]) -> None:
        """The main thread's report of a cell, unless the watchdog already stopped it."""
        with self.lock:
            if self.reported:
                while True:  # the runner is ending: wait for os._exit
                    time.sleep(1)
            self.in_cell = False
            send(self.sock, {"op": "done", **result})

    def run(self) -> None:
        exit_now = os._exit  # bound now: a cell may rebind os._exit later
        while True:
            time.sleep(WATCH_INTERVAL_S if self.in_cell else IDLE_WATCH_INTERVAL_S)
            with self.lock:
                self.own_cpu_s = time.thread_time()
                if self.budget is None:
                    continue
                start_cpu, allowed_s, start_wall, own_at_start = self.budget
                used = sandbox_cpu_s() - start_cpu - (self.own_cpu_s - own_at_start)
                memory_over = (
                    self.in_cell
                    and self.memory_budget > 0
                    and tree_memory_bytes([1, *program_pids()], self.memory_budget)
                    > self.memory_budget
                )
                if used <= allowed_s and not memory_over:
                    continue
                self.reported = True
                kill_all()
                with contextlib.suppress(OSError):
                    send(
                        self.sock,
                        {
                            "op": "done",
                            "wall_s": time.monotonic() - start_wall,
                            "cpu_s": used,
                            "max_rss_kb": 0,
                            "exit_code": -1,
                            "signal": int(signal.SIGKILL),
                            "timed_out": False,
                            "killed": True,
                            "memory_error": memory_over,
                            "reusable": False,
                        },
                    )
            exit_now(0)


watchdog: CpuWatchdog


def serve_session(sock: socket.socket, limits: dict[str, Any]) -> None:
    """Runner loop of a session: cells share one namespace for the session's life."""
    global watchdog
    apply_limits(limits, session=True)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = [""]
    watchdog = CpuWatchdog(sock, int(limits["memory_bytes"]))
    # A cell's forked children would be non-dumpable like the runner, and their memory then
    # counted by whole RSS (their pages shared with the runner counted again each).
    os.register_at_fork(after_in_child=lambda: _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0))
    threading.Thread(target=watchdog.run, name="rlfleet-cpu-watchdog", daemon=True).start()
    while (received := receive(sock)) is not None:
        request, fds = received
        if request["op"] == "run":
            watchdog.report(run_cell(request, fds, main.__dict__))


def check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount_scratch(size_bytes: int, inodes: int) -> None:
    """Mount /tmp and /dev/shm afresh, bounded in bytes and in inodes, in a mount
    namespace of the sandbox's own user namespace (where the runner still holds
    CAP_SYS_ADMIN). Every later process of the sandbox descends from the runner and so
    sees these mounts."""
    check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    options = f"size={size_bytes},nr_inodes={inodes},mode=0755".encode()
    for path in SCRATCH_DIRS:
        check(
            _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options),
            f"mount tmpfs on {path}",
        )


def drop_capabilities() -> None:
    """Drop every capability, bounding and ambient sets included, and check it."""
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    with open("/proc/self/status") as fh:
        status = dict(line.split(":\t", 1) for line in fh.read().splitlines() if ":\t" in line)
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if int(status[name], 16):
            raise RuntimeError(f"capabilities left after dropping them: {name} {status[name]}")


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(bpf: bytes) -> None:
    """Install a classic-BPF seccomp filter (built by the service with libseccomp)."""
    check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    program = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = SockFprog(len(bpf) // 8, ctypes.addressof(program))
    check(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
        "seccomp",
    )


def harden(setup: dict[str, Any]) -> None:
    """Finish the sandbox before anything runs in it (see the module docstring)."""
    mount_scratch(setup["tmpfs_bytes"], setup["tmpfs_inodes"])
    drop_capabilities()
    if setup["seccomp"]:
        install_seccomp(base64.b64decode(setup["seccomp"]))


def main(argv: list[str]) -> int:
    mode, ctrl_fd = argv[1], int(argv[2])
    sock = socket.socket(fileno=ctrl_fd)
    setup = json.loads(argv[3])
    harden(setup)
    # Non-dumpable: a program of this sandbox (same uid) can neither ptrace the runner nor
    # read its /proc/<pid>/fd or memory.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # As init, the runner gets only the signals it handles: Python's SIGINT handler made
    # `kill(1, SIGINT)` from a program end it. Ignored here, restored in each program.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.makedirs(WORK_DIR, exist_ok=True)
    os.chdir(WORK_DIR)
    null = os.open(os.devnull, os.O_RDWR)
    limits = setup["limits"] if mode == "session" else None
    send(sock, {"op": "ready", "python": sys.version.split()[0]})
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    # Objects that exist now are never collected: forked children then do not dirty
    # their copy-on-write pages by GC bookkeeping.
    gc.freeze()
    if limits is not None:
        serve_session(sock, limits)
    else:
        serve_oneshot(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
