"""Weight updates by name into the hf engine serving a hybrid Mamba-2 / attention / MoE
model (the bundled `tiny-nemotron-h`), one parameter kind at a time.

An update names tensors as the checkpoint does (rlfleet_weights.names): every routed
expert on its own, although the module fuses them. For each kind (Mamba's `A_log`, `D`,
`dt_bias`, conv1d, projections; routed experts, shared experts, the router and its
aux-loss-free bias; attention; norms, embeddings and head) an update changes only that
kind's tensors; the engine's greedy logprobs must then match a float32 reference built
with those weights and must have moved (an update that lands nowhere would still pass
a match against stale weights otherwise). The random weights barely use the SSM state
(in_proj at std 0.02 makes its term ~1e-6 of a logprob), so a first, whole update scales
in_proj 30x: then every Mamba parameter moves the output. A kind the table does not name fails the test,
so a new parameter kind cannot go unchecked.

The engine decodes a token at a time (Mamba's recurrent step); a whole-sequence forward
(what the trainer runs: the chunked scan) is a different sum. With the scaled state the
two differ by ~1.4e-3 in a logprob in float32 (transformers' own generate included), and
by ~2e-2 once A_log is pushed far out; with the bundled weights by ~5e-7. So the engine
is checked against a teacher-forced step-by-step reference to 1e-4 after every update
(the weights landed exactly) and against the whole-sequence forward only before them.
"""

from __future__ import annotations

import pytest
import torch
from rlfleet_core.models import nemotron_h_parameter_kind, resolve_model
from rlfleet_weights.names import checkpoint_named
from weight_testlib import Reference, assert_close, greedy_samples, rollout_stub, stream_weights

PROMPT = [1, 300, 301, 302, 201, 1, 303, 304, 201]

SCALES: dict[str, float] = {
    # noise per parameter kind: large enough to move greedy logprobs
    "mamba A_log": 2.0,
    "mamba D": 2.0,
    "mamba dt_bias": 2.0,
    "mamba conv1d": 0.5,
    "mamba projections and gated norm": 0.2,
    "routed experts": 0.2,
    "shared experts": 0.2,
    "router": 1.0,
    "router bias (aux-loss-free)": 1.0,
    "attention": 0.2,
    "norms, embeddings, head": 0.2,
}


@torch.no_grad()
def _stepwise(
    reference: Reference, weights: dict[str, torch.Tensor], tokens: list[int]
) -> list[float]:
    """`tokens`' logprobs after PROMPT, fed one at a time through the model's cache."""
    model = reference.model
    model.load_state_dict(weights)
    out = model(input_ids=torch.tensor([PROMPT]), use_cache=True)
    logprobs = []
    for token in tokens:
        logprobs.append(float(torch.log_softmax(out.logits[0, -1].float(), dim=-1)[token]))
        out = model(
            input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True
        )
    return logprobs


def _check(reference: Reference, weights: dict[str, torch.Tensor], sample: object) -> None:
    got, tokens = list(sample.logprobs), list(sample.token_ids)  # type: ignore[attr-defined]
    assert_close(got, _stepwise(reference, weights, tokens))


@pytest.mark.asyncio
@pytest.mark.budget(120, "a hybrid model served; eleven updates, each checked by logprobs")
async def test_every_parameter_kind_lands_by_name() -> None:
    model_path = resolve_model("tiny-nemotron-h")
    reference = Reference(model_path, PROMPT)
    served = {name: tensor.clone() for name, tensor in reference.base.items()}
    # Views into `served` under checkpoint names: changing one changes `served`.
    views = checkpoint_named(reference.model, served)
    by_kind: dict[str, list[str]] = {}
    for name in views:
        by_kind.setdefault(nemotron_h_parameter_kind(name), []).append(name)
    assert set(by_kind) == set(SCALES), f"kinds without tensors: {set(SCALES) - set(by_kind)}"
    assert len(by_kind["routed experts"]) == 3 * 4 * 2  # 3 MoE layers x 4 experts x up/down

    gen = torch.Generator().manual_seed(7)
    async with rollout_stub(["engine=hf", f"model={model_path}"]) as stub:
        (before,) = await greedy_samples(stub, PROMPT, calls=1, n=1, max_tokens=12)
        _check(reference, served, before)
        assert_close(list(before.logprobs), reference.logprobs(served, list(before.token_ids)))
        with torch.no_grad():
            for name in by_kind["mamba projections and gated norm"]:
                if ".in_proj." in name:
                    views[name].mul_(30.0)
        whole = {name: tensor.clone() for name, tensor in views.items()}
        assert (await stream_weights(stub, 1, whole, timeout_s=60)).weight_version == 1
        (first,) = await greedy_samples(stub, PROMPT, calls=1, n=1, max_tokens=12)
        _check(reference, served, first)
        reference.base = {name: tensor.clone() for name, tensor in served.items()}
        for version, (kind, names) in enumerate(by_kind.items(), start=2):
            scale = SCALES[kind]
            with torch.no_grad():
                for name in names:
                    views[name].add_(scale * torch.randn(views[name].shape, generator=gen))
            update = {name: views[name].clone() for name in names}
            reply = await stream_weights(stub, version, update, timeout_s=60)
            assert reply.weight_version == version, kind
            (after,) = await greedy_samples(stub, PROMPT, calls=1, n=1, max_tokens=12)
            try:
                _check(reference, served, after)
            except AssertionError as exc:
                raise AssertionError(f"{kind}: {exc}") from None
            want = _stepwise(reference, served, list(after.token_ids))
            stale = _stepwise(reference, reference.base, list(after.token_ids))
            moved = max(abs(a - b) for a, b in zip(want, stale, strict=True))
            assert moved > 1e-3, f"{kind}: the update moved logprobs by only {moved:.1e}"
            reference.base = {name: tensor.clone() for name, tensor in served.items()}
