"""A model's Hugging Face config as a plain dict, for any ModelSpec (catalog entry or config.json).

Both the measuring worker (random-weight models) and the planner (models built on the meta
device) start from this dict. It imports neither torch nor transformers: turning it into a
``PretrainedConfig`` is ``tunebench.plan.config.hf_config``'s job (planner) or the worker's.

A config.json is used as written. A catalog entry stores the llama-style field names
(hidden_size, num_hidden_layers, ...); the few model types whose transformers config uses other
names get them here (transformers/models/<type>/configuration_<type>.py).
"""

from __future__ import annotations

from typing import Any

from tunebench.catalog.models import ModelSpec

_COMMON = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
)  # fmt: skip
_EXTRA = ("rope_theta", "rope_scaling", "attention_bias", "mlp_bias", "sliding_window")
# LLaVA-NeXT defaults (transformers LlavaNextConfig): used when a catalog entry writes its pinpoints as a note.
_LLAVA_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]


def config_dict(spec: ModelSpec) -> dict[str, Any]:
    """transformers config kwargs (with ``model_type``) of a model; a config.json verbatim."""
    if spec.extra.get("config"):
        return {k: v for k, v in spec.extra["config"].items() if k not in ("architectures", "_name_or_path")}
    mt = spec.model_type
    if mt == "llava_next":
        return _llava_next(spec)
    if mt == "gpt_bigcode":  # GPTBigCodeConfig names: n_embd, n_inner, n_layer, n_head, n_positions
        cfg = {
            "n_embd": spec.hidden_size,
            "n_inner": spec.intermediate_size,
            "n_layer": spec.num_hidden_layers,
            "n_head": spec.num_attention_heads,
            "n_positions": spec.max_position_embeddings,
            "vocab_size": spec.vocab_size,
            "multi_query": spec.extra.get("multi_query", spec.num_key_value_heads == 1),
            "activation_function": spec.extra.get("activation_function"),
        }
        return {"model_type": mt, **_defined(cfg)}
    if mt == "bloom":  # BloomConfig: hidden_size, n_layer, n_head (the MLP is 4 x hidden)
        cfg = {"hidden_size": spec.hidden_size, "n_layer": spec.num_hidden_layers, "n_head": spec.num_attention_heads}
        return {"model_type": mt, "vocab_size": spec.vocab_size, **_defined(cfg)}
    cfg = {"model_type": mt, **_defined({k: getattr(spec, k) for k in _COMMON})}
    cfg.update(_defined({k: spec.extra.get(k) for k in _EXTRA}))
    if spec.num_local_experts is not None:  # 0 for dense granite-4.0 hybrids (the config class defaults to MoE)
        cfg["num_local_experts"] = spec.num_local_experts
        cfg["num_experts_per_tok"] = spec.num_experts_per_tok
    if mt.startswith("granite"):
        cfg.update(spec.extra.get("granite_multipliers") or {})
    if mt == "granitemoehybrid":
        cfg.update({k: v for k, v in (spec.extra.get("mamba") or {}).items() if k != "mamba_d_inner"})
        cfg.update(_defined({k: spec.extra.get(k) for k in ("shared_intermediate_size", "position_embedding_type")}))
        attention = set(spec.extra.get("attention_layer_indices") or [])
        cfg["layer_types"] = ["attention" if i in attention else "mamba" for i in range(spec.num_hidden_layers or 0)]
    return cfg


def _llava_next(spec: ModelSpec) -> dict[str, Any]:
    """LlavaNextConfig kwargs from a catalog entry's text_config / vision_config."""
    notes = ("base", "note", "architectures", "params", "params_without_head", "projection_dim")
    text = {k: v for k, v in (spec.extra.get("text_config") or {}).items() if k not in notes}
    for key in _COMMON:  # the catalog writes the text model's dimensions at the top level
        if getattr(spec, key) is not None:
            text.setdefault(key, getattr(spec, key))
    raw_vision = spec.extra.get("vision_config") or {}
    vision = {k: v for k, v in raw_vision.items() if k not in notes}
    if "params_without_head" in raw_vision:  # SigLIP towers of LLaVA-NeXT models run without the pooling head
        vision["vision_use_head"] = False
    feature_layer = vision.pop("vision_feature_layer", -2)
    strategy = vision.pop("vision_feature_select_strategy", "default")
    pinpoints = spec.extra.get("image_grid_pinpoints")
    return _defined(
        {
            "model_type": "llava_next",
            "text_config": text,
            "vision_config": vision,
            "vision_feature_layer": feature_layer,
            "vision_feature_select_strategy": strategy,
            "image_grid_pinpoints": pinpoints if isinstance(pinpoints, list) else _LLAVA_PINPOINTS,
            "image_token_index": spec.extra.get("image_token_index"),
            "projector_hidden_act": spec.extra.get("projector_hidden_act"),
            "tie_word_embeddings": spec.tie_word_embeddings,
        }
    )


def _defined(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
