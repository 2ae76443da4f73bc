"""`rlfleet run --run compose`: the six tiny stages (rlvr1 → rlvr2 → rlvr3 → swe1 → swe2
→ rlhf) against the container stack of deploy/compose/compose.yaml, with the bundled
random `tiny` model on the hf engine and one step per stage. Each stage's trainer runs on
this host against the published ports (weights over StreamWeights into the rollout
container); swe2's episodes run in instance containers that the swe-runner container
starts through the mounted Docker socket; rlhf's judge is the `judge` container
(SmolLM2-135M-Instruct). Checks the report lists the six stages, the end-of-run
regression section and the rlhf GenRM win-rate file exist, every stage's lineage names its
parent, and nothing of the compose project is left afterwards.

It takes longer than the other compose tests (docs/containers.md has the time measured),
so it runs only with RLFLEET_COMPOSE_PIPELINE=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import test_compose as tc
from rlfleet_core.ports import pick_free_port
from support import RLFLEET, ensure_images, require_docker

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(3600)]

OPT_IN = "RLFLEET_COMPOSE_PIPELINE"
STAGES = ["rlvr1", "rlvr2", "rlvr3", "swe1", "swe2", "rlhf"]
SERVICES = ("sandbox", "reward", "rollout", "swe-runner")
"""Images the run needs (the judge is the rollout image)."""
SMALL = [
    "grpo.max_num_steps=1",
    "grpo.num_prompts_per_step=2",
    "grpo.num_generations_per_prompt=2",
    "grpo.num_val_prompts=2",
    "grpo.val_samples_per_prompt=2",
    "generation.max_new_tokens=8",
    "policy.train_micro_batch_size=4",
]


@pytest.mark.skipif(
    os.environ.get(OPT_IN) != "1",
    reason=f"the six-stage compose pipeline takes many minutes: set {OPT_IN}=1 to run it",
)
def test_six_tiny_stages_through_run_compose(tmp_path: Path) -> None:
    require_docker(compose=True)
    ensure_images(*SERVICES)
    ports, grpc_targets, http_urls = tc._ports()
    ports |= {"JUDGE_PORT": str(pick_free_port()), "JUDGE_HTTP_PORT": str(pick_free_port())}
    project = f"rlfleet-pipe-{uuid.uuid4().hex[:8]}"
    # COMPOSE_PROFILES: this test's own ps/down see the judge container too
    env = {**tc._env_without_token(), **ports, "COMPOSE_PROFILES": "judge"}
    stack = tc.Stack(project, env, grpc_targets, http_urls)
    (tmp_path / "env.toml").write_text(
        f'[compose]\nlauncher = "compose"\ncompose_file = "{tc.COMPOSE_FILE}"\n'
        f'project_name = "{project}"\nwait_timeout_s = 600\n'
    )
    out = tmp_path / "run"
    command = [
        RLFLEET, "run", "--run", "compose", "--out", str(out), "--engine", "hf",
        "--model", "tiny", *SMALL,
    ]  # fmt: skip
    try:
        started = time.monotonic()
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3300
        )
        print(f"six stages through compose: {time.monotonic() - started:.0f} s")
        print(f"$ {' '.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        report = json.loads((out / "report.json").read_text())
        assert [s["stage"] for s in report["stages"]] == STAGES
        assert report.get("regression"), sorted(report)
        assert (out / "regression" / "results.json").is_file()
        win = json.loads((out / "stages" / "rlhf" / "genrm_win_rate.json").read_text())
        assert {"win_rate", "pairs"} <= set(win), win
        for index, name in enumerate(STAGES):
            lineage = json.loads((out / "stages" / name / "lineage.json").read_text())
            assert lineage["parent_stage"] == (STAGES[index - 1] if index else None), lineage
        assert (out / "logs" / "compose.log").stat().st_size > 0
        # the run brought its project down: no container (of any profile) is left
        ps = stack.compose("ps", "-a", "-q")
        assert ps.returncode == 0 and ps.stdout.strip() == "", ps.stdout
        assert stack.leftovers() == [], f"left behind by project {project}"
    finally:
        if stack.leftovers():
            stack.compose("down", "--timeout", "10", "--volumes", "--remove-orphans")
