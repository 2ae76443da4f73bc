"""The gRPC face against a real loopback service: runs, statuses, sessions, errors."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from rlfleet_proto.v1 import sandbox_pb2
from rlfleet_sandbox.config import PoolConfig, SessionsConfig
from rlfleet_sandbox.engine import SandboxEngine
from rlfleet_sandbox.sandbox import SandboxStartError
from sandbox_testlib import (
    ROOT_ONLY,
    TEST_UID,
    Harness,
    make_config,
    sandbox_processes,
    serving,
    wait_no_sandbox_processes,
)

OK = sandbox_pb2.EXEC_STATUS_OK


async def test_python_stdout_stdin_files_and_exit_code(sandbox: Harness) -> None:
    code = "import sys\nprint(input().upper(), open('data/in.txt').read())\nsys.exit(3)"
    result = await sandbox.run(
        code, stdin="hello\n", files=(sandbox_pb2.File(path="data/in.txt", content=b"file!"),)
    )
    assert result.status == sandbox_pb2.EXEC_STATUS_ERROR
    assert result.exit_code == 3
    assert result.stdout == "HELLO file!\n"
    assert 0 < result.wall_time_s < 5


async def test_exception_traceback_looks_like_python(sandbox: Harness) -> None:
    result = await sandbox.run("def f():\n    raise ValueError('boom')\nf()")
    assert result.status == sandbox_pb2.EXEC_STATUS_ERROR
    assert result.exit_code == 1
    assert 'File "<string>", line 3, in <module>' in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: boom")
    assert "runner" not in result.stderr  # our frames are not shown


async def test_bash_with_executable_file(sandbox: Harness) -> None:
    script = sandbox_pb2.File(
        path="run.sh", content=b"#!/bin/bash\necho from-script $1\n", executable=True
    )
    result = await sandbox.run(
        'read x; ./run.sh "$x"; pwd', language="bash", stdin="arg\n", files=(script,)
    )
    assert result.status == OK, result
    assert result.stdout == "from-script arg\n/tmp/work\n"


async def test_large_code_stdin_and_atexit(sandbox: Harness) -> None:
    code = (
        "import atexit, sys\natexit.register(lambda: print('bye'))\n"
        + "x = 1\n" * 20000
        + "print(len(sys.stdin.read()))"
    )
    result = await sandbox.run(code, stdin="y" * 300_000)
    assert result.status == OK, result.stderr
    assert result.stdout == "300000\nbye\n"


async def test_threads_are_joined_before_exit(sandbox: Harness) -> None:
    code = "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), print('late'))).start()"
    result = await sandbox.run(code)
    assert result.stdout == "late\n"


async def test_bad_requests_name_the_field(sandbox: Harness) -> None:
    cases = [
        (sandbox_pb2.ExecuteRequest(code="print(1)"), "language"),
        (sandbox_pb2.ExecuteRequest(language=sandbox_pb2.LANGUAGE_PYTHON, code="  "), "code"),
        (
            sandbox_pb2.ExecuteRequest(
                language=sandbox_pb2.LANGUAGE_PYTHON,
                code="1",
                files=[sandbox_pb2.File(path="../x")],
            ),
            "files[0].path",
        ),
        (
            sandbox_pb2.ExecuteRequest(
                language=sandbox_pb2.LANGUAGE_PYTHON,
                code="1",
                files=[sandbox_pb2.File(path="/etc/x")],
            ),
            "files[0].path",
        ),
        (
            sandbox_pb2.ExecuteRequest(
                language=sandbox_pb2.LANGUAGE_PYTHON,
                code="1",
                limits=sandbox_pb2.Limits(timeout_s=-1),
            ),
            "limits.timeout_s",
        ),
        (
            sandbox_pb2.ExecuteRequest(
                language=sandbox_pb2.LANGUAGE_BASH, code="ls", session_id="abc"
            ),
            "language",
        ),
        (
            sandbox_pb2.ExecuteRequest(
                language=sandbox_pb2.LANGUAGE_PYTHON, code="1", session_id="a b"
            ),
            "session_id",
        ),
    ]
    for request, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await sandbox.stub.Execute(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith(field + ":"), info.value.details()


async def test_unknown_session_is_not_found(sandbox: Harness) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await sandbox.run("1", session_id="nope")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_limits_are_clamped_to_the_caps(sandbox: Harness) -> None:
    result = await sandbox.run(
        "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))", max_open_files=10**6
    )
    cap = sandbox.config.limits.max_max_open_files
    assert result.stdout == f"({cap}, {cap})\n"


async def test_session_keeps_state_and_forgets_after_close(sandbox: Harness) -> None:
    session = await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
    sid = session.session_id
    assert session.idle_timeout_s == sandbox.config.sessions.idle_timeout_s
    assert (await sandbox.run("x = 40", session_id=sid)).status == OK
    assert (await sandbox.run("x += 2", session_id=sid)).status == OK
    third = await sandbox.run("x", session_id=sid)
    assert third.stdout == "42\n"  # a trailing expression is echoed, as in IPython
    failing = await sandbox.run("y = 1\nundefined_name", session_id=sid)
    assert failing.status == sandbox_pb2.EXEC_STATUS_ERROR and "NameError" in failing.stderr
    assert (await sandbox.run("print(x, y)", session_id=sid)).stdout == "42 1\n"
    closed = await sandbox.stub.CloseSession(
        sandbox_pb2.CloseSessionRequest(session_id=sid), timeout=10
    )
    assert closed.existed
    again = await sandbox.stub.CloseSession(
        sandbox_pb2.CloseSessionRequest(session_id=sid), timeout=10
    )
    assert not again.existed
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await sandbox.run("x", session_id=sid)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_session_cell_timeout_keeps_state(sandbox: Harness) -> None:
    sid = (
        await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
    ).session_id
    await sandbox.run("kept = 'yes'", session_id=sid)
    slow = await sandbox.run("import time\ntime.sleep(30)", session_id=sid, timeout_s=0.5)
    assert slow.status == sandbox_pb2.EXEC_STATUS_TIMEOUT
    assert slow.wall_time_s < 3
    assert (await sandbox.run("print(kept)", session_id=sid)).stdout == "yes\n"


async def test_session_that_ignores_its_timeout_is_reset(sandbox: Harness) -> None:
    sid = (
        await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
    ).session_id
    await sandbox.run("kept = 1", session_id=sid)
    code = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass"
    stuck = await sandbox.run(code, session_id=sid, timeout_s=0.3)
    assert stuck.status == sandbox_pb2.EXEC_STATUS_TIMEOUT
    assert "state is lost" in stuck.stderr
    after = await sandbox.run("print('kept' in globals())", session_id=sid)
    assert after.stdout == "False\n"


async def test_session_whose_sandbox_died_between_calls_says_its_state_is_lost(
    sandbox: Harness,
) -> None:
    """Its sandbox is killed from outside while idle (the OOM killer, a lost Ray node):
    the next cell runs on a fresh interpreter and says the state is lost, never silently."""
    sid = (
        await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
    ).session_id
    await sandbox.run("kept = 1", session_id=sid)
    for pid, _ in sandbox_processes():  # the pool's sandboxes too: they are replaced
        os.kill(pid, signal.SIGKILL)
    assert not await asyncio.to_thread(wait_no_sandbox_processes)
    await asyncio.sleep(0.2)  # the service reaps its children
    after = await sandbox.run("print('kept' in globals())", session_id=sid)
    assert after.stdout == "False\n" and "state is lost" in after.stderr, after
    again = await sandbox.run("print('again')", session_id=sid)
    assert again.stdout == "again\n" and "state is lost" not in again.stderr
    await sandbox.assert_healthy()


async def test_sessions_are_capped_and_expire_when_idle() -> None:
    # Two harnesses: with one short idle timeout for both checks, a loaded machine (a CI run
    # with a busy loop per core) took longer than it to create the two sessions, the first
    # expired, and the third was not refused.
    async with serving(
        make_config(sessions=SessionsConfig(max_sessions=2, idle_timeout_s=600))
    ) as capped:
        for _ in range(2):
            await capped.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await capped.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_sessions" in (info.value.details() or "")
    async with serving(
        make_config(
            sessions=SessionsConfig(max_sessions=2, idle_timeout_s=0.5, reap_interval_s=0.1)
        )
    ) as harness:
        ids = [
            (
                await harness.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
            ).session_id
            for _ in range(2)
        ]
        await asyncio.sleep(3.0)  # six idle timeouts: the reaper runs every 0.1 s
        for sid in ids:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await harness.run("1", session_id=sid)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
        await harness.stub.CreateSession(sandbox_pb2.CreateSessionRequest(), timeout=10)
    assert not await asyncio.to_thread(wait_no_sandbox_processes)


async def test_concurrent_runs_beyond_pool_size_all_finish(sandbox: Harness) -> None:
    results = await asyncio.gather(*(sandbox.run(f"print({i} * 2)") for i in range(12)))
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(12)]


async def test_use_once_pool_replaces_each_sandbox() -> None:
    async with serving(make_config(pool=PoolConfig(size=1, max_runs_per_sandbox=1))) as harness:
        pids = [(await harness.run("import os; print(os.getpid())")).stdout for _ in range(3)]
        assert all(p for p in pids)
        first = await harness.run("import os; open('mark', 'w').write('x'); print(os.listdir('.'))")
        second = await harness.run("import os; print(os.listdir('.'))")
        assert first.stdout == "['mark']\n" and second.stdout == "[]\n"
    assert not await asyncio.to_thread(wait_no_sandbox_processes)


async def test_deadline_cancels_run_and_sandbox_is_replaced(sandbox: Harness) -> None:
    request = sandbox_pb2.ExecuteRequest(
        language=sandbox_pb2.LANGUAGE_PYTHON,
        code="import time; time.sleep(30)",
        limits=sandbox_pb2.Limits(timeout_s=20),
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await sandbox.stub.Execute(request, timeout=0.5)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await sandbox.assert_healthy()
    await sandbox.assert_healthy()


@ROOT_ONLY
def test_sandboxes_die_with_a_killed_service() -> None:
    """--die-with-parent: a service that is SIGKILLed (no clean shutdown) takes every
    sandbox with it."""
    assert not sandbox_processes()
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet_sandbox",
            "--port",
            "0",
            "pool.size=2",
            f"isolation.sandbox_uid={TEST_UID}",
            f"isolation.sandbox_gid={TEST_UID}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while len(sandbox_processes()) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(sandbox_processes()) == 4  # two sandboxes: bwrap + runner each
    finally:
        os.kill(service.pid, signal.SIGKILL)
        service.wait()
    assert not wait_no_sandbox_processes(5.0)


async def test_session_memory_bomb_keeps_the_session(sandbox: Harness) -> None:
    request = sandbox_pb2.CreateSessionRequest(limits=sandbox_pb2.Limits(memory_bytes=192 << 20))
    sid = (await sandbox.stub.CreateSession(request, timeout=10)).session_id
    await sandbox.run("kept = 7", session_id=sid)
    bomb = await sandbox.run("x = bytearray(1 << 30)", session_id=sid)
    assert bomb.status == sandbox_pb2.EXEC_STATUS_MEMORY
    assert (await sandbox.run("kept * 6", session_id=sid)).stdout == "42\n"
    flood = await sandbox.run(
        "while True: print('y' * 10000)", session_id=sid, max_output_bytes=20_000
    )
    assert flood.status == sandbox_pb2.EXEC_STATUS_OUTPUT_LIMIT and len(flood.stdout) == 20_000
    assert (await sandbox.run("kept", session_id=sid)).stdout == "7\n"


async def test_start_fails_loudly_when_sandboxes_cannot_start() -> None:
    config = make_config(
        isolation={
            "python": "/nonexistent/python3",
            "sandbox_uid": TEST_UID,
            "sandbox_gid": TEST_UID,
        }
    )
    engine = SandboxEngine(config)
    with pytest.raises(SandboxStartError, match=r"sandbox did not start .*nonexistent/python3"):
        await engine.start()
    await engine.stop()
    with pytest.raises(
        FileNotFoundError, match=r"isolation.bwrap: 'no-such-bwrap' not found; install bubblewrap"
    ):
        SandboxEngine(make_config(isolation={"bwrap": "no-such-bwrap"}))
