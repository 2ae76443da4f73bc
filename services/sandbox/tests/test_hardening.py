"""Containment added by issue 12: seccomp, inode-bounded tmpfs, the runner's signals,
cleanup of deep trees, no forgeable notes, and session cells that cannot outlive their
limits. Each program prints ATTEMPT before its attack, as in test_hostile.py."""

from __future__ import annotations

import asyncio
import platform

import pytest
from rlfleet_proto.v1 import sandbox_pb2
from rlfleet_sandbox.config import PoolConfig
from sandbox_testlib import Harness, make_config, sandbox_processes, serving

OK = sandbox_pb2.EXEC_STATUS_OK
TIMEOUT = sandbox_pb2.EXEC_STATUS_TIMEOUT
X86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 syscall numbers")
SESSION_RESET = "the session's interpreter was stopped"


@X86_64
async def test_dangerous_syscalls_are_denied_by_seccomp(sandbox: Harness) -> None:
    calls = {
        "io_uring_setup": "libc.syscall(425, 4, params)",
        "bpf": "libc.syscall(321, 0, buf, 128)",
        "userfaultfd": "libc.syscall(323, 0)",
        "perf_event_open": "libc.syscall(298, buf, 0, -1, -1, 0)",
        "kexec_load": "libc.syscall(246, 0, 0, None, 0)",
        "keyctl": "libc.syscall(250, 0, -4, 0)",
        "add_key": "libc.syscall(248, b'user', b'k', b'v', 1, -4)",
        "unshare": "libc.syscall(272, 0x00020000)",
        "setns": "libc.syscall(308, 0, 0)",
        "mount": "libc.syscall(165, b'none', b'/tmp/work', b'tmpfs', 0, None)",
        "ptrace": "libc.syscall(101, 0, 0, 0, 0)",  # PTRACE_TRACEME
    }
    code = (
        "import ctypes\nprint('ATTEMPT')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\nbuf = ctypes.create_string_buffer(256)\n"
        + "".join(
            f"ctypes.set_errno(0); r = {call}; print({name!r}, r, ctypes.get_errno())\n"
            for name, call in calls.items()
        )
        + "print([l for l in open('/proc/self/status') if l.startswith('Seccomp:')])\n"
    )
    result = await sandbox.attack(code)
    outcomes = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[1:-1]}
    assert outcomes == {name: ["-1", "1"] for name in calls}, result.stdout  # EPERM
    assert "Seccomp:\\t2" in result.stdout
    await sandbox.assert_healthy()


async def test_tmpfs_inodes_are_bounded(sandbox: Harness) -> None:
    limit = sandbox.config.isolation.tmpfs_inodes
    code = (
        "import os\nprint('ATTEMPT')\n"
        "for place in ('/tmp/work', '/dev/shm'):\n"
        "    n = 0\n"
        "    try:\n"
        f"        while n < {limit + 2000}:\n"
        "            os.close(os.open(f'{place}/f{n}', os.O_CREAT | os.O_WRONLY)); n += 1\n"
        "    except OSError as exc:\n"
        "        print(place, n, exc.errno)\n"
        "    else:\n"
        "        print(place, n, 'ESCAPED')\n"
    )
    result = await sandbox.attack(code, timeout_s=60)
    lines = [line.split() for line in result.stdout.splitlines()[1:]]
    assert [line[0] for line in lines] == ["/tmp/work", "/dev/shm"], result.stdout
    for _place, count, error in lines:
        assert error == "28", result.stdout  # ENOSPC: out of inodes, not of bytes
        assert int(count) < limit
    after = await sandbox.run("import os\nprint(os.listdir('/tmp/work'), os.listdir('/dev/shm'))")
    assert after.stdout == "[] []\n"
    await sandbox.assert_healthy()


