"""Prefix caching for the hf engine: the KV of finished samples, reused by later prompts.

A multi-turn episode sends its whole conversation again every turn, and a judge's prompts
share their instructions and the question; without reuse each request prefills from token
0 (a 700-token tool-use conversation re-read at every turn, by every trajectory). A
finished sample leaves the keys and values of its prompt and generated tokens here; a
later prompt takes the longest common prefix with any of them and prefills only the rest.

Entries belong to the weight version they were computed under: a lookup under another
version empties the store first, so no prompt is ever continued from keys computed under
other weights. Only
caches made of plain attention layers take part (`supports`); a sliding-window or a
recurrent (Mamba) layer's state cannot be cut at an arbitrary token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlfleet_rollout.engines.requests import left_padded

MIN_REUSE = 16
"""Shorter common prefixes are prefilled again: the saving would not pay for the copy."""


@dataclass
class _Entry:
    tokens: torch.Tensor
    """The token ids whose keys and values are held (1-D, int64, on the CPU)."""
    keys: list[torch.Tensor]
    """Per layer [heads, tokens, head_dim]."""
    values: list[torch.Tensor]
    nbytes: int


@dataclass
class Hit:
    """A reusable prefix of one prompt: its first `length` tokens' keys and values."""

    length: int
    entry: _Entry | None


NO_HIT = Hit(0, None)


def supports(cache: Any) -> bool:
    """True for a cache made only of plain attention layers (transformers' DynamicLayer)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class PrefixCache:
    """Least-recently-used store of per-sample keys and values, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_id = 0
        self._version = 0
        self.bytes = 0
        self.reused_tokens = 0
        """Prompt tokens not prefilled thanks to a hit (a counter for tests and status)."""

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def _at(self, version: int) -> None:
        if version != self._version:
            self.clear()
            self._version = version

    def lookup(self, tokens: Sequence[int], version: int) -> Hit:
        """The longest prefix of `tokens` held for weight `version`, leaving at least its
        last token to prefill (its logits start the sample)."""
        self._at(version)
        if not self._entries or len(tokens) <= MIN_REUSE:
            return NO_HIT
        query = torch.tensor(tokens, dtype=torch.long)
        best, best_id = 0, -1
        for entry_id, entry in self._entries.items():
            n = min(len(entry.tokens), len(query) - 1)
            same = entry.tokens[:n] == query[:n]
            length = n if bool(same.all()) else int(same.to(torch.int8).argmin())
            if length > best:
                best, best_id = length, entry_id
        if best < MIN_REUSE:
            return NO_HIT
        self._entries.move_to_end(best_id)
        self.reused_tokens += best
        return Hit(best, self._entries[best_id])

    def store(
        self,
        tokens: Sequence[int],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        version: int,
    ) -> None:
        """Hold one sample's keys and values (per layer [heads, len(tokens), head_dim]),
        all computed under weight `version`."""
        if version < self._version:
            return
        self._at(version)
        nbytes = sum(t.numel() * t.element_size() for t in (*keys, *values))
        if len(tokens) <= MIN_REUSE or nbytes > self.max_bytes:
            return
        held = torch.tensor(tokens, dtype=torch.long)
        # An entry this one extends is a prefix of it: the new one serves every lookup it did.
        for entry_id, entry in list(self._entries.items()):
            n = len(entry.tokens)
            if n <= len(held) and bool((held[:n] == entry.tokens).all()):
                self._drop(entry_id)
        while self._entries and self.bytes + nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[self._next_id] = _Entry(held, keys, values, nbytes)
        self._next_id += 1
        self.bytes += nbytes

    def keep(
        self, cache: Any, mask: torch.Tensor, rows: list[tuple[int, list[int]]], version: int
    ) -> None:
        """Store each (batch row, its token ids) of a decode batch's `cache` (with its
        attention `mask`), computed under weight `version`."""
        if not rows or not supports(cache):
            return
        for b, tokens in rows:
            self.store(tokens, *row_kv(cache, mask, b, len(tokens)), version)

    def _drop(self, entry_id: int) -> None:
        self.bytes -= self._entries.pop(entry_id).nbytes


def row_kv(
    cache: Any, mask: torch.Tensor, row: int, length: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Copies of row `row`'s first `length` real positions (mask 1) in every layer."""
    where = mask[row].nonzero().squeeze(-1)[:length]
    keys = [layer.keys[row][:, where].clone() for layer in cache.layers]
    values = [layer.values[row][:, where].clone() for layer in cache.layers]
    return keys, values


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], tuple[Any, torch.Tensor]]
"""(ids, attention mask over past + ids, positions of ids, past cache or None) ->
(cache, the last position's logits)."""


