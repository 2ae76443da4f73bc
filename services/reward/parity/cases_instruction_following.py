"""Seeded verify requests for `instruction_following` (parity with NeMo-Gym's server, which
checks with the `verifiable_instructions` registry).

Every registry id whose checker runs without NLTK's punkt data is generated, with kwargs
as NeMo-Gym's data writes them, and responses that are near misses or hits for it (plus
texts from a shared pool, so each also meets the other instructions of its row). Ids that
need punkt (see PUNKT_IDS) are left out: in a side environment without the data NeMo-Gym
scores them 0 whatever the answer, so they are covered by table tests instead.
`generate()` returns `{"category", "request", "reference"}`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from generate import message, response  # parity/ is on sys.path, as for record_mir

SEED = 13
COUNT = 900

PUNKT_IDS = (
    "length_constraints:number_sentences",
    "change_case:capital_word_frequency",
    "count:counting_composition",
    "count:count_unique",
    "keywords:keyword_specific_position",
    "keywords:start_end",
)

_WORDS = [
    "river",
    "stone",
    "light",
    "garden",
    "quiet",
    "market",
    "bridge",
    "winter",
    "story",
    "paper",
    "cloud",
    "music",
]
_PROMPT = "Write a short note about the river and the stone bridge in winter."
_PHRASE = "The early bird catches the worm"
_POOL = [
    "The river runs under the stone bridge. In winter the garden is quiet, and the market closes early!",
    "the river runs under the stone bridge. in winter the garden is quiet and the market closes early",
    "THE RIVER RUNS UNDER THE STONE BRIDGE. IN WINTER THE GARDEN IS QUIET AND THE MARKET CLOSES EARLY",
    "<<A Winter Story>>\n\nThe river is cold.\n\nThe stone bridge is old.\n\nThe market is closed.",
    "* river\n* stone\n- bridge\n* winter light",
    "Section 1\nThe river.\nSection 2\nThe bridge.\nSection 3\nThe garden.",
    "SECTION 1 river SECTION 2 stone",
    "First part about the river.\n***\nSecond part about the stone bridge.\n***\nThird part.",
    "Paragraph one on the river.\n\nParagraph two on the bridge.",
    "Paragraph one.\n\n\n\nParagraph two after a gap.\n\n",
    '{"river": "cold", "bridge": ["stone", "old"]}',
    '```json\n{"river": 1}\n```',
    '"The river is cold, the bridge is stone."',
    "My answer is yes.",
    "My answer is maybe",
    "The river is *very* cold and the **stone** bridge is *old*. *Quiet* **garden**.",
    "Dear [name], meet me at [place] by the [river].",
    "The river is cold.\n\nP.S. The bridge is old.",
    "The river is cold.\np.p.s the bridge is older than the town.",
    "Answer one: the river.\n******\nAnswer two: the bridge.",
    "Same text\n******\nSame text",
    "river stone level noon racecar kayak bridge",
    "[river] [stone] [bridge]",
    "<<river stone>> <<bridge winter>> <<light garden>>",
    "river-stone-bridge. winter-garden-light.",
    "Rivers run. Stones stay. Bridges span wide waters.",
    "no punctuation at all here just words about the river",
    "Wow! The river! The bridge!",
    "",
    "Río y puente de piedra en invierno, el mercado está cerrado y el jardín tranquilo.",
    "Le fleuve coule sous le pont de pierre. En hiver le jardin est calme et le marché ferme tôt.",
    "river " * 30,
    "The stone river winter market. " * 8,
]


def _relation(rng: random.Random) -> str:
    return rng.choice(["less than", "at least"])


def _word(rng: random.Random) -> str:
    return rng.choice(_WORDS)


# id -> (kwargs maker, response maker from those kwargs, or None to use the pool)
Maker = Callable[[random.Random], dict[str, Any]]
Writer = Callable[[random.Random, dict[str, Any]], str]


def _kw(**fixed: Callable[[random.Random], Any]) -> Maker:
    return lambda rng: {k: f(rng) for k, f in fixed.items()}


def _none(rng: random.Random) -> dict[str, Any]:
    return {}


# The registry checks these twice, under an IFEval id and a newer one: one maker serves both.
_KEYWORD_FREQUENCY: tuple[Maker, Writer] = (
    _kw(keyword=_word, frequency=lambda r: r.randint(1, 4), relation=_relation),
    lambda r, k: " ".join([k["keyword"]] * r.randint(0, 5) + r.sample(_WORDS, 3)),
)


def _letter_frequency(letters: str, most: int) -> Maker:
    return _kw(
        letter=lambda r: r.choice(letters),
        let_frequency=lambda r: r.randint(1, most),
        let_relation=_relation,
    )


def _paragraphs(rng: random.Random, n: int, first: str | None = None, sep: str = "\n\n") -> str:
    paras = [f"{_word(rng).capitalize()} {_word(rng)} {_word(rng)}." for _ in range(n)]
    if first is not None and paras:
        k = rng.randrange(n)
        paras[k] = (
            rng.choice([first, first.capitalize(), f'"{first}', f"{first},", f"({first}"])
            + " text."
        )
    return sep.join(paras)


def _sentences(rng: random.Random, first: str | None = None, last: str | None = None) -> str:
    out = []
    for _ in range(rng.randint(1, 4)):
        words = [_word(rng) for _ in range(rng.randint(2, 5))]
        if first and rng.random() < 0.8:
            words[0] = first
        if last and rng.random() < 0.8:
            words[-1] = last
        out.append(" ".join(words) + rng.choice([".", "!", "?", ""]))
    return " ".join(out)


def _each_sentence(edge: str) -> tuple[Maker, Writer]:
    """The maker and writer of `<edge>_word:<edge>_word_sent` (edge `first` or `last`):
    sentences that mostly start (or end) with the row's word."""
    key = f"{edge}_word"
    return _kw(**{key: _word}), lambda r, k: _sentences(r, **{edge: k[key]})


