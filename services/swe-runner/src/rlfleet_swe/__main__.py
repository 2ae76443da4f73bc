"""`rlfleet-swe`: run the swe-runner service (same flags as `rlfleet serve swe-runner`)."""

from rlfleet_core.server import service_main

from rlfleet_swe.service import SERVICE


def main() -> None:
    service_main(SERVICE)


if __name__ == "__main__":
    main()
