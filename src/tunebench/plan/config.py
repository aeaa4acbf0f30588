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
    FFN_KEYS,
    HEAD_KEYS,
    HIDDEN_KEYS,
    KV_KEYS,
    LAYER_KEYS,
    POSITION_KEYS,
    VOCAB_KEYS,
    _first,
    chatglm_fields,
    text_fields,
)
from tunebench.errors import InputError

# Remote-code families whose fields mean something else than a llama config's (their modeling code
# on the Hub): the per-matrix MLP width of Qwen-1 is intermediate_size / 2 (Qwen/Qwen-7B
# modeling_qwen.py QWenMLP: w1, w2 = Linear(h, intermediate_size // 2)); ChatGLM's dense_h_to_4h
# is Linear(h, 2 x ffn_hidden_size), a gated MLP of ffn_hidden_size (THUDM/chatglm3-6b modeling_chatglm.py).
MLP_WIDTH_DIVISOR = {"qwen": 2}
# How the modelling code of a remote-code family names (and fuses) the modules of the llama-like stand-in the
# planner builds: the decoder stack, the input embedding, the output layer, and per module of a decoder layer
# the stand-in modules it holds (a fused module's output is their concatenation). LoRA target_modules are
# matched against these names, as peft matches them against the real model.
REMOTE_LAYOUTS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen-7B modeling_qwen.py: QWenLMHeadModel(transformer = QWenModel(wte, h, ln_f), lm_head);
    # QWenAttention c_attn = Linear(h, 3 x kv_channels x heads) (bias), c_proj; QWenMLP: a1 * silu(a2) with
    # a1 = w1(x), a2 = w2(x) (w2 is the gate), c_proj back to h.
    "qwen": {"layers": "transformer.h", "embed": "transformer.wte", "head": "lm_head", "modules": {
        "attn.c_attn": ("q_proj", "k_proj", "v_proj"), "attn.c_proj": ("o_proj",),
        "mlp.w1": ("up_proj",), "mlp.w2": ("gate_proj",), "mlp.c_proj": ("down_proj",)}},
    # THUDM/chatglm3-6b (and chatglm2-6b) modeling_chatglm.py: ChatGLMForConditionalGeneration.transformer =
    # ChatGLMModel(embedding.word_embeddings, encoder.layers, encoder.final_layernorm, output_layer);
    # SelfAttention query_key_value = Linear(h, heads x kv_channels + 2 x multi_query_group_num x kv_channels,
    # bias=add_bias_linear or add_qkv_bias), dense; MLP dense_h_to_4h = Linear(h, 2 x ffn_hidden_size) (swiglu:
    # silu(first half) x second half), dense_4h_to_h.
    "chatglm": {"layers": "transformer.encoder.layers", "embed": "transformer.embedding.word_embeddings",
                "head": "transformer.output_layer", "modules": {
        "self_attention.query_key_value": ("q_proj", "k_proj", "v_proj"), "self_attention.dense": ("o_proj",),
        "mlp.dense_h_to_4h": ("gate_proj", "up_proj"), "mlp.dense_4h_to_h": ("down_proj",)}},
    # baichuan-inc/Baichuan2-7B-Base and -13B-Base modeling_baichuan.py: BaichuanForCausalLM(model(embed_tokens,
    # layers, norm), lm_head = NormHead); Attention / BaichuanAttention W_pack = Linear(h, 3h, bias=False), o_proj;
    # MLP gate_proj, up_proj, down_proj. The 13B models use ALiBi instead of rotary positions (no parameters).
    "baichuan": {"layers": "model.layers", "embed": "model.embed_tokens", "head": "lm_head", "modules": {
        "self_attn.W_pack": ("q_proj", "k_proj", "v_proj"), "self_attn.o_proj": ("o_proj",),
        "mlp.gate_proj": ("gate_proj",), "mlp.up_proj": ("up_proj",), "mlp.down_proj": ("down_proj",)}},
    # internlm/internlm2-7b modeling_internlm2.py: InternLM2ForCausalLM(model(tok_embeddings, layers, norm), output);
    # InternLM2Attention wqkv = Linear(h, (heads + 2 x num_key_value_heads) x head_dim, bias=config.bias), wo;
    # InternLM2MLP w2(silu(w1(x)) x w3(x)).
    "internlm2": {"layers": "model.layers", "embed": "model.tok_embeddings", "head": "output", "modules": {
        "attention.wqkv": ("q_proj", "k_proj", "v_proj"), "attention.wo": ("o_proj",),
        "feed_forward.w1": ("gate_proj",), "feed_forward.w3": ("up_proj",), "feed_forward.w2": ("down_proj",)}},
}  # fmt: skip
# Model types written by old remote code that transformers now builds under another name.
RENAMED_TYPES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}


