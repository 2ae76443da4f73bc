"""The benchmark result convention shared by every `rlfleet bench <name>`.

A benchmark measures a metric for our code and for a baseline *in the same run* and
reports the ratio, oriented so that higher is better. Each result is one JSON object:
name, metric, value, unit, baseline, ratio, target, device (+ timestamp when recorded),
appended to bench/results/<name>.jsonl.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class BenchResult:
    name: str
    """Benchmark name, as in `rlfleet bench <name>`."""
    metric: str
    """What was measured, e.g. "rps_c16" or "p99_latency_ms_c16"."""
    value: float
    unit: str
    baseline: float
    """The same metric for the baseline, measured in the same run."""
    target: float | None = None
    """The ratio we aim for (ratio >= target), if this metric has one."""
    higher_is_better: bool = True
    device: str = field(default_factory=lambda: describe_device())
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """value/baseline, inverted for lower-is-better metrics, so higher is always better."""
        if self.value <= 0 or self.baseline <= 0:
            return 0.0
        return self.value / self.baseline if self.higher_is_better else self.baseline / self.value

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.ratio >= self.target

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("higher_is_better")
        extra = data.pop("extra")
        data["ratio"] = round(self.ratio, 4)
        data["higher_is_better"] = self.higher_is_better
        data.update(extra)
        return data


def describe_device() -> str:
    """What ran the benchmark, e.g. "cpu: AMD EPYC 9B14 x2" or "cuda: NVIDIA H100 80GB HBM3 x1"."""
    override = os.environ.get("RLFLEET_BENCH_DEVICE")
    if override:
        return override
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # optional: CPU needs none

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except ImportError:
        pass
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model} x{os.cpu_count()}"


def record(results: Sequence[BenchResult], results_dir: Path) -> list[dict[str, Any]]:
    """Append each result with a timestamp to results_dir/<name>.jsonl; return the rows."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = []
    for result in results:
        row = {**result.to_json(), "timestamp": stamp}
        with (results_dir / f"{result.name}.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        rows.append(row)
    return rows


def percentile(samples: Sequence[float], q: float) -> float:
    """q-th percentile (q in [0, 100]) with linear interpolation, as numpy's default."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"q ({q}) must be within [0, 100]")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def before_rows(env: str) -> dict[str, dict[str, Any]]:
    """This benchmark's rows from an earlier tree, by metric: the JSONL file named by the
    environment variable `env` (`rlfleet bench <name> --json --no-save` run there), or {}."""
    path = os.environ.get(env)
    if not path:
        return {}
    rows = []
    with open(path) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(
                    f"{env}={path}: line {number} is not a JSON row ({exc.msg}): {line[:80]!r}; "
                    "write it with `rlfleet bench <name> --json --no-save > FILE`"
                ) from None
    return {str(row["metric"]): row for row in rows}


def attach_before(results: Sequence[BenchResult], rows: dict[str, dict[str, Any]]) -> None:
    """Name the earlier tree's figure in each result's extra (`before_value`,
    `before_ratio`, `before_ref`), e.g. to show what a change costs."""
    for result in results:
        row = rows.get(result.metric)
        if row is not None:  # a copy: results may share one extra dict
            result.extra = {
                **result.extra,
                "before_value": row["value"],
                "before_ratio": row["ratio"],
                "before_ref": row.get("ref", row.get("timestamp", "")),
            }
