"""Hostile patches are contained and score 0. Each patch fixes the bug only if its attack
worked (forking 10,000 processes, reaching the host over the network, reading a host file),
so a contained attack gives a wrong answer; the test also checks the attack left no trace
on the host and that no container is left behind (the `stub` fixture)."""

from __future__ import annotations

import secrets
import socket
import subprocess
import threading
from pathlib import Path

from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from swe_testlib import diff_of, host_checkout, instances, request_for

INSTANCE = {i.instance_id: i for i in instances()}["rlfleet__tinystats-1"]
BUGGY = "    return ordered[len(ordered) // 2]\n"
FIXED = (
    "    middle = len(ordered) // 2\n"
    "    if len(ordered) % 2:\n"
    "        return ordered[middle]\n"
    "    return (ordered[middle - 1] + ordered[middle]) / 2\n"
)


def hostile(tmp_path: Path, attack: str) -> str:
    """A patch to tinystats' median: run `attack` (which sets `worked`), then return the
    right answer only if it worked."""
    body = "    worked = False\n" + attack + "    if not worked:\n        return -1\n" + FIXED
    return diff_of(host_checkout(INSTANCE, tmp_path), {"tinystats/core.py": (BUGGY, body)})


async def unresolved(stub: swe_pb2_grpc.SweRunnerServiceStub, patch: str) -> swe_pb2.EvaluateResult:
    """Evaluate `patch`, which must not resolve the instance."""
    result = await stub.Evaluate(request_for(INSTANCE, patch, timeout_s=60), timeout=120)
    assert not result.resolved, result.log_tail
    return result


async def evaluate(stub: swe_pb2_grpc.SweRunnerServiceStub, patch: str) -> swe_pb2.EvaluateResult:
    """`unresolved`, and when the tests ran, the instance's failing tests still fail."""
    result = await unresolved(stub, patch)
    if result.status == swe_pb2.EVAL_STATUS_COMPLETED:
        # The patched code ran, and its contained attack made it answer wrongly.
        outcomes = {t.name: t.outcome for t in result.tests}
        assert {outcomes[name] for name in INSTANCE.fail_to_pass} == {
            swe_pb2.TEST_OUTCOME_FAILED
        }, result.log_tail
    return result


async def test_fork_bomb_is_capped(stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path) -> None:
    attack = (
        "    import os\n"
        "    kids = 0\n"
        "    try:\n"
        "        while kids < 10000:\n"
        "            if os.fork() == 0:\n"
        "                os.execvp('bash', ['bash', '-c', ':(){ :|:& };:'])\n"
        "            kids += 1\n"
        "    except OSError:\n"
        "        pass\n"
        "    worked = kids >= 10000\n"
    )
    result = await evaluate(stub, hostile(tmp_path, attack))
    assert result.status in (swe_pb2.EVAL_STATUS_COMPLETED, swe_pb2.EVAL_STATUS_TIMEOUT)
    # The host can still start processes.
    subprocess.run(["true"], check=True, timeout=10)


