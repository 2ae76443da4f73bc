"""Configuration of the reward service (`rlfleet serve reward key=value ...`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator
from rlfleet_core.config import ConfigModel
from rlfleet_core.raycluster import RayConfig
from rlfleet_core.server import ServiceConfig

from rlfleet_reward.environments import ENVIRONMENT_NAMES
from rlfleet_reward.episodes import EPISODE_ENVIRONMENT_NAMES
from rlfleet_reward.judge.config import GenRMConfig, JudgeConfig
from rlfleet_reward.placement import check_placements


def _refuse_unknown(names: list[str], known: Sequence[str], what: str) -> None:
    """ValueError listing the `names` not in `known` (and what is known), if any."""
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(known)}")


class PoolConfig(ConfigModel):
    """The verifier worker processes (`pool.*`)."""

    backend: Literal["process", "ray"] = "process"
    """Where the worker processes run: `process`, on this host; `ray`, spread over a Ray
    cluster (`ray.*`): `ray.workers` Ray actors, each running `workers` processes on its
    node with the same timeouts and kill-and-replace (docs/reward.md, "Ray mode")."""
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=256)
    """Worker processes scoring CPU-bound environments; default one per core. With
    `backend=ray`, per Ray actor."""
    max_queue: int = Field(4096, ge=1)
    """Jobs that may wait for a worker; beyond this, calls get RESOURCE_EXHAUSTED (HTTP 429)."""
    kill_grace_s: float = Field(1.0, gt=0, le=60)
    """Part of each job's budget kept for the hard stop: the worker's own (signal) timeout
    fires this long before the budget ends, and a worker still silent at the end (stuck
    in C code) is killed and replaced. Budgets under 2x this split in half instead."""
    threads: int = Field(4, ge=1, le=256)
    """Threads scoring environments placed in `thread` (`placement`); up to `max_queue`
    more checks wait for one, beyond that calls get RESOURCE_EXHAUSTED (HTTP 429)."""
    inline_budget_s: float = Field(0.05, gt=0, le=1.0)
    """Longest an environment placed on the event loop (`loop`) may hold it per answer:
    a check still running then is interrupted and scored again in a worker process, so
    other requests (and /healthz) wait at most this long behind one answer."""
    start_method: str = "forkserver"
    """multiprocessing start method: forkserver (warm, safe beside gRPC threads) or spawn."""

    @field_validator("start_method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        if value not in ("forkserver", "spawn"):
            raise ValueError(
                f"must be forkserver or spawn, got {value!r} (fork is unsafe beside gRPC threads)"
            )
        return value


class LimitsConfig(ConfigModel):
    """Input limits (`limits.*`), checked before any work is done. A request over a size
    limit is refused with HTTP 413 (gRPC INVALID_ARGUMENT); any other malformed input
    with HTTP 422 (gRPC INVALID_ARGUMENT); both name the field and the limit."""

    max_request_bytes: int = Field(8 << 20, ge=1 << 10, le=64 << 20)
    """Largest request: an HTTP body, or a serialized gRPC request (a ScoreStream item).
    Bodies over this are refused from their Content-Length, unread; it also bounds the
    time one request can hold the event loop in JSON parsing."""
    max_response_chars: int = Field(1 << 20, ge=1 << 10)
    """Characters in one response to score: final text plus reasoning (a 128k-token
    generation is ~0.5 M)."""
    max_row_chars: int = Field(1 << 20, ge=1 << 10)
    """Size of one row: characters of `row_json` (gRPC), or of the strings and keys in the
    row fields (HTTP, where the row is the body without `response`)."""
    max_group_size: int = Field(1024, ge=1)
    """Responses in one ScoreGroup call."""
    max_json_depth: int = Field(32, ge=2, le=256)
    """Nesting of objects and arrays in any JSON the service reads (body, `row_json`,
    tool-call arguments)."""
    max_json_items: int = Field(10_000, ge=1)
    """Entries in any one JSON array or object."""
    max_field_items: dict[str, int] = Field(
        default_factory=lambda: {"instruction_id_list": 256, "kwargs": 256}
    )
    """Tighter entry limits for arrays/objects under these keys, wherever they appear:
    each instruction of `instruction_following` costs a check in the worker and a
    component in the result (40,000 made ~1 MB jobs and ~1.6 MB results)."""
    max_json_nodes: int = Field(200_000, ge=100)
    """Values (strings, numbers, arrays, objects...) in one request's JSON."""
    max_int_digits: int = Field(1000, ge=20, le=4300)
    """Digits of a JSON integer (Python refuses to parse more than 4300)."""


class SandboxConfig(ConfigModel):
    """How the `code` environment reaches the sandbox service (`sandbox.*`)."""

    target: str | None = None
    """host:port of rlfleet.v1.SandboxService; None = the code env answers SANDBOX_ERROR."""
    call_overhead_s: float = Field(5.0, gt=0)
    """Deadline of an Execute call = the program's time limit + this (start-up, transfer)."""
    memory_bytes: int = Field(1 << 30, ge=16 << 20)
    """Address-space limit asked for each program."""


