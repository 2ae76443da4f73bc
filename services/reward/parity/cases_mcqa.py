"""Seeded verify requests for `mcqa` across its failure categories (parity with NeMo-Gym).

`generate()` returns cases `{"category", "request", "reference"}`: `request` is what
rlfleet gets, `reference` is `{"server", "request", "config"}` for reference.py (they differ
only for `lenient_answer_colon_md`, which NeMo-Gym takes from its server config, not the row).
"""

from __future__ import annotations

import random
import string
from typing import Any

from generate import message, response  # parity/ is on sys.path, as for record_mir

SEED = 13
COUNT = 640

_TEXTS = [
    "Mitochondria",
    "Ribosome",
    "Polymerase Chain Reaction (PCR)",
    "E. coli",
    "Newton's second law",
    "2.5 m/s",
    "Venus",
    "None of the above",
    "Both A and B",
    "sodium chloride",
    "Karyotyping",
    "x = 3",
]
_MODES = ["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"]
_REGEXES = [
    r"Answer:\s*\\boxed\{([A-J])\}",
    r"answer is \(?([A-Z])\)?",
    r"Final answer:\s*(.+)",
    r"\[\[([A-Za-z])\]\]",
    r"Answer:\s*([A-J])",
]
_PREFIXES = ["Final Answer:", "The answer is", "Réponse :", "答案："]


def _answer_text(
    rng: random.Random, letters: list[str], options: dict[str, str], gold: str
) -> tuple[str, str]:
    """(category, response text): the ways models write (or fail to write) a choice."""
    pick = gold if rng.random() < 0.5 else rng.choice(letters)
    other = rng.choice([x for x in letters if x != pick] or letters)
    outside = rng.choice([x for x in string.ascii_uppercase[:12] if x not in letters] or ["Z"])
    text = options.get(pick, "")
    lead = rng.choice(
        [
            "",
            "Let me think step by step.\n",
            "The options differ in one way. ",
            "**Reasoning** A is wrong.\n\n",
        ]
    )
    forms = [
        ("boxed", rf"\boxed{{{pick}}}"),
        ("boxed_text", rf"\boxed{{\text{{{pick}}}}}"),
        ("boxed_text_spaced", rf"\boxed{{\text{{ {pick} }}}}"),
        ("boxed_paren", rf"\boxed{{({pick})}}"),
        ("boxed_bracket", rf"\boxed{{[{pick}]}}"),
        ("boxed_label", rf"\boxed{{{pick}: {text}}}"),
        ("boxed_label_paren", rf"\boxed{{{pick}) {text}}}"),
        ("boxed_label_dot", rf"\boxed{{{pick}. {text}}}"),
        ("boxed_lower", rf"\boxed{{{pick.lower()}}}"),
        ("boxed_option_text", rf"\boxed{{{text}}}"),
        ("boxed_option_text_wrapped", rf"\boxed{{\text{{{text}}}}}"),
        ("boxed_option_text_case", rf"\boxed{{{text.upper()}  }}"),
        ("boxed_two_letters", rf"\boxed{{{pick}, {other}}}"),
        ("boxed_word", rf"\boxed{{{pick}nswer}}"),
        ("boxed_outside_options", rf"\boxed{{{outside}}}"),
        ("boxed_then_other", rf"\boxed{{{other}}} wait, no: \boxed{{{pick}}}"),
        ("boxed_unclosed", rf"\boxed{{{pick}"),
        ("boxed_nested", rf"\boxed{{\mathrm{{{pick}}}}}"),
        ("fbox", rf"\fbox{{{pick}}}"),
        ("answer_colon", f"Answer: {pick}"),
        ("answer_colon_lower", f"answer: {pick.lower()}"),
        ("answer_colon_text", f"Answer: {text}"),
        ("answer_colon_text_case", f"ANSWER:   {text.lower()}  "),
        ("answer_colon_boxed", rf"Answer: \boxed{{{pick}}}"),
        ("answer_colon_textwrap", rf"Answer: \text{{{pick}}}"),
        ("answer_colon_because", f"Answer: {pick} because {text}"),
        ("answer_colon_list", f"Answer: {pick} or {other}"),
        ("answer_colon_slash", f"Answer: {pick}/{other}"),
        ("answer_colon_twice", f"Answer: {other}\nOn reflection.\nAnswer: {pick}"),
        ("answer_md_bold", f"**Answer:** {pick}"),
        ("answer_md_bold_paren", f"**Answer:** ({pick})"),
        ("answer_md_italic", f"_Answer_: {pick}."),
        ("answer_md_sentence", f"Answer: so the choice is {pick}"),
        ("answer_fullwidth", f"Answer: {chr(0xFF21 + ord(pick) - 65) if pick in 'ABCD' else pick}"),
        ("answer_arabic", "Answer: " + {"A": "أ", "B": "ب", "C": "ج", "D": "د"}.get(pick, pick)),
        ("answer_is_paren", f"The answer is ({pick})."),
        ("final_answer", f"Final Answer: {pick}"),
        ("final_answer_text", f"Final answer: {text}"),
        ("double_bracket", f"[[{pick}]]"),
        ("reponse", f"Réponse : {pick}"),
        ("chinese_prefix", f"答案：{pick}"),
        ("bare_letter", pick),
        ("bare_paren", f"({pick})"),
        ("final_line_letter", f"Considering all of it.\n{pick}."),
        ("option_text_only", text),
        ("no_answer", "I cannot decide between these."),
        ("hedge", f"It could be {pick} or {other}."),
        ("empty", ""),
        ("whitespace", "  \n "),
        ("outside_letter", f"Answer: {outside}"),
    ]
    category, body = rng.choice(forms)
    if category in ("empty", "whitespace"):
        return category, body
    tail = rng.choice(["", "", "\n", " Hope this helps."])
    return category, lead + body + tail


