"""Model catalog: architecture facts of every model the experiments accept.

Facts come from ``data/models.json`` (a copy of ``model_catalog.json``, docs/reference/published-runs.md §1; each
entry keeps its ``source`` and ``confidence``). A model can also be given as a path to a Hugging
Face ``config.json`` (or a folder holding one) so users can plan and run models outside the catalog.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunebench.errors import InputError, parse_json, suggest

DATA = Path(__file__).parent / "data"

# transformers decoder-layer class per model_type: what FSDP wraps (TRANSFORMER_BASED_WRAP) and what
# accelerate falls back to through the model's _no_split_modules (transformers/models/<type>/modeling_*.py).
DECODER_LAYER_CLASS = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "gemma": "GemmaDecoderLayer",
    "phi3": "Phi3DecoderLayer",
    "granite": "GraniteDecoderLayer",
    "granitemoe": "GraniteMoeDecoderLayer",
    "granitemoehybrid": "GraniteMoeHybridDecoderLayer",
    "gpt_bigcode": "GPTBigCodeBlock",
    "bloom": "BloomBlock",
}
VISION_LAYER_CLASS = {"clip_vision_model": "CLIPEncoderLayer", "siglip_vision_model": "SiglipEncoderLayer"}

# PretrainedConfig subclasses' default for tie_word_embeddings when config.json omits it
# (transformers/models/<type>/configuration_*.py).
_TIE_DEFAULT = {"gemma": True, "gpt_bigcode": True, "bloom": True}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one model. Sizes are counts (parameters, tokens), not bytes."""

    name: str
    model_type: str
    hf_id: str | None = None
    architectures: tuple[str, ...] = ()
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool | None = None
    num_local_experts: int | None = None
    num_experts_per_tok: int | None = None
    decoder_layer_class: str | None = None
    fsdp_wrap_classes: tuple[str, ...] = ()
    total_params: int | None = None
    active_params: int | None = None
    confidence: str = "verified"
    source: tuple[str, ...] = ()
    config_path: str | None = None  # set when the model came from a config.json
    aliases: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_moe(self) -> bool:
        return bool(self.num_local_experts)

    @property
    def is_vision(self) -> bool:
        """A vision-language model (LLaVA-NeXT and others with a vision tower)."""
        return self.model_type == "llava_next" or bool((self.extra.get("config") or {}).get("vision_config"))

    @property
    def wrap_classes(self) -> str | None:
        """fsdp_transformer_layer_cls_to_wrap value: comma-separated class names."""
        classes = self.fsdp_wrap_classes or ((self.decoder_layer_class,) if self.decoder_layer_class else ())
        return ",".join(classes) or None


# Short names people type for catalog models, beyond the catalog's names, HF ids and their last part
# (which are aliases already): the one table of them. Each maps to the catalog model it means; a base
# model is never resolved to an instruct one (granite-3.1-8b is suggested granite-3.1-8b-instruct).
SHORT_NAMES = {
    "mistral-7b": "mistral-7b-v0.1",  # the SFTTrainer spec's Mistral-7B, the catalog's only one
    "llama-2-70b": "llama2-70b",
    "llama-3-8b": "llama3-8b",
    "llama-3-70b": "llama3-70b",
}


def _aliases(name: str, hf_id: str | None) -> tuple[str, ...]:
    out = {name.lower(), *(short for short, target in SHORT_NAMES.items() if target == name)}
    if hf_id:
        out |= {hf_id.lower(), hf_id.split("/")[-1].lower()}
    return tuple(sorted(out))


def _from_catalog_entry(entry: dict[str, Any]) -> ModelSpec:
    known = set(ModelSpec.__dataclass_fields__) - {"extra", "aliases", "architectures", "fsdp_wrap_classes", "source"}
    kwargs = {k: entry.get(k) for k in known if k in entry}
    wrap = entry.get("fsdp_wrap_classes") or (
        [entry["decoder_layer_class"]] if entry.get("decoder_layer_class") else []
    )
    return ModelSpec(
        **kwargs,
        architectures=tuple(entry.get("architectures") or ()),
        fsdp_wrap_classes=tuple(wrap),
        source=tuple(entry.get("source") or ()),
        aliases=_aliases(entry["name"], entry.get("hf_id")),
        extra={k: v for k, v in entry.items() if k not in ModelSpec.__dataclass_fields__},
    )


@functools.cache
def load_models() -> dict[str, ModelSpec]:
    """The catalog, keyed by short name (the SFTTrainer spec model_name values plus the extras in the file)."""
    raw = json.loads((DATA / "models.json").read_text())
    return {name: _from_catalog_entry(entry) for name, entry in raw.items() if not name.startswith("_")}


@functools.cache
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for name, spec in load_models().items():
        for alias in spec.aliases:
            index.setdefault(alias, name)
    return index


