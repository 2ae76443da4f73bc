"""Checks of the machine itself: Python, uv, bubblewrap, docker, loopback ports, disk."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from rlfleet_core.bwrap import PROCESS_FLAGS, SANDBOX_UID, namespace_flags

from rlfleet_pipeline.doctor.check import Check

PROBE_TIMEOUT_S = 20.0
"""Deadline of each external command (uv --version, docker info, the bwrap sandbox)."""

MIN_PYTHON = (3, 11)

# The loopback ports `deploy/compose/compose.yaml` publishes when its variables are unset
# (the local launcher picks free ports instead, so these matter only for --run compose).
COMPOSE_PORTS = {
    "TRAINER_PORT": 50051,
    "ROLLOUT_PORT": 50052,
    "REWARD_PORT": 50053,
    "SANDBOX_PORT": 50054,
    "SWE_PORT": 50055,
    "ROLLOUT_HTTP_PORT": 8052,
    "REWARD_HTTP_PORT": 8053,
    "SANDBOX_HTTP_PORT": 8054,
}

DISK_FAIL_BYTES = 2 * 2**30
"""Below this a run cannot hold the tiny pipeline's checkpoints and exports."""
DISK_WARN_BYTES = 10 * 2**30

# The sandbox service's isolation (rlfleet_core.bwrap, as services/sandbox isolation.py
# uses it), minus the mounts a real session needs: if this starts, the kernel and
# container allow the namespaces.
BWRAP_FLAGS = (*namespace_flags(SANDBOX_UID), *PROCESS_FLAGS)


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    found = ".".join(map(str, version))
    if version[:2] >= MIN_PYTHON:
        return Check("python", "ok", f"{found} ({sys.executable})")
    return Check(
        "python",
        "fail",
        f"{found}: rlfleet needs {'.'.join(map(str, MIN_PYTHON))} or newer",
        "uv python install 3.11 && uv sync --python 3.11",
    )


def check_uv() -> Check:
    uv = shutil.which("uv")
    if uv is None:
        return Check("uv", "warn", "not on PATH", "python3 -m pip install uv")
    try:
        result = _run([uv, "--version"])
    except subprocess.TimeoutExpired:
        return Check("uv", "warn", f"{uv} --version did not answer", "python3 -m pip install -U uv")
    return Check("uv", "ok", f"{result.stdout.strip() or _last_line(result.stderr)} ({uv})")


def bwrap_probe_command(bwrap: str, euid: int) -> list[str]:
    """A trivial sandbox (`true` inside every namespace the sandbox service unshares),
    started as that service starts it: as root, through setpriv under an unprivileged uid."""
    prefix: list[str] = []
    if euid == 0:
        prefix = [
            "setpriv",
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ]
    mounts = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            mounts += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            mounts += ["--ro-bind", top, top]
    true = shutil.which("true") or "/usr/bin/true"
    return [
        *prefix,
        bwrap,
        *BWRAP_FLAGS,
        *mounts,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--remount-ro",
        "/",
        "--clearenv",
        "--",
        true,
    ]


def _userns_fix() -> str:
    """The setting that most likely refuses unprivileged user namespaces here."""
    knobs = {
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns": (
            "1",
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        ),
        "/proc/sys/kernel/unprivileged_userns_clone": (
            "0",
            "sysctl -w kernel.unprivileged_userns_clone=1",
        ),
        "/proc/sys/user/max_user_namespaces": ("0", "sysctl -w user.max_user_namespaces=15000"),
    }
    for path, (bad, fix) in knobs.items():
        try:
            if Path(path).read_text().strip() == bad:
                return fix
        except OSError:
            continue
    # Docker's default seccomp and AppArmor profiles refuse the namespaces bwrap needs.
    return (
        "start this container with --security-opt seccomp=unconfined "
        "--security-opt apparmor=unconfined"
    )


