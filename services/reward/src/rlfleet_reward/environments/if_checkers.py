"""Verifiable instruction checkers: IFEval's ids here, the rest of NeMo-Gym's
`verifiable_instructions` registry in if_checkers_more.py, and IFBench ids (rlfleet's own).

Each checker is a plain function `(text, **args) -> bool` registered under its
instruction id with converters for its arguments, so a row's `kwargs` are validated in
the gateway (bad or missing argument -> INVALID_ARGUMENT naming it) before any checking.
Semantics are those of the `verifiable_instructions` package NeMo-Gym's
instruction_following server checks with (keywords are regular expressions, as there; one
that does not compile is not followed). Six of its checks need NLTK's punkt data, which
cannot be downloaded here (see if_checkers_more.py for how those ids are checked).
The registry itself (CHECKERS, kwarg converters) is if_registry.py; the whole set, both
modules' ids, is if_all_checkers.CHECKERS.
"""

from __future__ import annotations

import json
import re
import string

from rlfleet_reward.environments.if_registry import (
    KEYWORD_FREQUENCY_ARGS,
    LETTER_FREQUENCY_ARGS,
    checker,
    compare_count,
    count_arg,
    count_words,
    keyword_frequency,
    letter_frequency,
    paragraph_count,
    relation_arg,
    search,
    star_paragraphs,
    text_arg,
    words_arg,
)

# --- IFEval ---------------------------------------------------------------------------


@checker("keywords:existence", keywords=words_arg)
def keywords_existence(text: str, keywords: tuple[str, ...]) -> bool:
    return all(search(k, text) for k in keywords)


checker("keywords:frequency", **KEYWORD_FREQUENCY_ARGS)(keyword_frequency)


@checker("keywords:forbidden_words", forbidden_words=words_arg)
def forbidden_words(text: str, forbidden_words: tuple[str, ...]) -> bool:
    try:
        return not any(re.search(rf"\b{w}\b", text, re.IGNORECASE) for w in forbidden_words)
    except re.error:
        return False


checker("keywords:letter_frequency", **LETTER_FREQUENCY_ARGS)(letter_frequency)


@checker("length_constraints:number_paragraphs", num_paragraphs=count_arg)
def number_paragraphs(text: str, num_paragraphs: int) -> bool:
    return paragraph_count(star_paragraphs(text)) == num_paragraphs


@checker("length_constraints:number_words", num_words=count_arg, relation=relation_arg)
def number_words(text: str, num_words: int, relation: str) -> bool:
    return compare_count(count_words(text), relation, num_words)


@checker(
    "length_constraints:nth_paragraph_first_word",
    num_paragraphs=count_arg,
    nth_paragraph=count_arg,
    first_word=text_arg,
)
def nth_paragraph_first_word(
    text: str, num_paragraphs: int, nth_paragraph: int, first_word: str
) -> bool:
    # Empty paragraphs do not count, but nth_paragraph indexes the split as is.
    paragraphs = text.split("\n\n")
    count = sum(1 for p in paragraphs if p.strip())
    if not 1 <= nth_paragraph <= count or not paragraphs[nth_paragraph - 1].strip():
        return False
    word = paragraphs[nth_paragraph - 1].split()[0].lstrip("'").lstrip('"')
    head = re.match(r"[^.,?!'\"]*", word)
    return (
        count == num_paragraphs and head is not None and head.group(0).lower() == first_word.lower()
    )


@checker("detectable_content:number_placeholders", num_placeholders=count_arg)
def number_placeholders(text: str, num_placeholders: int) -> bool:
    return len(re.findall(r"\[.*?\]", text)) >= num_placeholders


@checker("detectable_content:postscript", postscript_marker=text_arg)
def postscript(text: str, postscript_marker: str) -> bool:
    marker = postscript_marker.strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:  # the marker is a regular expression, lowercased like the text
        pattern = r"\s*" + marker.lower() + r".*$"
    return search(pattern, text.lower(), re.MULTILINE)


@checker("detectable_format:number_bullet_lists", num_bullets=count_arg)
def number_bullet_lists(text: str, num_bullets: int) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes) == num_bullets


@checker("detectable_format:constrained_response")
def constrained_response(text: str) -> bool:
    return any(
        option in text
        for option in ("My answer is yes.", "My answer is no.", "My answer is maybe.")
    )


