"""Text helpers shared by environments: reasoning split, \\boxed{} and code extraction.

Kept free of heavy imports: the gateway process uses them too.
"""

from __future__ import annotations

import re

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


def split_reasoning(text: str) -> tuple[str, str]:
    """(answer, reasoning) from a raw generation with optional <think>...</think>.

    A generation that opened <think> and never closed it was cut off while reasoning: its
    answer is empty (it must not be graded on half a thought).
    """
    if _THINK_CLOSE in text:
        reasoning, _, answer = text.rpartition(_THINK_CLOSE)
        return answer.strip(), reasoning.replace(_THINK_OPEN, "", 1).strip()
    if _THINK_OPEN in text:
        before, _, reasoning = text.partition(_THINK_OPEN)
        return before.strip(), reasoning.strip()
    return text, ""


def find_boxed(text: str) -> list[str]:
    r"""Contents of every \boxed{...} / \fbox{...} in order, with nested braces balanced.

    >>> find_boxed(r"so \boxed{\frac{1}{2}} or \boxed{3}")
    ['\\frac{1}{2}', '3']
    """
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return []
    # One pass pairs every brace with its match, so thousands of unclosed \boxed{ cost
    # linear time, not one scan to the end of the text each.
    closing: dict[int, int] = {}
    opened: list[int] = []
    for brace in re.finditer(r"[{}]", text):
        if brace.group() == "{":
            opened.append(brace.end())
        elif opened:
            closing[opened.pop()] = brace.start()
    return [text[start : closing[start]] for start in starts if start in closing]


def last_complete_boxed(text: str) -> str | None:
    r"""NeMo-Gym's gate: the contents of the *last* `\boxed{` if its braces close, else None
    (an earlier complete box does not count; `\fbox{` and `\boxed {` are not boxes).

    >>> last_complete_boxed(r"\boxed{1} then \boxed{\frac{1}{2}}")
    '\\frac{1}{2}'
    >>> last_complete_boxed(r"\boxed{1} then \boxed{2") is None
    True
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    start += len("\\boxed{")
    depth = 1
    for match in re.finditer(r"[{}]", text[start:]):
        depth += 1 if match.group() == "{" else -1
        if depth == 0:
            return text[start : start + match.start()]
    return None


# "Final answer[ is][:] X", "The answer is[:] X", "Answer: X" (a bare "answer" needs the colon).
_FINAL_LINE = re.compile(
    r"(?:final answer\s*(?:is)?\s*[:：]?|the answer is\s*[:：]?|answer\s*[:：])\s*(.+)$",
    re.IGNORECASE,
)


def final_answer_line(text: str) -> str | None:
    """The answer after the last 'Final answer:' / 'The answer is' / 'Answer:' phrase."""
    for line in reversed(text.strip().splitlines()):
        match = _FINAL_LINE.search(line)
        if match:
            answer = match.group(1).strip().rstrip(".").strip()
            answer = answer.strip("*").strip()
            if answer:
                return answer
    return None


# The info string is bounded: with `[^\n]*`, every ``` of a long line without a newline
# scanned to its end (20,000 backticks triples took 7.5 s, in the gateway's event loop).
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]{0,200}\n(.*?)```", re.DOTALL)


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, in order."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def extract_code(text: str, language: str = "python") -> str:
    """The program in a response: the last fenced block in `language` (or untagged),
    else the last fenced block of any kind, else the whole text (a bare program)."""
    blocks = code_blocks(text)
    tagged = [body for lang, body in blocks if lang in (language, "py", "python3", "")]
    if tagged:
        return tagged[-1]
    if blocks:
        return blocks[-1][1]
    return text


def extract_json_text(text: str) -> str:
    """The JSON document in a response: a ```json fence if present, else the text."""
    for lang, body in reversed(code_blocks(text)):
        if lang in ("json", ""):
            return body.strip()
    return text.strip()
