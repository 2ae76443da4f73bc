"""The suite's clock: where the test time goes, and a time budget for every test.

Loaded for every run by the root conftest.py. It does three things:

- **A budget per test.** A test may take `DEFAULT_BUDGET_S` (120 s) of setup + call:
  its own fixtures and its body. A test that needs more carries
  `@pytest.mark.budget(SECONDS, "why, in one line")`; one that runs over its budget fails
  with a message saying so, and how to mark it. Fixtures shared by several tests (class,
  module, package or session scope) are not charged to the first test that happens to
  start them: they are timed on their own and listed in the summary.
  `RLFLEET_TEST_BUDGET_SCALE` multiplies every budget (a slower machine than CI's).
- **A summary at the end:** the run's wall time, time per area (each `libs/<pkg>`,
  `services/<svc>`, `tests/`), the slowest files and the slowest shared fixtures.
- **A record:** with `RLFLEET_TEST_TIMES=PATH`, the same figures per test as JSON
  (`.ci/run` writes one; docs/development.md's time table comes from it).

Works the same under pytest-xdist: workers attach their timings to each report.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

DEFAULT_BUDGET_S = 120.0
HEAVY_LANE_S = 300.0
"""A file with a test budgeted at this or more runs in the heavy lane under xdist."""
HEAVY_LANE = "heavy-lane"
"""The group of the heavy files; with several lanes, heavy-lane-1, heavy-lane-2, ..."""
SHARED_SCOPES = {"class", "module", "package", "session"}
_SHARED_KEY = pytest.StashKey[dict[str, float]]()
_SETUP_KEY = pytest.StashKey[float]()
_CPU_KEY = pytest.StashKey[float]()


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (the services,
    stages and tools a test starts). Not counted: processes that daemons start (Docker
    containers, Ray's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


DOCKER_CPU_FILES = (
    ("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage", 1e-9),  # cgroup v1: nanoseconds
    ("/sys/fs/cgroup/cpu,cpuacct/docker/cpuacct.usage", 1e-9),
    ("/sys/fs/cgroup/docker/cpu.stat", 1e-6),  # cgroup v2, cgroupfs driver: usage_usec
)
"""Where the Docker engine accounts its containers' CPU time as one total (removed
containers included). With systemd's driver each container has a scope of its own that
goes with it: no total, so none is shown."""


def machine_cpu_s() -> dict[str, float | None]:
    """CPU seconds the whole machine has been busy (/proc/stat: all but idle and iowait)
    and those of Docker's containers, since boot: a run's figures are the differences."""
    busy: float | None = None
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        ticks = [int(f) for f in fields[:8]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    docker: float | None = None
    for path, unit in DOCKER_CPU_FILES:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if path.endswith("cpu.stat"):
            text = next(
                (line.split()[1] for line in text.splitlines() if line.startswith("usage_usec")), ""
            )
        try:
            docker = int(text.strip()) * unit
        except ValueError:
            continue
        break
    return {"busy_s": busy, "docker_s": docker}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "budget(seconds, why): this test may take up to `seconds` of setup + call "
        f"(default {DEFAULT_BUDGET_S:.0f} s); `why` says in one line what needs the time",
    )
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(SuiteClock(config), "suite-clock")
    elif config.getvalue("loadgroup"):
        config.pluginmanager.register(GroupSuffix(), "suite-clock-groups")


class GroupSuffix:
    """`--dist loadgroup` on pytest 9.2: pytest-xdist 3.8 writes the group into the node
    id's old `_nodeid` field, which pytest 9.2 no longer reads (its ids are structured),
    so every group was silently ignored (pytest-dev/pytest-xdist#1386, fix #1388 not
    released). After xdist's own hook, an id still without its group gets it the way
    xdist meant: `<nodeid>@<group>`, which its scheduler splits on."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        try:
            from _pytest.nodeid import NodeId  # pytest >= 9.2: the structured ids
        except ImportError:  # an older pytest reads `_nodeid`: xdist's own suffix holds
            return

        for item in items:
            group = _scope(item)
            if item.get_closest_marker("xdist_group") and not item.nodeid.endswith(f"@{group}"):
                item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