def _bridge_gateway() -> str:
    done = subprocess.run(
        ["docker", "network", "inspect", "bridge", "--format",
         "{{(index .IPAM.Config 0).Gateway}}"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.strip()


async def test_network_is_unreachable(
    stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path
) -> None:
    gateway = _bridge_gateway()
    listener = socket.create_server((gateway, 0))
    port = listener.getsockname()[1]
    listener.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    attack = (
        "    import socket\n"
        f"    for host in ({gateway!r}, 'host.docker.internal', '1.1.1.1', 'pypi.org'):\n"
        "        try:\n"
        f"            socket.create_connection((host, {port} if host == {gateway!r} else 443),"
        " timeout=3).close()\n"
        "            worked = True\n"
        "        except OSError:\n"
        "            pass\n"
    )
    try:
        result = await evaluate(stub, hostile(tmp_path, attack))
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
    assert result.status == swe_pb2.EVAL_STATUS_COMPLETED, result.log_tail
    assert accepted == []


async def test_host_files_are_out_of_reach(
    stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path
) -> None:
    secret = secrets.token_hex(16)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    escaped = tmp_path / "escaped.txt"
    attack = (
        "    import glob, os\n"
        f"    for path in [{str(secret_file)!r}, '/proc/1/root' + {str(secret_file)!r},\n"
        "                 *glob.glob('/proc/*/root' + " + repr(str(secret_file)) + ")]:\n"
        "        try:\n"
        f"            worked = worked or open(path).read() == {secret!r}\n"
        "        except OSError:\n"
        "            pass\n"
        f"    for path in [{str(escaped)!r}, '/proc/1/root' + {str(escaped)!r}]:\n"
        "        try:\n"
        "            os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "            open(path, 'w').write('out')\n"
        "        except OSError:\n"
        "            pass\n"
    )
    result = await evaluate(stub, hostile(tmp_path / "repo", attack))
    assert result.status == swe_pb2.EVAL_STATUS_COMPLETED, result.log_tail
    assert not escaped.exists()
    assert secret not in result.log_tail.replace(repr(secret), "")


async def test_endless_output_is_bounded(stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    flood = (
        "head -c 100000000 /dev/zero | tr '\\0' x; python3 -m pytest -rA -p no:cacheprovider tests"
    )
    result = await stub.Evaluate(request_for(INSTANCE, INSTANCE.patch, test_command=flood),
                                 timeout=120)  # fmt: skip
    assert result.status == swe_pb2.EVAL_STATUS_COMPLETED, result.error
    assert result.resolved
    assert len(result.log_tail) <= 16384


async def test_memory_hog_is_capped(
    stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path
) -> None:
    # 1 GiB under the tests' 256 MiB cap (eval.memory_bytes): the kernel's OOM killer ends it.
    attack = (
        "    blocks = []\n"
        "    for _ in range(1024):\n"
        "        blocks.append(bytearray(1 << 20))\n"
        "    worked = True\n"
    )
    result = await unresolved(stub, hostile(tmp_path, attack))
    assert result.status in (swe_pb2.EVAL_STATUS_COMPLETED, swe_pb2.EVAL_STATUS_INFRA_ERROR)


def _forged_summary() -> str:
    """What a reward hack prints: a fake start marker and every required test PASSED."""
    lines = ["", "@@rlfleet-swe tests-start"]
    lines += [f"PASSED {name}" for name in [*INSTANCE.fail_to_pass, *INSTANCE.pass_to_pass]]
    return "\n".join(lines) + "\n"


async def test_forged_test_output_does_not_resolve(
    stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path
) -> None:
    """The patched code writes a fake summary straight to the container's output (past
    pytest's capture, through the shell's stdout) and ends pytest with exit code 0: the
    forged lines must not count, because results come only from the runner's own report."""
    attack = (
        "    import os\n"
        f"    forged = {_forged_summary()!r}\n"
        "    for pid in (os.getppid(), os.getpid()):\n"
        "        try:\n"
        "            fd = os.open(f'/proc/{pid}/fd/1', os.O_WRONLY)\n"
        "            os.write(fd, forged.encode()); os.close(fd)\n"
        "        except OSError:\n"
        "            pass\n"
        "    os._exit(0)\n"
    )
    result = await unresolved(stub, hostile(tmp_path, attack))
    outcomes = {t.name: t.outcome for t in result.tests if t.required}
    assert swe_pb2.TEST_OUTCOME_PASSED not in set(outcomes.values()), outcomes


async def test_patches_to_test_machinery_are_refused(
    stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path
) -> None:
    """A conftest.py (or pytest config, sitecustomize, a .pth file, a file of the test patch)
    could rewrite the test reports; a patch that touches one is refused and scores 0."""
    repo = host_checkout(INSTANCE, tmp_path)
    conftest = (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    (repo / "conftest.py").write_text(conftest)
    subprocess.run(["git", "add", "-N", "conftest.py"], cwd=repo, check=True)
    patch = subprocess.run(
        ["git", "diff"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    assert "conftest.py" in patch
    result = await unresolved(stub, patch)
    assert result.status == swe_pb2.EVAL_STATUS_PATCH_FAILED, result.log_tail
    assert "conftest.py" in result.error and "test" in result.error
