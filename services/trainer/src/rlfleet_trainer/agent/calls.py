"""How a multi-turn trajectory's tool calls ended, and when a trajectory counts as a
hallucination (the DPO stage's pairs and held-out rate; docs/trainer.md "DPO").

Outcomes of one call (`CALL_OUTCOMES`):
- `malformed`: the trainer could not read it (`tool_format`: not JSON, no `"name"`,
  arguments not an object, an opening tag without its closing one, a turn cut by the
  token limit inside a call included); the trainer answers it with an error itself.
- the reward gateway's kinds, counted per episode and returned in CloseEpisode's info as
  `calls/<kind>`: `ok` (ran), `unknown_tool` (a tool the episode does not show),
  `invalid_arguments` (not a JSON object, too long, or outside the tool's JSON Schema),
  `tool_error` (the tool refused or failed: no such account, insufficient funds, timeout),
  `after_end` (made after the environment ended the episode).

A trajectory is **hallucinated** when at least one of its calls is `malformed`,
`unknown_tool` or `invalid_arguments`: a call that cannot be read, to a tool that is not
there, or with arguments the tool's schema refuses. A tool's own refusal (`tool_error`)
does not count: the call was well formed and the environment answered it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

CALL_OUTCOMES = ("ok", "malformed", "unknown_tool", "invalid_arguments", "tool_error", "after_end")
HALLUCINATED_OUTCOMES = ("malformed", "unknown_tool", "invalid_arguments")

VERDICT_OF_OUTCOME = {
    "malformed": "malformed_call",
    "unknown_tool": "wrong_name",
    "invalid_arguments": "wrong_arguments",
}
"""A hallucinated trajectory's verdict, in the single-turn `tool_use` environment's words
(dpo.HALLUCINATION_VERDICTS): the first outcome of HALLUCINATED_OUTCOMES it has."""


def call_counts(info: Mapping[str, str], malformed: int) -> dict[str, int]:
    """The trajectory's calls by outcome: the gateway's `calls/<kind>` counts (from the
    episode's score info) plus the `malformed` calls the trainer answered itself. An
    outcome without calls is 0; an unreadable count is an error naming the key."""
    counts = dict.fromkeys(CALL_OUTCOMES, 0)
    for key, value in info.items():
        if not key.startswith("calls/"):
            continue
        try:
            counts[key.removeprefix("calls/")] = int(value)
        except ValueError:
            raise ValueError(f"episode score info {key}={value!r}: expected a count") from None
    counts["malformed"] += malformed
    return counts


def is_hallucinated(counts: Mapping[str, int]) -> bool:
    return any(counts.get(kind, 0) > 0 for kind in HALLUCINATED_OUTCOMES)


def trajectory_verdict(counts: Mapping[str, int]) -> str:
    """`malformed_call`, `wrong_name` or `wrong_arguments` for a hallucinated trajectory
    (the first that applies, in that order); `correct` when it made at least one call and
    none was hallucinated; `no_call` when it made none."""
    for kind in HALLUCINATED_OUTCOMES:
        if counts.get(kind, 0) > 0:
            return VERDICT_OF_OUTCOME[kind]
    return "correct" if sum(counts.values()) > 0 else "no_call"


def hallucination_rate(trajectories: Iterable[Mapping[str, int]]) -> float:
    """Share of the trajectories with at least one hallucinated call (0 for none)."""
    flags = [is_hallucinated(counts) for counts in trajectories]
    return sum(flags) / len(flags) if flags else 0.0
