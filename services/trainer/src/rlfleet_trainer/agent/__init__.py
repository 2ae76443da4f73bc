"""Multi-turn (agentic) rollouts: the policy calls an episode's tools turn by turn.

- `tool_format`: how tools are described to the model and how its tool calls are parsed.
- `render`: the chat template's token ids for the prompt (with tools) and for the
  environment's turns (tool results plus the next assistant header).
- `episodes`: the trainer's side of the reward gateway's episode RPCs.
- `rollout`: one trajectory's loop and a prompt's group of them.
"""