INSTRUCTIONS: dict[str, tuple[Maker, Writer | None]] = {
    "keywords:existence": (
        _kw(keywords=lambda r: r.sample(_WORDS, r.randint(1, 3))),
        lambda r, k: " ".join(r.sample(k["keywords"] + _WORDS, 4)),
    ),
    "keywords:frequency": _KEYWORD_FREQUENCY,
    "keywords:forbidden_words": (
        _kw(forbidden_words=lambda r: r.sample(_WORDS, 2)),
        lambda r, k: (
            " ".join(r.sample(_WORDS, 3)) + r.choice(["", " rivers", " river's", " Stone."])
        ),
    ),
    "keywords:letter_frequency": (_letter_frequency("aeirstAE", 12), None),
    "language:response_language": (_kw(language=lambda r: r.choice(["en", "es", "fr"])), None),
    "length_constraints:number_paragraphs": (
        _kw(num_paragraphs=lambda r: r.randint(1, 4)),
        lambda r, k: _paragraphs(r, r.randint(1, 4), sep=r.choice(["\n***\n", " *** ", "***"])),
    ),
    "length_constraints:number_words": (
        _kw(num_words=lambda r: r.randint(3, 40), relation=_relation),
        None,
    ),
    "length_constraints:nth_paragraph_first_word": (
        lambda r: (
            lambda n: {
                "num_paragraphs": n,
                "nth_paragraph": r.randint(1, n),
                "first_word": _word(r),
            }
        )(r.randint(1, 4)),
        lambda r, k: _paragraphs(r, r.randint(1, 4), first=k["first_word"]),
    ),
    "detectable_content:number_placeholders": (
        _kw(num_placeholders=lambda r: r.randint(1, 4)),
        None,
    ),
    "detectable_content:postscript": (
        _kw(postscript_marker=lambda r: r.choice(["P.S.", "P.P.S", "p.s.", "Note:"])),
        lambda r, k: (
            r.choice(["Body.\n", "Body. "])
            + r.choice(["P.S. x", "p.p.s y", "P. S. z", "Note: n", "PS q"])
        ),
    ),
    "detectable_format:number_bullet_lists": (_kw(num_bullets=lambda r: r.randint(1, 5)), None),
    "detectable_format:constrained_response": (_none, None),
    "detectable_format:number_highlighted_sections": (
        _kw(num_highlights=lambda r: r.randint(1, 5)),
        None,
    ),
    "detectable_format:multiple_sections": (
        _kw(
            section_spliter=lambda r: r.choice(["Section", "SECTION", "Part", "Section "]),
            num_sections=lambda r: r.randint(1, 4),
        ),
        None,
    ),
    "detectable_format:json_format": (_none, None),
    "detectable_format:title": (
        _none,
        lambda r, k: r.choice(["<<T>> x", "<< >> x", "<<>> x", "<<a\nb>>", "<<> >>"]),
    ),
    "combination:two_responses": (
        _none,
        lambda r, k: r.choice(
            [
                "a******b",
                "******a******b",
                "a******b******",
                "a******a",
                "a****** ******b",
                "a******b******c",
            ]
        ),
    ),
    "combination:repeat_prompt": (
        _kw(prompt_to_repeat=lambda r: _PROMPT),
        lambda r, k: r.choice(
            [_PROMPT + " The river.", "  " + _PROMPT.upper(), "Sure. " + _PROMPT]
        ),
    ),
    "startend:end_checker": (
        _kw(
            end_phrase=lambda r: r.choice(
                ["Is there anything else I can help with?", "Any other questions?", "the end"]
            )
        ),
        lambda r, k: "Body. " + k["end_phrase"] + r.choice(["", '"', " ", ".", "\n"]),
    ),
    "change_case:english_capital": (_none, None),
    "change_case:english_lowercase": (_none, None),
    "punctuation:no_comma": (_none, None),
    "startend:quotation": (_none, None),
    "copy:repeat_phrase": (
        _kw(phrase=lambda r: _PHRASE, small_n=lambda r: r.randint(2, 3)),
        lambda r, k: " ".join(
            r.choice(
                [
                    _PHRASE,
                    "The early cat catches the worm",
                    "The late dog catches the worm",
                    "The early bird eats the worm",
                ]
            )
            for _ in range(r.randint(1, 3))
        ),
    ),
    "copy:copy": (
        _kw(prompt_to_repeat=lambda r: _PROMPT),
        lambda r, k: r.choice([_PROMPT, " " + _PROMPT.lower() + " ", _PROMPT + " Done."]),
    ),
    "new:copy_span_idx": (
        _kw(
            prompt_to_repeat=lambda r: _PROMPT,
            n_start=lambda r: r.randint(1, 10),
            n_end=lambda r: r.randint(20, 40),
        ),
        lambda r, k: r.choice(
            [_PROMPT[k["n_start"] : k["n_end"]], _PROMPT[k["n_start"] : k["n_end"] + 1], _PROMPT]
        ),
    ),
    "detectable_format:sentence_hyphens": (
        _none,
        lambda r, k: r.choice(
            ["One.-Two.-Three.", "One. - Two.", "One-two-three.", "Single sentence.", "A.-B"]
        ),
    ),
    "keywords:no_adjacent_consecutive": (
        _none,
        lambda r, k: r.choice(
            ["apple cat egg", "apple banana", "zebra apple", "river stone", "a b", "Ace Bed"]
        ),
    ),
    "detectable_format:square_brackets": (_none, None),
    "keywords:word_once": (
        _kw(keyword=_word),
        lambda r, k: " ".join([k["keyword"]] * r.randint(0, 2) + r.sample(_WORDS, 2)),
    ),
    "keywords:word_count_different_numbers": _KEYWORD_FREQUENCY,
    "keywords:exclude_word_harder": (
        _kw(keyword=_word),
        lambda r, k: r.choice(
            [f"a {k['keyword']} b", f"{k['keyword']} b", f"a {k['keyword']}.", "a b c"]
        ),
    ),
    "paragraphs:paragraphs": (
        _none,
        lambda r, k: _paragraphs(r, r.randint(1, 3), sep=r.choice(["\n***\n", " *** "])),
    ),
    "paragraphs:paragraphs2": (
        _none,
        lambda r, k: _paragraphs(r, r.randint(1, 3), sep=r.choice(["\n\n", "\n\n\n\n", "\n"])),
    ),
    "first_word:first_word_sent": _each_sentence("first"),
    "first_word:first_word_answer": (
        _kw(first_word=_word),
        lambda r, k: (
            r.choice(
                [k["first_word"], k["first_word"].upper(), "  " + k["first_word"] + ",", "Well"]
            )
            + " and more."
        ),
    ),
    "last_word:last_word_sent": _each_sentence("last"),
    "last_word:last_word_answer": (
        _kw(last_word=_word),
        lambda r, k: (
            "Text ends with "
            + r.choice([k["last_word"], k["last_word"] + ".", f"{k['last_word']}!)", "other"])
        ),
    ),
    "detectable_format:bigram_wrapping": (
        _none,
        lambda r, k: r.choice(
            ["<<a b>> <<c d>>", "<<a b>> <<c", "<<a b>> c d", "<<a>> <<b>>", "<<a b>>"]
        ),
    ),
    "copy:copying_simple": (
        _kw(prompt_to_repeat=lambda r: _PROMPT),
        lambda r, k: r.choice([_PROMPT, _PROMPT.upper() + "\n", _PROMPT[:-1]]),
    ),
    "copy:copying_multiple": (
        _kw(prompt_to_repeat=lambda r: _PROMPT, N=lambda r: r.randint(2, 3)),
        lambda r, k: "******".join([_PROMPT] * r.randint(1, 3)),
    ),
    "punctuation:punctuation_dot": (_none, None),
    "punctuation:punctuation_exclamation": (_none, None),
    "count:lowercase_counting": (_kw(N=lambda r: r.randint(1, 20)), None),
    "letters:letter_counting": (_kw(N=lambda r: r.randint(5, 80), relation=_relation), None),
    "letters:letter_counting2": (_letter_frequency("eirst", 10), None),
    "count:count_increment_word": (
        _kw(keyword1=_word, keyword2=_word),
        lambda r, k: " ".join(
            [k["keyword1"]] * r.randint(0, 2) + [k["keyword2"]] * r.randint(1, 3) + ["x"]
        ),
    ),
    "keywords:palindrome": (_none, None),
}


