"""Pure parts: the bwrap command line, limits, paths, status rules, cell compilation."""

from __future__ import annotations

import signal

import pytest
from rlfleet_core.errors import InvalidArgument
from rlfleet_sandbox.config import LimitsConfig, SandboxServiceConfig
from rlfleet_sandbox.inside.runner import compile_cell
from rlfleet_sandbox.isolation import HostPath, build_bwrap_command, privilege_drop_prefix
from rlfleet_sandbox.seccomp import DENIED_SYSCALLS, build_filter
from rlfleet_sandbox.sessions import ANONYMOUS, owner_of
from rlfleet_sandbox.types import RunFacts, Status, check_file_path, classify, resolve_limits


def test_bwrap_command_is_exact() -> None:
    prefix = ["setpriv", "--reuid=1234", "--regid=1234", "--clear-groups", "--inh-caps=-all", "--"]
    cmd = build_bwrap_command(
        prefix=prefix,
        bwrap="/usr/bin/bwrap",
        host_paths=[HostPath("/usr"), HostPath("/lib", "usr/lib"), HostPath("/opt/py")],
        tmpfs_bytes=1 << 20,
        env={"PATH": "/usr/bin", "HOME": "/tmp/work"},
        argv=["/usr/bin/python3", "-I", "-c", "pass"],
    )
    assert cmd == [
        *prefix,  # first, as given
        "/usr/bin/bwrap",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup",
        "--disable-userns",
        "--assert-userns-disabled",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--hostname",
        "sandbox",
        "--as-pid-1",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "CAP_SYS_ADMIN",
        "--cap-add",
        "CAP_SETPCAP",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/lib",
        "/lib",
        "--ro-bind",
        "/opt/py",
        "/opt/py",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        "1048576",
        "--tmpfs",
        "/tmp",
        "--size",
        "1048576",
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        "--clearenv",
        "--setenv",
        "HOME",
        "/tmp/work",
        "--setenv",
        "PATH",
        "/usr/bin",
        "--",
        "/usr/bin/python3",
        "-I",
        "-c",
        "pass",
    ]
    assert "--share-net" not in cmd and "--bind" not in cmd  # nothing writable from the host


def test_privilege_drop_only_as_root() -> None:
    assert privilege_drop_prefix(4242, 4343, euid=0)[:3] == [
        "setpriv",
        "--reuid=4242",
        "--regid=4343",
    ]
    assert privilege_drop_prefix(4242, 4343, euid=1000) == []


def test_limits_default_clamp_and_reject() -> None:
    config = LimitsConfig()
    limits = resolve_limits({"timeout_s": 0, "memory_bytes": 1 << 40, "max_processes": 3}, config)
    assert limits.timeout_s == config.timeout_s
    assert limits.memory_bytes == config.max_memory_bytes
    assert limits.max_processes == 3
    with pytest.raises(InvalidArgument, match=r"limits.cpu_time_s: must be >= 0"):
        resolve_limits({"cpu_time_s": -1}, config)
    with pytest.raises(InvalidArgument, match=r"limits.timeout_s: must be >= 0 .* got nan"):
        resolve_limits({"timeout_s": float("nan")}, config)


def test_http_deadline_must_cover_a_default_run() -> None:
    with pytest.raises(ValueError, match=r"http.deadline_s \(5.0\) must be > limits.timeout_s"):
        SandboxServiceConfig.model_validate({"http": {"deadline_s": 5}})


def test_owner_is_a_hash_of_the_key_and_keyless_needs_permission() -> None:
    key = "k" * 32
    owner = owner_of(key, allow_keyless=False)
    assert key not in owner and owner == owner_of(key, allow_keyless=False)
    assert owner != owner_of("j" * 32, allow_keyless=False)
    assert owner_of(None, allow_keyless=True) == ANONYMOUS
    with pytest.raises(InvalidArgument, match=r"x-rlfleet-client-key: is required"):
        owner_of(None, allow_keyless=False)
    with pytest.raises(InvalidArgument, match=r"x-rlfleet-client-key: use 16-256"):
        owner_of("with space 1234567890", allow_keyless=False)


def test_seccomp_filter_is_classic_bpf_covering_the_list() -> None:
    bpf = build_filter()
    assert len(bpf) % 8 == 0  # struct sock_filter: 8 bytes per instruction
    # More instructions than denied calls: one compare each, plus the arch checks.
    assert len(bpf) // 8 > len(DENIED_SYSCALLS)


def test_limits_config_checks_defaults_against_caps() -> None:
    with pytest.raises(ValueError, match=r"timeout_s \(10.0\) must be <= max_timeout_s \(5.0\)"):
        LimitsConfig(max_timeout_s=5)


@pytest.mark.parametrize(
    "path", ["", "/abs", "../up", "a/../../b", "a/./b", "a//b", "sp ace/\n", "x" * 300]
)
def test_bad_file_paths(path: str) -> None:
    with pytest.raises(InvalidArgument, match=r"files\[2\].path"):
        check_file_path(path, 2)


def test_good_file_path() -> None:
    assert check_file_path("src/pkg/mod_1.py", 0) == "src/pkg/mod_1.py"


def _facts(**kw: object) -> RunFacts:
    base: dict[str, object] = {
        "exit_code": 0,
        "signal": 0,
        "cpu_s": 0.1,
        "timed_out": False,
        "memory_error": False,
        "output_overflow": False,
    }
    return RunFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_classify_order() -> None:
    limits = resolve_limits({"cpu_time_s": 2}, LimitsConfig())
    assert classify(_facts(), limits) is Status.OK
    assert classify(_facts(exit_code=1), limits) is Status.ERROR
    assert (
        classify(
            _facts(exit_code=-1, signal=signal.SIGKILL, timed_out=True, output_overflow=True),
            limits,
        )
        is Status.OUTPUT_LIMIT
    )
    assert (
        classify(_facts(exit_code=-1, signal=signal.SIGKILL, timed_out=True), limits)
        is Status.TIMEOUT
    )
    assert classify(_facts(exit_code=-1, signal=signal.SIGXCPU), limits) is Status.TIMEOUT
    assert (
        classify(_facts(exit_code=-1, signal=signal.SIGKILL, cpu_s=2.01), limits) is Status.TIMEOUT
    )
    assert classify(_facts(exit_code=-1, signal=signal.SIGKILL, cpu_s=0.5), limits) is Status.ERROR
    assert classify(_facts(exit_code=1, memory_error=True), limits) is Status.MEMORY
    assert (
        classify(_facts(exit_code=2, stderr_tail=b"bash: xmalloc: cannot allocate 8 bytes"), limits)
        is Status.MEMORY
    )
    assert classify(_facts(exit_code=-1, signal=signal.SIGSEGV), limits) is Status.ERROR


def test_compile_cell_echoes_only_a_trailing_expression() -> None:
    assert len(compile_cell("x = 1\nx", interactive=True)) == 2
    assert len(compile_cell("x = 1", interactive=True)) == 1
    assert len(compile_cell("x = 1\nx", interactive=False)) == 1
