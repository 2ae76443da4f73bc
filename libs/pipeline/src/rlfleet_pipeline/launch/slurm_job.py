"""`rlfleet rl --run <slurm profile>`: write the stage's sbatch script, submit it, follow
the job (squeue while it is queued or running, sacct once it has left the queue) and
cancel it (scancel) when the submitter is interrupted (docs/slurm.md).

Every SLURM command runs with a deadline; the job's result is its first component's
(the batch script's, which exits with the trainer's status).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.run_folder import StageFolder
from rlfleet_core.config import dump_yaml

from rlfleet_pipeline.launch.profiles import SlurmProfile
from rlfleet_pipeline.launch.slurm import render_sbatch
from rlfleet_pipeline.stage_plan import FleetPlan

COMMAND_TIMEOUT_S = 60.0
FINAL_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}
UNKNOWN_LIMIT_S = 300.0
"""How long a job may be unknown to squeue, sacct and scontrol before following stops."""


class SlurmError(RuntimeError):
    pass


def slurm_script(
    recipe: RecipeConfig,
    profile: SlurmProfile,
    run_dir: Path,
    fleet: FleetPlan,
    resume: bool = False,
) -> str:
    """The stage's sbatch script: the fleet's services, each given the plan's overrides
    (the rollout serving the policy's model), the trainer on the recipe in run_dir."""
    trainer_args = ["-c", str(StageFolder(run_dir).recipe_yaml), "--run-dir", str(run_dir)]
    if resume:
        trainer_args.insert(0, "--resume")
    overrides = {service: fleet.given(service) for service in fleet.settings}
    # A collective weight_transport (gloo, nccl) is kept: the trainer tasks get the
    # rendezvous address (RLFLEET_WEIGHT_SYNC_HOST = the trainer's first node).
    return render_sbatch(profile, recipe.stage, trainer_args, overrides, fleet.services)


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise SlurmError(
            f"`{command[0]}` not found on PATH: run `rlfleet rl --run <slurm profile>` on a "
            "SLURM login node (or use --dry-run for the script)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"`{shlex.join(command)}` did not answer in {COMMAND_TIMEOUT_S:.0f} s"
        ) from None


@dataclass
class JobState:
    state: str
    """squeue's or sacct's state of the job's first component (PENDING, RUNNING, ...)."""
    exit_code: int | None = None
    """The batch script's exit code once the job is final."""

    @property
    def final(self) -> bool:
        return self.state.split()[0] in FINAL_STATES


class SlurmJob:
    def __init__(self, job_id: str, log_dir: Path) -> None:
        self.job_id = job_id
        self.log_dir = log_dir
        """<job_dir>/<job id>: addresses.env, each service's log, trainer.log."""

    @classmethod
    def submit(cls, script: Path, job_dir: Path, sbatch_args: list[str]) -> SlurmJob:
        done = _run(["sbatch", "--parsable", *sbatch_args, str(script)])
        if done.returncode != 0:
            raise SlurmError(f"sbatch refused {script}: {(done.stderr or done.stdout).strip()}")
        job_id = done.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
        return cls(job_id, job_dir / job_id)

    def state(self) -> JobState:
        queued = _run(["squeue", "-h", "-j", self.job_id, "-o", "%T"])
        lines = queued.stdout.split() if queued.returncode == 0 else []
        if lines:
            return JobState(lines[0])
        # Left the queue (or squeue forgot it): accounting has the result.
        acct = _run(["sacct", "-X", "-n", "-P", "-j", self.job_id, "-o", "JobID,State,ExitCode"])
        for line in acct.stdout.splitlines():
            job, state, code = [*line.split("|"), "", ""][:3]
            if job in (self.job_id, f"{self.job_id}+0"):
                exit_code = int(code.split(":")[0]) if code.split(":")[0].isdigit() else None
                return JobState(state, exit_code)
        # No accounting (no slurmdbd): slurmctld keeps a finished job for MinJobAge.
        shown = _run(["scontrol", "show", "job", "-o", self.job_id])
        fields = dict(w.split("=", 1) for w in shown.stdout.split() if "=" in w)
        if "JobState" in fields:
            code = fields.get("ExitCode", "").split(":")[0]
            return JobState(fields["JobState"], int(code) if code.isdigit() else None)
        return JobState("UNKNOWN")

    def cancel(self) -> None:
        done = _run(["scancel", self.job_id])
        if done.returncode != 0:
            raise SlurmError(f"scancel {self.job_id}: {(done.stderr or done.stdout).strip()}")

    def wait_final(self, timeout_s: float, poll_s: float) -> JobState:
        deadline = time.monotonic() + timeout_s
        state = self.state()
        while not state.final and time.monotonic() < deadline:
            time.sleep(poll_s)
            state = self.state()
        return state


class LogTail:
    """New complete lines of a file that may not exist yet."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in complete]


def submit_stage(
    recipe: RecipeConfig,
    profile: SlurmProfile,
    run_dir: Path,
    fleet: FleetPlan,
    resume: bool = False,
) -> SlurmJob:
    """Write recipe.yaml and the script into run_dir (both must be on the shared
    filesystem, as job_dir), make job_dir and submit."""
    job_dir = Path(profile.job_dir).absolute()
    profile = profile.model_copy(update={"job_dir": str(job_dir)})
    run_dir = run_dir.absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    job_dir.mkdir(parents=True, exist_ok=True)
    StageFolder(run_dir).recipe_yaml.write_text(dump_yaml(recipe))
    script = run_dir / "slurm.sbatch"
    script.write_text(slurm_script(recipe, profile, run_dir, fleet, resume))
    return SlurmJob.submit(script, job_dir, profile.sbatch_args)


def follow(
    job: SlurmJob,
    poll_s: float,
    on_state: Callable[[JobState], None],
    on_line: Callable[[str], None],
) -> JobState:
    """Until the job is final: report each new state and each new trainer log line."""
    tail = LogTail(job.log_dir / "trainer.log")
    last = ""
    known = time.monotonic()
    while True:
        state = job.state()
        if state.state != "UNKNOWN":
            known = time.monotonic()
        elif time.monotonic() - known > UNKNOWN_LIMIT_S:
            raise SlurmError(
                f"job {job.job_id}: neither squeue, sacct nor scontrol has known it for "
                f"{UNKNOWN_LIMIT_S:.0f} s"
            )
        if state.state != last:
            on_state(state)
            last = state.state
        for line in tail.lines():
            on_line(line)
        if state.final:
            return state
        time.sleep(poll_s)


def cancel(job: SlurmJob, poll_s: float, timeout_s: float = 120.0) -> JobState:
    """scancel, then wait (bounded) for the job to reach its final state."""
    job.cancel()
    return job.wait_final(timeout_s, poll_s)