def budget_of(item: pytest.Item) -> float:
    """The item's budget in seconds; a `budget` mark without a reason is refused."""
    scale = float(os.environ.get("RLFLEET_TEST_BUDGET_SCALE", "1") or 1)
    mark = item.get_closest_marker("budget")
    if mark is None:
        return DEFAULT_BUDGET_S * scale
    seconds = mark.args[0] if mark.args else mark.kwargs.get("seconds")
    why = mark.args[1] if len(mark.args) > 1 else mark.kwargs.get("why", "")
    if not isinstance(seconds, (int, float)) or seconds <= 0 or not str(why).strip():
        raise pytest.UsageError(
            f"{item.nodeid}: write the budget mark as "
            '@pytest.mark.budget(SECONDS, "why this test needs them")'
        )
    return float(seconds) * scale


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist: each file goes to one worker whole (its module and session
    fixtures start once there), unless its tests name an `xdist_group` of their own.
    The files with a test budgeted at HEAVY_LANE_S or more (the end-to-end stages, the
    compose stacks) run in heavy lanes, one lane fewer than there are workers
    (`heavy_lanes`): a lane runs its files one after another, and one worker always
    works through the light files. (Two workers, both running end-to-end stages with
    two threads each, took 3-4x their time each; the suite now runs one thread a process,
    root conftest.py.) A file can leave the lanes with an `xdist_group` of its own (the
    fresh install: mostly downloads). The groups with the longest budgets go first, so
    the run does not end on one long test while the other workers idle. (Every worker
    collects the same order: the sort is stable and depends only on the marks.)"""
    budgets = {item.nodeid: budget_of(item) for item in items}  # a bad mark stops here
    if not hasattr(config, "workerinput"):
        return
    by_file: dict[str, float] = defaultdict(float)
    for item in items:
        by_file[_file(item)] = max(by_file[_file(item)], budgets[item.nodeid])
    lanes = heavy_lanes(
        {f: b for f, b in by_file.items() if b >= HEAVY_LANE_S},
        int(config.workerinput.get("workercount", 2)),
    )
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(lanes.get(_file(item), _file(item))))
    longest: dict[str, float] = defaultdict(float)
    for item in items:
        key = _scope(item)
        longest[key] = max(longest[key], budgets[item.nodeid])
    first_seen = {key: index for index, key in enumerate(dict.fromkeys(map(_scope, items)))}
    items.sort(key=lambda item: (-longest[_scope(item)], first_seen[_scope(item)]))


def heavy_lanes(heavy: dict[str, float], workers: int) -> dict[str, str]:
    """The lane of each heavy file (file -> budget): one lane fewer than workers (at least
    one), so one worker always works through the light files; the longest files first,
    each to the lane with the least budget so far."""
    loads = [0.0] * max(1, workers - 1)
    lanes: dict[str, str] = {}
    for path, budget in sorted(heavy.items(), key=lambda kv: (-kv[1], kv[0])):
        lane = loads.index(min(loads))
        loads[lane] += budget
        lanes[path] = HEAVY_LANE if len(loads) == 1 else f"{HEAVY_LANE}-{lane + 1}"
    return lanes


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _scope(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0] if mark and mark.args else _file(item))


def _area(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if parts[0] in ("libs", "services") else parts[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, None, None]:
    start = time.perf_counter()
    yield
    if fixturedef.scope not in SHARED_SCOPES:
        return
    item = getattr(request, "_pyfuncitem", None)
    if item is not None:
        shared = item.stash.setdefault(_SHARED_KEY, {})
        name = f"{fixturedef.argname} ({fixturedef.scope}, {fixturedef.baseid or '.'})"
        shared[name] = shared.get(name, 0.0) + time.perf_counter() - start


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_KEY] = _cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    shared = item.stash.get(_SHARED_KEY, {})
    if call.when == "teardown":
        report.user_properties.append(("cpu_s", _cpu_s() - item.stash.get(_CPU_KEY, 0.0)))
        return
    if call.when == "setup":
        item.stash[_SETUP_KEY] = max(0.0, call.duration - sum(shared.values()))
        if shared:
            report.user_properties.append(("shared_fixtures_s", dict(shared)))
        return
    if call.when != "call":
        return
    own = item.stash.get(_SETUP_KEY, 0.0) + call.duration
    report.user_properties.append(("own_s", own))
    budget = budget_of(item)
    if own > budget and report.outcome == "passed":
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {own:.1f} s (setup + call), over its budget of "
            f"{budget:.1f} s. Make it cheaper (a shared fixture, the tiny model, fewer "
            "steps), or, if the time buys coverage nothing else gives, mark it "
            '@pytest.mark.budget(SECONDS, "why, in one line") — docs/development.md, '
            '"Adding a slow test".'
        )


class SuiteClock:
    """Collects the reports (in the controller under xdist) and prints the summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.time()
        self.machine_at_start = machine_cpu_s()
        self.tests: dict[str, dict[str, Any]] = {}
        self.fixtures: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(
            report.nodeid, {"seconds": 0.0, "own_s": 0.0, "cpu_s": 0.0, "outcome": "passed"}
        )
        entry["seconds"] += report.duration
        for key, value in report.user_properties:
            if key in ("own_s", "cpu_s"):
                entry[key] = value
            elif key == "shared_fixtures_s":
                for name, seconds in value.items():
                    self.fixtures[name] += seconds
        if report.outcome != "passed" and entry["outcome"] == "passed":
            entry["outcome"] = report.outcome

    def summary(self) -> dict[str, Any]:
        files: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        areas: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for nodeid, entry in self.tests.items():
            for table, key in ((files, nodeid.split("::", 1)[0]), (areas, _area(nodeid))):
                table[key][0] += 1
                table[key][1] += entry["seconds"]
                table[key][2] += entry["cpu_s"]
        now = machine_cpu_s()
        machine = {
            key: (now[key] - start) if now[key] is not None and start is not None else None  # type: ignore[operator]
            for key, start in self.machine_at_start.items()
        }
        return {
            "wall_s": time.time() - self.started,
            "cores": os.cpu_count() or 1,
            "machine_busy_s": machine["busy_s"],
            "docker_cpu_s": machine["docker_s"],
            "test_s": sum(e["seconds"] for e in self.tests.values()),
            "cpu_s": sum(e["cpu_s"] for e in self.tests.values()),
            "areas": {k: {"tests": v[0], "seconds": v[1], "cpu_s": v[2]} for k, v in areas.items()},
            "files": {k: {"tests": v[0], "seconds": v[1], "cpu_s": v[2]} for k, v in files.items()},
            "shared_fixtures": dict(self.fixtures),
            "tests": self.tests,
        }

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        data = self.summary()
        if not data["tests"]:
            return
        write = terminalreporter.write_line
        terminalreporter.section("suite clock (tests/suite_clock.py)")
        write(
            f"wall {data['wall_s']:.0f} s; {len(data['tests'])} tests took "
            f"{data['test_s']:.0f} s in all (setup + call + teardown) and {data['cpu_s']:.0f} "
            "CPU seconds (the pytest processes and the children they waited for)"
        )
        if data["machine_busy_s"] is not None:
            capacity = data["wall_s"] * data["cores"]
            docker = data["docker_cpu_s"]
            write(
                f"the machine: {data['cores']} cores, busy {data['machine_busy_s']:.0f} CPU s "
                f"({100 * data['machine_busy_s'] / max(capacity, 1e-9):.0f} % of "
                f"{capacity:.0f}); Docker's containers "
                + (f"{docker:.0f} CPU s" if docker is not None else "not accounted here")
                + " (the rest: Ray's workers, daemons, anything else running)"
            )

        def table(title: str, rows: dict[str, Any], limit: int) -> None:
            ranked = sorted(rows.items(), key=lambda kv: -kv[1]["seconds"])[:limit]
            write(f"\n| {title} | tests | seconds | CPU seconds |\n| --- | --- | --- | --- |")
            for name, row in ranked:
                write(f"| {name} | {row['tests']} | {row['seconds']:.0f} | {row['cpu_s']:.0f} |")

        table("area", data["areas"], 50)
        table("slowest files", data["files"], 25)
        fixtures = sorted(data["shared_fixtures"].items(), key=lambda kv: -kv[1])[:15]
        fixtures = [(name, seconds) for name, seconds in fixtures if seconds >= 0.5]
        if fixtures:
            write("\n| shared fixture (scope, where) | setup seconds |\n| --- | --- |")
            for name, seconds in fixtures:
                write(f"| {name} | {seconds:.0f} |")
        target = os.environ.get("RLFLEET_TEST_TIMES")
        if target:
            Path(target).write_text(json.dumps(data, indent=1, sort_keys=True))
            write(f"\nper-test times: {target}")
