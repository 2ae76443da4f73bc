"""`tool_use` (multi-turn): conversational tool use over a small bank, with a verifiable
goal state.

The row gives the world and the goal; the policy reads and changes the world with four
deterministic tools, and the episode scores 1 iff the end state equals the goal (and,
when the row has `expected_answer`, the final answer states it).

Row fields:
- `initial_state` (required): `{"accounts": {id: {"owner": str, "balance": number,
  "frozen": bool (default false)}}}`; balances >= 0 with at most 2 decimals.
- `goal_state` (required): the same shape; the whole end state must equal it.
- `expected_answer` (optional): a string the final answer must contain (case-insensitive,
  as a whole word or number: "150" does not match "1500").
- `responses_create_params.tools` (optional): the tools shown to the policy (a subset of
  this environment's, each by name).

Tools: `list_accounts(owner?)`, `get_balance(account_id)`, `transfer(from_account,
to_account, amount)` (refused when frozen, same account, or short of funds) and
`set_frozen(account_id, frozen)`. Money is kept as decimals, so 0.1 + 0.2 is 0.3.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

from rlfleet_reward.episodes.base import (
    CallOutcome,
    EpisodeContext,
    EpisodeEnvironment,
    Tool,
    ToolError,
)
from rlfleet_reward.types import RowError, Sample, Score, scored

_ID = {"type": "string", "minLength": 1, "maxLength": 64}
_MAX_ACCOUNTS = 1000
_CENT = Decimal("0.01")

TOOLS = (
    Tool(
        "list_accounts",
        "List the bank's accounts (id, owner, frozen), optionally only one owner's.",
        {
            "type": "object",
            "properties": {"owner": {"type": "string", "maxLength": 200}},
            "additionalProperties": False,
        },
    ),
    Tool(
        "get_balance",
        "The balance of one account.",
        {
            "type": "object",
            "properties": {"account_id": _ID},
            "required": ["account_id"],
            "additionalProperties": False,
        },
    ),
    Tool(
        "transfer",
        "Move money between two accounts; neither may be frozen.",
        {
            "type": "object",
            "properties": {
                "from_account": _ID,
                "to_account": _ID,
                "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e12},
            },
            "required": ["from_account", "to_account", "amount"],
            "additionalProperties": False,
        },
    ),
    Tool(
        "set_frozen",
        "Freeze or unfreeze an account.",
        {
            "type": "object",
            "properties": {"account_id": _ID, "frozen": {"type": "boolean"}},
            "required": ["account_id", "frozen"],
            "additionalProperties": False,
        },
    ),
)


@dataclass(frozen=True)
class Account:
    owner: str
    balance: Decimal
    frozen: bool = False


@dataclass(frozen=True)
class AccountsSpec:
    initial: tuple[tuple[str, Account], ...]
    goal: tuple[tuple[str, Account], ...]
    expected_answer: str | None


def _money(value: Any, field: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RowError(field, f"expected a finite number, got {str(value)[:50]!r}")
    amount = Decimal(str(value))
    if amount < 0 or amount != amount.quantize(_CENT):
        raise RowError(field, f"must be >= 0 with at most 2 decimals, got {value}")
    return amount


def _accounts(row: Mapping[str, Any], key: str) -> tuple[tuple[str, Account], ...]:
    world = row.get(key)
    if not isinstance(world, dict):
        raise RowError(key, "required: an object with `accounts`")
    accounts = world.get("accounts")
    if not isinstance(accounts, dict) or not accounts:
        raise RowError(f"{key}.accounts", "required: a non-empty object of accounts by id")
    if len(accounts) > _MAX_ACCOUNTS:
        raise RowError(f"{key}.accounts", f"at most {_MAX_ACCOUNTS} accounts")
    out = []
    for account_id, body in accounts.items():
        at = f"{key}.accounts.{account_id[:64]}"
        if not 1 <= len(account_id) <= 64:
            raise RowError(at, "account ids have 1-64 characters")
        if not isinstance(body, dict):
            raise RowError(at, "expected an object with owner and balance")
        owner, frozen = body.get("owner"), body.get("frozen", False)
        if not isinstance(owner, str) or not owner:
            raise RowError(f"{at}.owner", "required: a non-empty string")
        if not isinstance(frozen, bool):
            raise RowError(f"{at}.frozen", "expected true or false")
        out.append(
            (account_id, Account(owner, _money(body.get("balance"), f"{at}.balance"), frozen))
        )
    return tuple(sorted(out))


def _number(amount: Decimal) -> int | float:
    return int(amount) if amount == amount.to_integral_value() else float(amount)


def _contains(text: str, answer: str) -> bool:
    pattern = r"(?<![\w.])" + re.escape(answer.strip()) + r"(?![\w]|\.\d)"
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


class AccountsEnvironment(EpisodeEnvironment):
    name: ClassVar[str] = "tool_use"
    description: ClassVar[str] = (
        "Multi-turn tool use over a small bank (list, balance, transfer, freeze); reward 1 "
        "iff the end state equals the row's goal state (and the final answer, if any)."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("initial_state", "goal_state")
    optional_fields: ClassVar[tuple[str, ...]] = ("expected_answer", "responses_create_params")
    tools: ClassVar[tuple[Tool, ...]] = TOOLS

    def parse_row(self, row: Mapping[str, Any]) -> AccountsSpec:
        initial, goal = _accounts(row, "initial_state"), _accounts(row, "goal_state")
        if [k for k, _ in initial] != [k for k, _ in goal]:
            raise RowError(
                "goal_state.accounts",
                "must hold the same account ids as initial_state (no tool adds or removes one)",
            )
        answer = row.get("expected_answer")
        if answer is not None and (
            not isinstance(answer, str | int | float)
            or isinstance(answer, bool)
            or not str(answer).strip()
        ):
            raise RowError("expected_answer", "expected a non-empty string or number")
        return AccountsSpec(initial, goal, None if answer is None else str(answer))

    async def open(self, spec: AccountsSpec, ctx: EpisodeContext) -> dict[str, Account]:
        return dict(spec.initial)

    async def call(
        self, state: dict[str, Account], tool: str, arguments: dict[str, Any], ctx: EpisodeContext
    ) -> CallOutcome:
        def account(key: str) -> Account:
            account_id = arguments[key]
            if account_id not in state:
                raise ToolError(f"no account {account_id!r}; list_accounts shows the ids")
            return state[account_id]

        if tool == "list_accounts":
            owner = arguments.get("owner")
            rows = [
                {"account_id": k, "owner": a.owner, "frozen": a.frozen}
                for k, a in sorted(state.items())
                if owner is None or a.owner.casefold() == owner.strip().casefold()
            ]
            return CallOutcome(json.dumps(rows))
        if tool == "get_balance":
            found = account("account_id")
            return CallOutcome(
                json.dumps(
                    {"account_id": arguments["account_id"], "balance": _number(found.balance)}
                )
            )
        if tool == "set_frozen":
            found = account("account_id")
            state[arguments["account_id"]] = Account(
                found.owner, found.balance, arguments["frozen"]
            )
            return CallOutcome(
                json.dumps({"account_id": arguments["account_id"], "frozen": arguments["frozen"]})
            )
        if tool == "transfer":
            source, target = account("from_account"), account("to_account")
            amount = Decimal(str(arguments["amount"]))
            if amount != amount.quantize(_CENT):
                raise ToolError(f"amount {arguments['amount']} has more than 2 decimals")
            if arguments["from_account"] == arguments["to_account"]:
                raise ToolError("from_account and to_account are the same account")
            for key, found in (("from_account", source), ("to_account", target)):
                if found.frozen:
                    raise ToolError(f"account {arguments[key]!r} is frozen")
            if source.balance < amount:
                raise ToolError(
                    f"insufficient funds: {arguments['from_account']!r} has {_number(source.balance)}"
                )
            state[arguments["from_account"]] = Account(
                source.owner, source.balance - amount, source.frozen
            )
            state[arguments["to_account"]] = Account(
                target.owner, target.balance + amount, target.frozen
            )
            return CallOutcome(
                json.dumps(
                    {
                        "ok": True,
                        "from_balance": _number(source.balance - amount),
                        "to_balance": _number(target.balance + amount),
                    }
                )
            )
        raise ToolError(f"unknown tool {tool!r}")  # the manager only passes known tools

    async def score(
        self, spec: AccountsSpec, state: dict[str, Account], sample: Sample, ctx: EpisodeContext
    ) -> Score:
        goal = dict(spec.goal)
        wrong = sorted(k for k in set(goal) | set(state) if goal.get(k) != state.get(k))
        state_ok = not wrong
        answer_ok = spec.expected_answer is None or _contains(sample.text, spec.expected_answer)
        info: dict[str, object] = {"state_matches": state_ok, "answer_matches": answer_ok}
        if wrong:
            info["accounts_differing"] = ", ".join(wrong[:10])
        return scored({"task": 1.0 if state_ok and answer_ok else 0.0}, **info)
