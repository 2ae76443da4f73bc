"""The `rlfleet` command: one entry for serving, running, preparing data and benchmarks.

This module only builds the typer app; each command lives in rlfleet_cli.commands and
shares the consoles and error exits of rlfleet_cli.ui. Config knobs are dotted
`key=value` overrides, not new flags: flags are kept to the few that every command needs
(ports, config file, output folder).
"""

from __future__ import annotations

import signal

import typer

from rlfleet_cli.commands import (
    bench,
    config,
    data,
    doctor,
    report,
    reward,
    rl,
    run,
    serve,
    status,
    web,
)

app = typer.Typer(
    name="rlfleet",
    help="rlfleet: multi-stage GRPO post-training of LLMs (RLVR → SWE-RL → RLHF) as gRPC services.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _interruptible() -> None:
    # A process started in the background by a non-interactive shell (a CI script, a
    # `cmd &`) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt:
    # Ctrl-C / kill -INT must still stop every command cleanly (`rlfleet rl --run slurm`
    # cancels its job, `rlfleet run` stops its stage; `serve` installs its own handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Registration order is the order of `rlfleet --help`.
app.command()(serve.version)
app.command(context_settings={"allow_extra_args": False})(serve.serve)
app.command()(serve.up)
app.command()(status.status)
app.command()(web.ui)
app.command()(doctor.doctor)
app.command()(run.run)
app.add_typer(data.data_app, name="data")
app.add_typer(reward.reward_app, name="reward")
app.command()(rl.rl)
app.command()(report.report)
app.command()(bench.bench)
app.add_typer(config.config_app, name="config")


if __name__ == "__main__":
    app()
