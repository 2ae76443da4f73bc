"""`rlfleet-reward`: run the reward service (same flags as `rlfleet serve reward`)."""

from rlfleet_core.server import service_main

from rlfleet_reward.service import SERVICE


def main() -> None:
    service_main(SERVICE)


if __name__ == "__main__":
    main()
