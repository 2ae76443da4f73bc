"""rlfleet wire contracts (package `rlfleet.v1`), generated from protos/.

Import messages and stubs from `rlfleet_proto.v1`, e.g.
`from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlfleet-proto")
except PackageNotFoundError:  # imported from a source tree (e.g. a GPU box's PYTHONPATH)
    __version__ = "0+source"

# Full gRPC service names, as used by health checks and reflection.
ROLLOUT_SERVICE = "rlfleet.v1.RolloutService"
REWARD_SERVICE = "rlfleet.v1.RewardService"
SANDBOX_SERVICE = "rlfleet.v1.SandboxService"
SWE_RUNNER_SERVICE = "rlfleet.v1.SweRunnerService"
TRAINER_SERVICE = "rlfleet.v1.TrainerService"
