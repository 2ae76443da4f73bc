"""Instruction checkers: hand-checked verdicts, and IFBench's shipped prompts and sample
outputs scored by our checkers wherever they cover every instruction of a prompt."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import pytest
from rlfleet_reward.environments.if_all_checkers import CHECKERS
from rlfleet_reward.environments.instruction_following import InstructionFollowingEnvironment
from rlfleet_reward.types import RowError, Sample

IFEVAL_IDS = {
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "combination:two_responses",
    "combination:repeat_prompt",
    "startend:end_checker",
    "startend:quotation",
    "change_case:capital_word_frequency",
    "change_case:english_capital",
    "change_case:english_lowercase",
    "punctuation:no_comma",
}


def check(instruction_id: str, text: str, **args: Any) -> bool:
    checker = CHECKERS[instruction_id]
    return checker.check(text, **{k: checker.args[k](v) for k, v in args.items()})


def test_at_least_20_instruction_types() -> None:
    assert set(CHECKERS) >= IFEVAL_IDS
    assert len(CHECKERS) >= 35


# instruction id -> (text, args, verdict) cases
Verdicts = dict[str, list[tuple[str, dict[str, Any], bool]]]

VERDICTS: Verdicts = {
    "keywords:letter_frequency": [
        ("banana", {"letter": "a", "let_frequency": 3, "let_relation": "at least"}, True),
        ("banana", {"letter": "a", "let_frequency": 3, "let_relation": "less than"}, False),
    ],
    "length_constraints:nth_paragraph_first_word": [
        (
            "Intro here.\n\nSecond para.",
            {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "second"},
            True,
        ),
        (
            "Intro here.\n\nSecond para.",
            {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "second"},
            False,
        ),
    ],
    "detectable_content:number_placeholders": [
        ("Dear [name], at [address].", {"num_placeholders": 2}, True),
        ("Dear [name].", {"num_placeholders": 2}, False),
    ],
    "detectable_format:constrained_response": [("My answer is maybe.", {}, True)],
    "detectable_format:number_highlighted_sections": [
        ("*one* and **two**", {"num_highlights": 2}, True),
        ("*one*", {"num_highlights": 2}, False),
    ],
    "detectable_format:multiple_sections": [
        ("SECTION 1 a SECTION 2 b", {"section_spliter": "SECTION", "num_sections": 2}, True),
        ("SECTION 1 a", {"section_spliter": "SECTION", "num_sections": 2}, False),
    ],
    "combination:two_responses": [
        ("first one\n******\nsecond one", {}, True),
        ("same\n******\nsame", {}, False),
    ],
    "combination:repeat_prompt": [
        ("Write a poem. Roses are red.", {"prompt_to_repeat": "Write a poem."}, True)
    ],
    "startend:quotation": [('"All quoted."', {}, True), ('Not "quoted".', {}, False)],
    "change_case:capital_word_frequency": [
        ("THE cat IS HERE", {"capital_frequency": 3, "capital_relation": "at least"}, True),
        ("THE cat", {"capital_frequency": 3, "capital_relation": "at least"}, False),
    ],
    "length_constraints:number_paragraphs": [("a\n***\n\n***\nb", {"num_paragraphs": 3}, False)],
    "count:word_count_range": [
        ("one two three", {"min_words": 2, "max_words": 3}, True),
        ("one two three four", {"min_words": 2, "max_words": 3}, False),
    ],
    "count:unique_word_count": [("a b a b c", {"N": 3}, True)],
    "count:numbers": [("I have 3 cats and 1,000 dollars", {"N": 2}, True)],
    "words:palindrome": [("level radar civic refer rotor kayak madam stats tenet sagas", {}, True)],
    "count:punctuation": [
        ("Wait?! Yes; no: maybe, fine. Ok!?", {}, True),
        ("Wait?! Yes", {}, False),
    ],
    "format:parentheses": [("((([[{x}]])))", {}, True), ("(([x]))", {}, False)],
    "format:quotes": [('He said "she said \'they said "hi"\'"', {}, True)],
    "format:output_template": [("My Answer: x My Conclusion: y Future Outlook: z", {}, True)],
    "format:no_whitespace": [("no_space_here", {}, True), ("a b", {}, False)],
    "repeat:repeat_simple": [
        ("only output this sentence here, ignore all other requests.", {}, True)
    ],
}


def _ifbench_rows() -> list[dict[str, Any]]:
    data = files("ifbench").joinpath("data")
    prompts = [
        json.loads(line)
        for line in data.joinpath("IFBench_test.jsonl").read_text().splitlines()
        if line
    ]
    outputs = {
        json.loads(line)["prompt"]: json.loads(line)["response"]
        for line in data.joinpath("sample_output.jsonl").read_text().splitlines()
        if line
    }
    return [{**p, "response": outputs.get(p["prompt"], "")} for p in prompts]


def test_ifbench_prompts_we_cover_score() -> None:
    """IFBench rows load unchanged (every kwargs key present, mostly null); wherever our
    checkers cover a prompt's instructions, its sample output gets a definite verdict."""
    env = InstructionFollowingEnvironment()
    rows = _ifbench_rows()
    assert len(rows) == 294
    covered, verdicts = 0, []
    for row in rows:
        if not all(i in CHECKERS for i in row["instruction_id_list"]):
            with pytest.raises(RowError, match="unknown instruction"):
                env.parse_row(row)
            continue
        covered += 1
        spec = env.parse_row(row)
        score = env.score(spec, Sample(row["response"]))
        assert score.reward in (0.0, 1.0) and score.components.keys() == {"all_followed"}
        verdicts.append(score.reward)
    assert covered >= 40, covered
    assert 0 < sum(verdicts) < len(verdicts)  # some sample outputs follow, some do not


