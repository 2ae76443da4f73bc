"""`rlfleet-sandbox`: run the sandbox service (same flags as `rlfleet serve sandbox`)."""

from rlfleet_core.server import service_main

from rlfleet_sandbox.service import SERVICE


def main() -> None:
    service_main(SERVICE)


if __name__ == "__main__":
    main()