def _options(rng: random.Random) -> tuple[list[str], list[dict[str, Any]], dict[str, str]]:
    count = rng.choice([2, 3, 4, 4, 4, 5, 6, 10])
    letters = list(string.ascii_uppercase[:count])
    texts = rng.sample(_TEXTS, k=min(count, len(_TEXTS)))
    texts += [f"value {i}" for i in range(count - len(texts))]
    options = dict(zip(letters, texts, strict=True))
    shape = rng.random()
    rows: list[dict[str, Any]] = [{k: v} for k, v in options.items()]
    if shape < 0.1:  # a null entry is no choice (NeMo-Gym drops it)
        rows.append({string.ascii_uppercase[count]: None})
    elif shape < 0.15:  # lowercase keys
        rows = [{k.lower(): v} for k, v in options.items()]
    return letters, rows, options


def generate(seed: int = SEED, count: int = COUNT) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        letters, option_rows, options = _options(rng)
        gold = rng.choice(letters)
        category, text = _answer_text(rng, letters, options, gold)
        row: dict[str, Any] = {
            "responses_create_params": {"input": [{"role": "user", "content": f"Question {i}?"}]},
            "uuid": f"case-{i}",
            "options": option_rows,
            "expected_answer": gold.lower() if rng.random() < 0.05 else gold,
        }
        config: dict[str, Any] = {}
        mode_roll = rng.random()
        mode = None
        if mode_roll < 0.25:
            mode = "lenient_answer_colon_md"
            config = {"grading_mode": mode}
        elif mode_roll < 0.9:
            mode = rng.choice(_MODES)
            row["grading_mode"] = mode
        meta_roll = rng.random()
        if meta_roll < 0.2:
            pick = rng.sample(_REGEXES, k=rng.choice([1, 2]))
            row["template_metadata"] = {
                "template_id": f"t{i % 7}",
                "output_regex": pick[0] if len(pick) == 1 else pick,
            }
        elif meta_roll < 0.35 and mode == "lenient_answer_colon_md":
            row["template_metadata"] = {"answer_prefix": rng.choice(_PREFIXES)}
        reference = dict(row, response=response([message(text)]))
        request = dict(reference)
        if config:
            request["grading_mode"] = config["grading_mode"]
        cases.append(
            {
                "category": f"{mode or 'default'}/{category}",
                "request": request,
                "reference": {"server": "mcqa", "request": reference, "config": config},
            }
        )
    return cases
