"""`rlfleet-rollout`: run the rollout service (same flags as `rlfleet serve rollout`)."""

from rlfleet_core.server import service_main

from rlfleet_rollout.service import SERVICE


def main() -> None:
    service_main(SERVICE)


if __name__ == "__main__":
    main()
