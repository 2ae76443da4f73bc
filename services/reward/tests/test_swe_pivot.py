"""`swe_pivot` (stage SWE1): a table of next actions against a demonstrated one, in process
and through the real gateway (gRPC Score). Equivalent actions written differently score 1
(the issue's Done-when); near misses score 0; bad rows are refused naming the field;
hostile responses (huge, deeply nested, many calls) score 0 within bounds."""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import pytest
from reward_support import RewardServer, nemo_response, score_request
from rlfleet_proto.v1 import reward_pb2_grpc
from rlfleet_reward.environments import get_environment
from rlfleet_reward.environments.swe_equivalence import bash_form
from rlfleet_reward.types import FailureKind, RowError, Sample, ToolCall

SOURCE = (
    "def median(values):\n    ordered = sorted(values)\n    return ordered[len(ordered) // 2]\n"
)
FIXED = SOURCE.replace(
    "    return ordered[len(ordered) // 2]\n",
    "    mid = len(ordered) // 2\n"
    "    if len(ordered) % 2:\n"
    "        return ordered[mid]\n"
    "    return (ordered[mid - 1] + ordered[mid]) / 2\n",
)
OLD = "    return ordered[len(ordered) // 2]\n"
NEW = FIXED[len(SOURCE) - len(OLD) :]


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def row(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "expected_action": {"name": name, "arguments": arguments},
        "workdir": "/testbed",
        "files": {"tinystats/core.py": SOURCE},
    }


BASH = row("bash", command="grep -rn 'def median' tinystats")
LS = row("bash", command="ls -la tinystats")
HEAD = row("bash", command="head -n 5 tinystats/core.py")
PYTEST = row("bash", command="python3 -m pytest -q -x tests/test_core.py")
VIEW = row("view", path="tinystats/core.py")
EDIT = row("edit", path="tinystats/core.py", old_str=OLD, new_str=NEW)
SUBMIT = row("submit")

# Commands answering BASH (`grep -rn 'def median' tinystats`), by case id: the same
# search written otherwise, and near misses that search something else.
BASH_SAME_SEARCH = {
    "bash-same": "grep -rn 'def median' tinystats",
    "bash-quotes": 'grep -rn "def median" tinystats',
    "bash-spaces": "grep   -rn  'def median'   tinystats",
    "bash-flag-order": "grep -nr 'def median' tinystats",
    "bash-flags-split": "grep -n -r 'def median' tinystats",
    "bash-flag-after": "grep 'def median' tinystats -rn",
    "bash-cd-workdir": "cd /testbed && grep -rn 'def median' tinystats",
    "bash-trailing-semi": "grep -rn 'def median' tinystats;",
}
BASH_OTHER_SEARCH = {
    "bash-other-pattern": "grep -rn 'def mean' tinystats",
    "bash-missing-flag": "grep -n 'def median' tinystats",
    "bash-other-dir": "grep -rn 'def median' tests",
    "bash-pipe-added": "grep -rn 'def median' tinystats | head",
    "bash-cd-elsewhere": "cd /tmp && grep -rn 'def median' tinystats",
}


def bash_cases(
    commands: dict[str, str], reward: float
) -> list[tuple[str, dict[str, Any], str, float]]:
    return [(case_id, BASH, call("bash", command=c), reward) for case_id, c in commands.items()]


# (id, row, response, reward)
EQUIVALENT = [
    *bash_cases(BASH_SAME_SEARCH, 1.0),
    ("ls-flags", LS, call("bash", command="ls -a -l tinystats"), 1.0),
    # Expansion characters keep the quotes (they matter to the shell); flags still reorder.
    (
        "bash-glob-other-path",
        row("bash", command='grep -rn "def .*(" .'),
        call("bash", command='grep -nr "def .*(" ./'),
        0.0,
    ),
    (
        "bash-glob-same-quotes",
        row("bash", command='grep -rn "def .*(" .'),
        call("bash", command='grep  -n -r "def .*(" .'),
        1.0,
    ),
    (
        "bash-glob-other-quotes",
        row("bash", command='grep -rn "def .*(" .'),
        call("bash", command="grep -rn 'def .*(' ."),
        0.0,
    ),
    ("head-attached-value", HEAD, call("bash", command="head -n5 tinystats/core.py"), 1.0),
    (
        "pytest-flags",
        PYTEST,
        call("bash", command="python3 -m pytest -x -q tests/test_core.py"),
        1.0,
    ),
    ("view-abs-path", VIEW, call("view", path="/testbed/tinystats/core.py"), 1.0),
    ("view-dot-path", VIEW, call("view", path="./tinystats//core.py"), 1.0),
    ("view-whole-range", VIEW, call("view", path="tinystats/core.py", view_range=[1, -1]), 1.0),
    ("edit-same", EDIT, call("edit", path="tinystats/core.py", old_str=OLD, new_str=NEW), 1.0),
    (
        "edit-shorter-context",
        EDIT,
        call(
            "edit",
            path="/testbed/tinystats/core.py",
            old_str="    return ordered[len(ordered) // 2]",
            new_str=NEW.rstrip("\n"),
        ),
        1.0,
    ),
    (
        "edit-whole-file",
        EDIT,
        call("edit", path="tinystats/core.py", old_str="", new_str=FIXED),
        1.0,
    ),
    ("submit", SUBMIT, call("submit"), 1.0),
    ("submit-extra-args", SUBMIT, call("submit", reason="done"), 1.0),
    (
        "think-then-call",
        BASH,
        "<think>look</think>I will search.\n"
        + call("bash", command="grep -rn 'def median' tinystats"),
        1.0,
    ),
    (
        "arguments-as-string",
        BASH,
        '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"grep -nr \'def median\' tinystats\\"}"}</tool_call>',
        1.0,
    ),
]

