"""The instruction ids of NeMo-Gym's `verifiable_instructions` registry beyond IFEval's
(copying, first/last words, paragraphs, letter and word counts, wrapping), with that
package's semantics (keywords are regular expressions; a kwarg it would replace by a
random value when 0 or missing is refused here instead).

Six ids need NLTK's punkt data, which cannot be downloaded here (nor does a pip package
ship it): `length_constraints:number_sentences` counts punkt sentences, and
`change_case:capital_word_frequency`, `count:counting_composition`, `count:count_unique`,
`keywords:keyword_specific_position` and `keywords:start_end` tokenize with
`word_tokenize`, whose sentence step is punkt. Here sentences come from
`split_sentences_vi` (the package's own regex splitter, which knows the common
abbreviations) and words from NLTK's data-free Treebank tokenizer, sentence by sentence.
These ids are checked by hand-worked tables, not against NeMo-Gym.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from rlfleet_reward.environments.if_registry import (
    KEYWORD_FREQUENCY_ARGS,
    LETTER_FREQUENCY_ARGS,
    checker,
    compare_count,
    count_arg,
    count_matches,
    keyword_frequency,
    letter_frequency,
    paragraph_count,
    relation_arg,
    star_paragraphs,
    text_arg,
)


def positive_arg(value: Any) -> int:
    number = count_arg(value)
    if number == 0:
        raise ValueError("expected a positive integer, got 0")
    return number


_LETTER = "([A-Za-z])"
_STARTERS = (
    r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s"
    r"|However\s|That\s|This\s|Wherever)"
)
# Dots that do not end a sentence become <prd>, sentence ends get <stop>, in this order.
_SENTENCE_RULES: tuple[tuple[str, Any], ...] = (
    (r"(Mr|St|Mrs|Ms|Dr)[.]", r"\1<prd>"),
    (r"[.](com|net|org|io|gov|edu|me)", r"<prd>\1"),
    (r"([0-9])[.]([0-9])", r"\1<prd>\2"),
    (r"\.{2,}", lambda m: "<prd>" * len(m.group(0)) + "<stop>"),
)
_SENTENCE_RULES_2: tuple[tuple[str, str], ...] = (
    (r"\s" + _LETTER + "[.] ", r" \1<prd> "),
    (r"([A-Z][.][A-Z][.](?:[A-Z][.])?) " + _STARTERS, r"\1<stop> \2"),
    (_LETTER + "[.]" + _LETTER + "[.]" + _LETTER + "[.]", r"\1<prd>\2<prd>\3<prd>"),
    (_LETTER + "[.]" + _LETTER + "[.]", r"\1<prd>\2<prd>"),
    (r" (Inc|Ltd|Jr|Sr|Co)[.] " + _STARTERS, r" \1<stop> \2"),
    (r" (Inc|Ltd|Jr|Sr|Co)[.]", r" \1<prd>"),
    (" " + _LETTER + "[.]", r" \1<prd>"),
)


def split_sentences_vi(text: str) -> list[str]:
    """Sentences as verifiable_instructions' regex splitter finds them (abbreviations,
    initials, decimals and web addresses do not end a sentence)."""
    text = (" " + text + "  ").replace("\n", " ")
    for pattern, replacement in _SENTENCE_RULES:
        text = re.sub(pattern, replacement, text)
    text = text.replace("Ph.D.", "Ph<prd>D<prd>")
    for pattern, replacement in _SENTENCE_RULES_2:
        text = re.sub(pattern, replacement, text)
    # A closing quote goes before the sentence's end mark.
    for before, after in ((".\u201d", "\u201d."), ('."', '".'), ('!"', '"!'), ('?"', '"?')):
        text = text.replace(before, after)
    for mark in ".?!":
        text = text.replace(mark, mark + "<stop>")
    sentences = [s.strip() for s in text.replace("<prd>", ".").split("<stop>")]
    if sentences and not sentences[-1]:
        sentences.pop()
    return sentences


def tokenize_words(text: str) -> list[str]:
    """NLTK's word_tokenize, with split_sentences_vi standing in for punkt."""
    from nltk.tokenize import NLTKWordTokenizer

    tokenizer = NLTKWordTokenizer()
    return [
        token for sentence in split_sentences_vi(text) for token in tokenizer.tokenize(sentence)
    ]


