"""Mixed-environment data order: a blend's environments interleaved in every batch.

A plain shuffle of a blend puts the environments in a batch by chance: with 4 prompts a
step and three environments, about one step in nine leaves one of them out entirely, and
a run of such steps trains on one environment while the others drift (the Super recipe
mixes its 21 environments in every batch because "single-environment training leads to
severe regressions on other benchmarks").

`EnvSchedule` orders the prompt stream so that every window of consecutive prompts holds
the environments in proportion to their weights (by default their row counts):

- an epoch is `len(rows)` prompts; environment e gets q_e of its positions, the largest-
  remainder rounding of w_e / Σw × len(rows) (every environment with w_e > 0 gets ≥ 1);
- position j of an epoch goes to the environment furthest behind its share,
  argmax_e (q_e × (j + 1) / n − taken_e); ties go by an environment order shuffled per
  epoch with (seed, epoch), so the pattern is seeded but never starves one;
- the k-th prompt of environment e is row perm_{e,u}[k mod c_e] of its c_e rows, pass
  u = k div c_e, perm seeded by (seed, e, u) (identity order when not shuffling).

With the default weights every row is used exactly once per epoch (q_e = c_e). Other
weights repeat the rows of an up-weighted environment within an epoch; a prompt's id
then counts that environment's passes (`<row id>@<u>`), so ids stay unique. Everything is
derived from the prompt index, so a checkpoint's cursor alone restores the order.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

MAX_CACHED_PASSES = 64
"""Per-environment permutations kept (a pass of a small environment is short)."""


class EnvSchedule:
    def __init__(
        self,
        row_envs: Sequence[str],
        *,
        seed: int,
        shuffle: bool,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if not row_envs:
            raise ValueError("no prompt rows: the data set is empty")
        self.seed = seed
        self.shuffle = shuffle
        self.rows_of: dict[str, list[int]] = {}
        for index, env in enumerate(row_envs):
            self.rows_of.setdefault(env, []).append(index)
        self.envs = sorted(self.rows_of)
        self.length = len(row_envs)
        self.quota = self._quotas(weights)
        self._patterns: dict[int, tuple[list[str], list[int]]] = {}
        self._perms: dict[tuple[str, int], list[int]] = {}

    def _quotas(self, weights: Mapping[str, float] | None) -> dict[str, int]:
        if not weights:
            return {env: len(rows) for env, rows in self.rows_of.items()}
        for env, weight in weights.items():
            if env not in self.rows_of:
                raise ValueError(
                    f"data.env_weights.{env}: no row of this environment in the data "
                    f"(environments: {', '.join(self.envs)})"
                )
            if not weight >= 0:
                raise ValueError(f"data.env_weights.{env}: must be >= 0, got {weight}")
        missing = [env for env in self.envs if env not in weights]
        if missing:
            raise ValueError(
                f"data.env_weights: no weight for {', '.join(missing)} (in the data); give "
                "every environment of the blend a weight (0 leaves it out)"
            )
        total = sum(weights.values())
        if total <= 0:
            raise ValueError("data.env_weights: at least one weight must be > 0")
        live = [env for env in self.envs if weights[env] > 0]
        if len(live) > self.length:
            raise ValueError(
                f"data.env_weights: {len(live)} environments with weight > 0 but only "
                f"{self.length} prompts per epoch"
            )
        # Largest remainder over the slots left after one for each live environment.
        spare = self.length - len(live)
        shares = {env: weights[env] / total * spare for env in live}
        quota = {env: 1 + int(shares[env]) for env in live}
        left = self.length - sum(quota.values())
        for env in sorted(live, key=lambda e: (-(shares[e] - int(shares[e])), e))[:left]:
            quota[env] += 1
        return quota

    def _pattern(self, epoch: int) -> tuple[list[str], list[int]]:
        """(environment of each position, that environment's count before it)."""
        if epoch not in self._patterns:
            order = [env for env in self.envs if self.quota.get(env, 0) > 0]
            if self.shuffle:
                random.Random(f"{self.seed}:envs:{epoch}").shuffle(order)
            taken = dict.fromkeys(order, 0)
            envs: list[str] = []
            before: list[int] = []
            n = self.length
            for j in range(n):
                env = max(order, key=lambda e: self.quota[e] * (j + 1) / n - taken[e])
                envs.append(env)
                before.append(taken[env])
                taken[env] += 1
            self._patterns = {epoch: (envs, before)}
        return self._patterns[epoch]

    def _perm(self, env: str, use: int) -> list[int]:
        key = (env, use)
        if key not in self._perms:
            rows = list(self.rows_of[env])
            if self.shuffle:
                random.Random(f"{self.seed}:{env}:{use}").shuffle(rows)
            if len(self._perms) >= MAX_CACHED_PASSES:
                self._perms.clear()
            self._perms[key] = rows
        return self._perms[key]

    def locate(self, index: int) -> tuple[int, int]:
        """(row index, pass of its environment) of the index-th prompt of the stream."""
        epoch, position = divmod(index, self.length)
        envs, before = self._pattern(epoch)
        env = envs[position]
        k = epoch * self.quota[env] + before[position]
        use, offset = divmod(k, len(self.rows_of[env]))
        return self._perm(env, use)[offset], use
