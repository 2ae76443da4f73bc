"""`rlfleet bench [name]`: runs bench/<name>.py and records its results (or lists them).

A benchmark module defines `DESCRIPTION` and `run(quick: bool) -> list[BenchResult]`;
its baseline is measured inside the same `run` call. Module names use underscores,
command names dashes (`weight-sync` → bench/weight_sync.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer
from rich.table import Table
from rlfleet_core.bench import record

from rlfleet_cli.ui import fail, out


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


def bench(
    name: Annotated[str | None, typer.Argument(help="Benchmark to run; omit to list them.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per result.")
    ] = False,
    quick: Annotated[bool, typer.Option(help="Fewer iterations (a smoke run).")] = False,
    save: Annotated[
        bool, typer.Option(help="Append results to bench/results/<name>.jsonl.")
    ] = True,
) -> None:
    """Run a benchmark: ours vs a baseline in the same run, as a ratio (higher is better).

    Results are appended to bench/results/<name>.jsonl (with a timestamp and the device).
    """
    try:
        bench_dir = find_bench_dir()
        if name is None:
            for bench_name, path in list_benchmarks(bench_dir).items():
                module = load_benchmark(bench_name, bench_dir)
                out.print(f"{bench_name:<16} {getattr(module, 'DESCRIPTION', path.name)}")
            return
        module = load_benchmark(name, bench_dir)
    except BenchNotFound as exc:
        raise fail(str(exc)) from None
    results = module.run(quick=quick)
    rows = record(results, bench_dir / "results") if save else [r.to_json() for r in results]
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row) + "\n")
        return
    table = Table(title=f"bench {name}  ({rows[0]['device'] if rows else ''})")
    for column in ("metric", "value", "baseline", "unit", "ratio", "target"):
        table.add_column(column, justify="left" if column in ("metric", "unit") else "right")
    for result in results:
        met = {True: "[green]", False: "[red]", None: ""}[result.met]
        table.add_row(
            result.metric,
            f"{result.value:.4g}",
            f"{result.baseline:.4g}",
            result.unit,
            f"{met}{result.ratio:.3f}",
            "" if result.target is None else f"≥ {result.target}",
        )
    out.print(table)
