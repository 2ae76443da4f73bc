"""The sandbox's seccomp filter, built with libseccomp (the `libseccomp2` system library,
through ctypes: its Python bindings are not on PyPI) and installed by the runner once it
has finished building the sandbox (runner.harden).

A deny list, not an allow list: programs under test use a wide and changing set of
system calls, while the calls below serve no test program and are the kernel's most
exploited or most powerful surfaces. Denied calls fail with EPERM. System calls of
another ABI (i386 `int 0x80`, x32) kill the process: libseccomp's default for an
architecture the filter does not list, so the deny list cannot be bypassed through them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

DENIED_SYSCALLS = (
    # Asynchronous I/O rings: a large, often exploited surface that bypasses other filters.
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # Anonymous memory files: their pages are in no process's PSS and in no mount the
    # runner meters (the sandbox's tmpfs, SysV shm), so without cgroup v2 a run could hold
    # max_processes x max_open_files x max_file_size_bytes of them unseen (issue 28).
    # Files in /tmp or /dev/shm do the same job and are counted.
    "memfd_create",
    "memfd_secret",
    # Kernel programs, page-fault handling from user space, performance counters.
    "bpf",
    "userfaultfd",
    "perf_event_open",
    # Replacing or extending the kernel.
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    # Keyrings: kernel state that outlives a process.
    "keyctl",
    "add_key",
    "request_key",
    # Reading or writing other processes.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    # Mounts and namespaces: the sandbox's shape is final once the runner is ready.
    "mount",
    "umount2",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    # File handles bypass path checks; the rest touch host-wide state.
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "fanotify_init",
    "syslog",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "uselib",
    "vhangup",
)
"""System calls the sandbox denies (EPERM). Names unknown on this architecture are skipped."""

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_ACT_ERRNO = 0x00050000


class SeccompUnavailable(OSError):
    """libseccomp is missing or failed; the message says how to get it."""


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(
            f"isolation.seccomp: libseccomp not found ({exc}); install it "
            "(apt-get install -y libseccomp2) or set isolation.seccomp=false"
        ) from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.restype = ctypes.c_int
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def build_filter(denied: tuple[str, ...] = DENIED_SYSCALLS) -> bytes:
    """The filter as classic BPF (struct sock_filter[], 8 bytes per instruction)."""
    lib = _load()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("isolation.seccomp: seccomp_init failed")
    try:
        for name in denied:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not a system call of this architecture
                continue
            rc = lib.seccomp_rule_add(ctx, _SCMP_ACT_ERRNO | errno.EPERM, number, 0)
            if rc != 0:
                raise SeccompUnavailable(
                    f"isolation.seccomp: cannot deny {name}: {os.strerror(-rc)}"
                )
        out = os.memfd_create("seccomp-bpf")
        try:
            rc = lib.seccomp_export_bpf(ctx, out)
            if rc != 0:
                raise SeccompUnavailable(f"isolation.seccomp: export failed: {os.strerror(-rc)}")
            os.lseek(out, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(out, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(out)
    finally:
        lib.seccomp_release(ctx)
