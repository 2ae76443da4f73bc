"""`rlfleet bench <name>`: runs bench/<name>.py and records its results.

A benchmark module defines `DESCRIPTION` and `run(quick: bool) -> list[BenchResult]`;
its baseline is measured inside the same `run` call. Module names use underscores,
command names dashes (`weight-sync` → bench/weight_sync.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


class BenchNotFound(LookupError):
    pass


def find_bench_dir(start: Path | None = None) -> Path:
    """The repository's bench/ folder: $RLFLEET_BENCH_DIR, else the nearest parent of the
    working directory that has bench/ beside a pyproject.toml."""
    env = os.environ.get("RLFLEET_BENCH_DIR")
    if env:
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "bench").is_dir() and (folder / "pyproject.toml").is_file():
            return folder / "bench"
    raise BenchNotFound(
        "no bench/ folder found: run from inside the rlfleet repository or set RLFLEET_BENCH_DIR"
    )


def list_benchmarks(bench_dir: Path) -> dict[str, Path]:
    return {
        p.stem.replace("_", "-"): p
        for p in sorted(bench_dir.glob("*.py"))
        if not p.name.startswith("_")
    }


def load_benchmark(name: str, bench_dir: Path) -> ModuleType:
    available = list_benchmarks(bench_dir)
    if name not in available:
        raise BenchNotFound(
            f"no benchmark {name!r} in {bench_dir}; available: {', '.join(available) or 'none'}"
        )
    spec = importlib.util.spec_from_file_location(
        f"rlfleet_bench_{name.replace('-', '_')}", available[name]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses (and pickling) look a module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise BenchNotFound(f"{available[name]} defines no run(quick) function")
    return module
