"""Prompt rows in NeMo-Gym shape, tokenized once, served in a seeded order with a cursor.

Row shape: `responses_create_params.input` (a list of chat messages, or a string taken
as one user message), an environment name in `env` or `agent_ref.name`, optional `id`,
plus the environment's verification fields (passed to the reward gateway untouched).

Order: epoch e visits the rows in the permutation seeded by (seed, e); the cursor is the
count of prompts issued so far, so prompt k is row perm_e[k mod n] of epoch e = k div n,
with id `<row id>@<e>`. A checkpoint stores only the cursor: resuming re-derives the order.

Reasoning control (rlfleet_contracts.reasoning): the chat template gets the recipe's
`reasoning.chat_template_kwargs` overlaid by the row's own
`responses_create_params.chat_template_kwargs`; the row's `max_output_tokens` (or
`max_tokens` / `max_completion_tokens`) caps that prompt's generation; a training source
with a low-effort schedule converts the prompts it schedules (rlfleet_trainer.reasoning).

With `data.interleave_envs` and more than one environment, `mixing.EnvSchedule` orders the
stream instead (every batch holds the blend's environments in proportion), and the id
counts the passes over the row's environment.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfleet_contracts.reasoning import row_max_output_tokens, row_template_kwargs
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.rows import DataError, env_of, prompt_messages, read_blend

from rlfleet_trainer.mixing import EnvSchedule
from rlfleet_trainer.reasoning import LowEffortSchedule


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    """`<row id>@<epoch>`: unique for each use of a row in a run."""
    index: int
    """Position in the run's prompt stream (what a checkpoint stores to re-issue it)."""
    env: str
    row_json: str
    """The data row as JSON, for the reward gateway."""
    token_ids: tuple[int, ...]
    """Chat template applied, generation prompt added."""
    max_tokens: int | None = None
    """The row's cap on generated tokens; None = the recipe's `generation.max_new_tokens`."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file, or of every *.jsonl under a folder (what data prep
    writes); a bad line is a `DataError` naming the file and line."""
    return [source.row for source in read_blend(Path(path))]


def row_messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """The chat messages of a NeMo-Gym row, reduced to what a chat template reads."""
    return [{"role": m["role"], "content": m.get("content", "")} for m in prompt_messages(row)]


def row_env(row: dict[str, Any], default_env: str) -> str:
    return env_of(row) or default_env


class PromptSource:
    """Infinite, seeded stream of prompts over a list of rows."""

    @classmethod
    def from_recipe(
        cls,
        recipe: RecipeConfig,
        rows: Sequence[dict[str, Any]],
        tokenizer: Any,
        shuffle: bool,
        training: bool = False,
        weighted: bool = True,
    ) -> PromptSource:
        """`shuffle` is the caller's: training rows follow `data.shuffle`, held-out rows
        keep their order; held-out rows are interleaved but not re-weighted (`weighted`).
        Only a `training` source follows the low-effort schedule: the held-out reward
        measures the prompts as the data gives them."""
        data = recipe.data
        max_prompt = data.max_prompt_tokens or (
            recipe.policy.max_total_sequence_length - recipe.generation.max_new_tokens
        )
        low_effort = recipe.reasoning.low_effort
        schedule = None
        if training and low_effort.phases and rows:
            schedule = LowEffortSchedule.build(
                low_effort,
                rows,
                data.default_env,
                recipe.grpo.seed,
                recipe.grpo.num_prompts_per_step,
            )
        return cls(
            rows,
            tokenizer,
            seed=recipe.grpo.seed,
            shuffle=shuffle,
            default_env=data.default_env,
            max_prompt_tokens=max_prompt,
            template_kwargs=dict(recipe.reasoning.chat_template_kwargs),
            low_effort=schedule,
            interleave_envs=data.interleave_envs,
            env_weights=data.env_weights if weighted else None,
        )

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        tokenizer: Any,
        *,
        seed: int,
        shuffle: bool = True,
        default_env: str = "math",
        max_prompt_tokens: int | None = None,
        template_kwargs: dict[str, Any] | None = None,
        low_effort: LowEffortSchedule | None = None,
        interleave_envs: bool = False,
        env_weights: dict[str, float] | None = None,
    ) -> None:
        if not rows:
            raise ValueError("no prompt rows: the data set is empty")
        self.rows = list(rows)
        for i, row in enumerate(self.rows):  # fail at start, not at the row's turn
            try:
                row_template_kwargs(row)
                row_max_output_tokens(row)
            except DataError as exc:
                raise DataError(f"row {row.get('id', i)}: {exc}") from None
        self.template_kwargs = dict(template_kwargs or {})
        self.low_effort = low_effort
        self.tokenizer = tokenizer
        self.seed = seed
        self.shuffle = shuffle
        self.default_env = default_env
        self.max_prompt_tokens = max_prompt_tokens
        self.cursor = 0
        self._orders: dict[int, list[int]] = {}
        envs = [row_env(row, default_env) for row in self.rows]
        self.schedule: EnvSchedule | None = None
        if env_weights and not interleave_envs:
            raise ValueError("data.env_weights needs data.interleave_envs=true")
        if interleave_envs and (len(set(envs)) > 1 or env_weights):
            self.schedule = EnvSchedule(envs, seed=seed, shuffle=shuffle, weights=env_weights)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.rows)))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch]

    def _locate(self, index: int) -> tuple[int, int]:
        """(row index, pass) of the index-th prompt; the pass goes into its id."""
        if self.schedule is not None:
            return self.schedule.locate(index)
        epoch, position = divmod(index, len(self.rows))
        return self._order(epoch)[position], epoch

    def prompt_at(self, index: int) -> Prompt:
        row_index, epoch = self._locate(index)
        row = self.rows[row_index]
        row_id = str(row.get("id", row_index))
        if self.low_effort is not None:
            row = self.low_effort.apply(row, index, row_env(row, self.default_env))
        token_ids = self.tokenizer.apply_chat_template(
            row_messages(row),
            add_generation_prompt=True,
            tokenize=True,
            **{**self.template_kwargs, **row_template_kwargs(row)},
        )
        if hasattr(token_ids, "keys"):  # transformers 5 returns a BatchEncoding
            token_ids = token_ids["input_ids"]
        return Prompt(
            prompt_id=f"{row_id}@{epoch}",
            index=index,
            env=row_env(row, self.default_env),
            row_json=json.dumps(row),
            token_ids=tuple(int(t) for t in token_ids),
            max_tokens=row_max_output_tokens(row),
        )

    def next(self) -> Prompt:
        prompt = self.prompt_at(self.cursor)
        self.cursor += 1
        return prompt

    def too_long(self, prompt: Prompt) -> bool:
        return self.max_prompt_tokens is not None and len(prompt.token_ids) > self.max_prompt_tokens

    def issued_ids(self) -> list[str]:
        """Ids of every prompt issued so far (for the ledger check)."""
        return [self._id_at(i) for i in range(self.cursor)]

    def _id_at(self, index: int) -> str:
        row_index, epoch = self._locate(index)
        return f"{self.rows[row_index].get('id', row_index)}@{epoch}"