NEAR_MISSES = [
    *bash_cases(BASH_OTHER_SEARCH, 0.0),
    ("bash-and-vs-semi", row("bash", command="cd x && ls"), call("bash", command="cd x ; ls"), 0.0),
    ("head-other-count", HEAD, call("bash", command="head -n 6 tinystats/core.py"), 0.0),
    ("pytest-other-file", PYTEST, call("bash", command="python3 -m pytest -q -x tests"), 0.0),
    # Quoting matters once the shell expands: "$x" and $x are different commands.
    (
        "bash-expansion-quotes",
        row("bash", command='echo "$HOME"'),
        call("bash", command="echo $HOME"),
        0.0,
    ),
    ("view-other-file", VIEW, call("view", path="tinystats/__init__.py"), 0.0),
    ("view-other-range", VIEW, call("view", path="tinystats/core.py", view_range=[1, 2]), 0.0),
    ("view-via-bash", VIEW, call("bash", command="cat tinystats/core.py"), 0.0),
    (
        "edit-other-content",
        EDIT,
        call("edit", path="tinystats/core.py", old_str=OLD, new_str=NEW.replace("/ 2", "// 2")),
        0.0,
    ),
    (
        "edit-not-unique",
        EDIT,
        call("edit", path="tinystats/core.py", old_str="ordered", new_str="xs"),
        0.0,
    ),
    (
        "edit-not-found",
        EDIT,
        call("edit", path="tinystats/core.py", old_str="nope", new_str=NEW),
        0.0,
    ),
    (
        "edit-other-file",
        EDIT,
        call("edit", path="tinystats/other.py", old_str=OLD, new_str=NEW),
        0.0,
    ),
    ("edit-whole-file-wrong", EDIT, call("edit", path="tinystats/core.py", new_str=SOURCE), 0.0),
    ("submit-vs-bash", BASH, call("submit"), 0.0),
    ("no-call", BASH, "grep -rn 'def median' tinystats", 0.0),
    (
        "two-calls",
        BASH,
        call("bash", command="ls") + call("bash", command="grep -rn 'def median' tinystats"),
        0.0,
    ),
    (
        "unclosed",
        BASH,
        "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": "ls"}}),
        0.0,
    ),
    ("bad-json", BASH, "<tool_call>{name: bash}</tool_call>", 0.0),
    ("args-not-object", BASH, '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', 0.0),
    ("command-not-string", BASH, call("bash", command=["grep"]), 0.0),
    ("unsplittable", BASH, call("bash", command="grep -rn 'def median tinystats"), 0.0),
]

HOSTILE = [
    ("nested-json", BASH, "<tool_call>" + "[" * 200_000 + "]" * 200_000 + "</tool_call>", 0.0),
    (
        "nested-arguments",
        BASH,
        '<tool_call>{"name": "bash", "arguments": "' + "[" * 100_000 + '"}</tool_call>',
        0.0,
    ),
    ("huge-command", BASH, call("bash", command="grep " + "a " * 600_000), 0.0),
    ("many-calls", BASH, call("bash", command="ls") * 50_000, 0.0),
    ("many-open-tags", BASH, "<tool_call>" * 100_000, 0.0),
]

CASES = EQUIVALENT + NEAR_MISSES + HOSTILE


def _score(r: dict[str, Any], text: str) -> Any:
    env = get_environment("swe_pivot")
    return env.score(env.parse_row(r), Sample(text))


@pytest.mark.parametrize(("case_id", "r", "text", "reward"), CASES, ids=[c[0] for c in CASES])
def test_case_in_process(case_id: str, r: dict[str, Any], text: str, reward: float) -> None:
    score = _score(r, text)
    assert score.reward == reward, (case_id, score.info)
    assert score.components == {"equivalent_action": reward}
    assert score.info["verdict"] == ("equivalent" if reward else score.info["verdict"])
    if not reward:
        assert score.info["verdict"] != "equivalent", score.info


