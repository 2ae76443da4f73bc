"""Seeded verify requests across each mirrored environment's failure categories.

    uv run python services/reward/parity/generate.py ENV SEED COUNT OUT.jsonl

ENV is `math` or `structured_outputs`. Each line is `{"server", "env", "case", "request"}`:
`server` is the NeMo-Gym resources server (reference.py's input), `env` ours, `case` the
category (for reading differences), `request` a NeMo-Gym verify request (valid for the
server's own request model). Standard library plus PyYAML only: runs in rlfleet's venv.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from typing import Any

Items = list[dict[str, Any]]

# --- Responses objects ---------------------------------------------------------------------


def message(*texts: str, refusal: bool = False) -> dict[str, Any]:
    content: list[dict[str, Any]] = [
        {"type": "output_text", "text": t, "annotations": []} for t in texts
    ]
    if refusal:
        content.insert(0, {"type": "refusal", "refusal": "I would rather not. \\boxed{0}"})
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": content,
    }


def reasoning(text: str) -> dict[str, Any]:
    return {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def function_call(name: str, arguments: Any, i: int = 0) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": f"fc_{i}",
        "type": "function_call",
        "call_id": f"call_{i}",
        "status": "completed",
        "name": name,
        "arguments": raw,
    }


def response(output: Items) -> dict[str, Any]:
    """A Responses object holding `output` (what a NeMo-Gym model server returns)."""
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1.0,
        "model": "policy",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def request(prompt: str, output: Items, **fields: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "response": response(output),
        **fields,
    }


# --- math ----------------------------------------------------------------------------------

# (gold as datasets write it, equivalent answers, wrong answers)
Gold = tuple[str, list[str], list[str]]


def _golds(rng: random.Random) -> list[Gold]:
    n = rng.randint(-40, 400)
    p, q = rng.randint(1, 9), rng.choice([2, 4, 5, 8])
    a, b = sorted(rng.sample(range(-9, 20), 2))
    s = sorted(rng.sample(range(1, 30), 3))
    k = rng.randint(2, 9)
    pct = rng.choice([10, 20, 25, 40, 50, 75])
    dec = p / q
    return [
        (str(n), [str(n), f"{n}.0", f"{n}.00", f"{{{n}}}"], [str(n + 1), str(-n - 2)]),
        (
            f"\\frac{{{p}}}{{{q}}}",
            [f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}", f"{dec:g}", f"\\dfrac{{{p}}}{{{q}}}"],
            [f"\\frac{{{q}}}{{{p + q}}}", f"{dec + 1:g}"],
        ),
        (f"{dec:g}", [f"{dec:g}", f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}"], [f"{dec * 2 + 1:g}"]),
        (
            "\\{" + ",".join(map(str, s)) + "\\}",
            [
                "\\{" + ", ".join(map(str, reversed(s))) + "\\}",
                "\\{" + ",".join(map(str, s)) + "\\}",
                ", ".join(map(str, s)),
            ],
            ["\\{" + ",".join(map(str, s[:2])) + "\\}"],
        ),
        (f"[{a},{b})", [f"[{a}, {b})", f"\\left[{a},{b}\\right)"], [f"({a},{b})", f"[{a},{b}]"]),
        (
            str(k),
            [f"{k}\\text{{ cm}}", f"{k} \\mathrm{{m}}", f"{k}\\,\\text{{kg}}"],
            [f"{k + 1} cm"],
        ),
        (f"{pct}\\%", [f"{pct}\\%", f"{pct}", f"{pct}%"], [f"{pct / 100:g}", f"{pct + 5}\\%"]),
        (f"{k}\\sqrt{{3}}", [f"\\sqrt{{{3 * k * k}}}", f"{k}\\sqrt3"], [f"{k}\\sqrt{{2}}"]),
        ("x^2+1", ["1+x^2", "x^{2}+1"], ["x^2-1", "x+1"]),
        ("\\frac{\\pi}{2}", ["\\pi/2", "\\frac{\\pi}{2}", "90^\\circ"], ["\\pi"]),
        (f"${n}$", [str(n)], [str(n + 3)]),
        (f"\\({p}/{q}\\)", [f"\\frac{{{p}}}{{{q}}}"], [f"{q}/{p + q}"]),
        (f"\\(\\frac{{{p}}}{{{q}}}\\)", [f"{p}/{q}"], [str(p * q + 1)]),
        (f"$${n}$$", [str(n)], [str(n - 7)]),
        ("(1,2)", ["(1, 2)", "(1,2)"], ["(2,1)"]),
        ("\\text{Tuesday}", ["\\text{Tuesday}", "Tuesday"], ["Monday"]),
        ("2,3", ["2, 3", "3, 2"], ["2"]),
    ]


def _math_cases() -> dict[str, Callable[[random.Random, str, str], Items]]:
    """category -> f(rng, an answer, a wrong answer) -> output items."""
    pre = [
        "Let me work through this.\n",
        "We compute step by step: 2+2=4, then 7.\n\n",
        "",
        "First, $x = 3$ and $y = 1/2$.\n",
    ]

    def box(a: str) -> str:
        return "\\boxed{" + a + "}"

    return {
        "boxed": lambda r, a, w: [message(r.choice(pre) + f"So the answer is {box(a)}.")],
        "boxed-dollars": lambda r, a, w: [message(r.choice(pre) + f"$${box(a)}$$")],
        "boxed-inline-math": lambda r, a, w: [message(f"Therefore $x = {box(a)}$.")],
        "boxed-wrong": lambda r, a, w: [message(r.choice(pre) + f"The answer is {box(w)}.")],
        "unboxed-final": lambda r, a, w: [message(r.choice(pre) + f"The answer is {a}.")],
        "unboxed-bare": lambda r, a, w: [message(a)],
        "unboxed-dollars": lambda r, a, w: [message(f"Final answer: ${a}$")],
        "markdown-bold": lambda r, a, w: [message(f"**Answer:** **{a}**")],
        "markdown-heading": lambda r, a, w: [message(f"## Final answer\n\n{a}\n")],
        "unclosed-box": lambda r, a, w: [message(f"So the answer is \\boxed{{{a}")],
        "unclosed-after-complete": lambda r, a, w: [message(f"{box(a)} or maybe \\boxed{{{w}")],
        "empty-box": lambda r, a, w: [message(f"The answer is {a}. \\boxed{{}}")],
        "blank-box": lambda r, a, w: [message(f"{box(a)} then \\boxed{{ }}")],
        "nested-braces": lambda r, a, w: [message(box("{" + a + "}"))],
        "boxes-right-then-wrong": lambda r, a, w: [message(f"{box(a)}, no wait: {box(w)}")],
        "boxes-wrong-then-right": lambda r, a, w: [message(f"{box(w)}, no wait: {box(a)}")],
        "fbox": lambda r, a, w: [message(f"\\fbox{{{a}}}")],
        "boxed-space": lambda r, a, w: [message(f"\\boxed {{{a}}}")],
        "text-after-box": lambda r, a, w: [message(f"{box(a)}\n\nCheck: {w} is not it.")],
        "think-box-inside": lambda r, a, w: [
            message(f"<think>Maybe {box(a)}.</think>The answer is {w}.")
        ],
        "think-wrong-inside": lambda r, a, w: [
            message(f"<think>First guess {box(w)}</think>\n{box(a)}")
        ],
        "think-unclosed": lambda r, a, w: [message(f"<think>I believe it is {box(a)} but")],
        "think-answer-unboxed": lambda r, a, w: [message(f"<think>hmm</think>{a}")],
        "reasoning-item-box": lambda r, a, w: [reasoning(f"It is {box(a)}."), message(a)],
        "reasoning-item-wrong": lambda r, a, w: [reasoning(box(w)), message(box(a))],
        "two-messages": lambda r, a, w: [message("Work: 1+1=2."), message(box(a))],
        "box-split-across-items": lambda r, a, w: [message("\\boxed{", a + "}")],
        "box-split-across-messages": lambda r, a, w: [message("So \\boxed{"), message(a + "}")],
        "refusal-part": lambda r, a, w: [message(box(a), refusal=True)],
        "no-message": lambda r, a, w: [reasoning(box(a))],
        "empty-text": lambda r, a, w: [message("")],
        "latex-display": lambda r, a, w: [message(f"\\[ {box(a)} \\]")],
        "text-box": lambda r, a, w: [message(box(f"\\text{{{a}}}"))],
        "answer-line-then-box-wrong": lambda r, a, w: [message(f"Answer: {a}\n\n{box(w)}")],
    }


def math_requests(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = _math_cases()
    names = sorted(cases)
    out = []
    for i in range(count):
        name = names[i % len(names)]
        gold, right, wrong = rng.choice(_golds(rng))
        items = cases[name](rng, rng.choice(right), rng.choice(wrong))
        req = request("Solve it.", items, question="Solve it.", expected_answer=gold)
        out.append({"server": "math_with_judge", "env": "math", "case": name, "request": req})
    return out


# --- structured outputs --------------------------------------------------------------------


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, **extra}


PERSON = _obj(
    {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    required=["name", "age"],
    additionalProperties=False,
)
OPTIONAL = _obj({"title": {"type": "string"}, "score": {"type": "number"}}, required=["title"])
NESTED = _obj(
    {
        "user": _obj(
            {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}
        ),
        "active": {"type": "boolean"},
    }
)
POINTS = {"type": "array", "items": _obj({"x": {"type": "number"}, "y": {"type": "number"}})}
CHOICE = _obj(
    {
        "color": {"enum": ["red", "green", "blue"]},
        "value": {"anyOf": [{"type": "integer"}, _obj({"v": {"type": "string"}})]},
    }
)
PATTERN = _obj(
    {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
        "email": {"type": "string", "format": "email"},
    }
)
UNIQUE = _obj({"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}})
MAP = {"type": "object", "additionalProperties": {"type": "integer"}}
DRAFT7_TUPLE = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "array",
    "items": [{"type": "integer"}, {"type": "string"}],
}
NULLABLE = _obj({"n": {"type": ["integer", "null"]}, "s": {"type": "string"}})


def _docs(rng: random.Random) -> list[tuple[str, dict[str, Any] | list[Any] | bool, Any, Any]]:
    """(name, schema, a valid instance, an invalid instance)."""
    age, x = rng.randint(0, 90), rng.randint(-5, 50)
    name = rng.choice(["Ada", "Grace", "Linus", "Émile", "李"])
    return [
        ("person", PERSON, {"name": name, "age": age}, {"name": name, "age": str(age)}),
        ("optional", OPTIONAL, {"title": name, "score": x / 2}, {"title": name}),
        (
            "nested",
            NESTED,
            {"user": {"id": x, "tags": ["a", name]}, "active": True},
            {"user": {"id": x, "tags": ["a"]}, "active": "yes"},
        ),
        ("points", POINTS, [{"x": x, "y": 1.5}, {"x": 0, "y": -x}], [{"x": x}]),
        ("choice", CHOICE, {"color": "red", "value": x}, {"color": "pink", "value": x}),
        (
            "choice-obj",
            CHOICE,
            {"color": "blue", "value": {"v": name}},
            {"color": "blue", "value": 1.5},
        ),
        (
            "pattern",
            PATTERN,
            {"code": f"ABC-{age}", "email": "not an email"},
            {"code": "abc", "email": "a@b.c"},
        ),
        ("unique", UNIQUE, {"ids": [1, 2, x + 100]}, {"ids": [1, 1]}),
        ("map", MAP, {"a": 1, name: x}, {"a": "1"}),
        ("draft7-tuple", DRAFT7_TUPLE, [1, "a"], ["a", 1]),
        ("nullable", NULLABLE, {"n": None, "s": name}, {"n": "x", "s": name}),
    ]


def _json_texts(rng: random.Random, good: Any, bad: Any) -> dict[str, Items]:
    doc = json.dumps(good, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
    return {
        "json-valid": [message(doc)],
        "json-valid-whitespace": [message(f"\n  {doc}\n")],
        "json-invalid": [message(json.dumps(bad))],
        "json-fenced": [message(f"```json\n{doc}\n```")],
        "json-fenced-bare": [message(f"```\n{doc}\n```")],
        "json-prose-before": [message(f"Here is the JSON:\n{doc}")],
        "json-trailing-text": [message(f"{doc}\nHope this helps!")],
        "json-truncated": [message(doc[: max(1, len(doc) // 2)])],
        "json-empty": [message("")],
        "json-blank": [message("  \n ")],
        "json-no-message": [reasoning(doc)],
        "json-split-messages": [message(doc[: len(doc) // 2]), message(doc[len(doc) // 2 :])],
        "json-think-prefix": [message(f"<think>plan</think>{doc}")],
        "json-reasoning-item": [reasoning("I'll write JSON."), message(doc)],
        "json-nan": [message(doc.replace("1.5", "NaN") if "1.5" in doc else "NaN")],
        "json-single-quotes": [message(doc.replace('"', "'"))],
        "json-extra-prop": [message(json.dumps(_with_extra(good)))],
        "json-null": [message("null")],
    }


def _with_extra(doc: Any) -> Any:
    return {**doc, "extra": 1} if isinstance(doc, dict) else doc


def _yaml_texts(good: Any, bad: Any) -> dict[str, Items]:
    import yaml

    doc = yaml.safe_dump(good, allow_unicode=True)
    return {
        "yaml-valid": [message(doc)],
        "yaml-invalid": [message(yaml.safe_dump(bad))],
        "yaml-fenced": [message(f"```yaml\n{doc}```")],
        "yaml-as-json": [message(json.dumps(good))],
        "yaml-broken": [message("a: [1, 2\nb: {")],
    }


def _xml(value: Any, tag: str) -> str:
    if isinstance(value, dict):
        return f"<{tag}>" + "".join(_xml(v, k) for k, v in value.items()) + f"</{tag}>"
    if isinstance(value, list):
        return f"<{tag}>" + "".join(_xml(v, "item") for v in value) + f"</{tag}>"
    if value is None:
        return f"<{tag}/>"
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"<{tag}>{text.replace('&', '&amp;').replace('<', '&lt;')}</{tag}>"


def _xml_texts(good: Any, bad: Any) -> dict[str, Items]:
    return {
        "xml-valid": [message(_xml(good, "root"))],
        "xml-invalid": [message(_xml(bad, "root"))],
        "xml-broken": [message("<root><a>1</root>")],
        "xml-prose": [message("Result: " + _xml(good, "root"))],
    }


def _toml_texts(good: Any, bad: Any) -> dict[str, Items]:
    def dump(doc: Any) -> str:
        if not isinstance(doc, dict):
            return f"value = {json.dumps(doc)}"
        lines = [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in doc.items() if v is not None]
        return "\n".join(lines)

    return {
        "toml-valid": [message(dump(good))],
        "toml-invalid": [message(dump(bad))],
        "toml-broken": [message("a = ")],
    }


def _csv_texts(rng: random.Random) -> dict[str, Items]:
    x = rng.randint(0, 99)
    return {
        "csv-valid": [message(f"x,y\n{x},1.5\n2,{x}\n")],
        "csv-wrong-type": [message(f"x,y\nabc,{x}\n")],
        "csv-missing-cell": [message(f"x,y\n{x}\n")],
        "csv-extra-column": [message(f"x,y,z\n{x},1,2\n")],
        "csv-empty-cells": [message("x,y\n,\n")],
    }


def _tool_texts(rng: random.Random, good: Any, bad: Any) -> dict[str, tuple[Items, dict[str, Any]]]:
    key = {"tool_name": "emit", "tool_payload_key": "payload"}
    return {
        "tool-valid": ([function_call("emit", good)], {"tool_name": "emit"}),
        "tool-invalid": ([function_call("emit", bad)], {"tool_name": "emit"}),
        "tool-payload-key": ([function_call("emit", {"payload": good})], key),
        "tool-payload-missing": ([function_call("emit", good)], key),
        "tool-wrong-name": ([function_call("other", good)], {"tool_name": "emit"}),
        "tool-no-name-required": ([function_call("other", good)], {}),
        "tool-two-calls": ([function_call("emit", good), function_call("emit", good, 1)], {}),
        "tool-none": ([message(json.dumps(good))], {"tool_name": "emit"}),
        "tool-bad-json": ([function_call("emit", '{"a": ')], {"tool_name": "emit"}),
        "tool-non-object": ([function_call("emit", rng.choice(["[1]", "3", '"x"', "null"]))], {}),
        "tool-with-message": ([message("Calling."), function_call("emit", good)], {}),
    }


def structured_requests(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < count:
        doc_name, schema, good, bad = rng.choice(_docs(rng))
        kind = ["json", "json", "yaml", "xml", "toml", "csv", "tool"][i % 7]
        i += 1
        fields: dict[str, Any] = {"schema_type": kind if kind != "tool" else "json"}
        cases: dict[str, tuple[Items, dict[str, Any]]]
        if kind == "json":
            cases = {k: (v, {}) for k, v in _json_texts(rng, good, bad).items()}
        elif kind == "yaml":
            cases = {k: (v, {}) for k, v in _yaml_texts(good, bad).items()}
        elif kind == "xml":
            # (a draft-07 schema nested under 2020-12 is not a valid schema: a bad row here)
            wrap = rng.random() < 0.7 and doc_name != "draft7-tuple"
            schema = _obj({"root": schema}) if wrap else schema
            cases = {k: (v, {}) for k, v in _xml_texts(good, bad).items()}
        elif kind == "toml":
            cases = {k: (v, {}) for k, v in _toml_texts(good, bad).items()}
        elif kind == "csv":
            doc_name, schema = "points", POINTS
            cases = {k: (v, {}) for k, v in _csv_texts(rng).items()}
        else:
            cases = _tool_texts(rng, good, bad)
            fields["response_mode"] = "tool_call"
        case = rng.choice(sorted(cases))
        items, extra = cases[case]
        schema_str = json.dumps(schema)
        req = request("Reply in the format asked.", items, schema_str=schema_str, **fields, **extra)
        out.append(
            {
                "server": "structured_outputs",
                "env": "structured_outputs",
                "case": f"{case}/{doc_name}",
                "request": req,
            }
        )
    return out


GENERATORS = {"math": math_requests, "structured_outputs": structured_requests}


def main() -> None:
    env, seed, count, dst = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with open(dst, "w", encoding="utf-8") as f:
        for line in GENERATORS[env](seed, count):
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
