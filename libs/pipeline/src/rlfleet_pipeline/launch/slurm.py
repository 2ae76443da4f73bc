"""The sbatch script for one stage on SLURM: a heterogeneous job with one component per
service (docs/slurm.md).

Component order is fixed (trainer, rollout, reward[, sandbox][, swe-runner]). A service
runs as one task on its component's first node (the reward gateway and the sandbox may
have several nodes: the component then starts a Ray cluster over them and the service
spreads its workers there, `RAY_SERVICES`), listening on 0.0.0.0 at its own port
(`grpc_port` + an offset per service, so that components sharing a node do not collide).
Services find each other through `<job_dir>/<jobid>/addresses.env`: each service appends
`<SERVICE>_TARGET=<node>:<port>` once its health check says SERVING, and whoever needs an
address (the reward gateway the sandbox's and the swe-runner's, the trainer all of them)
sources the file until it is there. The wait has a deadline and ends as soon as a service's step exits, naming
the service and its log; no port is guessed across nodes.

The trainer component runs `trainer_tasks_per_node` tasks on each of its nodes, each with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK from SLURM; MASTER_ADDR = the
component's first node, MASTER_PORT from the profile) and RLFLEET_WEIGHT_SYNC_HOST = that
same node: global rank 0 runs there and hosts the collective weight group's store
(rlfleet_weights.collective), which the rollout node joins at that address.

Every service binds 0.0.0.0, so the job makes the fleet's shared auth token first
(`<job_dir>/<jobid>/auth_token`, mode 0600, 32 random bytes URL-safe like
`secrets.token_urlsafe(32)`) unless the submitter set RLFLEET_AUTH_TOKEN_FILE or
RLFLEET_AUTH_TOKEN; services and the trainer read it through RLFLEET_AUTH_TOKEN_FILE
(job_dir must be on a filesystem every node and container sees, as for addresses.env).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from rlfleet_pipeline.caches import CACHE_DIR_ENV, CACHE_SUBDIRS
from rlfleet_pipeline.launch.profiles import SlurmProfile

ENTRY = {
    "trainer": "rlfleet-trainer",
    "rollout": "rlfleet-rollout",
    "reward": "rlfleet-reward",
    "sandbox": "rlfleet-sandbox",
    "swe-runner": "rlfleet-swe",
}
GPU_SERVICES = ("trainer", "rollout")
PORT_OFFSET = {"rollout": 1, "reward": 2, "sandbox": 3, "swe-runner": 4}
"""Each service's gRPC port is profile.grpc_port + this (components may share a node)."""
RAY_SERVICES = ("reward", "sandbox")
"""Services whose workers spread over a Ray cluster (`pool.backend=ray`): given more than
one node, their component starts Ray on every node (the head on the first, where the
service runs) and the service joins it (`ray.address=auto`), one worker per node unless
the stage's overrides say otherwise."""
RAY_PORT = 6379
"""The Ray head's GCS port of a multi-node service component, + the service's offset."""


@dataclass
class Component:
    service: str
    nodes: int
    gpus_per_node: int
    partition: str | None
    tasks_per_node: int = 1

    @property
    def target_var(self) -> str:
        return self.service.upper().replace("-", "_") + "_TARGET"


