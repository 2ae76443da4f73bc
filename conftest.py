"""Plugins of the whole suite (libs/, services/, tests/), and the environment it runs in."""

import os

# Torch's OpenMP threads spin while they wait for work. The suite runs three pytest-xdist
# workers, and a stage runs its trainer, rollout and judge, on the same cores: spinning
# threads then take the CPU from the threads with work. Two 2-thread torch loops side by
# side on 2 cores took 21.4 s each with the default policy, 11.5 s with PASSIVE (6.2 s
# alone either way). Children (services, stages, torchrun ranks) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# One compute thread per process. The workers keep both cores busy, and a 2-thread
# torch loop beside another process spends its time waking and waiting for its second
# thread: a SmolLM2-sized decode loop took 20.9 s alone with 2 threads, 26.0 s with 1,
# but side by side 31 s each with 2 threads and 27 s with 1 (docs/development.md,
# "One thread a process"). Set OMP_NUM_THREADS to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

# suite_clock (tests/suite_clock.py): the time budget per test and the summary of where the
# time went; pytester: tests/test_suite_clock.py runs small suites under it.
pytest_plugins = ["suite_clock", "pytester"]
