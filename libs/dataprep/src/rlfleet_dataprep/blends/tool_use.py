"""Rows of the tiny tool-use blend (`tiny-tooluse`): the reward gateway's multi-turn
`tool_use` bank, tasks of graded difficulty over a three-account world.

Levels (`level` in each row's id):
1. one call: freeze or unfreeze an account, or say an account's balance (the final answer
   must state it: `expected_answer`);
2. one call with three arguments: a transfer;
3. two or three calls: move all of an account's money (get_balance, then transfer), a
   transfer then a freeze, or freeze every account of one owner (list_accounts, then
   set_frozen per account).

SmolLM2-135M-Instruct, the tiny model, was not fine-tuned on function calling (its SFT
mix, smol-smoltalk, left it to the 1.7B) and makes no call when only told the format (0
of 32 samples). Every prompt therefore opens with the same two worked exchanges (freeze
an account; read a balance) in the Hermes format the trainer parses; the row's own
accounts never appear in them. The tool schemas shown are the environment's, without
the length bounds (the gateway still checks calls against its own schema).
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

OWNERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
_ID = {"type": "string"}
SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "list_accounts": (
        "List the accounts (id, owner, frozen), optionally only one owner's.",
        {"type": "object", "properties": {"owner": {"type": "string"}}},
    ),
    "get_balance": (
        "The balance of one account.",
        {"type": "object", "properties": {"account_id": _ID}, "required": ["account_id"]},
    ),
    "transfer": (
        "Move money between two accounts; neither may be frozen.",
        {
            "type": "object",
            "properties": {"from_account": _ID, "to_account": _ID, "amount": {"type": "number"}},
            "required": ["from_account", "to_account", "amount"],
        },
    ),
    "set_frozen": (
        "Freeze or unfreeze an account.",
        {
            "type": "object",
            "properties": {"account_id": _ID, "frozen": {"type": "boolean"}},
            "required": ["account_id", "frozen"],
        },
    ),
}
SYSTEM = "You operate a bank through its tools. Call the tools the task needs, then say briefly what you did."


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# The worked exchanges every prompt opens with (ids Z1, Z2 are never a row's).
DEMO: list[dict[str, str]] = [
    {"role": "user", "content": "Freeze account Z1."},
    {"role": "assistant", "content": _call("set_frozen", account_id="Z1", frozen=True)},
    {"role": "tool", "content": json.dumps({"account_id": "Z1", "frozen": True})},
    {"role": "assistant", "content": "Account Z1 is frozen."},
    {"role": "user", "content": "What is the balance of account Z2?"},
    {"role": "assistant", "content": _call("get_balance", account_id="Z2")},
    {"role": "tool", "content": json.dumps({"account_id": "Z2", "balance": 40})},
    {"role": "assistant", "content": "The balance of Z2 is 40."},
]


def _tools(*names: str) -> list[dict[str, Any]]:
    """The row's tools (Chat Completions shape): always the two of the demonstration."""
    shown = [
        "set_frozen",
        "get_balance",
        *(n for n in names if n not in ("set_frozen", "get_balance")),
    ]
    return [
        {
            "type": "function",
            "function": {"name": n, "description": SCHEMAS[n][0], "parameters": SCHEMAS[n][1]},
        }
        for n in shown
    ]


def _world(rng: random.Random, shared_owner: bool) -> dict[str, Any]:
    ids = rng.sample([f"{c}{d}" for c in LETTERS[:-1] for d in range(1, 10)], 3)
    owners = rng.sample(OWNERS, 3)
    if shared_owner:
        owners[2] = owners[0]
    return {
        "accounts": {
            i: {"owner": o, "balance": rng.randrange(10, 500, 5), "frozen": False}
            for i, o in zip(ids, owners, strict=True)
        }
    }


def _task(
    kind: str, world: dict[str, Any], rng: random.Random
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(prompt, goal state, extra row fields) of one task over `world` (changed in place
    to the task's start, e.g. an account frozen for an unfreeze task)."""
    accounts = world["accounts"]
    a, b, _ = list(accounts)
    goal = copy.deepcopy(world)
    extra: dict[str, Any] = {}
    if kind == "freeze":
        goal["accounts"][a]["frozen"] = True
        return f"Freeze account {a}.", goal, extra
    if kind == "unfreeze":
        accounts[a]["frozen"] = True
        goal = copy.deepcopy(world)
        goal["accounts"][a]["frozen"] = False
        return f"Unfreeze account {a}.", goal, extra
    if kind == "balance":
        extra["expected_answer"] = str(accounts[a]["balance"])
        return f"What is the balance of account {a}?", goal, extra
    if kind == "transfer":
        amount = rng.randrange(5, accounts[a]["balance"] + 1, 5)
        goal["accounts"][a]["balance"] -= amount
        goal["accounts"][b]["balance"] += amount
        return f"Transfer {amount} from account {a} to account {b}.", goal, extra
    if kind == "move_all":
        goal["accounts"][b]["balance"] += accounts[a]["balance"]
        goal["accounts"][a]["balance"] = 0
        return f"Move all the money in account {a} to account {b}.", goal, extra
    if kind == "transfer_freeze":
        amount = rng.randrange(5, accounts[a]["balance"] + 1, 5)
        goal["accounts"][a]["balance"] -= amount
        goal["accounts"][b]["balance"] += amount
        goal["accounts"][a]["frozen"] = True
        return (
            f"Transfer {amount} from account {a} to account {b}, then freeze account {a}.",
            goal,
            extra,
        )
    if kind == "freeze_owner":
        owner = accounts[a]["owner"]
        # Two accounts are `owner`'s: the world was made with a shared owner.
        for body in goal["accounts"].values():
            body["frozen"] = body["owner"] == owner or body["frozen"]
        return f"Freeze every account of {owner}.", goal, extra
    raise ValueError(f"unknown task kind {kind!r}")


# (kind, level, tools beyond the demonstration's, whether the world shares an owner)
KINDS: tuple[tuple[str, int, tuple[str, ...], bool], ...] = (
    ("freeze", 1, (), False),
    ("unfreeze", 1, (), False),
    ("balance", 1, (), False),
    ("transfer", 2, ("transfer",), False),
    ("move_all", 3, ("transfer",), False),
    ("transfer_freeze", 3, ("transfer",), False),
    ("freeze_owner", 3, ("list_accounts",), True),
)


def tool_use_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` rows cycling over KINDS (so every level is in every slice), deterministic in
    `seed`."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        kind, level, tools, shared = KINDS[i % len(KINDS)]
        world = _world(rng, shared)
        prompt, goal, extra = _task(kind, world, rng)
        rows.append(
            {
                "id": f"tiny-tooluse-{i}-l{level}-{kind}",
                "agent_ref": {"name": "tool_use"},
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": SYSTEM},
                        *DEMO,
                        {"role": "user", "content": prompt},
                    ],
                    "tools": _tools(*tools),
                },
                "initial_state": world,
                "goal_state": goal,
                **extra,
            }
        )
    return rows
