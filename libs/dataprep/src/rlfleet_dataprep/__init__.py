"""rlfleet-dataprep: bundled blends, placeholder sources and the curriculum pass."""
