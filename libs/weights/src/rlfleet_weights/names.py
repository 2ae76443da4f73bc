"""Weight names on the wire and on disk: the HF checkpoint's own.

A transformers model may hold its weights under other names and shapes than its
checkpoint: Nemotron-H's checkpoint names every expert (`backbone.layers.1.mixer.experts.
3.up_proj.weight`, 2-D), its module holds one fused 3-D tensor per layer (`model.layers.1.
mixer.experts.up_proj`), as transformers 5 maps them at load (its conversion mapping).
Weight updates, exports and vLLM's loaders all speak the checkpoint's names, so the
trainer sends those and the hf engine receives those; for models whose module names are
the checkpoint's (Llama, Qwen2) both functions change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def checkpoint_named(model: Any, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors`, keyed by `model`'s own parameter names, under the checkpoint's names
    (transformers' reverse of the mapping it applied at load). A fused tensor comes back
    as one view per checkpoint tensor: nothing is copied."""
    from transformers.core_model_loading import revert_weight_conversion

    return dict(revert_weight_conversion(model, dict(tensors)))


def checkpoint_views(model: Any) -> dict[str, torch.Tensor]:
    """Every weight an update may name (parameters and buffers; tied weights under each of
    their names), under checkpoint names, as views into `model`'s own tensors: copying
    into a view writes the model."""
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    detached: dict[int, torch.Tensor] = {}  # one object per tied weight (staging shares it)
    own = {name: detached.setdefault(id(t), t.detach()) for name, t in named}
    views = checkpoint_named(model, own)
    storages = {tensor.untyped_storage().data_ptr() for tensor in own.values()}
    copied = [n for n, t in views.items() if t.untyped_storage().data_ptr() not in storages]
    if copied:  # a conversion that copies would make updates write into nothing
        raise RuntimeError(
            f"{type(model).__name__}: checkpoint names {copied[:3]} are not views of the "
            "model's weights (a transformers conversion that copies); updates cannot land"
        )
    return views
