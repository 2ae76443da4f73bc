"""Where a stage runs: `local` (processes on this machine), `compose` (the containers of
deploy/compose) or `slurm` (one heterogeneous job, one component per service)."""
