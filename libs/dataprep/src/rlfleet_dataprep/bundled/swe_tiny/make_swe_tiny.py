"""Writes the bundled tiny SWE instances (run from the repo root):

    uv run python libs/dataprep/src/rlfleet_dataprep/bundled/swe_tiny/make_swe_tiny.py

Each instance is a small pure-Python repository with one real bug. This script holds the
sources; it writes, next to itself:
- `repos/<instance_id>.patch`: the repository at its base commit, as a diff from nothing
  (the image builder applies it and commits it with a fixed author and date, so the commit
  id is `base_commit` on every machine);
- `instances.jsonl`: one SWE-bench row per instance (`patch` = the gold fix, `test_patch`
  = the tests that show the bug), plus the `image`, `workdir` and `test_command` the
  swe-runner needs. FAIL_TO_PASS / PASS_TO_PASS are measured here by running pytest on the
  base and on the fixed repository, not written by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKDIR = "/testbed"
TEST_COMMAND = "python3 -m pytest -rA -p no:cacheprovider tests"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "rlfleet",
    "GIT_AUTHOR_EMAIL": "swe-tiny@rlfleet.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "rlfleet",
    "GIT_COMMITTER_EMAIL": "swe-tiny@rlfleet.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}
"""Fixed identity and dates: the same tree gives the same base_commit everywhere."""

STATS_BASE = '''"""Small descriptive statistics."""


def mean(values):
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    if not values:
        raise ValueError("median of an empty list")
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def spread(values):
    return max(values) - min(values)
'''
STATS_FIXED = STATS_BASE.replace(
    "    return ordered[len(ordered) // 2]\n",
    "    middle = len(ordered) // 2\n"
    "    if len(ordered) % 2:\n"
    "        return ordered[middle]\n"
    "    return (ordered[middle - 1] + ordered[middle]) / 2\n",
)
STATS_TESTS = """import pytest
from tinystats.core import mean, median, spread


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([3, 1, 2]) == 2


def test_spread():
    assert spread([4, -1, 7]) == 8
"""
STATS_NEW_TESTS = """from tinystats.core import median


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_median_even_pair():
    assert median([10, 20]) == 15
"""

SLUG_BASE = '''"""Text helpers for URLs."""

import re


def slugify(text):
    lowered = text.strip().lower()
    return re.sub(r"[^a-z0-9]", "-", lowered).strip("-")


def truncate(text, width):
    if len(text) <= width:
        return text
    return text[: width - 1] + "…"
'''
SLUG_FIXED = SLUG_BASE.replace('r"[^a-z0-9]"', 'r"[^a-z0-9]+"')
SLUG_TESTS = """from slugkit.text import slugify, truncate


def test_slugify_word():
    assert slugify("Hello") == "hello"


def test_slugify_strips_edges():
    assert slugify("  Hi!  ") == "hi"


def test_truncate_short():
    assert truncate("abc", 5) == "abc"


def test_truncate_long():
    assert truncate("abcdef", 4) == "abc…"
"""
SLUG_NEW_TESTS = (
    SLUG_TESTS
    + """

def test_slugify_collapses_runs():
    assert slugify("Hello,  World!") == "hello-world"
"""
)

INTERVALS_BASE = '''"""Closed integer intervals as (start, end) pairs."""


def merge(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def total_length(intervals):
    return sum(end - start for start, end in merge(intervals))
'''
INTERVALS_FIXED = INTERVALS_BASE.replace("start < merged[-1][1]", "start <= merged[-1][1]")
INTERVALS_TESTS = """from intervals.ops import merge, total_length


