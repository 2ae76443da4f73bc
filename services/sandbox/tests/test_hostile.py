"""Hostile programs, each asserting containment.

Every test first proves that the thing attacked is really there and reachable for the
service (the secret is in the service's environment, the host file exists and the service
can read it, the port listens, ...), then that the program really ran its attack (it
prints ATTEMPT before trying), and only then that it failed. So each test would fail if
the corresponding containment were removed; `test_probes_detect_escape_without_isolation`
runs the harmless probes bare, without bubblewrap, and sees them escape. After each test
the service must still run programs, and (fixture teardown) no sandbox process remains.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rlfleet_proto.v1 import sandbox_pb2
from rlfleet_sandbox.config import PoolConfig
from sandbox_testlib import (
    ROOT_ONLY,
    TMPFS_BYTES,
    Harness,
    attempted,
    make_config,
    sandbox_processes,
    serving,
    wait_no_sandbox_processes,
)

OK = sandbox_pb2.EXEC_STATUS_OK
SECRET = f"s3cret-{uuid.uuid4().hex}"
REPO_FILE = Path(__file__).resolve().parents[3] / "pyproject.toml"


@pytest.fixture
async def sandbox(sandbox: Harness) -> AsyncIterator[Harness]:
    """conftest's service, which after each attack must still run programs and say it is
    healthy."""
    yield sandbox
    await sandbox.assert_healthy()


def read_probe(path: str) -> str:
    return (
        "print('ATTEMPT')\n"
        "try:\n"
        f"    print('ESCAPED', open({path!r}, errors='replace').read())\n"
        "except OSError as exc:\n"
        "    print('BLOCKED', type(exc).__name__)\n"
    )


# -- reading what belongs to the host ---------------------------------------------------


async def test_cannot_read_the_service_config(sandbox: Harness, tmp_path: Path) -> None:
    config = tmp_path / "sandbox.yaml"
    config.write_text(f"api_key: {SECRET}\n")
    assert SECRET in config.read_text()  # the service (this process) can read it
    result = await sandbox.attack(read_probe(str(config)))
    assert SECRET not in result.stdout + result.stderr
    assert "BLOCKED FileNotFoundError" in result.stdout


async def test_cannot_read_the_repository(sandbox: Harness) -> None:
    assert REPO_FILE.read_text().strip()
    result = await sandbox.attack(read_probe(str(REPO_FILE)))
    assert "BLOCKED" in result.stdout and "[project]" not in result.stdout


async def test_cannot_read_etc_shadow_or_root_home(sandbox: Harness) -> None:
    assert Path("/etc/shadow").is_file() and Path("/root").is_dir()
    code = (
        read_probe("/etc/shadow")
        + "import os\nprint('ROOT_HOME', os.path.exists('/root'), os.path.exists('/etc/passwd'))"
    )
    result = await sandbox.attack(code)
    assert "BLOCKED FileNotFoundError" in result.stdout
    assert "ROOT_HOME False False" in result.stdout


async def test_cannot_read_environment_secrets(sandbox: Harness) -> None:
    os.environ["RLFLEET_TEST_SECRET"] = SECRET  # the service's own environment
    try:
        assert (
            subprocess.run(
                ["printenv", "RLFLEET_TEST_SECRET"], capture_output=True, text=True
            ).stdout.strip()
            == SECRET
        )  # a child would inherit it
        code = (
            "import os\nprint('ATTEMPT')\n"
            "print(dict(os.environ))\n"
            "for pid in os.listdir('/proc'):\n"
            "    if pid.isdigit():\n"
            "        try: print(pid, open(f'/proc/{pid}/environ', 'rb').read())\n"
            "        except OSError as exc: print(pid, exc)\n"
        )
        result = await sandbox.attack(code)
        assert "PATH" in result.stdout  # the environment was printed, without the secret
        assert SECRET not in result.stdout + result.stderr
        assert "RLFLEET_TEST_SECRET" not in result.stdout
    finally:
        del os.environ["RLFLEET_TEST_SECRET"]


async def test_host_processes_are_invisible(sandbox: Harness) -> None:
    me = os.getpid()
    host_pids = [p for p in os.listdir("/proc") if p.isdigit()]
    assert len(host_pids) > 10 and Path(f"/proc/{me}/cmdline").read_bytes()
    code = (
        "import os\nprint('ATTEMPT')\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "print('PIDS', len(pids))\n"
        f"print('HOST', os.path.exists('/proc/{me}/cmdline') and open('/proc/{me}/cmdline').read())\n"
    )
    result = await sandbox.attack(code)
    assert int(result.stdout.split("PIDS ")[1].split()[0]) == 2  # the runner (init) and the program
    assert "pytest" not in result.stdout


async def test_proc_self_root_and_symlinks_do_not_escape(sandbox: Harness) -> None:
    assert REPO_FILE.is_file()
    code = (
        "import os\nprint('ATTEMPT')\n"
        f"os.symlink({str(REPO_FILE)!r}, 'link')\n"
        "os.symlink('/proc/1/root', 'root1')\n"
        f"for path in ['link', '/proc/self/root{REPO_FILE}', 'root1{REPO_FILE}',\n"
        f"             '/proc/1/cwd/{REPO_FILE.name}', '/proc/self/cwd/../../{REPO_FILE}']:\n"
        "    try: print('ESCAPED', path, open(path).read()[:20])\n"
        "    except OSError as exc: print('BLOCKED', path, type(exc).__name__)\n"
    )
    result = await sandbox.attack(code)
    assert "ESCAPED" not in result.stdout, result.stdout
    assert result.stdout.count("BLOCKED") == 5


# -- writing outside the work dir ----------------------------------------------------


async def test_cannot_write_outside_the_work_dir(sandbox: Harness) -> None:
    marker = f"rlfleet-escape-{uuid.uuid4().hex}"
    host_tmp = Path("/tmp") / marker
    host_tmp.write_text("probe")  # the service can write the host's /tmp ...
    host_tmp.unlink()
    code = (
        "import os\nprint('ATTEMPT')\n"
        f"for path in ['/usr/{marker}', '/{marker}', '/dev/{marker}', '/proc/sys/kernel/hostname', '/bin/{marker}']:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('ESCAPED', path)\n"
        "    except OSError as exc: print('BLOCKED', path, type(exc).__name__)\n"
        f"open('/tmp/{marker}', 'w').write('only in the sandbox tmpfs')\n"
        "print('TMP_OK')\n"
    )
    result = await sandbox.attack(code)
    assert "ESCAPED" not in result.stdout and result.stdout.count("BLOCKED") == 5
    assert "TMP_OK" in result.stdout
    for path in (Path("/usr") / marker, Path("/") / marker, host_tmp, Path("/bin") / marker):
        assert not path.exists()


async def test_disk_fill_is_capped_by_file_size_and_tmpfs(sandbox: Harness) -> None:
    big = (
        "print('ATTEMPT', flush=True)\n"
        "with open('big', 'wb') as fh:\n"
        "    for _ in range(1000): fh.write(b'x' * (1 << 20))\n"
    )
    result = await sandbox.attack(big, max_file_size_bytes=1 << 20)
    assert result.status == sandbox_pb2.EXEC_STATUS_ERROR
    assert result.signal == 25 or "File too large" in result.stderr  # SIGXFSZ
    many = (
        "import os\nprint('ATTEMPT')\nwritten = 0\n"
        "try:\n"
        "    for i in range(1000):\n"
        "        with open(f'f{i}', 'wb') as fh: fh.write(b'x' * (1 << 20))\n"
        "        written += 1 << 20\n"
        "except OSError as exc: print('STOPPED', exc.errno)\n"
        "print('WROTE', written)\n"
    )
    result = await sandbox.attack(many, max_file_size_bytes=2 << 20)
    assert "STOPPED 28" in result.stdout  # ENOSPC: the tmpfs is full
    assert int(result.stdout.split("WROTE ")[1]) <= TMPFS_BYTES


async def test_dev_shm_is_capped_too(sandbox: Harness) -> None:
    code = (
        "print('ATTEMPT')\nwritten = 0\n"
        "try:\n"
        "    for i in range(1000):\n"
        "        with open(f'/dev/shm/f{i}', 'wb') as fh: fh.write(b'x' * (1 << 20))\n"
        "        written += 1 << 20\n"
        "except OSError as exc: print('STOPPED', exc.errno)\n"
        "print('WROTE', written)\n"
    )
    result = await sandbox.attack(code, max_file_size_bytes=2 << 20)
    assert "STOPPED 28" in result.stdout
    assert 0 < int(result.stdout.split("WROTE ")[1]) <= TMPFS_BYTES


# -- network ------------------------------------------------------------------------


async def test_cannot_connect_to_a_host_loopback_port(sandbox: Harness) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):  # it really listens
            pass
        await asyncio.sleep(0.05)
        listener.accept()[0].close()
        code = (
            "import socket\nprint('ATTEMPT')\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('ESCAPED')\n"
            "except OSError as exc: print('BLOCKED', type(exc).__name__)\n"
        )
        result = await sandbox.attack(code)
        assert "BLOCKED ConnectionRefusedError" in result.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody got through
    finally:
        listener.close()


async def test_cannot_reach_host_unix_sockets(sandbox: Harness, tmp_path: Path) -> None:
    abstract = f"\0rlfleet-test-{uuid.uuid4().hex}"
    path = str(tmp_path / "svc.sock")
    servers = []
    for address in (abstract, path):
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen(1)
        servers.append(server)
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(address)  # reachable from the service
    try:
        code = (
            "import socket\nprint('ATTEMPT')\n"
            f"for address in [{abstract!r}, {path!r}]:\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try: s.connect(address); print('ESCAPED')\n"
            "    except OSError as exc: print('BLOCKED', type(exc).__name__)\n"
        )
        result = await sandbox.attack(code)
        assert "ESCAPED" not in result.stdout and result.stdout.count("BLOCKED") == 2
    finally:
        for server in servers:
            server.close()


async def test_no_network_interfaces_but_loopback(sandbox: Harness) -> None:
    host = {name for _i, name in socket.if_nameindex()}
    assert host - {"lo"}, "the host has a real interface"
    code = "import socket\nprint('ATTEMPT')\nprint(sorted(n for _i, n in socket.if_nameindex()))"
    result = await sandbox.attack(code)
    assert result.stdout.endswith("['lo']\n")


# -- resource bombs -------------------------------------------------------------------


async def test_fork_bomb_is_capped_by_the_process_limit(sandbox: Harness) -> None:
    code = (
        "import os, time\nprint('ATTEMPT', flush=True)\ncount = 0\n"
        "try:\n"
        "    for _ in range(300):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        count += 1\n"
        "except OSError as exc: print('LIMIT', exc.errno)\n"
        "print('FORKED', count, flush=True)\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    result = await sandbox.attack(code, max_processes=16, timeout_s=1.5)
    assert "LIMIT 11" in result.stdout  # EAGAIN from RLIMIT_NPROC
    assert int(result.stdout.split("FORKED ")[1].split()[0]) < 16
    assert result.status == sandbox_pb2.EXEC_STATUS_TIMEOUT
    assert time.monotonic() - start < 6


async def test_bash_fork_bomb_is_contained(sandbox: Harness) -> None:
    start = time.monotonic()
    result = await sandbox.attack(
        "echo ATTEMPT; :(){ :|:& };:; sleep 30", language="bash", max_processes=16, timeout_s=1.0
    )
    assert result.status in (sandbox_pb2.EXEC_STATUS_TIMEOUT, sandbox_pb2.EXEC_STATUS_ERROR)
    assert "retry: Resource temporarily unavailable" in result.stderr or "fork" in result.stderr
    assert time.monotonic() - start < 6


async def test_memory_bomb_is_stopped_by_the_address_space_limit(sandbox: Harness) -> None:
    result = await sandbox.attack(
        "print('ATTEMPT', flush=True)\nx = bytearray(1 << 30)\nprint('ESCAPED')",
        memory_bytes=128 << 20,
    )
    assert "ESCAPED" not in result.stdout
    assert result.status == sandbox_pb2.EXEC_STATUS_MEMORY, result
    gradual = (
        "print('ATTEMPT', flush=True)\nchunks = []\nwhile True: chunks.append(b'x' * (8 << 20))"
    )
    result = await sandbox.attack(gradual, memory_bytes=128 << 20, timeout_s=10)
    assert result.status == sandbox_pb2.EXEC_STATUS_MEMORY


async def test_memory_bomb_in_bash_is_reported_as_memory(sandbox: Harness) -> None:
    code = "echo ATTEMPT; x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ESCAPED ${#x}"
    result = await sandbox.attack(code, language="bash", memory_bytes=64 << 20)
    assert "ESCAPED 300000000" not in result.stdout
    assert result.status == sandbox_pb2.EXEC_STATUS_MEMORY, result


async def test_cpu_spin_hits_the_wall_clock(sandbox: Harness) -> None:
    start = time.monotonic()
    result = await sandbox.attack("print('ATTEMPT', flush=True)\nwhile True: pass", timeout_s=0.5)
    assert result.status == sandbox_pb2.EXEC_STATUS_TIMEOUT
    assert 0.5 <= result.wall_time_s < 2 and time.monotonic() - start < 4


async def test_cpu_spin_hits_the_cpu_limit(sandbox: Harness) -> None:
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nprint('ATTEMPT', flush=True)\nwhile True: pass"
    result = await sandbox.attack(code, timeout_s=20, cpu_time_s=1)
    assert result.status == sandbox_pb2.EXEC_STATUS_TIMEOUT
    assert result.signal == 9 and 1 <= result.cpu_time_s < 4  # hard limit after ignoring SIGXCPU


async def test_sleeping_past_the_timeout(sandbox: Harness) -> None:
    result = await sandbox.attack(
        "import time\nprint('ATTEMPT', flush=True)\ntime.sleep(120)", timeout_s=0.5
    )
    assert result.status == sandbox_pb2.EXEC_STATUS_TIMEOUT and result.wall_time_s < 2


async def test_huge_output_is_capped(sandbox: Harness) -> None:
    start = time.monotonic()
    code = "import sys\nprint('ATTEMPT', flush=True)\nwhile True: sys.stdout.write('x' * 65536)"
    result = await sandbox.attack(code, max_output_bytes=100_000, timeout_s=30)
    assert result.status == sandbox_pb2.EXEC_STATUS_OUTPUT_LIMIT
    assert result.stdout_truncated and len(result.stdout) == 100_000
    assert time.monotonic() - start < 5  # stopped at the cap, not at the timeout
    result = await sandbox.run(
        "import os\nwhile True: os.write(2, b'e' * 65536)",
        max_output_bytes=50_000,
        language="python",
        timeout_s=30,
    )
    assert result.status == sandbox_pb2.EXEC_STATUS_OUTPUT_LIMIT and len(result.stderr) == 50_000


# -- the sandbox's own machinery ------------------------------------------------------


async def test_killing_the_runner_and_everything_else(sandbox: Harness) -> None:
    code = (
        "import os, signal, time\nprint('ATTEMPT', os.getppid(), flush=True)\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "try: os.kill(-1, signal.SIGKILL)\n"
        "except ProcessLookupError: pass  # nothing else it may signal\n"
        "time.sleep(0.2)\nprint('RUNNER', os.getppid(), os.path.exists('/proc/1'))\n"
    )
    result = await sandbox.attack(code)
    # The runner is the namespace's init: signals from inside cannot kill it, so the run
    # ends normally and the sandbox goes on serving.
    assert result.stdout.startswith("ATTEMPT 1\n") and "RUNNER 1 True" in result.stdout
    assert result.status == OK
    for _ in range(3):
        await sandbox.assert_healthy()


async def test_pid_one_cannot_be_killed(sandbox: Harness) -> None:
    code = "import os, signal\nprint('ATTEMPT')\nos.kill(1, signal.SIGKILL)\nimport time; time.sleep(0.2)\nprint('ALIVE')"
    result = await sandbox.attack(code)
    assert "ALIVE" in result.stdout


async def test_ptrace_cannot_reach_the_service_or_the_runner(sandbox: Harness) -> None:
    me = os.getpid()
    assert Path(f"/proc/{me}").exists()
    code = (
        "import ctypes, os\nprint('ATTEMPT')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for pid in [{me}, os.getppid(), 1]:\n"
        "    r = libc.ptrace(16, pid, 0, 0)\n"  # PTRACE_ATTACH
        "    print('PTRACE', pid, r, ctypes.get_errno())\n"
        "for path in [f'/proc/{os.getppid()}/mem', f'/proc/{os.getppid()}/environ']:\n"
        "    try: open(path, 'rb').read(1); print('ESCAPED', path)\n"
        "    except OSError as exc: print('BLOCKED', type(exc).__name__)\n"
    )
    result = await sandbox.attack(code)
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("PTRACE")]
    assert [line[2] for line in lines] == ["-1", "-1", "-1"]
    # EPERM for all: the seccomp filter denies ptrace (without it: ESRCH for the service's
    # pid, which does not exist in here, and EPERM for the runner, which is not dumpable).
    assert [line[3] for line in lines] == ["1", "1", "1"]
    assert "ESCAPED" not in result.stdout


@ROOT_ONLY
async def test_no_privilege_inside(sandbox: Harness) -> None:
    code = (
        "import ctypes, os\nprint('ATTEMPT')\n"
        "status = open('/proc/self/status').read()\n"
        "print([l for l in status.splitlines() if l.startswith(('CapEff', 'CapBnd', 'NoNewPrivs'))])\n"
        "try: os.setuid(0); print('ESCAPED setuid')\n"
        "except OSError as exc: print('BLOCKED', type(exc).__name__)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('UNSHARE', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
        "print('MOUNT', libc.mount(b'none', b'/tmp/work', b'tmpfs', 0, None), ctypes.get_errno())\n"
        "print('UID', os.getuid(), open('/proc/self/uid_map').read().split())\n"
    )
    result = await sandbox.attack(code)
    assert (
        "CapEff:\\t0000000000000000" in result.stdout
        and "CapBnd:\\t0000000000000000" in result.stdout
    )
    assert "NoNewPrivs:\\t1" in result.stdout
    assert "BLOCKED" in result.stdout and "ESCAPED" not in result.stdout
    assert "UNSHARE -1" in result.stdout  # no nested user namespace (no private unbounded tmpfs)
    assert "MOUNT -1 1" in result.stdout
    assert "UID 65534 " in result.stdout  # on the host: TEST_UID, see the next test


@ROOT_ONLY
async def test_sandboxes_run_under_the_unprivileged_host_uid(sandbox: Harness) -> None:
    task = asyncio.create_task(sandbox.run("import time\nprint('ATTEMPT')\ntime.sleep(1)"))
    await asyncio.sleep(0.5)
    processes = sandbox_processes()
    assert processes, "the sandboxes' processes run under the configured uid"
    root_sandboxes = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
                real_uid = int(
                    next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]
                )
                if (
                    "rlfleet-sandbox-runner" in Path(f"/proc/{name}/cmdline").read_text()
                    and real_uid == 0
                    and int(name) != os.getpid()
                ):
                    root_sandboxes.append(name)
            except OSError:
                pass
    assert not root_sandboxes
    attempted(await task)


async def test_hostname_is_the_sandboxes_own(sandbox: Harness) -> None:
    assert socket.gethostname() != "sandbox"
    result = await sandbox.attack("import socket\nprint('ATTEMPT', socket.gethostname())")
    assert result.stdout.strip() == "ATTEMPT sandbox"


@ROOT_ONLY
async def test_background_processes_do_not_outlive_the_run(sandbox: Harness) -> None:
    code = (
        "import os, subprocess\nprint('ATTEMPT')\n"
        "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        import time; time.sleep(300)\n"
        "    os._exit(0)\n"
    )
    result = await sandbox.attack(code)
    assert result.status == OK
    await asyncio.sleep(0.2)
    processes = sandbox_processes()
    assert not [p for p in processes if "sleep" in p[1]], processes
    # Per pooled sandbox: bwrap outside, the runner inside; nothing else.
    assert len(processes) == 2 * sandbox.config.pool.size, processes
    after = await sandbox.run(
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    )
    assert (
        eval(after.stdout)[0] == 1 and len(eval(after.stdout)) == 2
    )  # the runner and this program


# -- one run cannot see another -------------------------------------------------------


async def test_runs_in_a_reused_sandbox_see_nothing_of_earlier_runs() -> None:
    async with serving(make_config(pool=PoolConfig(size=1, max_runs_per_sandbox=100))) as harness:
        plant = (
            "import ctypes, os\nprint('ATTEMPT')\n"
            f"open('/tmp/work/left', 'w').write({SECRET!r})\n"
            f"open('/tmp/left', 'w').write({SECRET!r})\n"
            f"open('/dev/shm/left', 'w').write({SECRET!r})\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"key = libc.syscall(248, b'user', b'left', {SECRET.encode()!r}, {len(SECRET)}, -4)\n"
            "shm = libc.shmget(0x5EC, 4096, 0o1666)\n"  # IPC_CREAT | 0666
            "print('PLANTED', key > 0, shm >= 0, os.getppid())\n"
        )
        first = await harness.attack(plant)
        assert "PLANTED False True" in first.stdout  # add_key: denied by seccomp
        look = (
            "import ctypes, os\nprint('ATTEMPT')\n"
            "print(os.listdir('/tmp/work'), os.listdir('/tmp'), os.listdir('/dev/shm'))\n"
            "print(open('/proc/sysvipc/shm').read().splitlines()[1:])\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print('KEY', libc.syscall(250, 10, -4, b'user', b'left', 0))\n"  # KEYCTL_SEARCH
            "print('RUNNER', os.getppid())\n"
        )
        second = await harness.attack(look)
        assert first.stdout.split()[-1] == second.stdout.split()[-1]  # same sandbox, reused
        assert "[] ['work'] []" in second.stdout
        assert "\n[]\n" in second.stdout
        assert "KEY -1" in second.stdout
        assert SECRET not in second.stdout
    assert not await asyncio.to_thread(wait_no_sandbox_processes)


async def test_sessions_cannot_see_each_other(sandbox: Harness) -> None:
    a = (
        await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
    ).session_id
    b = (
        await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
    ).session_id
    planted = await sandbox.run(
        f"secret = {SECRET!r}\nopen('/tmp/work/mine', 'w').write(secret)\nimport os\nos.listdir('.')",
        session_id=a,
    )
    assert planted.stdout == "['mine']\n"
    code = (
        "import os\nprint('ATTEMPT')\n"
        "print(os.listdir('/tmp/work'), 'secret' in globals())\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    for result in (await sandbox.run(code, session_id=b), await sandbox.run(code)):
        attempted(result)
        assert "[] False" in result.stdout and SECRET not in result.stdout


# -- the probes are real --------------------------------------------------------------


@pytest.mark.parametrize("probe", ["file", "env", "port", "write"])
def test_probes_detect_escape_without_isolation(probe: str, tmp_path: Path) -> None:
    """Control: the same attacks, run bare (`python -c` as the service would without
    bubblewrap), succeed — so the tests above fail if the isolation is removed."""
    config = tmp_path / "sandbox.yaml"
    config.write_text(f"api_key: {SECRET}\n")
    env = {**os.environ, "RLFLEET_TEST_SECRET": SECRET}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    marker = tmp_path / "written"
    code = {
        "file": read_probe(str(config)),
        "env": "import os\nprint('ATTEMPT', dict(os.environ))",
        "port": f"import socket\nprint('ATTEMPT')\nsocket.create_connection(('127.0.0.1', {port})); print('ESCAPED')",
        "write": f"print('ATTEMPT')\nopen({str(marker)!r}, 'w').write('x'); print('ESCAPED')",
    }[probe]
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
        ).stdout
    finally:
        listener.close()
    assert "ATTEMPT" in out
    assert SECRET in out or "ESCAPED" in out
