"""The sbatch script for one stage on SLURM: a heterogeneous job with one component per
service, each in its own container, each running Ray across its nodes.

Component order is fixed (trainer, rollout, reward[, sandbox][, swe-runner]). On every
component the first node runs the Ray head and the gRPC service; the other nodes join as
Ray workers. Services find each other through `<job_dir>/<jobid>/addresses.env`: each
component's first node appends `<SERVICE>_TARGET=host:port` once it is SERVING, and the
trainer starts only when every address is there, so no port is guessed across nodes.

Every service binds 0.0.0.0, so the job makes the fleet's shared auth token first
(`<job_dir>/<jobid>/auth_token`, mode 0600, 32 random bytes URL-safe like
`secrets.token_urlsafe(32)`) unless the submitter set RLFLEET_AUTH_TOKEN_FILE or
RLFLEET_AUTH_TOKEN; services and the trainer read it through RLFLEET_AUTH_TOKEN_FILE
(job_dir must be on a filesystem every node and container sees, as for addresses.env).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from rlfleet_pipeline.launch.profiles import SlurmProfile

ENTRY = {
    "rollout": "rlfleet-rollout",
    "reward": "rlfleet-reward",
    "sandbox": "rlfleet-sandbox",
    "swe-runner": "rlfleet-swe",
}
GPU_SERVICES = ("trainer", "rollout")


@dataclass
class Component:
    service: str
    nodes: int
    gpus_per_node: int
    partition: str

    @property
    def target_var(self) -> str:
        return self.service.upper().replace("-", "_") + "_TARGET"


def components(profile: SlurmProfile) -> list[Component]:
    n = profile.nodes
    cpu = profile.cpu_partition or profile.partition
    comps = [
        Component("trainer", n.trainer, profile.gpus_per_node, profile.partition),
        Component("rollout", n.rollout, profile.gpus_per_node, profile.partition),
        Component("reward", n.reward, 0, cpu),
    ]
    if n.sandbox:
        comps.append(Component("sandbox", n.sandbox, 0, cpu))
    if n.swe_runner:
        comps.append(Component("swe-runner", n.swe_runner, 0, cpu))
    return comps


def container_args(profile: SlurmProfile, service: str) -> tuple[list[str], list[str]]:
    """(srun flags, command prefix) that put `service` in its container."""
    image = profile.images.get(service)
    if image is None:
        raise ValueError(f"images.{service}: no container image set in the profile")
    if profile.container_runtime == "pyxis":
        flags = [f"--container-image={image}", "--no-container-mount-home"]
        if profile.mounts:
            flags.append(f"--container-mounts={','.join(profile.mounts)}")
        return flags, []
    binds = [f"--bind={m}" for m in profile.mounts]
    return [], [
        "apptainer",
        "exec",
        "--nv" if service in GPU_SERVICES else "--containall",
        *binds,
        image,
    ]


def _arg(value: str) -> str:
    """Shell-quote, but let `$VAR` expand on the node (addresses are known only there)."""
    if "$" in value and all(c.isalnum() or c in "$_.:=-/" for c in value):
        return f'"{value}"'
    return shlex.quote(value)


def _wait_for(variables: list[str]) -> str:
    ready = " && ".join(f'[[ -n "${{{v}:-}}" ]]' for v in variables)
    return f'until set -a && source "$ADDRESSES" && set +a && {ready}; do sleep 5; done'


def node_script(profile: SlurmProfile, index: int, comp: Component, command: list[str]) -> str:
    """Runs on every node of a component: Ray worker, or Ray head + the service."""
    publish = ""
    if comp.service != "trainer":
        port = profile.grpc_port
        publish = (
            f"  ( until python -m rlfleet_core.healthcheck 127.0.0.1:{port} >/dev/null 2>&1; "
            f'do sleep 2; done; echo "{comp.target_var}=$head:{port}" >> "$ADDRESSES" ) &\n'
        )
    return (
        f'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_{index}" | head -n1)\n'
        'if [[ "$(hostname)" == "$head" ]]; then\n'
        "  ray start --head --port=6379 --disable-usage-stats\n"
        f"{publish}"
        f"  exec {' '.join(_arg(a) for a in command)}\n"
        "else\n"
        '  exec ray start --address="$head:6379" --block --disable-usage-stats\n'
        "fi"
    )


def srun_line(profile: SlurmProfile, index: int, comp: Component, command: list[str]) -> str:
    flags, prefix = container_args(profile, comp.service)
    srun = [
        "srun",
        f"--het-group={index}",
        f"--nodes={comp.nodes}",
        "--ntasks-per-node=1",
        *flags,
        *prefix,
        "bash",
        "-c",
        node_script(profile, index, comp, command),
    ]
    return shlex.join(srun)


def render_sbatch(profile: SlurmProfile, stage: str, trainer_args: list[str]) -> str:
    """The whole sbatch script; `trainer_args` follow `rlfleet-trainer run`."""
    comps = components(profile)
    logs = f"{profile.job_dir}/$SLURM_JOB_ID"
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name=rlfleet-{stage}",
        f"#SBATCH --account={profile.account}",
        f"#SBATCH --time={profile.time}",
        f"#SBATCH --output={profile.job_dir}/%j/sbatch.log",
    ]
    for i, comp in enumerate(comps):
        if i:
            head.append("#SBATCH hetjob")
        head += [
            f"#SBATCH --partition={comp.partition}",
            f"#SBATCH --nodes={comp.nodes}",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --exclusive",
        ]
        if comp.gpus_per_node:
            head.append(f"#SBATCH --gpus-per-node={comp.gpus_per_node}")
    body = [
        "",
        "set -euo pipefail",
        f'export ADDRESSES="{logs}/addresses.env"',
        'mkdir -p "$(dirname "$ADDRESSES")" && : > "$ADDRESSES"',
        "",
        "# the fleet's shared auth token (docs/security.md): every service binds 0.0.0.0",
        'if [[ -z "${RLFLEET_AUTH_TOKEN_FILE:-}${RLFLEET_AUTH_TOKEN:-}" ]]; then',
        f'  export RLFLEET_AUTH_TOKEN_FILE="{logs}/auth_token"',
        "  (umask 077 && head -c 32 /dev/urandom | base64 -w0 | tr '+/' '-_' | tr -d '=' "
        '> "$RLFLEET_AUTH_TOKEN_FILE")',
        "fi",
    ]
    if profile.container_runtime != "pyxis":
        # apptainer --containall starts from a clean environment but passes APPTAINERENV_*.
        body += [
            'export APPTAINERENV_ADDRESSES="$ADDRESSES"',
            'export APPTAINERENV_RLFLEET_AUTH_TOKEN_FILE="${RLFLEET_AUTH_TOKEN_FILE:-}"',
            'export APPTAINERENV_RLFLEET_AUTH_TOKEN="${RLFLEET_AUTH_TOKEN:-}"',
        ]
    body.append("")
    port = ["--host", "0.0.0.0", "--port", str(profile.grpc_port)]
    indexed = list(enumerate(comps))
    # The reward gateway needs the sandbox's address, so it starts after the others.
    for i, comp in sorted(indexed[1:], key=lambda ic: ic[1].service == "reward"):
        command = [ENTRY[comp.service], *port]
        if comp.service == "reward" and profile.nodes.sandbox:
            body.append(_wait_for(["SANDBOX_TARGET"]))
            command.append("sandbox.target=$SANDBOX_TARGET")
        body.append(f'{srun_line(profile, i, comp, command)} > "{logs}/{comp.service}.log" 2>&1 &')
    body += [
        "",
        "# every service publishes its address once SERVING; then the trainer starts",
        _wait_for([c.target_var for c in comps[1:]]),
        "",
    ]
    trainer = [*trainer_args, "services.rollout=$ROLLOUT_TARGET", "services.reward=$REWARD_TARGET"]
    body += [
        f'{srun_line(profile, 0, comps[0], ["rlfleet-trainer", "run", *trainer])} 2>&1 | tee "{logs}/trainer.log"',
        "status=${PIPESTATUS[0]}",
        "kill $(jobs -p) 2>/dev/null || true",
        "exit $status",
    ]
    return "\n".join(head + body) + "\n"
