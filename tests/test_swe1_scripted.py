"""Stage SWE1 through the real rollout and reward services with a scripted policy: the
trainer's prompt source templates three pivot rows of one bundled demonstration (turns 0,
1, 2), the rollout service (`engine=scripted`) generates, the trainer's decode gives the
text and the reward gateway's `swe_pivot` env scores it over gRPC.

The scripted engine answers a prompt with the first script line not yet in it, so:
turn 0 gets the demonstrated call as the prompts render it (reward 1); turn 1, whose
prompt holds that call, gets an equivalent rewrite of turn 1's action (other quoting and
spacing, a no-op `cd /testbed &&`: reward 1); turn 2 gets that same rewrite again, which
is the previous step, not turn 2's action (reward 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import start_service

pytest.importorskip("rlfleet_rollout", reason="the rollout service package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")

from rlfleet_contracts.reward_client import RewardClient
from rlfleet_core.calls import CallRetry
from rlfleet_dataprep.swe_pivot import BUNDLED_DEMOS, call_text, prepare_swe_pivot, read_jsonl
from rlfleet_trainer.clients import RolloutClient, Sampling
from rlfleet_trainer.data import PromptSource

DEMO = "rlfleet__tinystats-1/grep-view-test"


async def test_scripted_next_actions_score_through_rollout_and_reward(tmp_path: Path) -> None:
    from rlfleet_core.models import resolve_model
    from transformers import AutoTokenizer

    out_dir, _ = prepare_swe_pivot(tmp_path / "data")
    rows = {
        r["id"]: r for split in ("train", "val") for r in read_jsonl(out_dir / split / "data.jsonl")
    }
    pivots = [rows[f"{DEMO}#{turn}"] for turn in range(3)]
    demo = next(d for d in read_jsonl(BUNDLED_DEMOS) if d["demo_id"] == DEMO)
    second = demo["turns"][1]["action"]
    assert second["name"] == "view"
    rewrite = {"name": "view", "arguments": {"path": "/testbed/./" + second["arguments"]["path"]}}
    first = demo["turns"][0]["action"]
    assert first["name"] == "bash"
    script = [call_text(first), "Now the file.\n" + call_text(rewrite)]

    model = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = PromptSource(pivots, tokenizer, seed=0, shuffle=False, default_env="swe_pivot")
    script_file = tmp_path / "script.jsonl"
    script_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in script))
    processes = []
    try:
        reward_process, reward_target = start_service(
            "rlfleet_reward", ['environments=["swe_pivot"]'], tmp_path / "reward.log"
        )
        processes.append(reward_process)
        rollout_process, rollout_target = start_service(
            "rlfleet_rollout",
            ["engine=scripted", f"script_path={script_file}", f"model={model}",
             "engine_config.max_model_len=4096"],
            tmp_path / "rollout.log",
        )  # fmt: skip
        processes.append(rollout_process)
        rollout = RolloutClient(rollout_target, 60.0, CallRetry(attempts=1))
        rewards = RewardClient(reward_target, 60.0, CallRetry(attempts=1))
        got = []
        try:
            for index in range(3):
                prompt = prompts.prompt_at(index)
                assert prompt.env == "swe_pivot"
                results = await rollout.generate(
                    prompt.prompt_id, prompt.token_ids, 2, Sampling(1.0, 1.0, 0, 300)
                )
                # What the trainer's loop scores: the samples decoded without special tokens.
                texts = [tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in results]
                scores = await rewards.score_group(
                    prompt.prompt_id, prompt.env, prompt.row_json, texts,
                    [len(r.token_ids) for r in results],
                )  # fmt: skip
                got.append(([s.reward for s in scores], texts[0]))
        finally:
            await rollout.close()
            await rewards.close()
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
    assert [r for r, _ in got] == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]], got
    assert got[0][1] == script[0] and got[1][1] == got[2][1] == script[1]
    # Turn 1's prompt holds turn 0's call as the script renders it: what the engine keys on.
    held = pivots[1]["responses_create_params"]["input"][2]["content"]
    assert held == script[0] and json.loads(held.split("\n")[1]) == first


def test_measuring_pivots_through_the_services(tmp_path: Path) -> None:
    """`--measure-samples`: K next actions per turn from the rollout's OpenAI face, scored
    by the reward gateway, written per row. A scripted policy that always submits (written
    with other spacing than the prompts' calls) earns 1 exactly on the submit turns and 0
    elsewhere; no turn has mixed outcomes, so no pivot is left and the prep says so."""
    from rlfleet_contracts.rows import DataError
    from rlfleet_core.models import resolve_model
    from rlfleet_dataprep.curriculum import CurriculumOptions, curriculum_services
    from support import ports_of

    submit = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
    script_file = tmp_path / "script.jsonl"
    script_file.write_text(json.dumps({"text": submit}) + "\n")
    model = resolve_model("smollm2-135m-instruct")
    processes = []
    try:
        reward_process, reward_target = start_service(
            "rlfleet_reward", ['environments=["swe_pivot"]'], tmp_path / "reward.log"
        )
        processes.append(reward_process)
        rollout_process, _ = start_service(
            "rlfleet_rollout",
            ["--http-port", "0", "engine=scripted", f"script_path={script_file}",
             f"model={model}", "engine_config.max_model_len=4096"],
            tmp_path / "rollout.log",
        )  # fmt: skip
        processes.append(rollout_process)
        url = f"http://127.0.0.1:{ports_of(rollout_process).http}"
        options = CurriculumOptions(samples=2, max_tokens=64, timeout_s=60)
        with (
            curriculum_services(options, rollout_url=url, reward_target=reward_target) as sampler,
            pytest.raises(DataError, match="no pivots"),
        ):
            prepare_swe_pivot(tmp_path / "out", sampler=sampler)
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
    sampled = read_jsonl(tmp_path / "out" / "tiny-swe1.sampled.jsonl")
    assert len(sampled) == 60
    submits = {r["id"] for r in sampled if r["rewards"] == [1.0, 1.0]}
    assert {r["id"] for r in sampled if r["rewards"] == [0.0, 0.0]} == {
        r["id"] for r in sampled
    } - submits
    demos = read_jsonl(BUNDLED_DEMOS)
    assert submits == {f"{d['demo_id']}#{len(d['turns']) - 1}" for d in demos}
