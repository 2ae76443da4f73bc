"""Score verify requests with NeMo-Gym's own resources servers (the parity reference).

Runs in a *side* environment that has nemo-gym installed (see `side_env.sh`), never in
rlfleet's: nemo-gym 0.7.0 declares Python >= 3.13, so it cannot be a dependency.

    PYTHONPATH=<unpacked nemo-gym wheel> <side python> reference.py IN.jsonl OUT.jsonl

Each input line is `{"server": "<resources server folder>", "request": {<verify request>}}`;
each output line is `{"server", "reward", "extracted"}` in the same order (`extracted` is
whatever answer the server reports, for reading differences). The server's `verify` is
called in-process (the same code its FastAPI route calls), so no ports are involved.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from typing import Any
from unittest.mock import MagicMock

# server folder -> (server class, config class, verify request class, extra config)
SERVERS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "math_with_judge": (
        "LibraryJudgeMathResourcesServer",
        "LibraryJudgeMathResourcesServerConfig",
        "LibraryJudgeMathVerifyRequest",
        {
            "should_use_judge": False,
            "judge_model_server": {"type": "responses_api_models", "name": "unused"},
            "judge_responses_create_params": {"input": []},
        },
    ),
    "mcqa": ("MCQAResourcesServer", "MCQAResourcesServerConfig", "MCQAVerifyRequest", {}),
    "structured_outputs": (
        "StructuredOutputsResourcesServer",
        "StructuredOutputsResourcesServerConfig",
        "StructuredOutputsVerifyRequest",
        {},
    ),
    "instruction_following": (
        "InstructionFollowingResourcesServer",
        "InstructionFollowingResourcesServerConfig",
        "InstructionFollowingVerifyRequest",
        {},
    ),
    "reasoning_gym": (
        "ReasoningGymResourcesServer",
        "ReasoningGymResourcesServerConfig",
        "ReasoningGymVerifyRequest",
        {},
    ),
}


def build(server: str) -> tuple[Any, Any]:
    """(server instance, its verify request model)."""
    from nemo_gym.server_utils import ServerClient

    server_cls, config_cls, request_cls, extra = SERVERS[server]
    module = importlib.import_module(f"resources_servers.{server}.app")
    config = getattr(module, config_cls)(
        host="127.0.0.1", port=0, entrypoint="", name=server, **extra
    )
    instance = getattr(module, server_cls)(
        config=config, server_client=MagicMock(spec=ServerClient)
    )
    return instance, getattr(module, request_cls)


async def score_all(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    built: dict[str, tuple[Any, Any]] = {}
    out = []
    for line in lines:
        server = line["server"]
        if server not in built:
            built[server] = build(server)
        instance, request_model = built[server]
        response = await instance.verify(request_model.model_validate(line["request"]))
        dumped = response.model_dump()
        extracted = dumped.get("extracted_answer", dumped.get("extracted"))
        out.append({"server": server, "reward": float(dumped["reward"]), "extracted": extracted})
    return out


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        lines = [json.loads(text) for text in f if text.strip()]
    results = asyncio.run(score_all(lines))
    with open(dst, "w", encoding="utf-8") as f:
        for result in results:
            f.write(json.dumps(result, default=str) + "\n")


if __name__ == "__main__":
    main()