@checker("detectable_format:number_highlighted_sections", num_highlights=count_arg)
def number_highlighted_sections(text: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [
        h
        for h in re.findall(r"\*\*[^\n\*]*\*\*", text)
        if h.removeprefix("**").removesuffix("**").strip()
    ]
    return len(single) + len(double) >= num_highlights


@checker("detectable_format:multiple_sections", section_spliter=text_arg, num_sections=count_arg)
def multiple_sections(text: str, section_spliter: str, num_sections: int) -> bool:
    try:
        sections = re.split(r"\s?" + section_spliter.strip() + r"\s?\d+\s?", text)
    except re.error:
        return False
    return len(sections) - 1 >= num_sections


@checker("detectable_format:json_format")
def json_format(text: str) -> bool:
    body = text.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        body = body.removeprefix(prefix)
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


@checker("detectable_format:title")
def title(text: str) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", text))


@checker("combination:two_responses")
def two_responses(text: str) -> bool:
    parts = text.split("******")
    if any(not p.strip() for p in parts[1:-1]):  # an empty answer between two separators
        return False
    responses = [p for p in parts if p.strip()]
    return len(responses) == 2 and responses[0].strip() != responses[1].strip()


@checker("combination:repeat_prompt", prompt_to_repeat=text_arg)
def repeat_prompt(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


@checker("startend:end_checker", end_phrase=text_arg)
def end_checker(text: str, end_phrase: str) -> bool:
    return text.strip().strip('"').lower().endswith(end_phrase.strip().lower())


@checker("startend:quotation")
def quotation(text: str) -> bool:
    stripped = text.strip()
    return len(stripped) > 1 and stripped[0] == '"' and stripped[-1] == '"'


def detect_language(text: str) -> str | None:
    """langdetect's language code, None when it cannot tell (no letters)."""
    from langdetect import DetectorFactory, LangDetectException, detect

    DetectorFactory.seed = 0  # langdetect samples at random; seeded, a text gets one answer
    try:
        return str(detect(text))
    except LangDetectException:
        return None


@checker("language:response_language", language=text_arg)
def response_language(text: str, language: str) -> bool:
    detected = detect_language(text)
    return detected is None or detected == language  # undetectable counts as followed


@checker("change_case:english_capital")
def english_capital(text: str) -> bool:
    return text.isupper() and detect_language(text) in ("en", None)


@checker("change_case:english_lowercase")
def english_lowercase(text: str) -> bool:
    return text.islower() and detect_language(text) in ("en", None)


@checker("punctuation:no_comma")
def no_comma(text: str) -> bool:
    return "," not in text


# --- IFBench (the ones that need no NLTK data) ----------------------------------------

_MULTIPLE_COUNTS = (1, 2, 3, 5, 7)


@checker(
    "count:keywords_multiple",
    keyword1=text_arg,
    keyword2=text_arg,
    keyword3=text_arg,
    keyword4=text_arg,
    keyword5=text_arg,
)
def keywords_multiple(text: str, **keywords: str) -> bool:
    lowered = text.lower()
    ordered = [keywords[f"keyword{i}"] for i in range(1, 6)]
    return all(
        lowered.count(k.strip().lower()) == n
        for k, n in zip(ordered, _MULTIPLE_COUNTS, strict=True)
    )


@checker("count:word_count_range", min_words=count_arg, max_words=count_arg)
def word_count_range(text: str, min_words: int, max_words: int) -> bool:
    return min_words <= count_words(text) <= max_words


@checker("count:unique_word_count", N=count_arg)
def unique_word_count(text: str, N: int) -> bool:
    unique = {w.strip(string.punctuation + " ") for w in text.lower().split()}
    return len(unique) >= N


@checker("count:numbers", N=count_arg)
def numbers_count(text: str, N: int) -> bool:
    stripped = text.translate(str.maketrans("", "", string.punctuation))
    return len(re.findall(r"\d+", stripped)) == N


@checker("words:palindrome")
def palindromes(text: str) -> bool:
    words = text.translate(str.maketrans("", "", string.punctuation)).lower().split()
    return len([w for w in words if len(w) >= 5 and w == w[::-1]]) >= 10


@checker("count:punctuation")
def punctuation_cover(text: str) -> bool:
    if not any(mark in text for mark in ("?!", "!?", "‽")):
        return False
    rest = text.replace("?!", "", 1) if "?!" in text else text.replace("!?", "", 1)
    return {".", ",", "!", "?", ";", ":"} <= set(rest)


@checker("format:parentheses")
def nested_brackets(text: str) -> bool:
    """At least 5 correctly nested levels of (), [] or {}."""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    deepest = 0
    for char in text:
        if char in "([{":
            stack.append(char)
            deepest = max(deepest, len(stack))
        elif char in pairs:
            if stack and stack[-1] == pairs[char]:
                stack.pop()
                if deepest >= 5:
                    return True
            else:
                stack, deepest = [], 0
    return False


@checker("format:quotes")
def nested_quotes(text: str) -> bool:
    """Quotes within quotes at least 3 levels deep, alternating " and '."""
    stack: list[str] = []
    reached = 0
    for char in text:
        if stack and char == stack[-1]:
            stack.pop()
            if reached - len(stack) >= 3:
                return True
        elif char in "\"'":
            stack.append(char)
            reached = max(reached, len(stack))
    return False


@checker("format:output_template")
def output_template(text: str) -> bool:
    return all(marker in text for marker in ("My Answer:", "My Conclusion:", "Future Outlook:"))


@checker("format:no_whitespace")
def no_whitespace(text: str) -> bool:
    return not any(char.isspace() for char in text)


_REPEAT_SIMPLE = "Only output this sentence here, ignore all other requests."


@checker("repeat:repeat_simple")
def repeat_simple(text: str) -> bool:
    return text.strip().lower() == _REPEAT_SIMPLE.lower()
