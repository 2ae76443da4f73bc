"""genrm_compare through the real services: the reward gateway (its own process, gRPC)
asks a real judge — SmolLM2-135M-Instruct served by the rollout service's OpenAI face —
to compare a ScoreGroup of 8 responses; and a judge that hangs or answers garbage (real
HTTP servers) gives failures with reasons within the deadline.

The tiny judge rarely writes a parseable verdict: each response is either scored from
verdicts that parsed (checked here against the verdicts it reports) or a JUDGE_ERROR with
the reason; the parse-failure rate is printed (`-s`)."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import grpc
import pytest
from support import ports_of, start_service, stop_service

pytest.importorskip("rlfleet_rollout", reason="the rollout service package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward service package is not installed")

from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

# Two models' worth of start-up plus 16 CPU generations: 50-150 s seen on a shared 2-core box.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.budget(240, "SmolLM2 serves as the judge on CPU"),
]

ANSWERS = [
    "Paris.",
    "The capital of France is Paris.",
    "I think it is Lyon.",
    "Paris, on the Seine, has been the capital of France for centuries.",
    "Berlin.",
    "It's Paris!",
    "Marseille is the capital.",
    "The answer is Paris, France's largest city.",
]
ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "What is the capital of France?"}]
    },
    "principles": ["The answer must be correct.", "Shorter is better when equally correct."],
}
JUDGE_ARGS = [
    "judge.temperature=0",
    "judge.max_tokens=120",
    "judge.cache_size=0",
    "judge.request_timeout_s=240",  # a shared 2-core machine once took > 60 s for a call
]


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def score_group(target: str, deadline_s: float) -> list[reward_pb2.ScoreResult]:
    with grpc.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        request = reward_pb2.ScoreGroupRequest(
            request_id="g",
            env="genrm_compare",
            row_json=json.dumps(ROW),
            responses=[reward_pb2.Response(text=a) for a in ANSWERS],
        )
        return list(stub.ScoreGroup(request, timeout=deadline_s).results)


def expected_reward(verdicts: list[list[float]], me: int) -> float:
    """Mean of my scores; a tie moves the first shown by 3.5 - ranking, the second by the
    opposite (worked here, not imported: NeMo-Gym's simple tiebreaker)."""
    mine = []
    for first, _second, s1, s2, ranking in verdicts:
        shift = 3.5 - ranking if s1 == s2 else 0.0
        mine.append(s1 + shift if first == me else s2 - shift)
    return sum(mine) / len(mine)


class _CountingProxy(http.server.BaseHTTPRequestHandler):
    """The judge's front door: forwards every request to the rollout's HTTP face and keeps
    what it saw (which pair, in which order: the rollout's /metrics only count them)."""

    upstream: ClassVar[str] = ""
    seen: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append({"path": self.path, **json.loads(body)})
        request = urllib.request.Request(
            self.upstream + self.path, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                status, payload = answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def serve(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def judge_and_gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[dict[str, object]], str, str, str]]:
    """(requests the judge received, reward gRPC target, reward /metrics URL, rollout
    /metrics URL)."""
    logs = tmp_path_factory.mktemp("genrm")
    rollout, _ = start_service(
        "rlfleet_rollout",
        ["--http-port", "0", "engine=hf", "model=smollm2-135m-instruct"],
        logs / "rollout.log",
    )
    seen: list[dict[str, object]] = []
    proxy = serve(
        type(
            "Proxy",
            (_CountingProxy,),
            {"upstream": f"http://127.0.0.1:{ports_of(rollout).http}", "seen": seen},
        )
    )
    try:
        reward, target = start_service(
            "rlfleet_reward",
            [
                "--http-port",
                "0",
                "environments=[genrm_compare]",
                "pool.workers=1",
                f"judge.base_url=http://127.0.0.1:{proxy.server_address[1]}/v1",
                *JUDGE_ARGS,
            ],
            logs / "reward.log",
        )
        try:
            yield (
                seen,
                target,
                f"http://127.0.0.1:{ports_of(reward).http}/metrics",
                f"http://127.0.0.1:{ports_of(rollout).http}/metrics",
            )
        finally:
            stop_service(reward)
    finally:
        proxy.shutdown()
        stop_service(rollout)


def test_eight_responses_make_eight_comparisons_each_way(
    judge_and_gateway: tuple[list[dict[str, object]], str, str, str],
) -> None:
    seen, target, reward_metrics, rollout_metrics = judge_and_gateway
    results = score_group(target, deadline_s=280)
    # circular over 8: 8 pairs, each judged in both orders = 16 calls at the judge
    assert [r["path"] for r in seen] == ["/v1/chat/completions"] * 16
    samples = r'rlfleet_rollout_samples_total\{face="http",finish_reason="[a-z_]+"\}'
    # The judge's own count agrees. A call the gateway gave up on (judge.request_timeout_s,
    # on a loaded machine) still runs to its end at the rollout: wait for it.
    for _ in range(120):
        if metric(rollout_metrics, samples) >= 16:
            break
        time.sleep(1)
    assert metric(rollout_metrics, samples) == 16
    shown = []
    for r in seen:
        user = str(r["messages"][1]["content"])  # type: ignore[index]
        pair = re.search(  # each response fenced (judge/fence.py)
            r"<<<BEGIN RESPONSE_1 \w+>>>\n(.*)\n<<<END RESPONSE_1 \w+>>>.*"
            r"<<<BEGIN RESPONSE_2 \w+>>>\n(.*)\n<<<END RESPONSE_2 \w+>>>",
            user,
            re.S,
        )
        assert pair is not None
        shown.append((ANSWERS.index(pair[1]), ANSWERS.index(pair[2])))
    ring = [(i, (i + 1) % 8) for i in range(8)]
    assert sorted(shown) == sorted(ring + [(j, i) for i, j in ring])
    assert len(results) == 8
    scored = [r for r in results if r.failure_kind == reward_pb2.FAILURE_KIND_NONE]
    for i, r in enumerate(results):
        if r in scored:
            verdicts = json.loads(r.info["verdicts"])
            assert len(verdicts) == 4 and r.info["comparisons"] == "4"
            assert r.reward == pytest.approx(expected_reward(verdicts, i))
            assert dict(r.reward_components) == {"genrm": pytest.approx(r.reward)}
        else:
            assert r.failure_kind == reward_pb2.FAILURE_KIND_JUDGE_ERROR and r.mask_sample
            assert "judge comparisons failed" in r.failure_reason and r.reward == 0
    parse_failures = metric(reward_metrics, "rlfleet_reward_judge_parse_failures_total")
    print(
        f"\nSmolLM2-135M judge: {parse_failures:.0f} of 16 answers did not parse "
        f"({parse_failures / 16:.0%}); {len(scored)} of 8 responses scored"
    )
    for r in results[:3]:
        print(r.failure_reason or r.info["verdicts"])


def check_refusals(target: str) -> None:
    """A single Score, or a group of one, cannot be compared: INVALID_ARGUMENT naming why."""
    with grpc.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        one = reward_pb2.Response(text="Paris.")
        calls = [
            (
                stub.Score,
                reward_pb2.ScoreRequest(
                    env="genrm_compare", row_json=json.dumps(ROW), response=one
                ),
                "env: genrm_compare scores a group",
            ),
            (
                stub.ScoreGroup,
                reward_pb2.ScoreGroupRequest(
                    env="genrm_compare", row_json=json.dumps(ROW), responses=[one]
                ),
                "responses: genrm_compare needs at least 2",
            ),
            (
                stub.ScoreGroup,
                reward_pb2.ScoreGroupRequest(
                    env="genrm_compare", row_json="{}", responses=[one, one]
                ),
                "row.responses_create_params.input: required",
            ),
        ]
        for method, request, details in calls:
            with pytest.raises(grpc.RpcError) as err:
                method(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details().startswith(details), err.value.details()


class _Judge(http.server.BaseHTTPRequestHandler):
    mode = "garbage"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "hang":
            time.sleep(60)
            return
        choice = {"message": {"content": "Response 1, clearly."}, "finish_reason": "stop"}
        body = json.dumps({"choices": [choice]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("hang", "did not answer within"), ("garbage", "not a verdict: no JSON object")],
)
def test_hanging_or_garbage_judge_fails_with_reasons(
    tmp_path: Path, mode: str, reason: str
) -> None:
    server = serve(type("Judge", (_Judge,), {"mode": mode}))
    reward, target = start_service(
        "rlfleet_reward",
        [
            "environments=[genrm_compare]",
            "pool.workers=1",
            f"judge.base_url=http://127.0.0.1:{server.server_address[1]}/v1",
            "judge.request_timeout_s=2",
            "env_timeout_s.genrm_compare=5",
        ],
        tmp_path / "reward.log",
    )
    try:
        # The 5 s budget answers well before the caller's 20 s deadline: a gateway that
        # waited on the judge past it would raise DEADLINE_EXCEEDED here.
        results = score_group(target, deadline_s=20)
        if mode == "garbage":
            check_refusals(target)
    finally:
        stop_service(reward)
        server.shutdown()
    assert len(results) == 8
    for r in results:
        assert r.failure_kind == reward_pb2.FAILURE_KIND_JUDGE_ERROR and r.mask_sample
        assert reason in r.failure_reason and r.reward == 0
