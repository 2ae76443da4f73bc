"""`rlfleet-trainer`: run the trainer service (same flags as `rlfleet serve trainer`)."""

from rlfleet_core.server import service_main

from rlfleet_trainer.service import SERVICE


def main() -> None:
    service_main(SERVICE)


if __name__ == "__main__":
    main()