def prefill(
    forward: Forward,
    prompts: Sequence[Sequence[int]],
    hits: Sequence[Hit],
    pad: int,
    device: torch.device,
    rows: Sequence[int] | None = None,
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill `prompts` (each after its hit's cached prefix): (cache, last logits, mask,
    next positions), left-padded as in a plain prefill, a row per entry of `rows` (the
    prompt each batch row starts from; default: one row per prompt, in order).

    Prompts whose remaining lengths differ a lot go through in separate forward passes
    (a 10-token continuation does not pad to a 700-token first turn); the results are
    joined into one batch by left-padding the keys, values and mask, and put in the
    order of `rows` with one copy of the cache."""
    rest = [len(p) - h.length for p, h in zip(prompts, hits, strict=True)]
    groups: list[list[int]] = []
    for b in sorted(range(len(prompts)), key=rest.__getitem__, reverse=True):
        if groups and 2 * rest[b] >= rest[groups[-1][0]]:
            groups[-1].append(b)
        else:
            groups.append([b])
    parts = [
        _prefill_group(forward, [prompts[b] for b in g], [hits[b] for b in g], pad, device)
        for g in groups
    ]
    cache, logits, mask, next_pos = parts[0] if len(parts) == 1 else _join(parts)
    # Each prompt's row in the joined batch, then the batch row each output row copies.
    place = torch.empty(len(prompts), dtype=torch.long)
    place[torch.tensor([b for g in groups for b in g])] = torch.arange(len(prompts))
    index = place if rows is None else place[torch.tensor(list(rows), dtype=torch.long)]
    if len(index) == len(place) and bool((index == torch.arange(len(place))).all()):
        return cache, logits, mask, next_pos
    index = index.to(device)
    cache.reorder_cache(index)  # index_select along the batch: repeats copy a row
    return cache, logits[index], mask[index], next_pos[index]


def _prefill_group(
    forward: Forward, prompts: list[Sequence[int]], hits: list[Hit], pad: int, device: torch.device
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    from transformers import DynamicCache

    ids, rest_mask = left_padded([p[h.length :] for p, h in zip(prompts, hits, strict=True)], pad)
    reuse = max(h.length for h in hits)
    past = None
    head_mask = torch.zeros((len(prompts), reuse), dtype=torch.long)
    if reuse:
        for b, hit in enumerate(hits):
            head_mask[b, reuse - hit.length :] = 1
        like = next(h.entry for h in hits if h.entry is not None)
        past = DynamicCache(
            ddp_cache_data=[
                (_stacked(hits, reuse, like, "keys", i), _stacked(hits, reuse, like, "values", i))
                for i in range(len(like.keys))
            ]
        )
    mask = torch.cat([head_mask, rest_mask], dim=-1).to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)[:, reuse:]
    cache, logits = forward(ids.to(device), mask, positions, past)
    return cache, logits, mask, positions[:, -1] + 1


def _stacked(hits: list[Hit], width: int, like: _Entry, kind: str, layer: int) -> torch.Tensor:
    """[rows, heads, width, head_dim]: each row's cached `kind` ("keys" or "values") of
    `layer`, its hit's first positions right-aligned (zeros before them are masked out)."""
    sample: torch.Tensor = getattr(like, kind)[layer]
    heads, _, dim = sample.shape
    out = sample.new_zeros((len(hits), heads, width, dim))
    for b, hit in enumerate(hits):
        if hit.entry is not None and hit.length:
            out[b, :, width - hit.length :] = getattr(hit.entry, kind)[layer][:, : hit.length]
    return out


def _join(
    parts: list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]],
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Several prefilled batches as one: each left-padded to the widest."""
    from transformers import DynamicCache

    width = max(mask.shape[-1] for _, _, mask, _ in parts)

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if not missing:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    layers = []
    for i in range(len(parts[0][0].layers)):
        keys = torch.cat([pad(c.layers[i].keys, -2) for c, _, _, _ in parts])
        values = torch.cat([pad(c.layers[i].values, -2) for c, _, _, _ in parts])
        layers.append((keys, values))
    return (
        DynamicCache(ddp_cache_data=layers),
        torch.cat([logits for _, logits, _, _ in parts]),
        torch.cat([pad(mask, -1) for _, _, mask, _ in parts]),
        torch.cat([next_pos for _, _, _, next_pos in parts]),
    )
