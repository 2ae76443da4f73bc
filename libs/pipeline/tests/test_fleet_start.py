"""How a local fleet starts: ports bound by the services themselves (no pick-then-bind
race), every service at once, a start-up report, failures named, shared caches."""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV, write_token_file
from rlfleet_core.client import check_health
from rlfleet_core.processes import pid_alive
from rlfleet_pipeline.caches import CACHE_DIR_ENV, CACHE_SUBDIRS
from rlfleet_pipeline.fleet import FleetError, LocalFleet

LIGHT = ["trainer", "swe-runner"]  # the two services that start in about a second


def child_port_args(parent: int) -> list[int]:
    """The --port/--http-port numbers on the command lines of `parent`'s children."""
    ports = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            args = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        for flag, value in itertools.pairwise(args):
            if flag in ("--port", "--http-port") and value.isdigit() and value != "0":
                ports.append(int(value))
    return ports


@pytest.fixture
def port_thief() -> Iterator[list[int]]:
    """Binds (and listens on) every port this process's children are told to use on
    their command line, as soon as it appears: another program taking the port between
    the launcher's pick and the service's bind. Yields the ports it stole."""
    stolen: list[int] = []
    held: list[socket.socket] = []
    stop = threading.Event()

    def steal() -> None:
        while not stop.wait(0.005):
            for port in child_port_args(os.getpid()):
                if port in stolen:
                    continue
                sock = socket.socket()
                try:
                    sock.bind(("127.0.0.1", port))
                    sock.listen()
                except OSError:
                    sock.close()
                    continue
                stolen.append(port)
                held.append(sock)

    thread = threading.Thread(target=steal, daemon=True)
    thread.start()
    yield stolen
    stop.set()
    thread.join(5)
    for sock in held:
        sock.close()


@pytest.fixture
def caller_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One token for fleets started side by side in this process (the fleet's own token
    setup changes this process's environment, which concurrent fleets share)."""
    path = tmp_path / "token"
    write_token_file(path)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(path))


def test_a_port_taken_between_pick_and_bind_does_not_break_the_start(
    tmp_path: Path, port_thief: list[int]
) -> None:
    # With pick-then-bind the launcher names a port on the command line and the thief
    # takes it before the child binds it: "cannot bind gRPC ... is the port in use?".
    with LocalFleet(LIGHT, tmp_path, say=lambda _: None) as fleet:
        for name in LIGHT:
            assert check_health(fleet.target(name)) == "SERVING"
    assert port_thief == []  # no number was ever announced before it was bound


def test_many_fleets_started_at_once_never_collide(tmp_path: Path, caller_token: None) -> None:
    fleets = [
        LocalFleet(LIGHT, tmp_path / f"fleet{i}", say=lambda _: None, start_timeout_s=300)
        for i in range(4)
    ]
    with ThreadPoolExecutor(len(fleets)) as pool:
        starts = [pool.submit(fleet.start) for fleet in fleets]
        errors = [f.exception() for f in starts]
    try:
        assert errors == [None] * len(fleets)
        ports = [p for f in fleets for s in f.processes.values() for p in (s.port, s.http_port)]
        assert len(set(ports)) == len(ports) == 4 * len(fleets)
        for fleet in fleets:
            for name in LIGHT:
                assert check_health(fleet.target(name)) == "SERVING"
    finally:
        for fleet in fleets:
            fleet.stop()


def test_services_start_in_parallel_and_the_report_says_when(tmp_path: Path) -> None:
    lines: list[str] = []
    with LocalFleet(LIGHT, tmp_path, say=lines.append) as fleet:
        report = json.loads((tmp_path / "startup.json").read_text())
        assert report == fleet.report()
    times = report["services"]
    assert set(times) == set(LIGHT)
    # Both were spawned before either was SERVING: nobody waited for another.
    assert max(t["spawned_s"] for t in times.values()) < min(t["serving_s"] for t in times.values())
    for row in times.values():
        assert 0 <= row["spawned_s"] <= row["bound_s"] <= row["serving_s"] <= report["total_s"]
        assert row["load_s"] == pytest.approx(row["serving_s"] - row["bound_s"], abs=2e-3)
        assert row["grpc_port"] > 0 and row["http_port"] > 0
    assert lines[0].startswith("services SERVING in ")
    assert [line.split()[0] for line in lines[2:]] == ["swe-runner", "trainer"]


