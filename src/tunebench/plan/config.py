"""The transformers config the planner builds a model from: any model type, with stated assumptions.

A model whose ``model_type`` transformers knows is built from its own config class (every field
of the config.json that the class accepts; read-only fields it computes itself are dropped and
listed). Any other config (remote-code models such as first-generation Qwen, ChatGLM, Baichuan,
InternLM) is read generically: the usual dimension fields under their family names become a
llama-like decoder (gated MLP, rotary positions, RMSNorm), and the output says so.

Imports transformers: only the planner's cold path (building a structure or a trace) calls this.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from typing import Any

from tunebench.catalog import ModelSpec
from tunebench.catalog.hf_config import config_dict
from tunebench.catalog.models import (
    FFN_KEYS, HEAD_KEYS, HIDDEN_KEYS, KV_KEYS, LAYER_KEYS, POSITION_KEYS, VOCAB_KEYS, _first, text_fields,
)  # fmt: skip
from tunebench.errors import InputError

# Remote-code families whose fields mean something else than a llama config's (their modeling code
# on the Hub): the per-matrix MLP width of Qwen-1 is intermediate_size / 2 (Qwen/Qwen-7B
# modeling_qwen.py QWenMLP: w1, w2 = Linear(h, intermediate_size // 2)); ChatGLM's dense_h_to_4h
# is Linear(h, 2 x ffn_hidden_size), a gated MLP of ffn_hidden_size (THUDM/chatglm3-6b modeling_chatglm.py).
MLP_WIDTH_DIVISOR = {"qwen": 2}
# Model types written by old remote code that transformers now builds under another name.
RENAMED_TYPES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}


@dataclass(frozen=True)
class ModelConfig:
    """A model's config as the planner uses it: the dict, how it is built, and what was assumed."""

    name: str
    data: dict[str, Any]  # config kwargs with model_type, as built (generic: the llama reading)
    builder: str  # "transformers" | "generic"
    assumptions: tuple[str, ...] = ()

    @property
    def model_type(self) -> str:
        return self.data["model_type"]

    @property
    def key(self) -> str:
        """Content hash of the config as built (cache key of structures and traces)."""
        text = json.dumps(self.data, sort_keys=True, default=str)
        return hashlib.sha256(f"{self.builder}:{text}".encode()).hexdigest()[:20]


def model_config(spec: ModelSpec) -> ModelConfig:
    """The config to build spec's model from (transformers' class, else the generic llama reading)."""
    from transformers import CONFIG_MAPPING

    data = dict(config_dict(spec))
    data["model_type"] = RENAMED_TYPES.get(data.get("model_type", ""), data.get("model_type"))
    data["use_cache"] = False  # training (fms-hf-tuning loads with use_cache=False)
    mt = data["model_type"]
    if mt in CONFIG_MAPPING:
        cleaned, dropped = _accepted_fields(CONFIG_MAPPING[mt], data)
        notes = (f"ignored {', '.join(dropped)}: computed by transformers' {CONFIG_MAPPING[mt].__name__}",) if dropped else ()
        return ModelConfig(spec.name, cleaned, "transformers", notes)
    return generic_config(spec.name, data)


def hf_config(config: ModelConfig, **overrides: Any):
    """The transformers PretrainedConfig of a ModelConfig (overrides applied, e.g. fewer layers)."""
    from transformers import CONFIG_MAPPING

    data = {**config.data, **overrides}
    mt = data.pop("model_type")
    try:
        return CONFIG_MAPPING[mt](**data)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the config class's validation of a user's file (e.g. KeyError: rope)
        raise cannot_build(config, f"transformers' {CONFIG_MAPPING[mt].__name__} rejects it", exc) from None


def cannot_build(config: ModelConfig, what: str, exc: BaseException) -> InputError:
    """The InputError (field model_name) of a config the library's config or model code cannot build."""
    detail = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # KeyError's str() adds quotes
    text = " ".join(str(detail).split())[:300]
    return InputError(
        "model_name",
        f"{config.name}: the {config.model_type} model cannot be built from its config ({what}: {type(exc).__name__}: {text})",
        allowed=f"a config.json that transformers' {config.model_type} code accepts",
    )


def _accepted_fields(config_class: type, data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """data without the keys the config class computes itself (read-only properties, e.g. Falcon head_dim)."""
    dropped = []
    out = {}
    for key, value in data.items():
        attr = inspect.getattr_static(config_class, key, None)
        if isinstance(attr, property) and attr.fset is None:
            dropped.append(key)
        else:
            out[key] = value
    return out, dropped


def generic_config(name: str, data: dict[str, Any]) -> ModelConfig:
    """A llama-like reading of a config transformers cannot build, with every assumption listed."""
    mt = data.get("model_type")
    text = text_fields(data)
    fields = {
        "hidden_size": _first(text, *HIDDEN_KEYS),
        "num_hidden_layers": _first(text, *LAYER_KEYS),
        "num_attention_heads": _first(text, *HEAD_KEYS),
        "intermediate_size": _first(text, *FFN_KEYS),
        "vocab_size": _first(text, *VOCAB_KEYS),
    }
    missing = [k for k, v in fields.items() if not isinstance(v, int) or v <= 0]
    if missing:
        raise InputError(
            "model_name",
            f"{name}: model_type {mt!r} is not built into transformers and its config lacks {', '.join(missing)}; "
            "the planner cannot size it",
            allowed="a config.json with hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, "
            "vocab_size (or their usual aliases)",
        )
    heads = fields["num_attention_heads"]
    kv = _first(text, *KV_KEYS) or (1 if text.get("multi_query") is True else heads)
    width = fields["intermediate_size"] // MLP_WIDTH_DIVISOR.get(str(mt), 1)
    head_dim = _first(text, "head_dim", "kv_channels") or fields["hidden_size"] // heads
    tied = bool(_first(data, "tie_word_embeddings") or _first(text, "tie_word_embeddings") or False)
    llama = {
        "model_type": "llama",
        "hidden_size": fields["hidden_size"],
        "intermediate_size": width,
        "num_hidden_layers": fields["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": fields["vocab_size"],
        "max_position_embeddings": _first(text, *POSITION_KEYS) or 4096,
        "tie_word_embeddings": tied,
        "use_cache": False,
    }
    mlp = f"intermediate {width}" + (f" = intermediate_size / {MLP_WIDTH_DIVISOR[mt]}, {mt}'s convention" if mt in MLP_WIDTH_DIVISOR else "")
    assumptions = (
        f"model_type {mt!r} is not built into transformers (remote code): planned as a llama-like decoder",
        f"read: hidden {llama['hidden_size']}, {llama['num_hidden_layers']} layers, {heads} attention heads, "
        f"{kv} key/value heads, head_dim {head_dim}, vocab {llama['vocab_size']}, {'tied' if tied else 'untied'} "
        "output layer",
        f"assumed: gated MLP of 3 matrices ({mlp}), rotary positions, RMSNorm, no biases",
    )
    return ModelConfig(name, llama, "generic", assumptions)
