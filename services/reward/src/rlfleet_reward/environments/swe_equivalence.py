"""Functional equivalence of two SWE agent actions: the rules of the `swe_pivot` env.

An action is one call of the swe-runner's agent tools (`bash` {command}, `view` {path,
optional view_range}, `edit` {path, old_str, new_str}, `submit` {}). Two actions are
equivalent when, run in the same state, they would have the same effect. This is a
comparison, not a string match, but a conservative one: when a rule cannot tell, the
answer is "not equivalent" (a false 0 costs a little signal; a false 1 rewards a wrong
action).

- Tool: the names must be equal (a `bash cat f` is not a `view f`: different tools).
- Paths: relative to the row's `workdir`, normalised (`./a//b.py`, `/testbed/a/b.py` and
  `a/b.py` are one file when workdir is /testbed).
- `bash`: both commands are split as the shell would (shlex, POSIX rules), so quoting and
  whitespace do not count (`grep -n 'def f' x.py` == `grep  -n "def f" x.py`). When a
  command holds expansion characters ($ ` * ? [ { ~), quoting changes its meaning, so the
  quotes are kept and must match. A leading `cd WORKDIR &&` (or `;`) is dropped: every
  call already starts in workdir; a trailing `;` is dropped. For the programs in
  `FLAG_PROGRAMS` (GNU tools that permute options, and pytest), a simple command without
  redirections compares as (program, set of short flags, options with their values,
  positionals in order): `ls -la` == `ls -a -l`, `head -n5 f` == `head -n 5 f`,
  `grep pat -n f` == `grep -n pat f`. A long option without `=` (its value may be the
  next word) or an unknown program keeps the words in order. A command that does not
  split (unbalanced quotes) compares by its whitespace-collapsed text.
- `view`: same path and same range (none == [1, -1]: the whole file).
- `edit`: same path, and applying each edit to the file's content before the action (the
  row's `files[path]`) gives the same text; an edit that does not apply (old_str absent or
  not unique) is not equivalent. An empty `old_str` writes `new_str` as the whole file, so
  a whole-file write that yields the demonstrated result is equivalent too. Without the
  file's content, old_str and new_str must be equal.
- `submit`: any submit equals submit.
- Any other tool: the arguments must be equal as JSON values.
- Arguments a tool does not read (a `timeout` on bash, a `reason` on submit) are ignored.

Sizes are bounded: a command over `MAX_COMMAND_CHARS` is not compared (verdict says so);
files and edits are bounded by the gateway's row and response limits, and each rule is
linear in them.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

MAX_COMMAND_CHARS = 10_000
"""Longer bash commands are not split (shlex is pure Python); such an action scores 0."""

FLAG_PROGRAMS: dict[str, str] = {
    # program -> its short options that take a value (the rest are boolean flags)
    "ls": "IwT",
    "cat": "",
    "wc": "",
    "nl": "bdfhilnsvw",
    "head": "nc",
    "tail": "nc",
    "grep": "efmABCDd",
    "egrep": "efmABCDd",
    "rg": "eftgAMBCjm",
    "pytest": "kmpcorWn",
    "python -m pytest": "kmpcorWn",
    "python3 -m pytest": "kmpcorWn",
}
"""Programs whose short options may be merged and reordered (GNU getopt permutes them;
pytest's are independent): the value-taking letters are listed so that `-n 5` stays a
pair. Options of other programs keep their order."""

_EXPANSION = re.compile(r"[$`*?\[{~]")
_OPERATORS = frozenset({"&&", "||", ";", "|", "&", ";;", "|&"})
_REDIRECTS = re.compile(r"^[<>]|^&>|^[<>]&")


@dataclass(frozen=True)
class Verdict:
    equivalent: bool
    reason: str


def normalize_path(path: str, workdir: str) -> str:
    """The file a path names, relative to workdir ('.' for workdir itself)."""
    full = posixpath.normpath(posixpath.join(workdir, path.strip()))
    root = posixpath.normpath(workdir)
    if full == root:
        return "."
    if full.startswith(root.rstrip("/") + "/"):
        return full[len(root.rstrip("/")) + 1 :]
    return full


def _words(command: str) -> list[str] | None:
    """Shell words and control operators, or None when the command does not split."""
    posix = not _EXPANSION.search(command)
    try:
        lexer = shlex.shlex(command, posix=posix, punctuation_chars=True)
        lexer.whitespace_split = True
        return list(lexer)
    except ValueError:
        return None


def _segments(words: list[str]) -> list[list[str]]:
    """Words grouped into simple commands, each operator its own one-word segment."""
    segments: list[list[str]] = [[]]
    for word in words:
        if word in _OPERATORS:
            segments += [[word], []]
        else:
            segments[-1].append(word)
    return [s for s in segments if s]


def _simple_form(words: list[str]) -> tuple[Any, ...]:
    """A simple command's normal form (see the module docstring); words as-is if unsafe."""
    verbatim = ("verbatim", *words)
    if any(_REDIRECTS.match(w) for w in words):
        return verbatim
    program, rest = words[0], words[1:]
    if len(words) >= 3 and words[1] == "-m" and words[2] == "pytest":
        program, rest = f"{words[0]} -m pytest", words[3:]
    takes_value = FLAG_PROGRAMS.get(program)
    if takes_value is None:
        return verbatim
    flags: set[str] = set()
    options: list[tuple[str, str]] = []
    positionals: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if word == "--":
            positionals += rest[i:]
            break
        if word.startswith("--"):
            if "=" not in word:
                return verbatim
            name, _, value = word.partition("=")
            options.append((name, value))
        elif word.startswith("-") and len(word) > 1 and not word[1:].isdigit():
            for j, letter in enumerate(word[1:], start=1):
                if letter in takes_value:
                    value = word[j + 1 :]
                    if not value:
                        if i >= len(rest):
                            return verbatim
                        value, i = rest[i], i + 1
                    options.append((f"-{letter}", value))
                    break
                flags.add(letter)
        else:
            positionals.append(word)
    names = [name for name, _ in options]
    # A repeated option may mean "the last one wins": keep such options in order.
    ordered = tuple(options) if len(set(names)) < len(names) else tuple(sorted(options))
    return ("command", program, frozenset(flags), ordered, tuple(positionals))


def bash_form(command: str, workdir: str) -> tuple[Any, ...]:
    """The normal form two equivalent commands share."""
    words = _words(command)
    if words is None:
        return ("unsplit", " ".join(command.split()))
    # Every call starts in workdir: `cd WORKDIR && x` is `x`.
    while (
        len(words) >= 3
        and words[0] == "cd"
        and normalize_path(words[1], workdir) == "."
        and words[2] in ("&&", ";")
    ):
        words = words[3:]
    while words and words[-1] == ";":
        words = words[:-1]
    return tuple(seg[0] if seg[0] in _OPERATORS else _simple_form(seg) for seg in _segments(words))


def apply_edit(content: str, old: str, new: str) -> str | None:
    """The swe-runner's edit: replace the one occurrence of old (empty: write new as the
    whole file); None when old is absent or not unique."""
    if not old:
        return new
    if content.count(old) != 1:
        return None
    return content.replace(old, new, 1)


def _view_range(arguments: dict[str, Any]) -> tuple[int, int] | None:
    raw = arguments.get("view_range")
    if raw is None:
        return (1, -1)
    if (
        isinstance(raw, list)
        and len(raw) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in raw)
    ):
        return (raw[0], raw[1])
    return None


