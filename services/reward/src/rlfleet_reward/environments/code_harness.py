"""The trusted unit-test harness of the `code` environment: the program the sandbox runs.

Its source text (this file) plus one call, `main(<solution>, <entry point>)`, is the whole
program; the test code, the row's prompt and a secret nonce arrive on stdin. Stdlib only and
Python 3.11: it runs on the sandbox's /usr/bin/python3, where no rlfleet package exists.

Why two processes: a program that runs the tests and the solution in one interpreter can
forge any result (exit 0 from an atexit hook, `sys.exit(0)` before the tests, an object whose
`__eq__` is always True, a patched `AssertionError`). So:
- The process forks first. The child runs the solution and serves calls to its entry point
  over a pipe; its stdin is /dev/null and its stdout is stderr, so it can neither read the
  task nor write the verdict. Arguments and results cross as Python literals (repr, parsed
  back by `literal_value`, which builds only plain builtin values): no object of the
  solution ever reaches the tests.
- The parent (non-dumpable, so the child can neither ptrace it nor open its /proc/<pid>/mem
  or /proc/<pid>/fd) reads the task from stdin only after the fork, so the nonce never
  exists in the child's memory; it runs the test code against a proxy of the entry point
  and writes one verdict line `{"nonce": ..., "verdict": "pass" | "fail", ...}` to stdout.
The gateway counts a pass only when that line carries its nonce. Killing, stopping or
signalling the parent leaves no verdict, which scores 0.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import struct
import sys
import traceback
import types
from typing import Any, NoReturn

_MAX_FRAME_BYTES = 16 << 20
_MAX_INT_DIGITS = 50_000
_MAX_DEPTH = 100
_MAX_MESSAGE_CHARS = 300
# Exceptions a call may raise into the tests as themselves (tests may expect them); any
# other Exception arrives as CandidateError. Never StopIteration: raised from a function
# that `map` calls it would silently end the iteration a test is checking.
_PASSED_THROUGH = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    LookupError,
    ZeroDivisionError,
    ArithmeticError,
    OverflowError,
    AttributeError,
    RuntimeError,
    RecursionError,
    NotImplementedError,
)
_NUMBER_NAMES = {"inf": float("inf"), "nan": float("nan"), "infj": complex(0, float("inf"))}


class CandidateError(Exception):
    """The solution raised an exception the tests cannot catch as its own type."""


class CandidateGone(BaseException):
    """The solution broke the protocol (died, exited, sent a non-literal): the run fails,
    whatever the test code catches (a BaseException, so `except Exception` misses it)."""


# --- plain values: the only things that cross the pipe ------------------------------------


def plain(value: Any, depth: int = 0) -> Any:
    """`value` as builtin types only (namedtuple -> tuple, Counter -> dict, IntEnum -> int);
    TypeError for anything that is not data."""
    if depth > _MAX_DEPTH:
        raise TypeError("nested too deep")
    if value is None or isinstance(value, bool):
        return value
    scalar: Any
    for scalar in (int, float, complex, str, bytes):
        if isinstance(value, scalar):
            return value if type(value) is scalar else scalar(value)
    container: Any
    for container in (list, tuple, set, frozenset):
        if isinstance(value, container):
            return container(plain(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"a {type(value).__name__} is not a plain value")


def literal_value(text: str) -> Any:
    """Parse `repr` output back into plain builtin values (ast.literal_eval plus inf, nan,
    set() and frozenset()); ValueError for anything else."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ValueError(f"not a Python literal ({type(exc).__name__})") from None
    try:
        return _build(tree.body, 0)
    except (TypeError, RecursionError, MemoryError) as exc:  # e.g. a list as a set element
        raise ValueError(f"not a plain literal ({type(exc).__name__})") from None


