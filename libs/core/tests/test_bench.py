from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_core.bench import BenchResult, attach_before, before_rows, percentile, record

REQUIRED = {"name", "metric", "value", "unit", "baseline", "ratio", "target", "device", "timestamp"}


def test_ratio_is_oriented_so_higher_is_better() -> None:
    fast = BenchResult(
        "x", "rps", value=150.0, unit="req/s", baseline=100.0, target=1.0, device="cpu"
    )
    assert fast.ratio == pytest.approx(1.5)
    assert fast.met is True
    latency = BenchResult(
        "x",
        "p99_ms",
        value=20.0,
        unit="ms",
        baseline=10.0,
        target=0.9,
        higher_is_better=False,
        device="cpu",
    )
    assert latency.ratio == pytest.approx(0.5)
    assert latency.met is False
    assert BenchResult("x", "m", value=0.0, unit="u", baseline=1.0, device="cpu").ratio == 0.0


def test_record_appends_one_json_line_per_result(tmp_path: Path) -> None:
    results = [
        BenchResult(
            "demo",
            "rps",
            2.0,
            "req/s",
            1.0,
            target=1.0,
            device="cpu: test",
            extra={"concurrency": 4},
        ),
        BenchResult("demo", "p50_ms", 5.0, "ms", 10.0, higher_is_better=False, device="cpu: test"),
    ]
    record(results, tmp_path)
    record(results[:1], tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "demo.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert set(row) >= REQUIRED
    assert rows[0]["ratio"] == 2.0 and rows[0]["concurrency"] == 4
    assert rows[1]["ratio"] == 2.0 and rows[1]["higher_is_better"] is False


def test_percentile_interpolates_like_numpy() -> None:
    data = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(data, 50) == 3.0
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 10.0
    assert percentile(data, 90) == pytest.approx(7.6)  # numpy.percentile(data, 90)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_an_earlier_trees_rows_are_attached_by_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = tmp_path / "before.jsonl"
    rows = [{"metric": "rps", "value": 5.0, "ratio": 0.5, "ref": "abc1234"}]
    earlier.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    shared: dict[str, object] = {"program": "p"}
    results = [
        BenchResult("b", "rps", 10.0, "1/s", 10.0, extra=shared),
        BenchResult("b", "p99", 3.0, "ms", 3.0, extra=shared),
    ]
    assert before_rows("RLFLEET_TEST_BEFORE") == {}  # unset: nothing to compare
    monkeypatch.setenv("RLFLEET_TEST_BEFORE", str(earlier))
    attach_before(results, before_rows("RLFLEET_TEST_BEFORE"))
    assert results[0].extra == {"program": "p", "before_value": 5.0, "before_ratio": 0.5,
                                "before_ref": "abc1234"}  # fmt: skip
    assert results[1].extra == {"program": "p"} and shared == {"program": "p"}


def test_before_rows_names_a_line_that_is_not_json(tmp_path, monkeypatch):
    # A build line on stdout (the bench's own images) must not pass as a row, nor crash.
    earlier = tmp_path / "before.jsonl"
    earlier.write_text('{"metric": "rps", "value": 1, "ratio": 1}\nsha256:33cb 212120441\n')
    monkeypatch.setenv("RLFLEET_TEST_BEFORE", str(earlier))
    with pytest.raises(SystemExit, match=r"line 2 is not a JSON row.*sha256"):
        before_rows("RLFLEET_TEST_BEFORE")
