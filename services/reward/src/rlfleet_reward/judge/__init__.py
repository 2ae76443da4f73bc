"""LLM judges for the reward gateway: the OpenAI-compatible client (client.py), its
settings (config.py) and the GenRM comparison arithmetic (genrm.py)."""