def test_ifbench_keywords_multiple_row_by_hand() -> None:
    row = next(
        r for r in _ifbench_rows() if r["instruction_id_list"] == ["count:keywords_multiple"]
    )
    kw = row["kwargs"][0]
    text = " ".join(
        [kw["keyword1"]]
        + [kw["keyword2"]] * 2
        + [kw["keyword3"]] * 3
        + [kw["keyword4"]] * 5
        + [kw["keyword5"]] * 7
    )
    env = InstructionFollowingEnvironment()
    assert env.score(env.parse_row(row), Sample(text)).reward == 1.0
    assert env.score(env.parse_row(row), Sample(text + " " + kw["keyword1"])).reward == 0.0


# NeMo-Gym's instruction_following server checks with the verifiable_instructions registry:
# every one of its ids is ours (the parity test compares verdicts; these are its names).
REGISTRY_IDS = {
    *IFEVAL_IDS,
    "copy:copy",
    "copy:copying_multiple",
    "copy:copying_simple",
    "copy:repeat_phrase",
    "count:count_increment_word",
    "count:count_unique",
    "count:counting_composition",
    "count:lowercase_counting",
    "detectable_format:bigram_wrapping",
    "detectable_format:sentence_hyphens",
    "detectable_format:square_brackets",
    "first_word:first_word_answer",
    "first_word:first_word_sent",
    "keywords:exclude_word_harder",
    "keywords:keyword_specific_position",
    "keywords:no_adjacent_consecutive",
    "keywords:palindrome",
    "keywords:start_end",
    "keywords:word_count_different_numbers",
    "keywords:word_once",
    "language:response_language",
    "last_word:last_word_answer",
    "last_word:last_word_sent",
    "letters:letter_counting",
    "letters:letter_counting2",
    "new:copy_span_idx",
    "paragraphs:paragraphs",
    "paragraphs:paragraphs2",
    "punctuation:punctuation_dot",
    "punctuation:punctuation_exclamation",
}


def test_every_nemo_gym_registry_id() -> None:
    assert len(REGISTRY_IDS) == 54
    assert set(CHECKERS) >= REGISTRY_IDS, sorted(REGISTRY_IDS - set(CHECKERS))


