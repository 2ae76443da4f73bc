"""Strict label verdicts for the per-response judge environments: the judge ends its
answer with one bracketed label (`[[YES]]`, `[[REFUSED]]`, ...). Only the judge's own
final answer counts (judge/fence.py): reasoning and fenced quotes are dropped, and the
label must be on the answer's last non-empty line, its conclusion. An answer carrying no
such label, or labels of both kinds, is not a verdict: VerdictError says which, and the
environment turns it into a JUDGE_ERROR failure (NeMo-Gym's servers read such answers as
"unclear": 0, 0.5 or NO; here it is never a reward)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from rlfleet_reward.judge.fence import UnfinishedAnswer, judge_answer
from rlfleet_reward.judge.genrm import VerdictError

T = TypeVar("T")
_PREVIEW_CHARS = 120

YES_NO: dict[str, bool] = {"[[YES]]": True, "[[NO]]": False}


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= _PREVIEW_CHARS else flat[:_PREVIEW_CHARS] + "...")


def parse_label(text: str, labels: Mapping[str, T]) -> T:
    """The value of the one kind of label in the judge's answer (reasoning and fenced
    quotes skipped; the label may repeat, and must be on the last non-empty line);
    VerdictError when there is none there, or more than one kind in the answer."""
    try:
        answer = judge_answer(text)
    except UnfinishedAnswer as exc:
        raise VerdictError(str(exc)) from None
    found = [label for label in labels if label in answer]
    if len(found) > 1:
        raise VerdictError(f"both {' and '.join(found)} in {_preview(text)}")
    lines = [line for line in answer.splitlines() if line.strip()]
    if not found or found[0] not in lines[-1]:
        raise VerdictError(
            f"no {' or '.join(labels)} label in {_preview(text)} (it must end the answer)"
        )
    return labels[found[0]]


def parse_yes_no(text: str) -> bool:
    """True for `[[YES]]`, False for `[[NO]]`."""
    return parse_label(text, YES_NO)
