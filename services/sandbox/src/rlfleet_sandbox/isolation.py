"""The bubblewrap command line of a sandbox, as a pure function of the host layout.

Every sandbox gets fresh user, PID, IPC, UTS, cgroup, mount and network namespaces (the
network namespace has only a loopback of its own: no route to the host or anywhere), all
capabilities dropped (the runner drops the last two itself once it has mounted its
inode-bounded tmpfs), no further user namespaces (so a program cannot mount an unbounded
tmpfs of its own), read-only system directories, size-capped private tmpfs for /tmp (the
work dir lives there) and /dev/shm, a read-only root, /proc of its own PID namespace, and
an environment that holds only what the config lists. bwrap itself is started under an
unprivileged host uid when the service is root (see `spawn_identity`), so the single uid
mapped into the sandbox is never host root.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SANDBOX_UID = 65534
"""uid and gid seen inside the sandbox (`nobody`)."""
SANDBOX_HOSTNAME = "sandbox"


@dataclass(frozen=True)
class HostPath:
    """A host path to expose read-only: a directory/file, or a symlink to recreate."""

    path: str
    symlink_target: str | None = None


def probe_host_paths(paths: Sequence[str]) -> list[HostPath]:
    """What each path is on this host; missing paths are dropped (e.g. no /lib64)."""
    found = []
    for path in paths:
        if os.path.islink(path):
            found.append(HostPath(path, os.readlink(path)))
        elif os.path.exists(path):
            found.append(HostPath(path))
    return found


def build_bwrap_command(
    *,
    prefix: Sequence[str],
    bwrap: str,
    host_paths: Sequence[HostPath],
    tmpfs_bytes: int,
    env: Mapping[str, str],
    argv: Sequence[str],
) -> list[str]:
    """The full bwrap argv that runs `argv` isolated. Pure: same inputs, same list."""
    cmd = [
        *prefix,
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup",
        "--disable-userns",
        "--assert-userns-disabled",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        SANDBOX_HOSTNAME,
        # The runner is the namespace's init: bwrap's own init would be a dumpable process
        # of the sandbox's uid that a program could ptrace and that survives between runs;
        # as init, the runner also cannot be killed from inside.
        "--as-pid-1",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        # Kept only until the runner has mounted /tmp and /dev/shm with an inode limit
        # (bwrap's --size sets no nr_inodes) and dropped every capability (runner.harden).
        "--cap-add",
        "CAP_SYS_ADMIN",
        "--cap-add",
        "CAP_SETPCAP",
    ]
    for host in host_paths:
        if host.symlink_target is not None:
            cmd += ["--symlink", host.symlink_target, host.path]
        else:
            cmd += ["--ro-bind", host.path, host.path]
    cmd += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(tmpfs_bytes),
        "--tmpfs",
        "/tmp",
        "--size",
        str(tmpfs_bytes),
        "--tmpfs",
        "/dev/shm",
        # The root and /dev are bwrap's own tmpfs mounts with no size cap: read-only.
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        "--clearenv",
    ]
    for key, value in sorted(env.items()):
        cmd += ["--setenv", key, value]
    cmd += ["--", *argv]
    return cmd


def resolve_bwrap(bwrap: str) -> str:
    """Absolute path of the bwrap executable, or a FileNotFoundError saying how to get it."""
    found = shutil.which(bwrap)
    if found is None:
        raise FileNotFoundError(
            f"isolation.bwrap: {bwrap!r} not found; install bubblewrap "
            "(apt-get install -y bubblewrap) or set isolation.bwrap to its path"
        )
    return found


def privilege_drop_prefix(sandbox_uid: int, sandbox_gid: int, euid: int) -> list[str]:
    """As root, exec bwrap through `setpriv` under the configured unprivileged uid: a user
    namespace maps its uid to the uid of the process that created it, and that must not
    be host root. (setpriv rather than Popen(user=...): the latter forces a full fork()
    of the multi-threaded service, whose child crashed here while gRPC calls were in
    flight; a plain exec lets Python use vfork.)"""
    if euid != 0:
        return []
    return [
        "setpriv",
        f"--reuid={sandbox_uid}",
        f"--regid={sandbox_gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ]