@checker("copy:repeat_phrase", phrase=text_arg, small_n=positive_arg)
def repeat_phrase(text: str, phrase: str, small_n: int) -> bool:
    """small_n copies of `phrase` (from its first to its last word), each with exactly one
    word changed -- as the reference checks it, the last copy decides the 'one'."""
    reference = phrase.strip().split()
    try:
        found = re.findall(rf"{reference[0]} .*? {reference[-1]}", text)
    except re.error:
        return False
    if not found or len(found) != small_n:
        return False
    changed = 0
    for copy in found:
        words = copy.split()
        if len(words) != len(reference):
            return False
        changed = sum(1 for a, b in zip(words, reference, strict=True) if a != b)
        if changed > 1:
            return False
    return changed == 1


@checker("copy:copy", prompt_to_repeat=text_arg)
@checker("copy:copying_simple", prompt_to_repeat=text_arg)
def copy_exactly(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower() == prompt_to_repeat.strip().lower()


@checker("new:copy_span_idx", prompt_to_repeat=text_arg, n_start=positive_arg, n_end=positive_arg)
def copy_span(text: str, prompt_to_repeat: str, n_start: int, n_end: int) -> bool:
    return text.strip().lower() == prompt_to_repeat[n_start:n_end].strip().lower()


@checker("copy:copying_multiple", prompt_to_repeat=text_arg, N=positive_arg)
def copy_many(text: str, prompt_to_repeat: str, N: int) -> bool:
    copies = text.split("******")
    wanted = prompt_to_repeat.strip().lower()
    return len(copies) == N and all(c.strip().lower() == wanted for c in copies)


@checker("detectable_format:sentence_hyphens")
def sentence_hyphens(text: str) -> bool:
    expected = split_sentences_vi(text.replace("-", " "))
    parts = text.split("-")
    return all(p.strip() == p and p == e for p, e in zip(parts, expected, strict=False))


@checker("keywords:no_adjacent_consecutive")
def no_adjacent_consecutive(text: str) -> bool:
    words = text.split()
    for left, right in itertools.pairwise(words):
        a, b = left[0].lower(), right[0].lower()
        if len(a) != 1 or len(b) != 1 or ord(b) - ord(a) == 1:
            return False
    return True


@checker("detectable_format:square_brackets")
def square_brackets(text: str) -> bool:
    return all(w.startswith("[") and w.endswith("]") for w in text.split())


@checker("keywords:word_once", keyword=text_arg)
def word_once(text: str, keyword: str) -> bool:
    return count_matches(keyword.strip(), text) == 1


# IFEval's keywords:frequency under its newer id (if_registry.py).
word_count_different_numbers = checker(
    "keywords:word_count_different_numbers", **KEYWORD_FREQUENCY_ARGS
)(keyword_frequency)


@checker("keywords:exclude_word_harder", keyword=text_arg)
def exclude_word_harder(text: str, keyword: str) -> bool:
    return f" {keyword.strip()} " not in text


@checker("paragraphs:paragraphs")
def two_paragraphs_stars(text: str) -> bool:
    return paragraph_count(star_paragraphs(text)) == 2


@checker("paragraphs:paragraphs2")
def two_paragraphs_blank_line(text: str) -> bool:
    return paragraph_count(text.split("\n\n")) == 2


@checker("first_word:first_word_sent", first_word=text_arg)
def first_word_each_sentence(text: str, first_word: str) -> bool:
    wanted = first_word.strip().lower()
    sentences = split_sentences_vi(text)
    return all(s.strip() and s.split()[0].strip().lower() == wanted for s in sentences)


@checker("first_word:first_word_answer", first_word=text_arg)
def first_word_answer(text: str, first_word: str) -> bool:
    words = text.split()
    return bool(words) and words[0].lower() == first_word.strip().lower()


def _bare_last_word(sentence: str) -> str:
    return re.sub(r"[^\w\s]", "", sentence.split()[-1].strip()).lower()


@checker("last_word:last_word_sent", last_word=text_arg)
def last_word_each_sentence(text: str, last_word: str) -> bool:
    wanted = last_word.strip().lower()
    sentences = split_sentences_vi(text)
    return all(s.strip() and _bare_last_word(s) == wanted for s in sentences)


@checker("last_word:last_word_answer", last_word=text_arg)
def last_word_answer(text: str, last_word: str) -> bool:
    return bool(text.split()) and _bare_last_word(text) == last_word.strip().lower()


@checker("detectable_format:bigram_wrapping")
def bigram_wrapping(text: str) -> bool:
    words = text.split()
    return all(
        words[i].startswith("<<") and words[i + 1].endswith(">>")
        for i in range(0, len(words) - 1, 2)
    )


@checker("punctuation:punctuation_dot")
def no_dot(text: str) -> bool:
    return "." not in text


@checker("punctuation:punctuation_exclamation")
def no_exclamation(text: str) -> bool:
    return "!" not in text


@checker("count:lowercase_counting", N=positive_arg)
def lowercase_counting(text: str, N: int) -> bool:
    return len(re.findall(r"\b[a-z]+\b", text)) <= N


@checker("letters:letter_counting", N=positive_arg, relation=relation_arg)
def letter_counting(text: str, N: int, relation: str) -> bool:
    return compare_count(len(re.findall(r"[a-zA-Z]", text)), relation, N)


# IFEval's keywords:letter_frequency under its newer id (if_registry.py).
letter_counting2 = checker("letters:letter_counting2", **LETTER_FREQUENCY_ARGS)(letter_frequency)


@checker("count:count_increment_word", keyword1=text_arg, keyword2=text_arg)
def count_increment_word(text: str, keyword1: str, keyword2: str) -> bool:
    return count_matches(keyword1.strip(), text) == 1 and count_matches(keyword2.strip(), text) == 2


@checker("keywords:palindrome")
def has_palindrome(text: str) -> bool:
    return any(w == w[::-1] for w in text.split())


@checker("count:counting_composition", n_sent=positive_arg, n_words=positive_arg)
def counting_composition(text: str, n_sent: int, n_words: int) -> bool:
    """3 paragraphs (split by ***) of n_sent sentences of n_words tokens each."""
    paragraphs = star_paragraphs(text)
    if paragraph_count(paragraphs) != 3:
        return False
    for paragraph in paragraphs:  # an empty first or last one has no sentence: not followed
        sentences = split_sentences_vi(paragraph)
        if len(sentences) != n_sent or any(len(tokenize_words(s)) != n_words for s in sentences):
            return False
    return True


@checker("count:count_unique")
def count_unique(text: str) -> bool:
    words = tokenize_words(text)
    return len(words) == len(set(words))


@checker("keywords:keyword_specific_position", keyword=text_arg, n=positive_arg, m=positive_arg)
def keyword_specific_position(text: str, keyword: str, n: int, m: int) -> bool:
    """`keyword` is the m-th token of the n-th sentence."""
    sentences = split_sentences_vi(text)
    if len(sentences) < n:
        return False
    words = tokenize_words(sentences[n - 1])
    return len(words) >= m and words[m - 1] == keyword.strip()


@checker("keywords:start_end")
def start_end(text: str) -> bool:
    words = tokenize_words(text)
    return len(words) >= 2 and words[0].lower() == words[-1].lower()


@checker(
    "change_case:capital_word_frequency", capital_frequency=count_arg, capital_relation=relation_arg
)
def capital_word_frequency(text: str, capital_frequency: int, capital_relation: str) -> bool:
    capitals = [w for w in tokenize_words(text) if w.isupper()]
    return compare_count(len(capitals), capital_relation, capital_frequency)


@checker("length_constraints:number_sentences", num_sentences=count_arg, relation=relation_arg)
def number_sentences(text: str, num_sentences: int, relation: str) -> bool:
    return compare_count(len(split_sentences_vi(text)), relation, num_sentences)