class SweRunnerConfig(ConfigModel):
    """How the `swe_agent` episode environment reaches the swe-runner service (`swe.*`).
    Defaults follow NeMo-Gym's published swe_agents settings (per-command 300 s; tests up
    to 900-1200 s; container memory 32 GB is the runner's own default)."""

    target: str | None = None
    """host:port of rlfleet.v1.SweRunnerService; None = `swe_agent` episodes are refused
    as UNAVAILABLE at OpenEpisode."""
    call_overhead_s: float = Field(30.0, gt=0)
    """Deadline of a call = its work's own limit + this (container start, queueing)."""
    command_timeout_s: float = Field(300.0, gt=0, le=1800)
    """Limit of one bash command in a session (lowered to fit `episodes.tool_timeout_s`)."""
    test_timeout_s: float = Field(900.0, gt=0, le=1800)
    """Limit of the instance's tests at CloseEpisode (lowered to fit
    `episodes.close_timeout_s`)."""
    memory_bytes: int = Field(0, ge=0)
    """Container memory cap of sessions and test runs; 0 = the runner's default."""


class EpisodesConfig(ConfigModel):
    """Multi-turn environments (`episodes.*`): OpenEpisode / Step / CloseEpisode."""

    environments: list[str] = Field(default_factory=lambda: list(EPISODE_ENVIRONMENT_NAMES))
    """Multi-turn environments served; OpenEpisode refuses others as unknown."""
    max_open: int = Field(1024, ge=1)
    """Episodes open at once (all callers); one more is RESOURCE_EXHAUSTED."""
    idle_timeout_s: float = Field(600.0, gt=0, le=86_400)
    """An episode unused this long is closed (freed, not scored); its id is then NOT_FOUND."""
    max_calls_per_step: int = Field(64, ge=1)
    """Tool calls in one Step; more is INVALID_ARGUMENT."""
    max_arguments_chars: int = Field(64 << 10, ge=64)
    """Characters of one call's `arguments_json`; a longer one gets an error result."""
    max_output_chars: int = Field(16 << 10, ge=256)
    """Characters of one tool result's content the policy sees; the rest is cut with a note."""
    tool_timeout_s: float = Field(30.0, gt=0, le=600)
    """Wall-clock limit of one tool call (sandboxed code included); then an error result."""
    close_timeout_s: float = Field(60.0, gt=0, le=1800)
    """Verification budget of CloseEpisode (a check script, math-verify); then TIMEOUT."""
    max_state_bytes: int = Field(256 << 10, ge=1 << 10, le=640 << 10)
    """Size of an episode's own state (the `terminal` env's work-dir files, sent to the
    sandbox with every command); a command that grows it past this gets an error result
    and leaves the state as it was. At most 640 KiB: the snapshot comes back base64 in
    the sandbox's 1 MiB output."""
    allow_keyless: bool = False
    """Let callers without an `x-rlfleet-client-key` open episodes. They then all act as
    one caller and can step and close each other's episodes; only for one trusted client."""

    @field_validator("environments")
    @classmethod
    def _known_episode_envs(cls, value: list[str]) -> list[str]:
        _refuse_unknown(value, EPISODE_ENVIRONMENT_NAMES, "multi-turn environments")
        return value


class RewardServiceConfig(ServiceConfig):
    """Settings of the reward service (`server.*` is shared by every service)."""

    environments: list[str] = Field(default_factory=lambda: list(ENVIRONMENT_NAMES))
    """Environments served; others are refused as unknown (and their libraries not loaded)."""
    extra_environments: dict[str, str] = Field(default_factory=dict)
    """More environments, name -> "package.module:Class" (an `Environment` subclass);
    they are served in addition to `environments`."""
    timeout_s: float = Field(10.0, gt=0, le=600)
    """Verification budget per response: its verdict or a TIMEOUT failure comes within
    this (queue wait included); a call's own deadline lowers it."""
    env_timeout_s: dict[str, float] = Field(
        default_factory=lambda: {
            "code": 60.0,
            "genrm_compare": 300.0,
            # One (or a few concurrent) judge calls per response.
            "safety": 120.0,
            "multi_challenge": 120.0,
            "single_step_tool_use_with_argument_comparison": 120.0,
        }
    )
    """Per-environment budgets that override `timeout_s` (e.g. code runs tests, judges
    generate)."""
    placement: dict[str, str] = Field(default_factory=dict)
    """Where each environment's check runs, overriding its default (`placement.math=thread`):
    `loop` (inline on the event loop, guarded by `pool.inline_budget_s`), `thread`
    (`pool.threads`) or `process` (the worker pool). Defaults and the costs behind them:
    docs/reward.md."""
    max_stream_in_flight: int = Field(256, ge=1)
    """ScoreStream requests of one stream being scored at once; the stream reads no
    further until one finishes (flow control instead of unbounded buffering)."""
    pool: PoolConfig = PoolConfig()
    ray: RayConfig = RayConfig()
    """The Ray cluster of `pool.backend=ray` (unused otherwise)."""
    limits: LimitsConfig = LimitsConfig()
    sandbox: SandboxConfig = SandboxConfig()
    episodes: EpisodesConfig = EpisodesConfig()
    swe: SweRunnerConfig = SweRunnerConfig()
    judge: JudgeConfig = JudgeConfig()
    """The LLM judge of judge-based environments (`genrm_compare`, `safety`, the question
    items of `multi_challenge`, the judged arguments of
    `single_step_tool_use_with_argument_comparison`)."""
    genrm: GenRMConfig = GenRMConfig()

    @field_validator("environments")
    @classmethod
    def _known_envs(cls, value: list[str]) -> list[str]:
        _refuse_unknown(value, ENVIRONMENT_NAMES, "environments")
        if not value:
            raise ValueError("must list at least one environment")
        return value

    @model_validator(mode="after")
    def _known_placements(self) -> RewardServiceConfig:
        check_placements(self.placement, [*self.environments, *self.extra_environments])
        return self