def _build(node: ast.AST, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError("nested too deep")
    if isinstance(node, ast.Constant) and node.value is not Ellipsis:
        return node.value
    if isinstance(node, ast.Name) and node.id in _NUMBER_NAMES:
        return _NUMBER_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _build(node.operand, depth + 1)
        if isinstance(operand, bool) or not isinstance(operand, int | float | complex):
            raise ValueError("sign on a non-number")
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        left, right = _build(node.left, depth + 1), _build(node.right, depth + 1)
        if not (isinstance(left, int | float) and isinstance(right, complex)):
            raise ValueError("arithmetic is not a literal")
        return left + right if isinstance(node.op, ast.Add) else left - right
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = [_build(item, depth + 1) for item in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        keys = [_build(k, depth + 1) for k in node.keys if k is not None]
        return dict(zip(keys, (_build(v, depth + 1) for v in node.values), strict=True))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("set", "frozenset")
        and len(node.args) <= 1
        and not node.keywords
    ):
        items = _build(node.args[0], depth + 1) if node.args else []
        return set(items) if node.func.id == "set" else frozenset(items)
    raise ValueError(f"{type(node).__name__} is not a plain literal")


# --- framing: 4-byte length, then UTF-8 JSON ----------------------------------------------


def send(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    view = memoryview(struct.pack("!I", len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def receive(fd: int) -> dict[str, Any] | None:
    """The next message, or None at end of stream; ValueError for a malformed one."""
    header = _read_exactly(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack("!I", header)
    if size > _MAX_FRAME_BYTES:
        raise ValueError(f"message of {size} bytes")
    data = _read_exactly(fd, size)
    if data is None:
        return None
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError("message is not JSON") from None
    if not isinstance(message, dict):
        raise ValueError("message is not an object")
    return message


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- the child: runs the solution, answers calls -------------------------------------------


def serve_solution(solution: str, entry_point: str, requests: int, replies: int) -> NoReturn:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    try:
        exec(compile(solution, "<solution>", "exec"), main_module.__dict__)
        function = main_module.__dict__[entry_point]
        if not callable(function):
            raise TypeError(f"{entry_point} is a {type(function).__name__}, not a function")
    except BaseException as exc:  # the solution's own failure, reported to the parent
        traceback.print_exc()
        send(replies, {"load_error": f"{type(exc).__name__}: {exc}"[:_MAX_MESSAGE_CHARS]})
        os._exit(1)
    send(replies, {"ready": True})
    while (request := receive(requests)) is not None:
        try:
            result = function(*literal_value(request["args"]), **literal_value(request["kwargs"]))
        except BaseException as exc:
            reply = {"raised": type(exc).__name__, "message": str(exc)[:_MAX_MESSAGE_CHARS]}
        else:
            try:
                reply = {"value": repr(plain(result))}
            except BaseException as exc:
                reply = {"not_plain": f"{type(exc).__name__}: {exc}"[:_MAX_MESSAGE_CHARS]}
        send(replies, reply)
    os._exit(0)


# --- the parent: runs the tests ------------------------------------------------------------


class CandidateProxy:
    """Stands in for the entry point in the test code; each call is a round trip."""

    def __init__(self, name: str, requests: int, replies: int) -> None:
        self.__name__ = name
        self.requests, self.replies = requests, replies
        self.broken = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            raise CandidateGone(self.broken)
        try:
            call = {"args": repr(plain(args)), "kwargs": repr(plain(kwargs))}
        except TypeError as exc:
            self.broken = f"harness: the test passes an argument it cannot send ({exc})"
            raise CandidateGone(self.broken) from None
        try:
            send(self.requests, call)
            reply = receive(self.replies)
            if reply is None:
                raise ValueError("its process ended during a call")
            if "value" in reply:
                return literal_value(str(reply["value"]))
            if "not_plain" in reply:
                raise ValueError(f"it returned no plain value ({reply['not_plain']})")
        except (OSError, ValueError) as exc:
            self.broken = f"the solution broke the call protocol: {exc}"
            raise CandidateGone(self.broken) from None
        raised, message = str(reply.get("raised")), str(reply.get("message"))
        by_name = {cls.__name__: cls for cls in _PASSED_THROUGH}
        if raised in by_name:
            raise by_name[raised](message)
        if raised in ("SystemExit", "KeyboardInterrupt", "GeneratorExit", "CandidateGone"):
            self.broken = f"the solution raised {raised} during a call"
            raise CandidateGone(self.broken)
        raise CandidateError(f"{raised}: {message}")


def run_tests(task: dict[str, Any], proxy: CandidateProxy) -> dict[str, str]:
    """Exec the row's prompt (its helpers, e.g. HumanEval's `poly`) and tests, then call
    `check(candidate)`."""
    namespace: dict[str, Any] = {"__name__": "__test__"}
    with contextlib.suppress(Exception):  # a bare header: the tests report what is missing
        exec(compile(task["prompt"], "<prompt>", "exec"), namespace)
    namespace[task["entry_point"]] = proxy
    try:
        exec(compile(task["test"], "<test>", "exec"), namespace)
        namespace["check"](proxy)
    except BaseException as exc:
        lines = [
            f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<test>"
        ]
        where = f" (test line {lines[-1]})" if lines else ""
        return {"verdict": "fail", "error": f"{type(exc).__name__}: {exc}"[:300] + where}
    if proxy.broken:  # swallowed by the test code, still a failure
        return {"verdict": "fail", "error": proxy.broken}
    return {"verdict": "pass"}


def make_undumpable() -> None:
    """PR_SET_DUMPABLE 0: no ptrace, /proc/<pid>/mem or /proc/<pid>/fd for the child. The
    sandbox's runner is non-dumpable already and a fork inherits that; this is for runs
    elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (ImportError, OSError, AttributeError):
        print("harness: prctl(PR_SET_DUMPABLE) unavailable", file=sys.stderr)


def main(solution: str, entry_point: str) -> NoReturn:
    sys.set_int_max_str_digits(_MAX_INT_DIGITS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # no KeyboardInterrupt injected into tests
    make_undumpable()
    sys.stdout.flush()
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(requests_w)
        os.close(replies_r)
        serve_solution(solution, entry_point, requests_r, replies_w)
    os.close(requests_r)
    os.close(replies_w)
    task = json.loads(sys.stdin.read())  # only now: the nonce never exists in the child
    proxy = CandidateProxy(entry_point, requests_w, replies_r)
    try:
        first = receive(replies_r)
    except ValueError as exc:
        first = {"load_error": f"the solution broke the call protocol: {exc}"}
    if first == {"ready": True}:
        outcome = run_tests(task, proxy)
    else:
        error = (first or {}).get("load_error", "the solution's process ended before its tests")
        outcome = {"verdict": "fail", "error": f"solution did not load: {error}"[:300]}
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    sys.stdout.write(json.dumps({"nonce": task["nonce"], **outcome}) + "\n")
    sys.stdout.flush()
    os._exit(0)
