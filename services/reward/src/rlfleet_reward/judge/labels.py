"""Strict label verdicts for the per-response judge environments: the judge ends its
answer with one bracketed label (`[[YES]]`, `[[REFUSED]]`, ...). An answer carrying no
label, or labels of both kinds, is not a verdict: VerdictError says which, and the
environment turns it into a JUDGE_ERROR failure (NeMo-Gym's servers read such answers as
"unclear": 0, 0.5 or NO; here it is never a reward)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

from rlfleet_reward.judge.genrm import VerdictError

T = TypeVar("T")

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_PREVIEW_CHARS = 120

YES_NO: dict[str, bool] = {"[[YES]]": True, "[[NO]]": False}


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= _PREVIEW_CHARS else flat[:_PREVIEW_CHARS] + "...")


def parse_label(text: str, labels: Mapping[str, T]) -> T:
    """The value of the one kind of label in `text` (reasoning in <think> skipped; the
    label may repeat); VerdictError when there is none, or more than one kind."""
    answer = _THINK.sub("", text)
    if "<think>" in answer:
        raise VerdictError("the judge's reasoning never ended (<think> without </think>)")
    found = [label for label in labels if label in answer]
    if not found:
        raise VerdictError(f"no {' or '.join(labels)} label in {_preview(text)}")
    if len(found) > 1:
        raise VerdictError(f"both {' and '.join(found)} in {_preview(text)}")
    return labels[found[0]]


def parse_yes_no(text: str) -> bool:
    """True for `[[YES]]`, False for `[[NO]]`."""
    return parse_label(text, YES_NO)
