"""rlfleet-contracts: the recipe schema, data rows, run-folder layout and typed clients several packages share."""