async def test_signals_to_the_runner_do_not_kill_it() -> None:
    async with serving(make_config(pool=PoolConfig(size=1, kill_grace_s=1.0))) as harness:
        code = (
            "import os, signal, time\nprint('ATTEMPT', flush=True)\n"
            "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,"
            " signal.SIGQUIT, signal.SIGXCPU):\n"
            "    os.kill(1, sig)\n"
            "time.sleep(0.3)\nprint('ALIVE')\n"
        )
        for _ in range(2):
            result = await harness.attack(code)
            assert result.status == OK and "ALIVE" in result.stdout, result
        # The program's own Ctrl-C still behaves as in `python -c`.
        own = await harness.run("import os, signal\nos.kill(os.getpid(), signal.SIGINT)")
        assert "KeyboardInterrupt" in own.stderr
        await harness.assert_healthy()


async def test_a_very_deep_tree_is_cleaned_up(sandbox: Harness) -> None:
    # 2,000 levels: past Python's recursion limit and, as a path, past PATH_MAX.
    code = (
        "import os\nprint('ATTEMPT')\n"
        "for _ in range(2000):\n    os.mkdir('dir'); os.chdir('dir')\n"
        "open('leaf', 'w').write('x')\nos.chmod('.', 0)\n"
    )
    for _ in range(2):  # both pooled sandboxes, or one twice
        result = await sandbox.attack(code)
        assert result.status == OK, result
        await sandbox.assert_healthy()
    clean = await sandbox.run("import os\nprint(os.listdir('/tmp/work'), os.listdir('/tmp'))")
    assert clean.stdout == "[] ['work']\n"


async def test_a_program_cannot_forge_the_runners_notes(sandbox: Harness) -> None:
    code = (
        "import os\nprint('ATTEMPT')\n"
        "for name in os.listdir('/proc/self/fd'):\n"
        "    if int(name) > 2:\n"
        "        try: os.write(int(name), b'memory')\n"
        "        except OSError: pass\n"
    )
    result = await sandbox.attack(code)
    assert result.status == OK, result


async def test_session_cell_processes_die_with_the_cell(sandbox: Harness) -> None:
    sid = (await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest())).session_id
    cell = (
        "import os, signal, subprocess\nprint('ATTEMPT')\n"
        "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
        "    os.setsid()\n"
        "    while True: pass\n"
        "kept = 'state'\n"
    )
    result = await sandbox.attack(cell, session_id=sid)
    assert result.status == OK, result
    await asyncio.sleep(0.2)
    assert not [p for p in sandbox_processes() if "sleep" in p[1]]
    look = await sandbox.run(
        "import os\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()), kept)",
        session_id=sid,
    )
    assert look.stdout == "['1'] state\n", look  # only the runner; the state survived


async def test_session_cell_cpu_limit_holds(sandbox: Harness) -> None:
    """The session's runner cannot have a hard RLIMIT_CPU (never raised again for the
    next cell); a cell that ignores SIGXCPU is still stopped at its CPU limit + 1 s,
    children included, long before its wall clock."""
    request = sandbox_pb2.CreateSessionRequest()
    for spinner in (
        "while True: pass\n",  # the cell itself
        "import os\nif os.fork() == 0:\n    while True: pass\nimport time\ntime.sleep(60)\n",
    ):
        sid = (await sandbox.stub.CreateSession(request)).session_id
        await sandbox.run("kept = 1", session_id=sid)
        code = (
            "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nprint('ATTEMPT', flush=True)\n"
            + spinner
        )
        result = await sandbox.attack(code, session_id=sid, timeout_s=60, cpu_time_s=1)
        assert result.status == TIMEOUT, result
        assert SESSION_RESET in result.stderr  # stopped by the CPU watchdog, not the clock
        assert result.cpu_time_s >= 1, result
        after = await sandbox.run("print('kept' in globals())", session_id=sid)
        assert after.stdout == "False\n"  # a fresh interpreter
        await sandbox.stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id=sid))
    await sandbox.assert_healthy()