def compare(
    expected_name: str,
    expected: dict[str, Any],
    name: str,
    got: dict[str, Any],
    *,
    workdir: str,
    files: dict[str, str],
) -> Verdict:
    """Whether the call (name, got) is functionally equivalent to (expected_name, expected).
    `expected` was checked by the row parser; `got` is whatever the policy wrote."""
    if name != expected_name:
        return Verdict(False, f"wrong tool: {name!r}, demonstrated {expected_name!r}")
    if name == "submit":
        return Verdict(True, "submit")
    if name == "bash":
        command = got.get("command")
        if not isinstance(command, str):
            return Verdict(False, "bash: arguments.command is not a string")
        if len(command) > MAX_COMMAND_CHARS:
            return Verdict(False, f"bash: command longer than {MAX_COMMAND_CHARS} characters")
        same = bash_form(command, workdir) == bash_form(expected["command"], workdir)
        return Verdict(same, "bash: same command" if same else "bash: different command")
    if name in ("view", "edit"):
        path = got.get("path")
        if not isinstance(path, str) or not path.strip():
            return Verdict(False, f"{name}: arguments.path is not a non-empty string")
        target = normalize_path(expected["path"], workdir)
        if normalize_path(path, workdir) != target:
            return Verdict(False, f"{name}: different file")
        if name == "view":
            rng = _view_range(got)
            same = rng is not None and rng == _view_range(expected)
            return Verdict(same, "view: same file and range" if same else "view: different range")
        old, new = got.get("old_str", ""), got.get("new_str")
        if not isinstance(old, str) or not isinstance(new, str):
            return Verdict(False, "edit: old_str and new_str must be strings")
        content = files.get(target)
        if content is None:
            same = (old, new) == (expected.get("old_str", ""), expected["new_str"])
            return Verdict(same, "edit: same strings (no file content in the row)")
        result = apply_edit(content, old, new)
        if result is None:
            return Verdict(False, "edit: old_str does not occur exactly once in the file")
        wanted = apply_edit(content, expected.get("old_str", ""), expected["new_str"])
        same = result == wanted
        return Verdict(same, "edit: same file content" if same else "edit: different content")
    same = got == expected
    return Verdict(same, f"{name}: {'same' if same else 'different'} arguments")