def components(profile: SlurmProfile, services: list[str] | None = None) -> list[Component]:
    """The job's components: the trainer, then the stage's `services` (None = those the
    profile gives nodes: rollout, reward, sandbox if nodes.sandbox, swe-runner if
    nodes.swe_runner), in a fixed order."""
    n = profile.nodes
    cpu = profile.cpu_partition or profile.partition
    gpus = profile.gpus_per_node
    ranks = profile.trainer_tasks_per_node or max(1, gpus)
    counts = {
        "rollout": n.rollout,
        "reward": n.reward,
        "sandbox": n.sandbox,
        "swe-runner": n.swe_runner,
    }
    wanted = [s for s in counts if counts[s]] if services is None else services
    unknown = sorted(set(wanted) - set(counts))
    if unknown:
        raise ValueError(f"services {unknown}: expected some of {', '.join(counts)}")
    comps = [Component("trainer", n.trainer, gpus, profile.partition, ranks)]
    for service in counts:
        if service in wanted:
            gpu = service in GPU_SERVICES
            part = profile.partition if gpu else cpu
            comps.append(Component(service, max(1, counts[service]), gpus if gpu else 0, part))
    for comp in comps[1:]:
        if comp.nodes > 1 and comp.service not in RAY_SERVICES:
            # The rollout's replicas keep a private Ray on one node; the swe-runner is one
            # process: more nodes would sit idle.
            raise ValueError(
                f"nodes.{comp.service.replace('-', '_')}={comp.nodes}: {comp.service} runs on "
                f"one node (only {' and '.join(RAY_SERVICES)} spread over several, through "
                "Ray); set it to 1"
            )
    return comps


def container_args(profile: SlurmProfile, service: str) -> tuple[list[str], list[str]]:
    """(srun flags, command prefix) that put `service` in its container."""
    if profile.container_runtime == "none":
        return [], []
    image = profile.images.get(service)
    if image is None:
        raise ValueError(f"images.{service}: no container image set in the profile")
    if profile.container_runtime == "pyxis":
        flags = [f"--container-image={image}", "--no-container-mount-home"]
        if profile.mounts:
            flags.append(f"--container-mounts={','.join(profile.mounts)}")
        return flags, []
    # apptainer passes the task's environment (SLURM_*, the addresses, the token file) in.
    nv = ["--nv"] if service in GPU_SERVICES and profile.gpus_per_node else []
    return [], ["apptainer", "exec", *nv, *(f"--bind={m}" for m in profile.mounts), image]


def _arg(value: str) -> str:
    """Shell-quote, but let `$VAR` expand on the node (addresses are known only there)."""
    if "$" in value and all(c.isalnum() or c in "$_.:=-/{}" for c in value):
        return f'"{value}"'
    return shlex.quote(value)


def _cmd(words: list[str]) -> str:
    return " ".join(_arg(w) for w in words)


def service_port(profile: SlurmProfile, service: str) -> int:
    return profile.grpc_port + PORT_OFFSET[service]


def ray_port(service: str) -> int:
    return RAY_PORT + PORT_OFFSET[service]


def task_script(profile: SlurmProfile, comp: Component, command: list[str]) -> str:
    """What each task of a component runs (in its container for pyxis)."""
    _, prefix = container_args(profile, comp.service)
    lines = list(profile.setup)
    if comp.service == "trainer":
        lines.append(
            'export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID" '
            f'MASTER_ADDR="$TRAINER_HEAD" MASTER_PORT={profile.master_port}'
        )
        # Global rank 0 (the task on $TRAINER_HEAD) hosts the weight group's store and
        # advertises this address to the rollout; a `setup` export (e.g. an IB name) wins.
        lines.append('export RLFLEET_WEIGHT_SYNC_HOST="${RLFLEET_WEIGHT_SYNC_HOST:-$TRAINER_HEAD}"')
    else:
        if comp.nodes > 1:
            # One task per node: task 0 is the Ray head and runs the service, the others
            # join its cluster and hold there (`--block`) until the step ends.
            ray = _cmd([*prefix, "ray", "start", "--disable-usage-stats"])
            head = f"$RAY_HEAD:{ray_port(comp.service)}"
            lines += [
                'RAY_HEAD=$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n1)',
                'if [[ "$SLURM_PROCID" != 0 ]]; then',
                f'  exec {ray} --address="{head}" --block',
                "fi",
                f"{ray} --head --port={ray_port(comp.service)}",
            ]
        port = service_port(profile, comp.service)
        health = _cmd([*prefix, "python", "-m", "rlfleet_core.healthcheck", f"127.0.0.1:{port}"])
        # Publish the address once SERVING. bash's /dev/tcp first (free) until the port is
        # bound, then the health check (a Python start each); `kill -0 $$`: the loop ends
        # with the service (SLURM does not track orphans).
        alive = "kill -0 $$ 2>/dev/null || exit 0"
        lines.append(
            f"( until (: <>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; do {alive}; sleep 1; done; "
            f"until {health} >/dev/null 2>&1; do {alive}; sleep 2; done; "
            f'echo "{comp.target_var}=$SLURMD_NODENAME:{port}" >> "$ADDRESSES" ) &'
        )
    lines.append(f"exec {_cmd([*prefix, *command])}")
    return "\n".join(lines)