def check_bwrap(path: str | None = None) -> Check:
    bwrap = shutil.which("bwrap", path=path)
    if bwrap is None:
        return Check(
            "bubblewrap",
            "fail",
            "bwrap not on PATH (the sandbox service needs it)",
            "apt-get install -y bubblewrap",
        )
    try:
        version = _last_line(_run([bwrap, "--version"]).stdout)
        result = _run(bwrap_probe_command(bwrap, os.geteuid()))
    except subprocess.TimeoutExpired:
        return Check(
            "bubblewrap", "fail", f"{bwrap}: the test sandbox did not finish", _userns_fix()
        )
    except OSError as exc:
        return Check("bubblewrap", "fail", f"{bwrap}: {exc}", "apt-get install -y bubblewrap")
    if result.returncode != 0:
        return Check(
            "bubblewrap",
            "fail",
            f"{version} ({bwrap}) cannot start a sandbox: {_last_line(result.stderr)}",
            _userns_fix(),
        )
    return Check("bubblewrap", "ok", f"{version} ({bwrap}); a test sandbox ran")


def check_docker(path: str | None = None) -> Check:
    docker = shutil.which("docker", path=path)
    if docker is None:
        return Check(
            "docker",
            "warn",
            "no docker client (needed only for --run compose and images)",
            "apt-get install -y docker.io",
        )
    try:
        result = _run([docker, "version", "--format", "{{.Server.Version}}"])
    except subprocess.TimeoutExpired:
        return Check(
            "docker", "warn", f"{docker}: the engine did not answer", "systemctl start docker"
        )
    if result.returncode != 0:
        return Check(
            "docker",
            "warn",
            f"client {docker}, engine unreachable: {_last_line(result.stderr)} "
            "(needed only for --run compose and images)",
            "systemctl start docker (no systemd: `dockerd >/var/log/dockerd.log 2>&1 &`)",
        )
    return Check("docker", "ok", f"engine {result.stdout.strip()} ({docker})")


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind: a port left in TIME_WAIT is free, a listening one is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def check_ports(environ: dict[str, str] | None = None) -> list[Check]:
    env = os.environ if environ is None else environ
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            free = sock.getsockname()[1]
    except OSError as exc:
        return [
            Check(
                "loopback",
                "fail",
                f"cannot bind a port on 127.0.0.1: {exc}",
                "ip link set lo up",
            )
        ]
    checks = [Check("loopback", "ok", f"127.0.0.1 binds (port {free} was free)")]
    busy = []
    for var, default in COMPOSE_PORTS.items():
        raw = env.get(var, "")
        port = int(raw) if raw.isdigit() else default
        if port_in_use(port):
            busy.append((var, port))
    if not busy:
        ports = ", ".join(str(p) for p in COMPOSE_PORTS.values())
        checks.append(Check("compose ports", "ok", f"free on 127.0.0.1: {ports}"))
    else:
        held = ", ".join(f"{port} ({var})" for var, port in busy)
        var, port = busy[0]
        checks.append(
            Check(
                "compose ports",
                "warn",
                f"in use on 127.0.0.1: {held} (only --run compose publishes them)",
                f"ss -ltnp 'sport = :{port}' to see who holds it, or export {var}=<free port>",
            )
        )
    return checks


def _existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(out: Path) -> list[Check]:
    from rlfleet_core.models import cache_dir

    places = {"runs": out, "rlfleet model cache": cache_dir()}
    try:
        from huggingface_hub import constants

        places["HF cache"] = Path(constants.HF_HUB_CACHE)
    except ImportError:
        pass
    checks = []
    for what, path in places.items():
        where = _existing(path)
        free = shutil.disk_usage(where).free
        found = f"{free / 2**30:.1f} GiB free at {path}"
        fix = f"free space on the disk of {where}, or " + (
            "pass --out on a larger disk"
            if what == "runs"
            else "set RLFLEET_CACHE_DIR / HF_HOME to a larger disk"
        )
        if free < DISK_FAIL_BYTES:
            checks.append(Check(f"disk ({what})", "fail", f"{found}; needs 2 GiB", fix))
        elif free < DISK_WARN_BYTES:
            checks.append(Check(f"disk ({what})", "warn", f"{found}; 10 GiB advised", fix))
        else:
            checks.append(Check(f"disk ({what})", "ok", found))
    return checks