def test_verdicts_say_why() -> None:
    assert _score(BASH, "no call here").info["verdict"] == "no_call"
    bad = _score(BASH, "<tool_call>{oops</tool_call>").info
    assert bad["verdict"] == "malformed_call" and "not valid JSON" in bad["error"]
    assert _score(BASH, call("bash", command="ls") * 2).info["verdict"] == "multiple_calls"
    miss = _score(EDIT, call("edit", path="tinystats/core.py", old_str="x", new_str="y")).info
    assert miss["verdict"] == "not_equivalent" and "exactly once" in miss["reason"]
    deep = _score(BASH, "<tool_call>" + "[" * 200_000 + "]" * 200_000 + "</tool_call>").info
    assert deep["verdict"] == "malformed_call" and "nests too deeply" in deep["error"]


def test_structured_tool_calls_are_read_first() -> None:
    env = get_environment("swe_pivot")
    sample = Sample(
        "", tool_calls=(ToolCall("bash", {"command": "grep -nr 'def median' tinystats"}),)
    )
    assert env.score(env.parse_row(BASH), sample).reward == 1.0


def test_bash_forms() -> None:
    # Redirections keep a command's words in order (a flag could not be moved across them).
    assert bash_form("ls -la 2>/dev/null", "/testbed") != bash_form("ls -al 2>/dev/null", "/t")
    assert bash_form("ls -la", "/testbed") == bash_form("ls -al", "/testbed")
    # A program outside FLAG_PROGRAMS keeps its flags in order.
    assert bash_form("sed -n -e 1p f", "/w") != bash_form("sed -e 1p -n f", "/w")
    # A long option without '=' may take the next word: no reordering.
    assert bash_form("grep --include x -r p .", "/w") != bash_form("grep -r --include x p .", "/w")


BAD_ROWS = [
    ({}, "expected_action"),
    ({"expected_action": "bash ls"}, "expected_action"),
    ({"expected_action": {"arguments": {}}}, "expected_action.name"),
    ({"expected_action": {"name": "bash", "arguments": "[1]"}}, "expected_action.arguments"),
    ({"expected_action": {"name": "bash", "arguments": {}}}, "expected_action.arguments.command"),
    (
        {"expected_action": {"name": "view", "arguments": {"path": " "}}},
        "expected_action.arguments.path",
    ),
    (
        {"expected_action": {"name": "edit", "arguments": {"path": "a"}}},
        "expected_action.arguments.new_str",
    ),
    ({**BASH, "workdir": "testbed"}, "workdir"),
    ({**BASH, "files": {"a": 1}}, "files"),
    (
        {
            **EDIT,
            "expected_action": {
                "name": "edit",
                "arguments": {"path": "tinystats/core.py", "old_str": "zzz", "new_str": "y"},
            },
        },
        "expected_action.arguments.old_str",
    ),
]


@pytest.mark.parametrize(("r", "field"), BAD_ROWS, ids=[f for _, f in BAD_ROWS])
def test_bad_rows_name_the_field(r: dict[str, Any], field: str) -> None:
    with pytest.raises(RowError) as err:
        get_environment("swe_pivot").parse_row(r)
    assert err.value.field == field, err.value


GRPC_CASES = EQUIVALENT[:6] + EQUIVALENT[-6:] + NEAR_MISSES[:4] + HOSTILE[:1]


@pytest.mark.parametrize(
    ("case_id", "r", "text", "reward"), GRPC_CASES, ids=[c[0] for c in GRPC_CASES]
)
def test_case_over_grpc(
    stub: reward_pb2_grpc.RewardServiceStub,
    case_id: str,
    r: dict[str, Any],
    text: str,
    reward: float,
) -> None:
    result = stub.Score(score_request("swe_pivot", r, text, request_id=case_id), timeout=30)
    assert FailureKind(result.failure_kind) is FailureKind.NONE, result.failure_reason
    assert result.reward == reward, dict(result.info)
    assert dict(result.reward_components) == {"equivalent_action": reward}


def test_bad_row_over_grpc(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(score_request("swe_pivot", {**BASH, "workdir": "rel"}, "x"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("row.workdir:"), err.value.details()


def test_structured_calls_over_http(reward_server: RewardServer) -> None:
    """NeMo-Gym's face: a `function_call` output item is the call (no text needed)."""
    body = {
        "responses_create_params": {"input": [{"role": "user", "content": "fix it"}]},
        **BASH,
        "response": nemo_response(
            "",
            function_calls=[
                {"name": "bash", "arguments": {"command": "grep -nr 'def median' tinystats"}}
            ],
        ),
    }
    reply = httpx.post(f"{reward_server.http_url}/swe_pivot/verify", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["reward"] == 1.0
    bad = httpx.post(
        f"{reward_server.http_url}/swe_pivot/verify", json={**body, "workdir": "rel"}, timeout=30
    )
    assert bad.status_code == 422 and bad.json()["field"] == "workdir", bad.text