def generate(seed: int = SEED, count: int = COUNT) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    ids = sorted(INSTRUCTIONS)
    cases = []
    for i in range(count):
        # Each id leads a case in turn (so every id is covered), joined by 0-2 others.
        lead = ids[i % len(ids)]
        chosen = [lead, *rng.sample([x for x in ids if x != lead], rng.choice([0, 0, 1, 2]))]
        kwargs = [INSTRUCTIONS[x][0](rng) for x in chosen]
        writer = INSTRUCTIONS[lead][1]
        text = (
            writer(rng, kwargs[0])
            if writer is not None and rng.random() < 0.7
            else rng.choice(_POOL)
        )
        metadata: dict[str, Any] = {
            "instruction_id_list": chosen,
            "prompt": _PROMPT,
            "kwargs": kwargs,
        }
        mode = rng.choice([None, None, "binary", "fraction", "fraction"])
        if mode is not None:
            metadata["grading_mode"] = mode
        request: dict[str, Any] = {
            "responses_create_params": {"input": [{"role": "user", "content": _PROMPT}]},
            "id": i,
        }
        if rng.random() < 0.5:
            request["verifier_metadata"] = metadata
        else:  # the legacy layout: verifier fields at the top level
            request.update(metadata)
        request["response"] = response([message(text)])
        cases.append(
            {
                "category": f"{lead}/{mode or 'default'}/{len(chosen)}",
                "request": request,
                "reference": {"server": "instruction_following", "request": request},
            }
        )
    return cases