def test_reward_starts_once_the_sandbox_has_its_port(tmp_path: Path) -> None:
    pytest.importorskip("rlfleet_reward")
    pytest.importorskip("rlfleet_sandbox")
    with LocalFleet(["reward", "sandbox"], tmp_path, say=lambda _: None) as fleet:
        sandbox, reward = (fleet.report()["services"][n] for n in ("sandbox", "reward"))  # type: ignore[index]
        args = fleet.processes["reward"].process.args
        assert f"sandbox.target={fleet.target('sandbox')}" in args  # type: ignore[operator]
    assert reward["after"] == ["sandbox"]
    assert reward["spawned_s"] >= sandbox["bound_s"]


def test_a_failing_service_is_named_and_the_others_are_stopped(tmp_path: Path) -> None:
    fleet = LocalFleet(
        LIGHT, tmp_path, overrides={"trainer": ["server.grace_s=soon"]}, say=lambda _: None
    )
    with pytest.raises(FleetError) as info:
        fleet.start()
    assert "trainer exited with code 2 while starting" in str(info.value)
    assert "server.grace_s: expected a number" in str(info.value)  # its log tail
    other = fleet.processes["swe-runner"].process
    assert other.returncode is not None and not pid_alive(other.pid)
    report = json.loads((tmp_path / "startup.json").read_text())
    assert report["total_s"] is None and report["services"]["trainer"]["serving_s"] is None


def test_services_get_the_shared_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache))
    for var in CACHE_SUBDIRS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/mine/triton")  # the caller's own wins
    with LocalFleet(["swe-runner"], tmp_path / "run", say=lambda _: None) as fleet:
        pid = fleet.processes["swe-runner"].process.pid
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        seen = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        assert os.environ["HF_HOME"] == str(cache / "huggingface")  # for the trainer too
    assert seen[CACHE_DIR_ENV] == str(cache)
    assert seen["HF_HOME"] == str(cache / "huggingface")
    assert seen["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "torchinductor")
    assert seen["VLLM_CACHE_ROOT"] == str(cache / "vllm")
    assert seen["UV_CACHE_DIR"] == str(cache / "uv")
    assert seen["TRITON_CACHE_DIR"] == "/mine/triton"
    assert "HF_HOME" not in os.environ  # restored by stop()


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_services_do_not_spin_waiting_unless_the_operator_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str | None, expected: str
) -> None:
    if given is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    with LocalFleet(["swe-runner"], tmp_path / "run", say=lambda _: None) as fleet:
        pid = fleet.processes["swe-runner"].process.pid
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        seen = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        assert os.environ["OMP_WAIT_POLICY"] == expected  # the trainer started beside it too
    assert seen["OMP_WAIT_POLICY"] == expected
    assert os.environ.get("OMP_WAIT_POLICY") == given  # restored by stop()


def test_a_profile_cache_dir_is_the_runs_cache_folder_unless_the_env_names_one(
    tmp_path: Path,
) -> None:
    from rlfleet_pipeline.caches import cache_env, use_cache_dir
    from rlfleet_pipeline.launch.compose import ComposeStack
    from rlfleet_pipeline.launch.profiles import LocalProfile, load_profile

    env_toml = tmp_path / "env.toml"
    env_toml.write_text('[local]\nlauncher = "local"\ncache_dir = "shared/cache"\n')
    profile = load_profile("local", env_toml)
    assert isinstance(profile, LocalProfile) and profile.cache_dir == "shared/cache"
    env: dict[str, str] = {}
    use_cache_dir(profile.cache_dir, env)
    assert env == {CACHE_DIR_ENV: str(Path("shared/cache").absolute())}
    mine = {CACHE_DIR_ENV: "/mine"}
    use_cache_dir(profile.cache_dir, mine)
    assert mine == {CACHE_DIR_ENV: "/mine"}
    assert cache_env({}) == {}  # unset: every tool keeps its own default
    compose = ComposeStack(tmp_path / "compose.yaml", "p", mine).process_env()
    assert compose["HF_HOME"] == "/mine/huggingface" and compose["UV_CACHE_DIR"] == "/mine/uv"
