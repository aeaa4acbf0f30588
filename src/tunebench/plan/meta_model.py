"""The model built from its config on the meta device, and its Structure read off its modules.

No memory and no weights: transformers instantiates every module with meta tensors, so parameter
counts, tied weights, linear layers (what PEFT's ``target_modules`` match), the decoder layers and
the vision tower are exact. ``plan.structure`` caches the result; ``plan.trace`` reuses the builder.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from typing import Any

from tunebench.errors import InputError
from tunebench.plan.structure import Linear, Structure
from tunebench.spec.properties import class_attentions


def build_model(config, hf, vision: bool):
    """The transformers model of a config on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    if not vision:
        _refuse_encoders(config, hf)
    try:
        with torch.device("meta"):
            return auto.from_config(hf)
    except ValueError as exc:  # no causal-LM (or image-text-to-text) class for this config
        raise InputError(
            "model_name",
            f"{config.name}: transformers has no {'image-text-to-text' if vision else 'causal language'} model "
            f"for model_type {config.model_type!r} ({str(exc).splitlines()[0][:120]})",
            allowed="a decoder (causal LM) or vision-language model",
        ) from None
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the modelling code fails on values of a user's config.json
        from tunebench.plan.config import cannot_build

        raise cannot_build(config, "the model class fails on it", exc) from None