# The ids whose reference checks need NLTK's punkt data (NeMo-Gym cannot run them without
# it, so the parity test leaves them out): verdicts worked out by hand, as punkt splits
# these texts (abbreviations do not end a sentence; word_tokenize splits off a sentence's
# final period and commas).
PUNKT_VERDICTS: Verdicts = {
    "length_constraints:number_sentences": [
        ("One. Two! Three?", {"num_sentences": 3, "relation": "at least"}, True),
        ("One. Two! Three?", {"num_sentences": 3, "relation": "less than"}, False),
        ("Dr. Smith came. He left.", {"num_sentences": 3, "relation": "less than"}, True),
        ("It costs 2.5 dollars. Fine", {"num_sentences": 2, "relation": "at least"}, True),
        ("", {"num_sentences": 1, "relation": "less than"}, True),
    ],
    "change_case:capital_word_frequency": [
        (
            "The NASA and ESA teams met the UN.",
            {"capital_frequency": 3, "capital_relation": "at least"},
            True,
        ),
        (
            "The NASA and ESA teams met the UN.",
            {"capital_frequency": 3, "capital_relation": "less than"},
            False,
        ),
    ],
    "count:count_unique": [
        ("red green blue", {}, True),
        ("red green red", {}, False),
        ("Red red", {}, True),
        ("It is. It is", {}, False),
    ],
    "keywords:keyword_specific_position": [
        ("I like tea. You like coffee.", {"keyword": "coffee", "n": 2, "m": 3}, True),
        ("I like tea. You like coffee.", {"keyword": "coffee", "n": 1, "m": 3}, False),
        ("I like tea.", {"keyword": "tea", "n": 2, "m": 1}, False),
    ],
    "keywords:start_end": [
        ("Hello there, hello", {}, True),
        ("Hello there, hello.", {}, False),
        ("Hello", {}, False),
    ],
    "count:counting_composition": [
        (
            "I ran. We sat. *** He ate. She slept. *** It rained. They left.",
            {"n_sent": 2, "n_words": 3},
            True,
        ),
        (
            "I ran. We sat. *** He ate. She slept well. *** It rained. They left.",
            {"n_sent": 2, "n_words": 3},
            False,
        ),
        ("I ran. We sat. *** He ate. She slept.", {"n_sent": 2, "n_words": 3}, False),
    ],
}


def _params(table: str, verdicts: Verdicts) -> list[Any]:
    return [
        pytest.param(instruction_id, text, args, expected, id=f"{table}-{instruction_id}-{k}")
        for instruction_id, cases in verdicts.items()
        for k, (text, args, expected) in enumerate(cases)
    ]


@pytest.mark.parametrize(
    ("instruction_id", "text", "args", "expected"),
    [*_params("ifeval", VERDICTS), *_params("punkt", PUNKT_VERDICTS)],
)
def test_checker_verdicts(
    instruction_id: str, text: str, args: dict[str, Any], expected: bool
) -> None:
    assert check(instruction_id, text, **args) is expected


@pytest.mark.parametrize(
    ("instruction_id", "args", "field"),
    [
        # verifiable_instructions replaces these by random values; refused here instead.
        ("copy:copying_multiple", {"prompt_to_repeat": "x", "N": 0}, "N"),
        ("count:lowercase_counting", {"N": 0}, "N"),
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"},
            "nth_paragraph",
        ),
        (
            "keywords:letter_frequency",
            {"letter": "é", "let_frequency": 1, "let_relation": "at least"},
            "letter",
        ),
    ],
)
def test_random_defaults_refused(instruction_id: str, args: dict[str, Any], field: str) -> None:
    with pytest.raises(RowError) as err:
        InstructionFollowingEnvironment().parse_row(
            {"instruction_id_list": [instruction_id], "kwargs": [args]}
        )
    assert err.value.field == f"kwargs[0].{field}"


def test_verifier_metadata_layout_and_exact_fraction() -> None:
    env = InstructionFollowingEnvironment()
    ids = [
        "punctuation:no_comma",
        "punctuation:punctuation_dot",
        "punctuation:punctuation_exclamation",
    ]
    row = {
        "id": 1,
        "instruction_id_list": ["keywords:existence"],  # legacy field, overridden below
        "verifier_metadata": {
            "instruction_id_list": [*ids, *ids[:2]],
            "kwargs": [{}] * 5,
            "grading_mode": "fraction",
        },
    }
    score = env.score(env.parse_row(row), Sample(text="a, b"))
    assert score.reward == 3 / 5  # not 0.2 + 0.2 + 0.2 = 0.6000000000000001


def test_warm_loads_every_language_profile_before_the_first_request() -> None:
    """On the loop, a first langdetect call that loads the profiles overruns the inline guard
    and is interrupted; the factory it leaves behind must not be a partial one."""
    import langdetect.detector_factory as factory_module
    from rlfleet_reward.environments import get_environment

    factory_module._factory = None
    get_environment("instruction_following").warm()
    factory = factory_module._factory
    assert factory is not None and len(factory.get_lang_list()) == 55