def _first(cfg: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


# Names the usual config fields go by across model families (transformers configuration_*.py and
# the remote-code configs of the Hub): the first one present wins.
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "hidden_dim", "model_dim", "embed_dim", "dim")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
KV_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
FFN_KEYS = ("intermediate_size", "ffn_hidden_size", "n_inner", "d_ff", "ffn_dim", "mlp_dim")
VOCAB_KEYS = ("vocab_size", "padded_vocab_size", "n_vocab")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len", "max_sequence_length", "n_ctx")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def chatglm_fields(text: dict[str, Any]) -> dict[str, Any]:
    """vocab_size and num_key_value_heads of a ChatGLM2/3 config (model_type chatglm, remote code) as its
    modelling code reads them (THUDM/chatglm3-6b modeling_chatglm.py): the embedding and the output layer have
    padded_vocab_size rows; multi_query_group_num key/value groups only with multi_query_attention."""
    heads = _first(text, *HEAD_KEYS)
    return {
        "vocab_size": _first(text, "padded_vocab_size", "vocab_size"),
        "num_key_value_heads": (text.get("multi_query_group_num") or 1) if text.get("multi_query_attention") else heads,
    }


def text_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (``text_config`` of multimodal models), else the config."""
    text = cfg.get("text_config") or cfg.get("llm_config")
    return {**text, "model_type": text.get("model_type")} if isinstance(text, dict) else cfg


# Bounds of a config's dimensions: an order of magnitude beyond the largest published model (hidden 18,432
# for PaLM-540B, 126 layers for Llama-3.1-405B, 256 k vocabulary for Gemma), so a typo or an overflow is
# refused before it reaches the planner's arithmetic or a tensor allocation. None: the field may be absent.
DIMENSION_BOUNDS = {
    "hidden_size": (1, 2**20, True), "num_hidden_layers": (1, 10_000, True), "vocab_size": (1, 2**24, True),
    "num_attention_heads": (1, 2**16, False), "num_key_value_heads": (1, 2**16, False),
    "head_dim": (1, 2**16, False), "intermediate_size": (1, 2**24, False), "num_local_experts": (0, 2**16, False),
    "num_experts_per_tok": (0, 2**16, False),
}  # fmt: skip


def check_dimensions(fields: dict[str, Any], name: str) -> None:
    """Refuse a config whose model dimensions are missing, not integers, or out of DIMENSION_BOUNDS: one
    line naming the file and the field (a missing hidden_size would otherwise take transformers' default)."""
    for key, (low, high, required) in DIMENSION_BOUNDS.items():
        value = fields.get(key)
        if value is None and not required:
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            got = "missing" if value is None else repr(value)[:40]
            raise InputError("model_name", f"config {name!r}: {key} {got}", allowed=f"an integer {low}..{high:,}")
    heads, kv = fields.get("num_attention_heads"), fields.get("num_key_value_heads")
    if heads and kv and heads % kv:  # grouped-query attention repeats each key/value head heads / kv times
        raise InputError(
            "model_name",
            f"config {name!r}: num_key_value_heads {kv} does not divide num_attention_heads {heads}",
            allowed=f"a divisor of {heads}",
        )


def spec_from_config(cfg: dict[str, Any], name: str, config_path: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config dict of any model type (key names differ per family).

    The spec is what commands display and validity rules read; the planner sizes the model from the
    config itself (tunebench.plan.structure), so no model type is refused here.
    """
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError("model_name", f"config {name!r} has no model_type", allowed="a Hugging Face config.json")
    text = text_fields(cfg)
    # LlavaNextConfig's text model defaults to llama (transformers models/llava_next/configuration_llava_next.py)
    text_type = text.get("model_type") or ("llama" if model_type == "llava_next" else model_type)
    hidden = _first(text, *HIDDEN_KEYS)
    heads = _first(text, *HEAD_KEYS)
    attn_config = text.get("attn_config") if isinstance(text.get("attn_config"), dict) else {}
    if text.get("multi_query") is True or (text_type == "gpt_bigcode" and text.get("multi_query", True)):
        kv = 1
    else:
        kv = _first(text, *KV_KEYS) or attn_config.get("kv_n_heads") or heads
    vocab = _first(text, *VOCAB_KEYS)
    if text_type == "chatglm":
        vocab, kv = chatglm_fields(text)["vocab_size"], chatglm_fields(text)["num_key_value_heads"]
    layers, intermediate = _first(text, *LAYER_KEYS), _first(text, *FFN_KEYS)
    check_dimensions(
        {
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "vocab_size": vocab,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": _first(text, "head_dim", "kv_channels"),
            "intermediate_size": intermediate,
            "num_local_experts": _first(text, *EXPERT_KEYS),
            "num_experts_per_tok": _first(text, "num_experts_per_tok", "moe_top_k", "top_k"),
        },
        name,
    )
    ratio = text.get("expansion_ratio")
    if intermediate is None and isinstance(ratio, (int, float)) and 0 < ratio <= 64:
        intermediate = int(ratio * hidden)  # MPT
    if intermediate is None and text_type in ("gpt_bigcode", "bloom", "gpt2", "falcon", "gpt_neox"):
        intermediate = 4 * hidden  # these families default to a 4 x hidden MLP
    head_dim = _first(text, "head_dim", "kv_channels") or (hidden // heads if heads else None)
    tie = _first(cfg, "tie_word_embeddings")
    if tie is None:
        tie = _first(text, "tie_word_embeddings")
    if tie is None:
        tie = _TIE_DEFAULT.get(text_type, False)
    decoder = DECODER_LAYER_CLASS.get(text_type)
    vision_class = VISION_LAYER_CLASS.get((cfg.get("vision_config") or {}).get("model_type", ""))
    wrap = tuple(c for c in (decoder, vision_class) if c)
    return ModelSpec(
        name=name,
        model_type=model_type,
        hf_id=cfg.get("_name_or_path") or None,
        architectures=tuple(cfg.get("architectures") or ()),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=_first(text, *POSITION_KEYS),
        tie_word_embeddings=bool(tie),
        num_local_experts=_first(text, *EXPERT_KEYS),
        num_experts_per_tok=_first(text, "num_experts_per_tok", "moe_top_k", "top_k"),
        decoder_layer_class=decoder,
        fsdp_wrap_classes=wrap,
        confidence="config.json",
        source=(config_path,) if config_path else (),
        config_path=config_path,
        extra={"config": cfg},
    )


def _looks_like_path(value: str) -> bool:
    return value.endswith(".json") or value.startswith((".", "/", "~")) or os.path.exists(value)


def hf_cached_config(repo_id: str) -> Path | None:
    """The config.json of a Hugging Face model id in the local Hugging Face cache (HF_HUB_CACHE, else
    HF_HOME/hub), found by huggingface_hub's try_to_load_from_cache: local files only, never the network.
    None when the cache does not hold it (or repo_id is no valid id)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # huggingface_hub comes with transformers; without it there is no cache to read
        return None
    try:
        hit = try_to_load_from_cache(repo_id, "config.json")  # its cache_dir: constants.HF_HUB_CACHE
    except ValueError:  # huggingface_hub's HFValidationError: not a repo id ("a b", "x/y/z")
        return None
    return Path(hit) if isinstance(hit, str) and Path(hit).is_file() else None


def _hf_cache() -> str:
    try:
        from huggingface_hub import constants
    except ImportError:
        return "(huggingface_hub is not installed)"
    return constants.HF_HUB_CACHE


def load_config_model(value: str, name: str | None = None) -> ModelSpec:
    """A model given as a config.json path or a folder holding one; name: what to call it (default:
    the config's absolute path)."""
    path = Path(value).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(
            "model_name", f"no config.json at {str(path)!r}", allowed="a catalog name or a config.json path"
        )
    from tunebench.inputs import text_of  # size, UTF-8 and NUL checks of every text input

    try:
        cfg = parse_json(text_of(path))
    except ValueError as exc:
        raise InputError("model_name", f"cannot read {str(path)!r} as JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise InputError("model_name", f"{str(path)!r} is not a JSON object", allowed="a Hugging Face config.json")
    resolved = str(path.resolve())
    return spec_from_config(cfg, name=name or resolved, config_path=resolved)


def _download_hint(text: str) -> str:
    """For a Hugging Face id ("org/name"): the command that caches its config.json (a few KB; the planner
    itself never goes to the network, hf_cached_config), else ""."""
    org, _, name = text.partition("/")
    if not (org and name) or "/" in name or any(ch.isspace() for ch in text):
        return ""
    return f" Cache its config.json once with `hf download {text} config.json` (huggingface_hub's CLI)."


def get_model(value: str) -> ModelSpec:
    """Look a model up by short name, case-insensitive alias (SHORT_NAMES among them), HF id of a catalog
    model, config.json path, or any Hugging Face id whose config.json is in the local Hugging Face cache
    (named by that id)."""
    text = str(value).strip()
    models = load_models()
    if text in models:
        return models[text]
    name = _alias_index().get(text.lower())
    if name:
        return models[name]
    if _looks_like_path(text):
        return load_config_model(text)
    cached = hf_cached_config(text)
    if cached is not None:
        return load_config_model(str(cached), name=text)
    raise InputError(
        "model_name",
        f"unknown model {text!r}: not in the catalog, and no config.json of it in the Hugging Face cache "
        f"{_hf_cache()}." + (_download_hint(text) or suggest(text, models)),
        allowed="a name from `tunebench models`, a Hugging Face id in the local cache (HF_HUB_CACHE or HF_HOME), "
        "or a path to a config.json",
    )


def list_models() -> list[ModelSpec]:
    return list(load_models().values())


@functools.cache
def _target_module_maps() -> dict[str, dict[str, list[str]]]:
    return json.loads((DATA / "lora_target_modules.json").read_text())


def default_target_modules(experiment_family: str, model_name: str) -> tuple[str, ...] | None:
    """The LoRA target modules the reference hardcodes for a model (the SFTTrainer spec "Hardcoded").

    experiment_family is 'finetune_lora_benchmark' or 'finetune_gptq-lora_benchmark'.
    """
    found = _target_module_maps().get(experiment_family, {}).get(model_name)
    return tuple(found) if found else None


@functools.cache
def model_paths() -> dict[str, dict[str, str]]:
    """Reference model_map: short name -> {Vanilla, GPTQ-Quantized} -> HF id or path."""
    import yaml

    return yaml.safe_load((DATA / "model_paths.yaml").read_text()) or {}
