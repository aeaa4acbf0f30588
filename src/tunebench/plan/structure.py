"""A model's exact structure, read off the model itself built on the meta device.

transformers builds the model from its config (``plan.config``) with no memory and no weights;
walking its modules gives exact parameter counts (tied weights once), every linear layer with the
name PEFT's ``target_modules`` matches, the decoder layers (the FSDP units), the vision tower,
fused Mixture-of-Experts weights and the attention implementations the model class supports.
The result is a plain, JSON-serialisable ``Structure``, cached on disk per config and library
version: later plans of the same architecture never import torch.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tunebench import paths
from tunebench.catalog import ModelSpec
from tunebench.errors import InputError

# bump when the extraction changes: old cache files are then ignored (4: layer_types; 5: ssd_flops_per_token)
STRUCTURE_VERSION = 5


@dataclass(frozen=True)
class Linear:
    """Linear layers sharing a module path (layer indices as '*'), their shape and count."""

    name: str  # e.g. "model.layers.*.self_attn.q_proj"
    d_in: int
    d_out: int
    count: int
    part: str = "layers"  # "layers" (decoder stack), "head" (output layer), "vision", "other"
    kind: str = "linear"  # "linear" | "embedding" (LoRA can adapt both)

    @property
    def params(self) -> int:
        return self.d_in * self.d_out * self.count

    @property
    def leaf(self) -> str:
        return self.name.rsplit(".", 1)[-1]


@dataclass(frozen=True, eq=False)
class Structure:
    """Counts and shapes of one model that the planner's formulas use (see module docstring)."""

    name: str
    model_type: str
    builder: str  # "transformers" | "generic"
    config_key: str
    config: dict[str, Any]  # the config kwargs it was built from (plan.config.ModelConfig.data)
    assumptions: tuple[str, ...]
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_position: int | None
    tied: bool
    total_params: int
    embedding_params: int  # input (and learned position) embeddings; excludes a tied output layer
    lm_head_params: int  # the output layer's matrix (shared storage when tied)
    layer_params: int  # every decoder layer together
    largest_layer_params: int  # the largest decoder layer (FSDP's unit under TRANSFORMER_BASED_WRAP)
    expert_params: int  # fused Mixture-of-Experts weights (3-D parameters, not nn.Linear)
    router_params: int  # other 2-D weights of the decoder layers that are not nn.Linear (MoE routers)
    experts: int
    top_k: int
    attention_layers: int  # decoder layers with self-attention (the rest: state-space layers)
    ssd_flops_per_token: float  # forward FLOPs per token of the Mamba-2 layers' SSD cores (meta_model)
    linears: tuple[Linear, ...]
    layer_kinds: tuple[tuple[str, int], ...] = ()  # (config layer_types value, count), if the config has them,
    # in the order of their first layer
    layer_types: tuple[str, ...] = ()  # every decoder layer's kind, in order (empty without layer_types)
    vision: dict[str, Any] = field(default_factory=dict)
    attention: tuple[str, ...] = ("eager",)  # implementations the model class supports
    default_attention: str = "eager"  # what transformers picks when none is asked for
    no_split_modules: tuple[str, ...] = ()
    # Remote-code families (plan.config.REMOTE_LAYOUTS): per linear of the family's own names, the leaf names
    # of the modules of the llama-like stand-in that was built (what the trace's peft adapts).
    stand_in: tuple[tuple[str, tuple[str, ...]], ...] = ()

    # --- parameter counts ------------------------------------------------------------------
    @functools.cached_property
    def quantized_params(self) -> int:
        """Weights 4-bit methods store in 4 bits: decoder linears and fused experts (not the output layer,
        embeddings or the vision tower; transformers get_keys_to_not_convert / bitsandbytes skip them)."""
        return (
            sum(lin.params for lin in self.linears if lin.part == "layers" and lin.kind == "linear")
            + self.expert_params
        )

    @functools.cached_property
    def largest_linear_params(self) -> int:
        """The largest quantised weight (one is dequantised to 16 bits at a time)."""
        sizes = [lin.d_in * lin.d_out for lin in self.linears if lin.part == "layers" and lin.kind == "linear"]
        if self.experts and self.layers:
            sizes.append(self.expert_params // (self.layers * self.experts))
        return max(sizes, default=0)

    @functools.cached_property
    def matmul_params_per_token(self) -> float:
        """Weights every text token multiplies with: decoder linears, the output layer, top_k/E of the experts.

        The FLOPs model charges 2 FLOPs per such weight per token forward (Kaplan et al. 2020, arXiv:2001.08361).
        """
        dense = sum(lin.params for lin in self.linears if lin.part in ("layers", "head") and lin.kind == "linear")
        dense += self.router_params
        routed = self.expert_params * (self.top_k / self.experts) if self.experts else 0.0
        return dense + routed

    @functools.cached_property
    def active_params(self) -> float:
        """Parameters one token uses (MoE: top_k of the experts), as model cards count 'active' size."""
        return (
            self.total_params
            - self.expert_params
            + (self.expert_params * self.top_k / self.experts if self.experts else 0)
        )

    @property
    def attention_flops_per_token_per_context(self) -> float:
        """Forward FLOPs per token per token of context of the attention core: QK^T and AV.

        2 matmuls x 2 FLOPs x heads x head_dim per (query, key) pair, halved for the causal mask (PaLM
        App. B counts 6 L H Q T for training with the full square; llm-foundry the same). Multiply by s.
        """
        return 2 * self.attention_layers * self.heads * self.head_dim

    @functools.cached_property
    def root_params(self) -> int:
        """Parameters outside the decoder layers (embeddings, output layer, final norm, vision tower)."""
        return self.total_params - self.layer_params

    def lora_params_per_rank(self, target_modules: tuple[str, ...] | str | None) -> tuple[int, tuple[str, ...]]:
        """(sum of d_in + d_out over adapted modules, target names that matched nothing).

        LoRA adds A (r x d_in) and B (d_out x r) to each adapted module: r (d_in + d_out) parameters
        (Hu et al. 2021, arXiv:2106.09685). Matching follows peft's check_target_module_exists: a
        name in the list matches a module whose path ends with '.name' (or is name); a string is a
        regular expression matched against the whole path; 'all-linear' is every linear layer but
        the output layer (peft tuners_utils._maybe_include_all_linear_layers).
        """
        if not target_modules:
            return 0, ()
        if isinstance(target_modules, str) and target_modules != "all-linear":
            pattern = re.compile(target_modules)
            total = sum(
                (lin.d_in + lin.d_out) * sum(1 for p in _paths(lin) if pattern.fullmatch(p)) for lin in self.linears
            )
            return total, () if total else (target_modules,)
        names = {target_modules} if isinstance(target_modules, str) else set(target_modules)
        if "all-linear" in names:
            return sum(
                (lin.d_in + lin.d_out) * lin.count
                for lin in self.linears
                if lin.kind == "linear" and lin.part != "head"
            ), ()
        total, seen = 0, set()
        for lin in self.linears:
            for name in names:
                if lin.name == name or lin.name.endswith("." + name):
                    total += (lin.d_in + lin.d_out) * lin.count
                    seen.add(name)
                    break
        return total, tuple(sorted(names - seen))

    def stand_in_targets(self, target_modules: tuple[str, ...] | str | None) -> tuple[str, ...] | str | None:
        """target_modules as names of the built stand-in's modules (a remote-code family's fused c_attn ->
        q_proj, k_proj, v_proj); unchanged for a model built under its own names. The trace then adapts
        those modules in every layer (a regular expression naming some layers only is traced as all)."""
        if not self.stand_in or not target_modules or target_modules == "all-linear":
            return target_modules
        held = dict(self.stand_in)
        out: list[str] = []
        for lin in self.linears:
            if lin.name in held and _targets_match(lin, target_modules):
                out.extend(leaf for leaf in held[lin.name] if leaf not in out)
        return tuple(out) or target_modules

    # --- (de)serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Structure:
        data = dict(data)
        data["linears"] = tuple(Linear(**lin) for lin in data["linears"])
        data["layer_kinds"] = tuple(tuple(k) for k in data.get("layer_kinds", ()))
        data["layer_types"] = tuple(data.get("layer_types", ()))
        for key in ("assumptions", "attention", "no_split_modules"):
            data[key] = tuple(data.get(key, ()))
        data["stand_in"] = tuple((name, tuple(leaves)) for name, leaves in data.get("stand_in", ()))
        return cls(**data)


def _targets_match(lin: Linear, target_modules: tuple[str, ...] | str) -> bool:
    """Whether target_modules (as lora_params_per_rank reads them) adapt a module of the group lin."""
    if isinstance(target_modules, str):
        pattern = re.compile(target_modules)
        return any(pattern.fullmatch(p) for p in _paths(lin))
    return any(lin.name == name or lin.name.endswith("." + name) for name in target_modules)


def _paths(lin: Linear) -> list[str]:
    """Module paths of a linear group (layer index '*' expanded 0..count-1, for regex matching)."""
    if "*" not in lin.name:
        return [lin.name]
    return [lin.name.replace("*", str(i), 1) for i in range(lin.count)]


# --- building ---------------------------------------------------------------------------------------
def structure_of(spec: ModelSpec) -> Structure:
    """The Structure of a model: from the disk cache, else built on the meta device and cached.

    InputError (field model_name) for a catalog entry whose dimensions are unknown.
    """
    if not spec.config_path:
        needed = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        missing = [k for k in needed if getattr(spec, k) is None]
        if missing:
            raise InputError(
                "model_name",
                f"{spec.name} has unknown dimensions ({', '.join(missing)}); the planner cannot size it",
                allowed="a model with known dimensions, or a path to its config.json",
            )
    return _structure(spec)


@functools.lru_cache(maxsize=512)
def _structure(spec: ModelSpec) -> Structure:  # ModelSpec hashes by name and dimensions
    index = _index_path()
    key = _spec_key(spec)
    cached = _read_index(index).get(key)
    if cached:
        path = cache_dir() / f"structure-{cached}.json"
        try:
            return Structure.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            pass  # rebuilt below
    from tunebench.plan.config import model_config

    config = model_config(spec)
    path = cache_dir() / f"structure-{config.key}.json"
    try:
        structure = Structure.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        from tunebench.plan.meta_model import build_structure

        structure = build_structure(config)
        write_json(path, structure.to_dict())
    _write_index(index, key, config.key)
    return structure


def cache_dir() -> Path:
    """Where structures and traces are cached (per library versions, see _versions)."""
    return paths.home() / "cache" / "planner" / library_versions()


@functools.cache
def library_versions() -> str:
    """torch, transformers and peft versions (what a structure or trace depends on), without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in ("torch", "transformers", "peft"):
        try:
            parts.append(f"{name}-{version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name}-none")
    return f"v{STRUCTURE_VERSION}-" + "-".join(parts).replace("+", "_")


def _spec_key(spec: ModelSpec) -> str:
    """Cheap key of a spec (no transformers import): its config dict, hashed."""
    import hashlib

    from tunebench.catalog.hf_config import config_dict

    text = json.dumps(config_dict(spec), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _index_path() -> Path:
    return cache_dir() / "structure-index.json"


def _read_index(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_index(path: Path, key: str, value: str) -> None:
    index = _read_index(path)
    if index.get(key) != value:
        index[key] = value
        write_json(path, index)


def write_json(path: Path, data: Any) -> None:
    """Atomic write (a reader never sees half a file; concurrent writers write equal content)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(path, json.dumps(data))


def image_tiles(structure: Structure, width: int, height: int) -> int:
    """Vision tiles one image becomes in LLaVA-NeXT 'anyres': the best grid pinpoint's tiles + 1 base.

    transformers llava_next ``select_best_resolution``: the pinpoint that keeps the most effective
    resolution, then wastes the least; without a pinpoint list, a grid of image_size tiles.
    """
    size = structure.vision.get("image_size", 336)
    pins = structure.vision.get("pinpoints")
    if isinstance(pins, list) and pins:
        best, best_eff, best_waste = None, -1.0, math.inf
        for ph, pw in pins:
            scale = min(pw / width, ph / height)
            eff = min(int(width * scale) * int(height * scale), width * height)
            waste = pw * ph - eff
            if eff > best_eff or (eff == best_eff and waste < best_waste):
                best, best_eff, best_waste = (ph, pw), eff, waste
        ph, pw = best
        return (ph // size) * (pw // size) + 1
    return math.ceil(width / size) * math.ceil(height / size) + 1
