"""`rlfleet rl rlhf -c tiny/rlhf --run compose`: the RLHF stage against the container
stack, its judge served by the `judge` container (a second rollout image, profile
`judge`) and the gateway given the judge's address and the stage's judge settings
through REWARD_OVERRIDES (compose.yaml's fixed `command:` cannot carry them). One step
with the tiny model as policy (until session 18 SmolLM2: a 135M training step and its
generation in a container for the same mechanics) and SmolLM2 as judge (a random model
writes no verdict); the gateway's own /metrics show the judge answered."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import test_compose as tc
from rlfleet_core.ports import pick_free_port
from support import RLFLEET, ensure_images, require_docker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.docker,
    pytest.mark.timeout(1200),
    pytest.mark.budget(600, "a compose stack with a judge container serving SmolLM2"),
]


def test_tiny_rlhf_stage_with_a_judge_container(tmp_path: Path) -> None:
    require_docker(compose=True)
    ensure_images("reward", "rollout")
    ports, grpc_targets, http_urls = tc._ports()
    ports |= {"JUDGE_PORT": str(pick_free_port()), "JUDGE_HTTP_PORT": str(pick_free_port())}
    project = f"rlfleet-rlhf-{uuid.uuid4().hex[:8]}"
    # COMPOSE_PROFILES: this test's own ps/down see the judge container too
    env = {**tc._env_without_token(), **ports, "COMPOSE_PROFILES": "judge"}
    stack = tc.Stack(project, env, grpc_targets, http_urls)
    (tmp_path / "env.toml").write_text(
        f'[compose]\nlauncher = "compose"\ncompose_file = "{tc.COMPOSE_FILE}"\n'
        f'project_name = "{project}"\nwait_timeout_s = 600\n'
    )
    prep = subprocess.run(
        [RLFLEET, "data", "prep", "rl", "tiny-rlhf", "--val-rows", "16"],
        cwd=tmp_path, env=stack.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert prep.returncode == 0, prep.stderr[-2000:]
    run_dir = tmp_path / "run"
    command = [
        RLFLEET, "rl", "rlhf", "-c", "tiny/rlhf", "--run", "compose", "--engine", "hf",
        "--out", str(run_dir), "--keep-up", "policy.model=tiny",
        "grpo.max_num_steps=1", "grpo.num_prompts_per_step=2", "grpo.num_val_prompts=2",
        # Two samples a prompt: one judged pair a group (circular pairs). Four made 20
        # comparisons at ~8 CPU s each on the judge container (~160 s alone, and past the
        # 1,100 s deadline beside the other workers in one CI run).
        "grpo.num_generations_per_prompt=2", "policy.train_micro_batch_size=4",
        "grpo.val_at_end=false", "checkpoint.export_hf=false",
    ]  # fmt: skip
    try:
        started = time.monotonic()
        done = subprocess.run(
            command, cwd=tmp_path, env=stack.env, capture_output=True, text=True, timeout=1100
        )
        print(f"rlhf stage through compose: {time.monotonic() - started:.0f} s")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        states = tc._service_states(stack)
        assert sorted(states) == ["judge", "reward", "rollout"]
        steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [s for s in steps if "step" in s]
        assert [s["step"] for s in steps] == [1] and steps[0]["genrm/comparisons"] > 0
        # The gateway asked the judge container and parsed its verdicts (prefill on).
        token = (run_dir / "auth_token").read_text().strip()
        request = urllib.request.Request(
            http_urls["reward"] + "/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        text = urllib.request.urlopen(request, timeout=30).read().decode()
        ok = sum(
            float(v)
            for v in re.findall(
                r'^rlfleet_reward_judge_calls_total\{outcome="ok"\} (\S+)$', text, re.M
            )
        )
        assert ok > 0, text[-2000:]
    finally:
        stack.compose("down", "--timeout", "10", "--volumes", "--remove-orphans")
    assert stack.leftovers() == [], f"left behind by project {project}"