@dataclass(frozen=True)
class ModelConfig:
    """A model's config as the planner uses it: the dict, how it is built, and what was assumed."""

    name: str
    data: dict[str, Any]  # config kwargs with model_type, as built (generic: the llama reading)
    builder: str  # "transformers" | "generic"
    assumptions: tuple[str, ...] = ()
    family: str = ""  # generic: the remote-code model_type whose module names REMOTE_LAYOUTS gives, if any

    @property
    def model_type(self) -> str:
        return self.data["model_type"]

    @property
    def key(self) -> str:
        """Content hash of the config as built (cache key of structures and traces)."""
        text = json.dumps(self.data, sort_keys=True, default=str)
        builder = f"{self.builder}:{self.family}" if self.family else self.builder
        return hashlib.sha256(f"{builder}:{text}".encode()).hexdigest()[:20]


def model_config(spec: ModelSpec) -> ModelConfig:
    """The config to build spec's model from (transformers' class, else the generic llama reading)."""
    from transformers import CONFIG_MAPPING

    data = dict(config_dict(spec))
    data["model_type"] = RENAMED_TYPES.get(data.get("model_type", ""), data.get("model_type"))
    data["use_cache"] = False  # training (fms-hf-tuning loads with use_cache=False)
    mt = data["model_type"]
    if mt in CONFIG_MAPPING:
        cleaned, dropped = _accepted_fields(CONFIG_MAPPING[mt], data)
        notes = (
            (f"ignored {', '.join(dropped)}: computed by transformers' {CONFIG_MAPPING[mt].__name__}",)
            if dropped
            else ()
        )
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
    if mt == "chatglm":  # padded_vocab_size; key/value groups only with multi_query_attention
        glm = chatglm_fields(text)
        fields["vocab_size"], kv = glm["vocab_size"], glm["num_key_value_heads"]
    width = fields["intermediate_size"] // MLP_WIDTH_DIVISOR.get(str(mt), 1)
    head_dim = _first(text, "head_dim", "kv_channels") or fields["hidden_size"] // heads
    tied = bool(_first(data, "tie_word_embeddings") or _first(text, "tie_word_embeddings") or False)
    bias = _attention_bias(str(mt), text)
    llama = {
        # transformers' qwen2 is the llama decoder with biases on q/k/v only (Qwen2Attention)
        "model_type": "qwen2" if bias == "q/k/v" else "llama",
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
    if bias == "q/k/v/o":  # LlamaAttention: attention_bias puts biases on q, k, v and o
        llama["attention_bias"] = True
    mlp = f"intermediate {width}" + (
        f" = intermediate_size / {MLP_WIDTH_DIVISOR[mt]}, {mt}'s convention" if mt in MLP_WIDTH_DIVISOR else ""
    )
    family = str(mt) if mt in REMOTE_LAYOUTS else ""
    positions = "rotary positions"
    if mt == "baichuan" and "max_position_embeddings" not in text:
        # Baichuan-13B / Baichuan2-13B modeling_baichuan.py: ALiBi from model_max_length (the 7B: rotary)
        positions = "ALiBi positions (no parameters; the attention bias tensor is not modelled)"
    assumptions = (
        f"model_type {mt!r} is not built into transformers (remote code): planned as a llama-like decoder",
        f"read: hidden {llama['hidden_size']}, {llama['num_hidden_layers']} layers, {heads} attention heads, "
        f"{kv} key/value heads, head_dim {head_dim}, vocab {llama['vocab_size']}, {'tied' if tied else 'untied'} "
        "output layer",
        f"assumed: gated MLP of 3 matrices ({mlp}), {positions}, RMSNorm, "
        + (f"biases on {bias} only" if bias else "no biases"),
    )
    if family:
        names = ", ".join(dict.fromkeys(m.rsplit(".", 1)[-1] for m in REMOTE_LAYOUTS[family]["modules"]))
        assumptions += (f"module names of {mt}'s modelling code (LoRA target_modules): {names}",)
    return ModelConfig(name, llama, "generic", assumptions, family)


def _attention_bias(mt: str, text: dict[str, Any]) -> str:
    """Which attention projections of the family have biases (its modelling code): "q/k/v", "q/k/v/o" or ""."""
    if mt == "qwen":  # modeling_qwen.py QWenAttention: c_attn = nn.Linear(h, 3 x projection) (bias default True)
        return "q/k/v"
    if mt == "chatglm":  # modeling_chatglm.py SelfAttention: bias=config.add_bias_linear or config.add_qkv_bias
        return "q/k/v" if text.get("add_qkv_bias") or text.get("add_bias_linear") else ""
    if mt == "internlm2":  # modeling_internlm2.py: wqkv and wo bias=config.bias (false in the released configs)
        return "q/k/v/o" if text.get("bias") else ""
    return ""