def srun_line(profile: SlurmProfile, index: int, comp: Component, command: list[str]) -> str:
    flags, _ = container_args(profile, comp.service)
    nodes = comp.nodes if comp.service == "trainer" or comp.service in RAY_SERVICES else 1
    srun = [
        "srun",
        f"--het-group={index}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={comp.tasks_per_node}",
        f"--ntasks={nodes * comp.tasks_per_node}",
        *flags,
        "bash",
        "-c",
        task_script(profile, comp, command),
    ]
    return shlex.join(srun)


def _cache_lines(profile: SlurmProfile) -> list[str]:
    """Every task shares one cache folder (models, HF hub, kernels, uv): exported here,
    so srun passes it to the tasks (pyxis and apptainer pass the environment in)."""
    if not profile.cache_dir:
        return []
    root = "${RLFLEET_CACHE_DIR:-" + profile.cache_dir + "}"
    lines = ["", "# one cache folder for every task (rlfleet_pipeline.caches)"]
    lines.append(f'export {CACHE_DIR_ENV}="{root}"')
    for var, sub in CACHE_SUBDIRS.items():
        lines.append(f'export {var}="${{{var}:-${CACHE_DIR_ENV}/{sub}}}"')
    return lines


def _wait_for(variables: list[str]) -> str:
    return f"wait_for {' '.join(variables)}"


WAIT_FOR = """\
# wait_for VAR...: source $ADDRESSES until every VAR is set; fail at once when a service's
# step has exited, or after START_TIMEOUT_S.
wait_for() {
  local deadline=$((SECONDS + START_TIMEOUT_S)) var pid missing
  while :; do
    set -a; source "$ADDRESSES"; set +a
    missing=""
    for var in "$@"; do [[ -n "${!var:-}" ]] || missing="$missing $var"; done
    [[ -z "$missing" ]] && return 0
    for pid in "${!STEPS[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "rlfleet: ${STEPS[$pid]} exited before serving; see $LOGS/${STEPS[$pid]}.log" >&2
        tail -n 20 "$LOGS/${STEPS[$pid]}.log" >&2 || true
        exit 1
      fi
    done
    if (( SECONDS >= deadline )); then
      echo "rlfleet: no address for$missing after ${START_TIMEOUT_S}s; see $LOGS" >&2
      exit 1
    fi
    sleep 2
  done
}"""


REWARD_TARGETS = {"sandbox": "sandbox.target", "swe-runner": "swe.target"}
"""The reward gateway's override naming each service it calls (when the job has it)."""


def _reward_targets(comps: list[Component]) -> dict[str, str]:
    """override key -> address variable, for the services of `comps` the gateway calls."""
    return {REWARD_TARGETS[c.service]: c.target_var for c in comps if c.service in REWARD_TARGETS}


