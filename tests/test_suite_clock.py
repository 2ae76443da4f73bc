"""The suite clock (tests/suite_clock.py) on small suites of its own: a test over its
budget fails naming the budget and how to mark it, a marked test gets its own budget,
shared fixtures are not charged to the test that first uses them, a budget mark without
a reason is refused, and the JSON record has the figures per test and per area."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

CLOCK = (Path(__file__).parent / "suite_clock.py").read_text()


@pytest.fixture(autouse=True)
def _inner_runs_write_nothing_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    # The inner suites would overwrite the outer run's JSON record and junit file
    # (.ci/run passes them through the environment).
    monkeypatch.delenv("RLFLEET_TEST_TIMES", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def _suite(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(suite_clock=CLOCK)
    pytester.makeconftest('pytest_plugins = ["suite_clock"]')
    pytester.makepyfile(test_budgets=body)


def test_over_budget_fails_and_marked_budget_holds(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _suite(
        pytester,
        """
import subprocess
import sys
import time
import pytest

@pytest.fixture(scope="session")
def shared():
    time.sleep(0.3)  # a shared start-up: timed on its own, not against the test

def test_slow():
    time.sleep(0.3)

@pytest.mark.budget(5000, "a child burning 0.4 s of CPU, to test the mark")
def test_marked():
    burn = "import time; t = time.process_time(); any(time.process_time() - t > 0.4 for _ in iter(int, 1))"
    subprocess.run([sys.executable, "-c", burn], check=True)

def test_quick_with_shared(shared):
    pass
""",
    )
    with monkeypatch.context() as env:  # for the inner run only: this test has its own budget
        # Scale 0.001: the default budget becomes 0.12 s, budget(5000, ...) 5 s (room for the
        # child's 0.4 CPU s on a loaded machine: at 1 s a run beside the suite went over).
        env.setenv("RLFLEET_TEST_BUDGET_SCALE", "0.001")
        env.setenv("RLFLEET_TEST_TIMES", str(pytester.path / "times.json"))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_slow took 0.3 s (setup + call), over its budget of 0.1 s*"])
    record = json.loads((pytester.path / "times.json").read_text())
    assert set(record["tests"]) == {
        f"test_budgets.py::{name}"
        for name in ("test_slow", "test_marked", "test_quick_with_shared")
    }
    assert record["tests"]["test_budgets.py::test_quick_with_shared"]["own_s"] < 0.1
    assert record["tests"]["test_budgets.py::test_quick_with_shared"]["seconds"] >= 0.3
    assert record["shared_fixtures"]["shared (session, test_budgets.py)"] >= 0.3
    assert record["areas"]["test_budgets.py"]["tests"] == 3
    # CPU: a child's is counted, a sleep's is not.
    # The child burns past 0.4 s of its clock; os.times counts whole clock ticks (and sums
    # them as floats: one run read 0.3999999999999999), so allow a few ticks.
    assert record["tests"]["test_budgets.py::test_marked"]["cpu_s"] >= 0.35
    assert record["tests"]["test_budgets.py::test_slow"]["cpu_s"] < 0.2
    assert record["files"]["test_budgets.py"]["cpu_s"] >= 0.35
    # The whole machine's busy time covers at least what the tests' processes used.
    assert record["machine_busy_s"] >= record["cpu_s"] - 0.1, record["machine_busy_s"]
    assert record["cores"] >= 1
    result.stdout.fnmatch_lines(["the machine: * cores, busy * CPU s (*"])


def test_budget_mark_needs_a_reason(pytester: pytest.Pytester) -> None:
    _suite(
        pytester,
        """
import pytest

@pytest.mark.budget(600)
def test_unexplained():
    pass
""",
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*test_unexplained: write the budget mark as*"])


@pytest.mark.parametrize("workers", [2, 3])
def test_heavy_files_keep_to_their_lanes_under_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Files with a test budgeted at HEAVY_LANE_S or more run in one lane fewer than
    there are workers (two workers: both on one, one after another; three: one on each
    of two); the other files spread over the workers, each file whole on one."""
    pytester.makepyfile(suite_clock=CLOCK)
    pytester.makeconftest('pytest_plugins = ["suite_clock"]')
    record = """
import os, pytest, time

def _note(name):
    with open(os.environ["WHERE"], "a") as out:
        out.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""
    heavy = (
        record
        + """
@pytest.mark.budget(400, "stands in for an end-to-end stage")
def test_long():
    time.sleep(0.5)
    _note(__name__)

def test_short_beside_it():
    _note(__name__)
"""
    )
    light = (
        record
        + """
@pytest.mark.parametrize("n", range(3))
def test_light(n):
    time.sleep(0.2)
    _note(__name__)
"""
    )
    pytester.makepyfile(test_heavy_a=heavy, test_heavy_b=heavy, test_light_c=light)
    pytester.makepyfile(test_light_d=light, test_light_e=light)
    where = pytester.path / "where.txt"
    monkeypatch.setenv("WHERE", str(where))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", str(workers), "--dist", "loadgroup", "--no-loadscope-reorder"
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()[-2000:]
    where_ran: dict[str, set[str]] = {}
    for line in where.read_text().split("\n") if where.exists() else []:
        if line:
            module, worker = line.split()
            where_ran.setdefault(module, set()).add(worker)
    assert len(where_ran) == 5, where_ran
    assert all(len(ws) == 1 for ws in where_ran.values()), where_ran  # each file whole
    same_lane = where_ran["test_heavy_a"] == where_ran["test_heavy_b"]
    assert same_lane == (workers == 2), where_ran
