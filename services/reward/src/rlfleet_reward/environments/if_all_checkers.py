"""Every instruction id with its checker, for the environments that grade instructions.

Importing a checker module registers its ids into `if_registry.CHECKERS`: IFEval's from
if_checkers.py first, then the rest of NeMo-Gym's registry from if_checkers_more.py. This
module imports both, so `CHECKERS` here holds the whole set, and the two checker modules
depend on the registry alone, never on each other."""

from __future__ import annotations

from rlfleet_reward.environments import if_checkers, if_checkers_more
from rlfleet_reward.environments.if_registry import CHECKERS, Checker

CHECKER_MODULES = (if_checkers, if_checkers_more)
"""The modules whose import filled CHECKERS, in registration order."""

__all__ = ["CHECKERS", "CHECKER_MODULES", "Checker"]
