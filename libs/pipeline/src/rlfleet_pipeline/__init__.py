"""rlfleet-pipeline: stages, the local fleet, launchers, recipes and the report."""