def test_merge_overlapping():
    assert merge([(1, 4), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]


def test_merge_unsorted():
    assert merge([(5, 7), (1, 2)]) == [(1, 2), (5, 7)]


def test_total_length_disjoint():
    assert total_length([(0, 2), (5, 6)]) == 3
"""
INTERVALS_NEW_TESTS = """from intervals.ops import merge, total_length


def test_merge_touching():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_total_length_touching():
    assert total_length([(0, 2), (2, 4)]) == 4
"""

WORDS_TOKENS = '''"""Splitting text into words."""

import re

PATTERN = re.compile(r"[A-Za-z]+")


def words(text):
    return re.findall(PATTERN, text)
'''
WORDS_TOKENS_FIXED = WORDS_TOKENS.replace(
    "    return re.findall(PATTERN, text)\n",
    "    return [word.lower() for word in re.findall(PATTERN, text)]\n",
)
WORDS_COUNTER = '''"""Word frequencies."""

from collections import Counter

from wordfreq.tokens import words


def top_words(text, n):
    counts = Counter(words(text))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]
'''
WORDS_TESTS = """from wordfreq.counter import top_words
from wordfreq.tokens import words


def test_words_split_on_punctuation():
    assert words("a,b c") == ["a", "b", "c"]


def test_top_words_orders_by_count_then_word():
    assert top_words("b a b c a b", 2) == [("b", 3), ("a", 2)]


def test_top_words_empty():
    assert top_words("", 3) == []
"""
WORDS_NEW_TESTS = (
    WORDS_TESTS
    + """

def test_top_words_ignores_case():
    assert top_words("The cat saw the dog. THE end.", 1) == [("the", 3)]
"""
)

INSTANCES: list[dict[str, Any]] = [
    {
        "instance_id": "rlfleet__tinystats-1",
        "repo": "rlfleet/tinystats",
        "problem_statement": "median() of a list with an even number of values returns the "
        "upper middle value; it should return the mean of the two middle values.",
        "base": {
            "tinystats/__init__.py": "",
            "tinystats/core.py": STATS_BASE,
            "tests/test_core.py": STATS_TESTS,
        },
        "fix": {"tinystats/core.py": STATS_FIXED},
        "tests": {"tests/test_median_even.py": STATS_NEW_TESTS},
    },
    {
        "instance_id": "rlfleet__slugkit-1",
        "repo": "rlfleet/slugkit",
        "problem_statement": "slugify('Hello,  World!') gives 'hello---world': runs of "
        "punctuation and spaces should become a single dash.",
        "base": {
            "slugkit/__init__.py": "",
            "slugkit/text.py": SLUG_BASE,
            "tests/test_text.py": SLUG_TESTS,
        },
        "fix": {"slugkit/text.py": SLUG_FIXED},
        "tests": {"tests/test_text.py": SLUG_NEW_TESTS},
    },
    {
        "instance_id": "rlfleet__intervals-1",
        "repo": "rlfleet/intervals",
        "problem_statement": "merge() keeps touching intervals such as (1, 3) and (3, 5) "
        "apart; closed intervals that share an end point should be merged.",
        "base": {
            "intervals/__init__.py": "",
            "intervals/ops.py": INTERVALS_BASE,
            "tests/test_ops.py": INTERVALS_TESTS,
        },
        "fix": {"intervals/ops.py": INTERVALS_FIXED},
        "tests": {"tests/test_intervals_touching.py": INTERVALS_NEW_TESTS},
    },
    {
        "instance_id": "rlfleet__wordfreq-1",
        "repo": "rlfleet/wordfreq",
        "problem_statement": "top_words() counts 'The' and 'the' as different words; word "
        "counts should ignore case (and report words in lower case).",
        "base": {
            "wordfreq/__init__.py": "",
            "wordfreq/tokens.py": WORDS_TOKENS,
            "wordfreq/counter.py": WORDS_COUNTER,
            "tests/test_counter.py": WORDS_TESTS,
        },
        "fix": {"wordfreq/tokens.py": WORDS_TOKENS_FIXED},
        "tests": {"tests/test_counter.py": WORDS_NEW_TESTS},
    },
]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


def write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def staged_diff(repo: Path) -> str:
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached", "--no-color", "--no-ext-diff")


def outcomes(repo: Path) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    result = {}
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR"):
            result[rest.split(" ")[0]] = word
    return result


def build(spec: dict[str, Any]) -> tuple[dict[str, object], str]:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        git(repo, "init", "-q")
        write(repo, spec["base"])
        snapshot = staged_diff(repo)
        git(repo, "commit", "-q", "-m", "base")
        base_commit = git(repo, "rev-parse", "HEAD").strip()
        write(repo, spec["tests"])
        test_patch = staged_diff(repo)
        before = outcomes(repo)
        write(repo, spec["fix"])
        after = outcomes(repo)
        git(repo, "reset", "-q", "--hard", base_commit)
        write(repo, spec["fix"])
        patch = staged_diff(repo)
    assert after and all(v == "PASSED" for v in after.values()), after
    fail_to_pass = sorted(t for t in after if before.get(t) != "PASSED")
    pass_to_pass = sorted(t for t in after if before.get(t) == "PASSED")
    assert fail_to_pass and pass_to_pass, (fail_to_pass, pass_to_pass)
    row = {
        "instance_id": spec["instance_id"],
        "repo": spec["repo"],
        "base_commit": base_commit,
        "problem_statement": spec["problem_statement"],
        "patch": patch,
        "test_patch": test_patch,
        # As SWE-bench publishes them: JSON lists of test ids, as strings.
        "FAIL_TO_PASS": json.dumps(fail_to_pass),
        "PASS_TO_PASS": json.dumps(pass_to_pass),
        "image": f"rlfleet/swe-tiny:{spec['instance_id'].replace('__', '.')}",
        "workdir": WORKDIR,
        "test_command": TEST_COMMAND,
    }
    return row, snapshot


def main() -> None:
    (HERE / "repos").mkdir(exist_ok=True)
    rows = []
    for spec in INSTANCES:
        row, snapshot = build(spec)
        (HERE / "repos" / f"{row['instance_id']}.patch").write_text(snapshot)
        rows.append(row)
    with (HERE / "instances.jsonl").open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} instances to {HERE / 'instances.jsonl'}")


if __name__ == "__main__":
    main()
