"""The commands of `rlfleet`, one module per command group."""
