r"""NeMo-Gym 0.7's multiple-choice answer formats (its `mcqa` resources server), re-implemented
so that the same response gets the same letter.

- `strict_single_letter_boxed`: the last `\boxed{...}` (braces balanced) holds one capital
  letter, alone among non-letters (`E`, `(B)`, `[C]`, `\text{E}`) or leading a label
  (`E: text`, `C) text`, `D. text`, `A - text`).
- `lenient_boxed`: strict, else the last box contains exactly one option's text.
- `lenient_answer_colon`: the first `Answer: ...` line holds one letter or an option's text.
- `lenient_answer_colon_md`: the last `Answer:` payload (markdown-tolerant: `**Answer:** B`,
  `_Answer_: (C)`, or the row's `template_metadata.answer_prefix`) that names one letter; a
  list of several letters (`A or B`, `A/C`) names none. Falls back to strict boxed when a
  prefix is given.
- `template_metadata.output_regex` (one pattern or a list, tried in order) runs first in
  every mode: the last match, case-insensitive; a single letter is taken as is, otherwise
  it must equal an option's text.
Only letters named in `options` (with a non-null text) count, except through output_regex.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Sequence

Options = tuple[tuple[str, str], ...]
"""(letter, text) pairs in row order; a letter may repeat (rows write one dict per option)."""

NEMO_MODES = (
    "strict_single_letter_boxed",
    "lenient_boxed",
    "lenient_answer_colon",
    "lenient_answer_colon_md",
)

_BOX = "\\boxed{"
_TEXT_WRAPPER = re.compile(r"\\text\{\s*(.*?)\s*\}", re.DOTALL)
_ONLY_LETTER = re.compile(r"^[^A-Za-z]*([A-Z])[^A-Za-z]*$")
_LABEL_LETTER = re.compile(r"^\s*([A-Z])\s*[:).\-]")
_ANSWER_LINE = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)
_ANSWER_MD = re.compile(r"[*_]{0,2}Answer[*_]{0,2}\s*:[*_\s]{0,2}(.+)", re.IGNORECASE | re.M)
_ISOLATED_LETTER = re.compile(r"(?<![A-Za-z])([A-Za-z])(?![A-Za-z])")
_LIST_GAP = re.compile(r"(?:\s*[/|&,;]\s*|\s+(?:or|and)\s+|\s+)", re.IGNORECASE)
_FIRST_LETTER = re.compile(r"^([a-zA-Z])(?![a-zA-Z0-9])")
_LAST_CAPITAL_WORD = re.compile(r"\b[A-Z]\b(?!.*\b[A-Z]\b)", re.DOTALL)
# Option letters in other scripts / full width, read as Latin A-D.
_SCRIPT_LETTERS = str.maketrans(
    {c: " " + latin for c, latin in zip("أبجدঅবডঢＡＢＣＤ", "ABCDABCDABCD", strict=True)}
)


def last_box(text: str) -> str | None:
    r"""Inside of the last `\boxed{`, or None if there is none or it never closes."""
    start = text.rfind(_BOX)
    if start < 0:
        return None
    depth = 0
    body_start = start + len(_BOX)
    for i in range(body_start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[body_start:i]
            depth -= 1
    return None


def unwrap_text(value: str) -> str:
    r"""Peel `\text{...}` wrappers that span the whole string."""
    while (m := _TEXT_WRAPPER.fullmatch(value)) is not None:
        value = m.group(1)
    return value


def squash(value: str) -> str:
    return " ".join(value.lower().split())


def _latinise(value: str) -> str:
    return unicodedata.normalize("NFKC", value).translate(_SCRIPT_LETTERS).strip()


def boxed_letter(text: str, allowed: frozenset[str]) -> str | None:
    inner = last_box(text)
    if inner is None:
        return None
    inner = unwrap_text(inner.strip())
    m = _ONLY_LETTER.match(inner) or _LABEL_LETTER.match(inner)
    if m is None or m.group(1) not in allowed:
        return None
    return m.group(1)


def boxed_option_text(text: str, options: Options, allowed: frozenset[str]) -> str | None:
    """The one option whose text the last box contains (None if none or several)."""
    inner = last_box(text)
    if inner is None:
        return None
    inner = inner.strip()
    candidates = (squash(inner), squash(unwrap_text(inner)))
    hits = {
        letter
        for letter, option in options
        if letter in allowed and squash(option)
        for candidate in candidates
        if squash(option) in candidate
    }
    return hits.pop() if len(hits) == 1 else None


def answer_line_letter(text: str, options: Options, allowed: frozenset[str]) -> str | None:
    m = _ANSWER_LINE.search(text)
    if m is None:
        return None
    payload = unwrap_text(m.group(1)).strip()
    if len(payload) == 1 and payload.isalpha() and payload.upper() in allowed:
        return payload.upper()
    wanted = squash(payload)
    for letter, option in options:
        if letter in allowed and squash(option) == wanted:
            return letter
    return None


def _lists_several(payload: str, allowed: frozenset[str]) -> bool:
    found = [
        (m.group(1).upper(), m.start(1), m.end(1))
        for m in _ISOLATED_LETTER.finditer(payload)
        if m.group(1).upper() in allowed
    ]
    return any(
        a[0] != b[0] and _LIST_GAP.fullmatch(payload[a[2] : b[1]]) is not None
        for a, b in itertools.pairwise(found)
    )


def payload_letter(payload: str, allowed: frozenset[str]) -> str | None:
    """The single choice an answer payload names ("B", "B because ...", "so it is C")."""
    candidate = _latinise(payload).strip().strip("*_` \t\n\r.,;:")
    if _lists_several(candidate, allowed):
        return None
    letter: str | None
    if len(candidate) == 1:
        letter = candidate
    elif (m := _FIRST_LETTER.match(candidate)) is not None:
        letter = m.group(1)
    else:
        last = _LAST_CAPITAL_WORD.search(candidate)
        letter = last.group(0) if last else None
    if letter and letter.upper() in allowed:
        return letter.upper()
    return None


def markdown_answer_letter(
    text: str, allowed: frozenset[str], answer_prefix: str | None
) -> str | None:
    original, text = text, unicodedata.normalize("NFKC", text)
    payloads = [(m.start(), m.group(1)) for m in _ANSWER_MD.finditer(text)]
    if answer_prefix:
        prefix = re.compile(
            re.escape(unicodedata.normalize("NFKC", answer_prefix)) + r"\s*", re.IGNORECASE
        )
        for m in prefix.finditer(text):
            end = text.find("\n", m.end())
            payloads.append((m.start(), text[m.end() : end if end >= 0 else len(text)]))
    payloads.sort(key=lambda p: p[0])  # stable: at one position, the Answer: match stays first
    for _, payload in reversed(payloads):
        letter = payload_letter(payload, allowed)
        if letter is not None:
            return letter
    if answer_prefix:
        return boxed_letter(original, allowed)
    return None


def regex_letter(
    text: str, patterns: Sequence[re.Pattern[str]], options: Options, allowed: frozenset[str]
) -> str | None:
    """First pattern whose last match names a letter (taken as is) or an option's text."""
    for pattern in patterns:
        matches = pattern.findall(text)
        if not matches:
            continue
        captured = _latinise(matches[-1].strip()).upper()
        if len(captured) == 1 and captured.isalpha():
            return captured
        wanted = squash(captured)
        for letter, option in options:
            if letter in allowed and squash(option) == wanted:
                return letter
    return None


def nemo_letter(
    text: str,
    mode: str,
    options: Options,
    allowed: frozenset[str],
    patterns: Sequence[re.Pattern[str]] = (),
    answer_prefix: str | None = None,
) -> str | None:
    """The letter NeMo-Gym's mcqa server reads from `text` in grading `mode`."""
    text = text.strip()
    if not text:
        return None
    letter = regex_letter(text, patterns, options, allowed) if patterns else None
    if letter is not None:
        return letter
    if mode == "strict_single_letter_boxed":
        return boxed_letter(text, allowed)
    if mode == "lenient_boxed":
        return boxed_letter(text, allowed) or boxed_option_text(text, options, allowed)
    if mode == "lenient_answer_colon":
        return answer_line_letter(text, options, allowed)
    return markdown_answer_letter(text, allowed, answer_prefix)