def _refuse_encoders(config, hf) -> None:
    """InputError for an encoder (BERT, RoBERTa, ...) or encoder-decoder (BART, ...) config: transformers gives
    them a causal-LM class too (BertLMHeadModel, BartForCausalLM), but it decodes causally only with
    is_decoder set, and an encoder-decoder's is its decoder alone, not the model the experiments tune."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    # is_decoder: BERT-likes as decoders; causal: XLM's own switch (XLMConfig has no is_decoder)
    if config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or any(
        getattr(hf, flag, False) for flag in ("is_decoder", "causal")
    ):
        return
    kind = "an encoder-decoder" if getattr(hf, "is_encoder_decoder", False) else "an encoder (masked language model)"
    raise InputError(
        "model_name",
        f"{config.name}: model_type {config.model_type!r} is {kind}, not a causal language model (its config has "
        "no is_decoder: true, or causal: true for xlm)",
        allowed="a decoder (causal LM) or vision-language model",
    )


def enable_checkpointing(model, kwargs: dict[str, Any]) -> None:
    """Turn on activation checkpointing with torch.utils.checkpoint ``kwargs``: transformers >= 5.2x names it
    ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` is its deprecated alias, which
    warns); earlier 5.x releases have only the old name."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def build_structure(config) -> Structure:
    """Build the model of a ModelConfig on the meta device and read its Structure off it."""
    from tunebench.plan.config import hf_config

    with quiet():
        hf = hf_config(config)
        vision = "vision_config" in config.data
        model = build_model(config, hf, vision)
        return read_structure(model, config, hf)


@contextlib.contextmanager
def quiet():
    """Silence the warnings and log lines torch and transformers print while models are built or traced."""
    loggers = [logging.getLogger(n) for n in ("torch._subclasses.fake_tensor", "transformers", "torch")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def read_structure(model, config, hf) -> Structure:  # over 60 lines: one keyword per Structure field
    """Structure of an instantiated (meta or real) transformers model."""
    import torch

    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    n_layers = int(getattr(text, "num_hidden_layers"))
    layers_name, layer_list = _decoder_layers(model, n_layers)
    unique: dict[int, torch.nn.Parameter] = {}
    for p in model.parameters():
        unique.setdefault(id(p), p)
    total = sum(p.numel() for p in unique.values())
    per_layer = [sum(p.numel() for p in _unique_params(layer)) for layer in layer_list]
    out_emb = model.get_output_embeddings()
    in_emb = model.get_input_embeddings()
    tied = out_emb is not None and out_emb.weight is in_emb.weight
    lm_head = out_emb.weight.numel() if out_emb is not None else 0
    lm_head_name = next((n for n, m in model.named_modules() if m is out_emb), "lm_head") if out_emb is not None else ""
    vision_prefixes = _vision_prefixes(model) if "vision_config" in config.data else ()
    linears = _linears(model, layers_name, lm_head_name, vision_prefixes)
    stand_in: tuple[tuple[str, tuple[str, ...]], ...] = ()
    if getattr(config, "family", ""):
        linears, stand_in = remote_names(linears, config.family, layers_name, lm_head_name)
    embedding = sum(
        m.weight.numel()
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Embedding) and not n.startswith(layers_name + ".") and not _under(n, vision_prefixes)
    ) - (lm_head if tied else 0)
    n_experts = int(_first_attr(text, "num_local_experts", "num_experts", "n_routed_experts") or 0)
    experts = sum(  # fused expert weights: (experts, out, in); 3-D convolution weights are not experts
        p.numel()
        for n, p in model.named_parameters()
        if n_experts and p.ndim == 3 and p.shape[0] == n_experts and n.startswith(layers_name + ".")
    )
    top_k = int(_first_attr(text, "num_experts_per_tok", "moe_top_k") or 0)
    routers = _router_params(model, layers_name, torch)
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    head_dim = int(getattr(text, "head_dim", 0) or (hidden // heads if heads else 0))
    attention_layers = sum(1 for layer in layer_list if _has_attention(layer))
    types = _layer_types(text, n_layers)
    ssd = sum(_ssd_flops_per_token(m) for layer in layer_list for m in layer.modules())
    return Structure(
        name=config.name,
        model_type=config.model_type,
        builder=config.builder,
        config_key=config.key,
        config=config.data,
        assumptions=config.assumptions,
        hidden=hidden,
        layers=n_layers,
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", 0) or heads),
        head_dim=head_dim,
        vocab=int(getattr(text, "vocab_size", 0) or (in_emb.weight.shape[0] if in_emb is not None else 0)),
        max_position=getattr(text, "max_position_embeddings", None),
        tied=bool(tied),
        total_params=int(total),
        embedding_params=int(embedding),
        lm_head_params=int(lm_head),
        layer_params=int(sum(per_layer)),
        largest_layer_params=int(max(per_layer, default=0)),
        expert_params=int(experts),
        router_params=int(routers),
        experts=n_experts,
        top_k=top_k,
        attention_layers=int(attention_layers),
        ssd_flops_per_token=float(ssd),
        linears=tuple(linears),
        layer_kinds=_layer_kinds(types),
        layer_types=types,
        vision=_vision(model, hf, vision_prefixes) if vision_prefixes else {},
        attention=class_attentions(model),
        default_attention=str(getattr(hf, "_attn_implementation", None) or "eager"),
        no_split_modules=tuple(getattr(model, "_no_split_modules", None) or ()),
        stand_in=stand_in,
    )


def remote_names(
    linears: list[Linear],
    family: str,
    layers_name: str,
    lm_head_name: str,
) -> tuple[list[Linear], tuple[tuple[str, tuple[str, ...]], ...]]:
    """The stand-in's linears under the module names of a remote-code family's modelling code, fused as it
    fuses them (plan.config.REMOTE_LAYOUTS), and which stand-in leaves each renamed linear holds."""
    from tunebench.plan.config import REMOTE_LAYOUTS

    layout = REMOTE_LAYOUTS[family]
    family_of = {leaf: module for module, leaves in layout["modules"].items() for leaf in leaves}
    prefix = layers_name + ".*."
    out: list[Linear] = []
    fused: dict[str, list[Linear]] = {}
    for lin in linears:
        module = family_of.get(lin.leaf) if lin.part == "layers" and lin.name.startswith(prefix) else None
        if module is not None:
            fused.setdefault(module, []).append(lin)
        elif lin.name == lm_head_name:
            out.append(Linear(layout["head"], lin.d_in, lin.d_out, lin.count, lin.part, lin.kind))
        elif lin.kind == "embedding" and lin.part == "other":
            out.append(Linear(layout["embed"], lin.d_in, lin.d_out, lin.count, lin.part, lin.kind))
        else:
            out.append(lin)
    held = []
    for module, parts in fused.items():
        name = f"{layout['layers']}.*.{module}"
        d_in, count = parts[0].d_in, parts[0].count
        if any(p.d_in != d_in or p.count != count for p in parts):  # never for the llama stand-in
            raise ValueError(f"cannot fuse {[p.name for p in parts]} into {name}")
        out.append(Linear(name, d_in, sum(p.d_out for p in parts), count, "layers", "linear"))
        held.append((name, tuple(p.leaf for p in parts)))
    return out, tuple(held)


def _router_params(model, layers_name: str, torch) -> int:
    """MoE routers and other 2-D weights of the decoder layers outside nn.Linear / nn.Embedding."""
    in_modules = {id(m.weight) for m in model.modules() if _module_shape(m, torch)[0]}
    return sum(
        p.numel()
        for n, p in model.named_parameters()
        if p.ndim == 2 and id(p) not in in_modules and n.startswith(layers_name + ".")
    )


def _layer_types(text, n_layers: int) -> tuple[str, ...]:
    """Every decoder layer's kind, from a hybrid model's ``layer_types`` (e.g. full/sliding attention, linear
    attention, Mamba); empty without them."""
    kinds = getattr(text, "layer_types", None)
    if not isinstance(kinds, (list, tuple)):
        return ()
    return tuple(str(k) for k in kinds[:n_layers])


def _layer_kinds(types: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """(kind, count) of the layer types, in the order of each kind's first layer."""
    counts: dict[str, int] = {}
    for k in types:
        counts[k] = counts.get(k, 0) + 1
    return tuple(counts.items())


def _unique_params(module) -> list:
    seen: dict[int, Any] = {}
    for p in module.parameters():
        seen.setdefault(id(p), p)
    return list(seen.values())


def _first_attr(obj: Any, *names: str) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value:
            return value
    return None


def _decoder_layers(model, n_layers: int) -> tuple[str, list]:
    """(path, layers) of the decoder stack: the ModuleList of num_hidden_layers text layers."""
    import torch

    best = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers and "vision" not in name:
            if best is None or name.count(".") < best[0].count("."):
                best = (name, list(module))
    if best is None:
        raise InputError("model_name", f"cannot find the {n_layers} decoder layers of {type(model).__name__}")
    return best


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _vision_prefixes(model) -> tuple[str, ...]:
    """Top-level module paths of a vision-language model's vision tower and projector."""
    out = []
    for name, _ in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("vision_tower", "vision_model", "visual", "multi_modal_projector", "image_newline") and not _under(
            name, tuple(out)
        ):
            out.append(name)
    return tuple(out)


def _linears(model, layers_name: str, lm_head_name: str, vision_prefixes: tuple[str, ...]) -> list[Linear]:
    """Linear (and embedding) modules grouped by path pattern and shape."""
    import torch

    groups: dict[tuple, int] = {}
    for name, module in model.named_modules():
        kind, shape = _module_shape(module, torch)
        if kind is None:
            continue
        if name == lm_head_name:
            part = "head"
        elif name.startswith(layers_name + "."):
            part = "layers"
        elif _under(name, vision_prefixes):
            part = "vision"
        else:
            part = "other"
        pattern = re.sub(r"\.\d+(?=\.|$)", ".*", name)
        key = (pattern, shape[0], shape[1], part, kind)
        groups[key] = groups.get(key, 0) + 1
    return [Linear(name, d_in, d_out, count, part, kind) for (name, d_in, d_out, part, kind), count in groups.items()]


def _module_shape(module, torch) -> tuple[str | None, tuple[int, int]]:
    """('linear', (d_in, d_out)) for nn.Linear and transformers' Conv1D, ('embedding', (V, h)), else None."""
    if isinstance(module, torch.nn.Linear):
        return "linear", (module.in_features, module.out_features)
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):  # transformers pytorch_utils.Conv1D: (nx, nf)
        return "linear", (int(module.weight.shape[0]), int(module.nf))
    if isinstance(module, torch.nn.Embedding):
        return "embedding", (module.num_embeddings, module.embedding_dim)
    return None, (0, 0)


def _ssd_flops_per_token(module) -> float:
    """Forward FLOPs per token of a Mamba-2 mixer's SSD core (its state-space scan; the mixer's projections are
    nn.Linear and counted with them), 0 for any other module.

    Every transformers Mamba-2 mixer (Mamba2Mixer, BambaMixer, GraniteMoeHybridMambaLayer, FalconH1Mixer,
    NemotronHMamba2Mixer, Zamba2MambaMixer) has num_heads H, head_dim P, ssm_state_size N, n_groups G and
    chunk_size Q. The chunked SSD algorithm (Dao & Gu 2024, arXiv:2405.21060 §6; mamba_ssm
    ops/triton/ssd_combined.py _mamba_chunk_scan_combined_fwd) per token: the chunk's state B^T x (2 H P N),
    the chunk's C B^T over the whole Q x Q block (_bmm_chunk_fwd, not causal: 2 G Q N), the output from the
    states C h (2 H P N) and the causal half of the intra-chunk (C B^T o L) x (_chunk_scan_fwd: H Q P).
    """
    names = ("num_heads", "head_dim", "ssm_state_size", "n_groups", "chunk_size")
    dims = [getattr(module, n, None) for n in names]
    if not all(isinstance(d, int) and d > 0 for d in dims):
        return 0.0
    heads, head_dim, state, groups, chunk = dims
    return float(4 * heads * head_dim * state + 2 * groups * chunk * state + heads * chunk * head_dim)


def _has_attention(layer) -> bool:
    """A decoder layer with self-attention (class names of transformers' attention modules)."""
    return any(
        "attention" in type(m).__name__.lower() and "mamba" not in type(m).__name__.lower() for m in layer.modules()
    )


def _vision(model, hf, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """Vision tower facts for image tokens and tower activations (LLaVA-NeXT anyres tiles)."""
    vc = getattr(hf, "vision_config", None)
    tower = sum(p.numel() for n, p in model.named_parameters() if _under(n, prefixes))
    size = int(getattr(vc, "image_size", 336) or 336)
    patch = int(getattr(vc, "patch_size", 14) or 14)
    pins = getattr(hf, "image_grid_pinpoints", None)
    return {
        "hidden": int(getattr(vc, "hidden_size", 1024)),
        "intermediate": int(getattr(vc, "intermediate_size", 4096)),
        "layers": int(getattr(vc, "num_hidden_layers", 24)),
        "heads": int(getattr(vc, "num_attention_heads", 16)),
        "patch": patch,
        "image_size": size,
        "patches_per_tile": (size // patch) ** 2,
        "params": int(tower),
        "tower_params": int(tower),
        "pinpoints": [list(p) for p in pins] if isinstance(pins, (list, tuple)) else None,
    }
