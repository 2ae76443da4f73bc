"""NeMo-Gym's own resources servers over real HTTP, the peer of `rlfleet bench reward`.

Each server runs in the side environment named by $RLFLEET_NEMO_GYM_PYTHON (a Python with
nemo-gym 0.7.0's dependencies) and $RLFLEET_NEMO_GYM_SRC (the unpacked wheel), built by
services/reward/parity/side_env.sh; services/reward/parity/serve_reference.py builds it
as NeMo-Gym does and serves its own FastAPI app with uvicorn on a free port. Without the
variables the benchmark says so and runs without the peer. (A helper module: its leading
underscore keeps it out of `rlfleet bench`'s list.)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rlfleet_core.bench import BenchResult, percentile
from rlfleet_core.ports import pick_free_port
from rlfleet_reward.environments import get_environment
from rlfleet_reward.types import RowError

REPO = Path(__file__).resolve().parents[1]
SERVE = REPO / "services/reward/parity/serve_reference.py"
# Our environment -> NeMo-Gym's resources server folder.
SERVERS = {"structured_outputs": "structured_outputs", "math": "math_with_judge"}


def missing() -> str | None:
    """Why the peer cannot run here, or None."""
    names = ("RLFLEET_NEMO_GYM_PYTHON", "RLFLEET_NEMO_GYM_SRC")
    unset = [n for n in names if not os.environ.get(n)]
    if unset:
        return (
            f"{' and '.join(unset)} not set: no NeMo-Gym peer "
            "(build one with services/reward/parity/side_env.sh DIR)"
        )
    return None


def start_all(folder: Path) -> dict[str, Peer]:
    """A running peer per environment in SERVERS; {} (and the reason printed) without
    the side environment."""
    reason = missing()
    if reason is not None:
        print(f"reward bench: {reason}", file=sys.stderr)
        return {}
    peers: dict[str, Peer] = {}
    try:
        for env in SERVERS:
            peers[env] = Peer(env, folder / f"nemo_gym_{env}.log")
    except BaseException:
        for running in peers.values():
            running.stop()
        raise
    return peers


class Peer:
    """One NeMo-Gym server process; `url` is its root (POST {url}/verify)."""

    def __init__(self, env: str, log: Path) -> None:
        port = pick_free_port()  # the peer takes a number on its command line
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [os.environ["RLFLEET_NEMO_GYM_PYTHON"], str(SERVE), SERVERS[env], str(port)],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONPATH": os.environ["RLFLEET_NEMO_GYM_SRC"],
                "PYTHONWARNINGS": "ignore",
            },
        )
        deadline = time.monotonic() + 180  # math-verify and sympy import for a while
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"NeMo-Gym {env} server exited: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/openapi.json", timeout=2):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"NeMo-Gym {env} server did not answer in 180 s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def verify_body(row: dict[str, Any], text: str) -> dict[str, Any]:
    """A verify request as a NeMo-Gym agent sends it (a full Responses-API response), which
    both servers accept unchanged."""
    return {
        **row,
        "responses_create_params": {"input": [{"role": "user", "content": "q"}]},
        "response": {
            "id": "resp",
            "created_at": 0,
            "model": "bench",
            "object": "response",
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "output": [
                {
                    "id": "msg",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
        },
    }


def valid(items: list[Any]) -> list[Any]:
    """The items both servers score (NeMo-Gym answers a malformed row differently), with
    the `question` NeMo-Gym's math server requires."""
    out = []
    for item in items:
        with contextlib.suppress(RowError):
            get_environment(item.env).parse_row(item.row)
            out.append(item._replace(row={"question": "q", **item.row}))
    return out


def versus_rows(
    metric: str, ours: Any, theirs: Any, target: float, items: int
) -> list[BenchResult]:
    extra: dict[str, Any] = {
        "concurrency": 64,
        "answers": items,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "peer": "nemo-gym 0.7.0 resources server, uvicorn+httptools, 1 process, HTTP",
    }
    rows = [
        BenchResult(
            "reward",
            f"rps_{metric}_vs_nemo_gym",
            ours[0],
            "req/s",
            theirs[0],
            target=target,
            extra=extra,
        )
    ]
    for q in (50, 99):
        rows.append(
            BenchResult(
                "reward",
                f"p{q}_ms_{metric}_vs_nemo_gym",
                percentile(ours[1], q),
                "ms",
                percentile(theirs[1], q),
                higher_is_better=False,
                extra={**extra, "target_ms": 50.0} if q == 99 and "http" in metric else extra,
            )
        )
    return rows
