"""The pipelines `rlfleet run` knows: stages in order, each a recipe, a blend and the
pipeline's own settings for it.

- `tiny` (the default): the seed's six stages in miniature on SmolLM2-135M-Instruct,
  RLVR 1 → 2 → 3 → SWE 1 (pivot) → SWE 2 (agentic, docker) → RLHF (GenRM judge), sized for
  about 25 minutes on 2 CPU cores.
- `tiny-rlvr`: its first three stages alone (the RLVR part; ~12 minutes).
- `super3`: the Nemotron 3 Super recipes, six stages, for `rlfleet run --dry-run`
  (rendered for SLURM or compose; not runnable on a CPU machine).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import format_override
from rlfleet_dataprep.swe_pivot import BLEND as SWE_PIVOT_BLEND

from rlfleet_pipeline.stage_plan import MAX_MODEL_LEN


@dataclass(frozen=True)
class PipelineStage:
    name: str
    recipe: str
    """A bundled recipe name or a recipe file."""
    blend: str
    """A bundled blend name or a blend file/directory (prepared into <out>/data)."""
    overrides: tuple[str, ...] = ()
    """The pipeline's settings for this stage's recipe (the user's overrides win)."""
    val_rows: int | None = None
    """Rows of the blend held out for validation (None: the pipeline's val_rows)."""


@dataclass(frozen=True)
class Pipeline:
    name: str
    model: str
    """Starting model of the first stage (a bundled name, a HF folder or a Hugging Face id)."""
    stages: tuple[PipelineStage, ...]
    val_rows: int = 100
    """Rows of each blend held out for validation (the last ones)."""
    rollout: tuple[str, ...] = ()
    """Overrides of the policy's rollout service for the whole run (it starts once)."""
    regression_kinds: tuple[str, ...] = ("rlvr", "swe1")
    """Stages whose held-out sets are measured again at the end, on the final weights
    (single-turn ones: an agentic or judged held-out set costs minutes per prompt here)."""

    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def shared_rollout(self, recipes: Sequence[RecipeConfig]) -> list[str]:
        """`rollout`, serving the longest sequence of any stage unless it sets a length:
        one rollout serves every stage, so it is never restarted for a longer one."""
        if any(o.startswith(f"{MAX_MODEL_LEN}=") for o in self.rollout):
            return list(self.rollout)
        longest = max(r.policy.max_total_sequence_length for r in recipes)
        return [*self.rollout, f"{MAX_MODEL_LEN}={longest}"]

    def rollout_settings(self, engine: str, recipes: Sequence[RecipeConfig]) -> list[str]:
        """The policy's rollout for the whole run: the engine, the starting model (each
        stage's trainer publishes its own weights first) and shared_rollout."""
        model = format_override("model", self.model)
        return [f"engine={engine}", model, *self.shared_rollout(recipes)]


RLVR_STAGES = tuple(PipelineStage(f"rlvr{i}", f"tiny/rlvr{i}", f"tiny-rlvr{i}") for i in (1, 2, 3))

# Each later stage cut to fit the 25-minute budget on 2 cores (docs/run.md has the
# measured times); the bundled recipes keep their fuller settings for `rlfleet rl`.
TINY_LATE_STAGES = (
    PipelineStage(
        "swe1",
        "tiny/swe1",
        SWE_PIVOT_BLEND,  # cut from the bundled demonstrations (rlfleet_dataprep.swe_pivot)
        overrides=(
            "grpo.max_num_steps=2",
            "grpo.num_prompts_per_step=2",
            "grpo.num_val_prompts=6",
            "grpo.val_samples_per_prompt=2",
            "generation.max_new_tokens=96",
        ),
    ),
    PipelineStage(
        "swe2",
        "tiny/swe2",
        "tiny-swe2",
        val_rows=1,  # one of the four bundled instances is held out
        overrides=("grpo.max_num_steps=1", "multi_turn.max_turns=2"),
    ),
    PipelineStage(
        "rlhf",
        "tiny/rlhf",
        "tiny-rlhf",
        val_rows=16,
        overrides=(
            "grpo.max_num_steps=2",
            "grpo.num_prompts_per_step=2",
            "grpo.num_val_prompts=4",
            # Two failing steps in a row end the stage (a weak judge fails groups).
            "grpo.max_consecutive_failing_steps=2",
        ),
    ),
)

TINY = Pipeline(
    name="tiny",
    model="smollm2-135m-instruct",
    stages=(*RLVR_STAGES, *TINY_LATE_STAGES),
)
TINY_RLVR = Pipeline(name="tiny-rlvr", model="smollm2-135m-instruct", stages=RLVR_STAGES)
SUPER3 = Pipeline(
    name="super3",
    model="./checkpoints/super3-sft",
    stages=tuple(
        PipelineStage(name, f"super3/{name}", blend)
        for name, blend in (
            ("rlvr1", "tiny-rlvr1"),
            ("rlvr2", "tiny-rlvr2"),
            ("rlvr3", "tiny-rlvr3"),
            ("swe1", SWE_PIVOT_BLEND),
            ("swe2", "tiny-swe2"),
            ("rlhf", "tiny-rlhf"),
        )
    ),
)
"""Super's six stages as recipes; the blends are the tiny ones, as placeholders that a
real run replaces with its own (`rlfleet run --pipeline super3 --dry-run` renders plans)."""

PIPELINES = {p.name: p for p in (TINY, TINY_RLVR, SUPER3)}
DEFAULT_PIPELINE = TINY.name
