"""Shared fixtures: the tiny model and an HF reference for logprob checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# vLLM's engine core runs in a child process: fork it (fast, and pytest's entry point
# is not re-importable under spawn). Weight-loading functions need vLLM's pickle fallback.
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # rollout_scenarios
    sys.path.insert(0, str(TESTS_DIR))
