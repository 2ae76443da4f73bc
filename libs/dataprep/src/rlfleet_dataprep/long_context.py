"""Synthetic long documents with one verifiable answer, for the `long_context` environment.

A placeholder `{"source": "long_context", "task": T, "seed": S, "length_chars": N}`
(or `length_tokens`, taken as 4 characters each) becomes a row whose prompt is a
document of about N characters of filler prose with facts hidden at random places, then
a question. The same (task, seed, length, options) always gives the same row. Tasks:

- `niah_single`: one "special magic number" for a key, among distractor keys.
- `niah_multi`: `needles` (default 3) numbers for one key; the answer lists all of them.
- `aggregate_count` / `aggregate_sum` / `aggregate_max`: `records` (default 12) shipment
  records scattered through the document; count, total or heaviest weight of those from
  one city (the others are distractors).
- `multi_hop`: a chain of `hops` (default 3) variable assignments (VAR B = VAR A, ...)
  starting from a number, shuffled in the document with a distractor chain; the answer
  is the number the last variable holds.

Numbers are written without thousands separators, and keys and cities are single
words, so the answer's list splitting and number normalisation are unambiguous.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from rlfleet_contracts.rows import DataError, Row

TASKS = (
    "niah_single",
    "niah_multi",
    "aggregate_count",
    "aggregate_sum",
    "aggregate_max",
    "multi_hop",
)
MAX_LENGTH_CHARS = 4_000_000
"""Largest document asked for (about a million tokens)."""

_FILLER = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
    "The river runs slowly past the old mill.",
    "A cold wind came down from the hills that evening.",
    "Nobody in the village remembered when the bridge was built.",
    "The market opens early on the first day of each week.",
    "Letters arrived late during the long winter.",
    "The lamp in the window burned until morning.",
    "Children played near the fountain in the square.",
)
_WORDS = (
    "amber",
    "basil",
    "cobalt",
    "dune",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lagoon",
    "meadow",
    "nectar",
    "onyx",
    "pebble",
    "quartz",
    "raven",
    "saffron",
    "tundra",
    "umber",
    "velvet",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
)
_CITIES = ("Oslo", "Lima", "Perth", "Quito", "Dakar", "Hanoi", "Porto", "Tunis")
_ANSWER_FORMAT = "\n\nEnd your response with a line of the form 'Final Answer: <answer>'."


def _key(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}"


def _document(rng: random.Random, facts: list[str], length_chars: int) -> str:
    """Filler prose of about `length_chars` characters with `facts` at random places."""
    sentences: list[str] = []
    size = sum(len(f) + 1 for f in facts)
    while size < length_chars:
        sentence = rng.choice(_FILLER)
        sentences.append(sentence)
        size += len(sentence) + 1
    for fact in facts:
        sentences.insert(rng.randint(0, len(sentences)), fact)
    return " ".join(sentences)


def _niah(rng: random.Random, needles: int) -> tuple[list[str], str, list[str]]:
    keys: list[str] = []
    while len(keys) < 4:
        key = _key(rng)
        if key not in keys:
            keys.append(key)
    target, distractors = keys[0], keys[1:]
    values = rng.sample(range(1_000_000, 9_999_999), needles + len(distractors))
    facts = [f"One of the special magic numbers for {target} is: {v}." for v in values[:needles]]
    facts += [
        f"One of the special magic numbers for {key} is: {v}."
        for key, v in zip(distractors, values[needles:], strict=True)
    ]
    if needles == 1:
        question = f"What is the special magic number for {target} mentioned in the text?"
    else:
        question = (
            f"What are all the special magic numbers for {target} mentioned in the text? "
            "List them separated by commas."
        )
    return facts, question, [str(v) for v in values[:needles]]


def _aggregate(rng: random.Random, task: str, records: int) -> tuple[list[str], str, list[str]]:
    city = rng.choice(_CITIES)
    ids = rng.sample(range(100, 999), records)
    facts, weights = [], []
    for i, crate in enumerate(ids):
        origin = city if i % 2 == 0 or rng.random() < 0.3 else rng.choice(_CITIES)
        weight = rng.randint(5, 500)
        if origin == city:
            weights.append(weight)
        facts.append(f"Shipping log: crate {crate} arrived from {origin} weighing {weight} kg.")
    if task == "aggregate_count":
        question, answer = f"How many crates arrived from {city}?", len(weights)
    elif task == "aggregate_sum":
        question = f"What is the total weight in kg of all crates that arrived from {city}?"
        answer = sum(weights)
    else:
        question = f"What is the weight in kg of the heaviest crate that arrived from {city}?"
        answer = max(weights)
    return facts, question, [str(answer)]


def _multi_hop(rng: random.Random, hops: int) -> tuple[list[str], str, list[str]]:
    names = rng.sample([w.upper() for w in _WORDS], 2 * (hops + 1))
    value, decoy = rng.sample(range(10_000, 99_999), 2)
    facts = []
    for chain, start in ((names[: hops + 1], value), (names[hops + 1 :], decoy)):
        facts.append(f"VAR {chain[0]} = {start}.")
        facts += [f"VAR {b} = VAR {a}." for a, b in itertools.pairwise(chain)]
    question = (
        f"The text assigns values to variables. Which number does VAR {names[hops]} hold, "
        "following the chain of assignments?"
    )
    return facts, question, [str(value)]


def _positive_int(spec: dict[str, Any], key: str, default: int, high: int) -> int:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise DataError(f"_placeholder.{key}: expected an integer in [1, {high}], got {value!r}")
    return value


def fill_long_context(spec: dict[str, Any]) -> Row:
    """{task, seed, length_chars | length_tokens, needles?, records?, hops?} → a row of the
    `long_context` environment (see the module docstring)."""
    task = spec["task"]
    if task not in TASKS:
        raise DataError(f"_placeholder.task: unknown long_context task {task!r}; one of {TASKS}")
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"_placeholder.seed: expected an integer, got {seed!r}")
    if "length_tokens" in spec:
        length = 4 * _positive_int(spec, "length_tokens", 0, MAX_LENGTH_CHARS // 4)
    else:
        length = _positive_int(spec, "length_chars", 0, MAX_LENGTH_CHARS)
    rng = random.Random(f"long_context:{task}:{seed}")
    if task in ("niah_single", "niah_multi"):
        needles = 1 if task == "niah_single" else _positive_int(spec, "needles", 3, 100)
        facts, question, answer = _niah(rng, needles)
    elif task == "multi_hop":
        facts, question, answer = _multi_hop(rng, _positive_int(spec, "hops", 3, 12))
    else:
        facts, question, answer = _aggregate(rng, task, _positive_int(spec, "records", 12, 800))
    document = _document(rng, facts, length)
    prompt = (
        "Read the following text carefully; a question about it follows.\n\n"
        f"<text>\n{document}\n</text>\n\n{question}{_ANSWER_FORMAT}"
    )
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "agent_ref": {"name": "long_context"},
        "expected_answer": answer if len(answer) > 1 else answer[0],
        "match_type": "exact",
        "task": task,
        "length": len(document),
        "seed": seed,
    }