def service_commands(
    profile: SlurmProfile, comps: list[Component], overrides: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Each service component's command line in the job (the trainer's is built apart):
    what the script runs and what `rlfleet rl --dry-run` checks against the services'
    own config models."""
    commands = {}
    for comp in comps[1:]:
        port = service_port(profile, comp.service)
        command = [ENTRY[comp.service], "--host", "0.0.0.0", "--port", str(port)]
        if comp.service == "reward":
            command += [f"{key}=${var}" for key, var in _reward_targets(comps).items()]
        if comp.nodes > 1:  # the Ray cluster the component's tasks start (task_script)
            command += ["pool.backend=ray", "ray.address=auto", f"ray.workers={comp.nodes}"]
        commands[comp.service] = command + overrides.get(comp.service, [])
    return commands


def render_sbatch(
    profile: SlurmProfile,
    stage: str,
    trainer_args: list[str],
    service_overrides: dict[str, list[str]] | None = None,
    services: list[str] | None = None,
) -> str:
    """The whole sbatch script; `trainer_args` follow `rlfleet-trainer run`;
    `service_overrides` are each service's key=value overrides (the rollout's engine=
    and model=, as `rollout_overrides` makes them); `services` as for `components`."""
    overrides = service_overrides or {}
    comps = components(profile, services)
    logs = f"{profile.job_dir}/$SLURM_JOB_ID"
    head = ["#!/bin/bash", f"#SBATCH --job-name=rlfleet-{stage}"]
    if profile.account:
        head.append(f"#SBATCH --account={profile.account}")
    if profile.time:
        head.append(f"#SBATCH --time={profile.time}")
    # job_dir is made by the submitter: SLURM does not create the output's folder.
    head.append(f"#SBATCH --output={profile.job_dir}/slurm-%j.out")
    for i, comp in enumerate(comps):
        if i:
            head.append("#SBATCH hetjob")
        if comp.partition:
            head.append(f"#SBATCH --partition={comp.partition}")
        head += [
            f"#SBATCH --nodes={comp.nodes}",
            f"#SBATCH --ntasks-per-node={comp.tasks_per_node}",
        ]
        if profile.exclusive:
            head.append("#SBATCH --exclusive")
        if comp.gpus_per_node:
            head.append(f"#SBATCH --gpus-per-node={comp.gpus_per_node}")
    body = [
        "",
        "set -euo pipefail",
        f'LOGS="{logs}"',
        'export ADDRESSES="$LOGS/addresses.env"',
        'mkdir -p "$LOGS" && : > "$ADDRESSES"',
        f"START_TIMEOUT_S={profile.start_timeout_s}",
        "declare -A STEPS=()  # pid of each service's srun -> service",
        'TRAINER_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | head -n1)',
        "export TRAINER_HEAD",
        "",
        "# the fleet's shared auth token (docs/security.md): every service binds 0.0.0.0",
        'if [[ -z "${RLFLEET_AUTH_TOKEN_FILE:-}${RLFLEET_AUTH_TOKEN:-}" ]]; then',
        '  export RLFLEET_AUTH_TOKEN_FILE="$LOGS/auth_token"',
        "  (umask 077 && head -c 32 /dev/urandom | base64 -w0 | tr '+/' '-_' | tr -d '=' "
        '> "$RLFLEET_AUTH_TOKEN_FILE")',
        "fi",
        *_cache_lines(profile),
        "",
        WAIT_FOR,
        "",
    ]
    indexed = list(enumerate(comps))
    commands = service_commands(profile, comps, overrides)
    # The reward gateway needs the sandbox's and the swe-runner's addresses, so it starts
    # after the others.
    for i, comp in sorted(indexed[1:], key=lambda ic: ic[1].service == "reward"):
        command = commands[comp.service]
        if comp.service == "reward" and _reward_targets(comps):
            body.append(_wait_for(list(_reward_targets(comps).values())))
        body.append(f'{srun_line(profile, i, comp, command)} > "$LOGS/{comp.service}.log" 2>&1 &')
        body.append(f"STEPS[$!]={comp.service}")
    body += [
        "",
        "# every service publishes its address once SERVING; then the trainer starts",
        _wait_for([c.target_var for c in comps[1:]]),
        "",
    ]
    trainer = [
        ENTRY["trainer"],
        "run",
        *trainer_args,
        "services.rollout=$ROLLOUT_TARGET",
        "services.reward=$REWARD_TARGET",
        *overrides.get("trainer", []),
    ]
    body += [
        "set +e",
        f'{srun_line(profile, 0, comps[0], trainer)} 2>&1 | tee "$LOGS/trainer.log"',
        "status=${PIPESTATUS[0]}",
        "kill $(jobs -p) 2>/dev/null",
        'echo "rlfleet: trainer exited with $status"',
        "exit $status",
    ]
    return "\n".join(head + body) + "\n"
