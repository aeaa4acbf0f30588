"""Architecture arithmetic: exact parameter counts and per-token activation widths of a model.

Everything is derived from the shapes of a ``ModelSpec`` (catalog entry or config.json), following
the module layouts of transformers' ``models/<model_type>/modeling_*.py`` (estimation.md §11 step 1):
decoder layers of attention (GQA/MQA via num_key_value_heads) and gated (SwiGLU) or plain (GELU)
MLPs, Mixture-of-Experts layers, hybrid Mamba-2 layers (granitemoehybrid), and the vision tower and
projector of LLaVA-NeXT models. Counts are checked against the catalog's ``total_params`` in tests.

Widths are *elements per token*; the memory model multiplies them by the dtype's bytes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from functools import cached_property

from tunebench.catalog import ModelSpec
from tunebench.errors import InputError

# Model types whose MLP is a plain two-matrix GELU MLP (c_fc/c_proj, dense_h_to_4h/dense_4h_to_h).
PLAIN_MLP_TYPES = ("gpt_bigcode", "bloom")
# Granite-family models scale the logits (``logits / logits_scaling``; transformers
# models/granite*/modeling_*.py), one more vocab-sized tensor per token in the loss.
LOGIT_SCALED_TYPES = ("granite", "granitemoe", "granitemoehybrid")


@dataclass(frozen=True)
class Linear:
    """One kind of linear layer: the module name PEFT's target_modules matches, shape and count."""

    name: str
    d_in: int
    d_out: int
    count: int  # occurrences in the model
    quantized: bool = True  # bitsandbytes/GPTQ quantise it (everything but lm_head and the vision tower)
    active_fraction: float = 1.0  # share of tokens that pass through it (MoE experts: top_k / experts)

    @property
    def params(self) -> int:
        return self.d_in * self.d_out * self.count


@dataclass(frozen=True)
class Arch:
    """Shapes and counts of one model that the planner needs."""

    name: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    max_position: int | None
    experts: int = 0
    top_k: int = 0
    shared_intermediate: int = 0  # granitemoehybrid shared MLP
    attention_layers: int = 0  # layers with self-attention (the rest are Mamba-2)
    mamba: dict = field(default_factory=dict)
    linears: tuple[Linear, ...] = ()
    embedding_params: int = 0  # input embeddings (+ learned positions)
    other_params: int = 0  # norms, biases, convolutions, SSM parameters, router-free extras
    vision: dict = field(default_factory=dict)  # vision tower: hidden, intermediate, layers, params, ...

    # --- parameter counts -------------------------------------------------------------------
    @cached_property
    def linear_params(self) -> int:
        return sum(lin.params for lin in self.linears)

    @cached_property
    def total_params(self) -> int:
        """Unique parameters (tied embeddings once), the catalog's convention."""
        return self.linear_params + self.embedding_params + self.other_params + self.vision.get("params", 0)

    @cached_property
    def quantized_params(self) -> int:
        """Parameters bitsandbytes NF4 / GPTQ store in 4 bits (decoder linears, not lm_head)."""
        return sum(lin.params for lin in self.linears if lin.quantized)

    @cached_property
    def lm_head_params(self) -> int:
        return sum(lin.params for lin in self.linears if lin.name == "lm_head")

    @cached_property
    def matmul_params_per_token(self) -> float:
        """Active weights every token multiplies with (MoE: top_k of experts; incl. lm_head, tied or not).

        The FLOPs model (estimation.md §6) charges 2 FLOPs per such weight per token forward.
        """
        return sum(lin.params * lin.active_fraction for lin in self.linears)

    @cached_property
    def active_params(self) -> float:
        return self.matmul_params_per_token + self.embedding_params + self.other_params

    @cached_property
    def largest_layer_params(self) -> int:
        """Parameters of one decoder layer (the FSDP unit of TRANSFORMER_BASED_WRAP), the largest kind."""
        per_layer = sum(lin.params for lin in self.linears if lin.name != "lm_head") / max(1, self.layers)
        return int(per_layer + self.other_params / max(1, self.layers))

    @cached_property
    def largest_linear_params(self) -> int:
        return max((lin.d_in * lin.d_out for lin in self.linears if lin.quantized), default=0)

    def lora_params_per_rank(self, target_modules: tuple[str, ...] | None) -> tuple[int, tuple[str, ...]]:
        """(sum of d_in + d_out over adapted linears, names that matched nothing).

        LoRA adds A (r x d_in) and B (d_out x r) to each adapted linear: r (d_in + d_out) params
        (Hu et al. 2021, arXiv:2106.09685; estimation.md §3.3). PEFT matches target_modules against the
        end of each module's name, so "c_proj" adapts both attention and MLP c_proj of GPTBigCode, and
        "q_proj" the vision tower's q_proj too.
        """
        if not target_modules:
            return 0, ()
        names = set(target_modules)
        if "all-linear" in names:
            names = {lin.name for lin in self.linears if lin.name != "lm_head"}
        total = 0
        seen = set()
        for lin in (*self.linears, *self.vision.get("linears", ())):
            if lin.name in names:
                total += (lin.d_in + lin.d_out) * lin.count
                seen.add(lin.name)
        return total, tuple(sorted(names - seen))

    # --- activation widths (elements per token) ----------------------------------------------
    @cached_property
    def attention_width(self) -> int:
        """Saved tensors of one attention block per token (estimation.md §4.2 adapted per component).

        norm input and output (2h), q before and after RoPE (2 a d), k and v (2 h_kv), attention
        output = o_proj input (a d), plus flash-attention's fp32 log-sum-exp (4 bytes x a = 2 a
        bf16-elements). No s^2 term: flash/SDPA attention never stores the score matrix.
        """
        q = self.heads * self.head_dim
        return 2 * self.hidden + 3 * q + 2 * self.kv_heads * self.head_dim + 2 * self.heads

    @cached_property
    def mlp_width(self) -> int:
        """Saved tensors of one MLP block per token: norm in/out (2h) + intermediates.

        Gated (SwiGLU): gate, up, act(gate), act*up = 4i (estimation.md §4.2). Plain GELU: fc1 output
        and GELU output = 2i (Korthikanti et al. 2022, arXiv:2205.05198, MLP term). MoE (Mixtral /
        GraniteMoe experts loop): each of the top_k routed copies holds its gathered input, output and 4i
        intermediates, plus the weighted sum (h) and fp32 router logits and probabilities (4E).
        """
        base = 2 * self.hidden
        if self.experts:
            routed = self.top_k * (2 * self.hidden + 4 * self.intermediate) + self.hidden + 4 * self.experts
            shared = 4 * self.shared_intermediate
            return base + routed + shared
        if self.model_type in PLAIN_MLP_TYPES:
            return base + 2 * self.intermediate
        return base + 4 * (self.shared_intermediate or self.intermediate)

    @cached_property
    def mamba_width(self) -> int:
        """Saved tensors of one Mamba-2 block per token (transformers granitemoehybrid / mamba2 layout).

        norm in/out (2h), in_proj output (2 d_inner + 2 g N + H), causal-conv output (d_inner + 2 g N),
        SSD output y, gated-norm input/output and out_proj input (4 d_inner), and the chunked scan's
        fp32 chunk states (H x P x N per chunk of C tokens = d_inner N / C, x2 for fp32).
        """
        m = self.mamba
        if not m:
            return 0
        d_inner, n_state, groups = m["d_inner"], m["d_state"], m["n_groups"]
        in_proj = 2 * d_inner + 2 * groups * n_state + m["n_heads"]
        conv = d_inner + 2 * groups * n_state
        states = 2 * d_inner * n_state / m["chunk_size"]
        return int(2 * self.hidden + in_proj + conv + 4 * d_inner + states)

    @cached_property
    def layer_width(self) -> int:
        """Widest decoder layer (what one layer's recomputation holds with checkpointing)."""
        attn_layer = self.attention_width + self.mlp_width if self.attention_layers else 0
        mamba_layer = self.mamba_width + self.mlp_width if self.layers > self.attention_layers else 0
        return max(attn_layer, mamba_layer)

    @cached_property
    def stack_width(self) -> int:
        """Sum over all decoder layers of their widths (activations stored without checkpointing)."""
        mamba_layers = self.layers - self.attention_layers
        return (
            self.attention_layers * (self.attention_width + self.mlp_width)
            + mamba_layers * (self.mamba_width + self.mlp_width)
        )

    @cached_property
    def attention_flops_per_token_per_context(self) -> float:
        """Forward FLOPs per token per token of context of the attention core: QK^T and AV.

        2 matmuls x 2 FLOPs x a x d per (query, key) pair, halved for the causal mask (PaLM App. B
        counts 6 L H Q T for training with the full square; llm-foundry the same). Multiply by s.
        """
        return 2 * self.attention_layers * self.heads * self.head_dim

    @cached_property
    def logits_copies(self) -> int:
        """Extra vocab-sized bf16 tensors per token beyond the HF loss (granite's logits_scaling)."""
        return 1 if self.model_type in LOGIT_SCALED_TYPES else 0


def _attention_linears(spec: ModelSpec, n_layers: int, h: int, heads: int, kv: int, d: int) -> list[Linear]:
    if spec.model_type == "gpt_bigcode":
        return [Linear("c_attn", h, heads * d + 2 * kv * d, n_layers), Linear("c_proj", heads * d, h, n_layers)]
    if spec.model_type == "bloom":
        return [Linear("query_key_value", h, 3 * h, n_layers), Linear("dense", h, h, n_layers)]
    return [
        Linear("q_proj", h, heads * d, n_layers),
        Linear("k_proj", h, kv * d, n_layers),
        Linear("v_proj", h, kv * d, n_layers),
        Linear("o_proj", heads * d, h, n_layers),
    ]


def _mlp_linears(spec: ModelSpec, n_layers: int, h: int, i: int, shared_i: int) -> list[Linear]:
    experts = spec.num_local_experts or 0
    top_k = spec.num_experts_per_tok or 0
    if spec.model_type == "gpt_bigcode":
        return [Linear("c_fc", h, i, n_layers), Linear("c_proj", i, h, n_layers)]
    if spec.model_type == "bloom":
        return [Linear("dense_h_to_4h", h, i, n_layers), Linear("dense_4h_to_h", i, h, n_layers)]
    if experts:
        frac = top_k / experts
        if spec.model_type == "mixtral":  # block_sparse_moe.experts.N.{w1,w3,w2} and .gate (router)
            out = [
                Linear("w1", h, i, n_layers * experts, active_fraction=frac),
                Linear("w3", h, i, n_layers * experts, active_fraction=frac),
                Linear("w2", i, h, n_layers * experts, active_fraction=frac),
            ]
        else:  # granitemoe*: ParallelExperts input_linear (2i) and output_linear, not nn.Linear
            out = [
                Linear("input_linear", h, 2 * i, n_layers * experts, active_fraction=frac),
                Linear("output_linear", i, h, n_layers * experts, active_fraction=frac),
            ]
        out.append(Linear("gate" if spec.model_type == "mixtral" else "router", h, experts, n_layers, quantized=False))
        if shared_i:
            out += [
                Linear("shared_input_linear", h, 2 * shared_i, n_layers),
                Linear("shared_output_linear", shared_i, h, n_layers),
            ]
        return out
    if spec.model_type == "granitemoehybrid":  # dense hybrids: shared_mlp.input_linear (2i) / output_linear
        width = shared_i or i
        return [Linear("input_linear", h, 2 * width, n_layers), Linear("output_linear", width, h, n_layers)]
    return [Linear("gate_proj", h, i, n_layers), Linear("up_proj", h, i, n_layers), Linear("down_proj", i, h, n_layers)]


def _mamba_dims(spec: ModelSpec) -> dict:
    raw = spec.extra.get("mamba")
    if raw is None and "config" in spec.extra:  # config.json of a granitemoehybrid model
        cfg = spec.extra["config"]
        if "mamba" in (cfg.get("layer_types") or []):
            expand = cfg.get("mamba_expand", 2)
            raw = {
                "mamba_d_inner": expand * spec.hidden_size,
                "mamba_d_state": cfg.get("mamba_d_state", 128),
                "mamba_n_heads": cfg.get("mamba_n_heads", 128),
                "mamba_n_groups": cfg.get("mamba_n_groups", 1),
                "mamba_d_conv": cfg.get("mamba_d_conv", 4),
                "mamba_chunk_size": cfg.get("mamba_chunk_size", 256),
            }
    if not raw:
        return {}
    return {
        "d_inner": raw["mamba_d_inner"],
        "d_state": raw["mamba_d_state"],
        "n_heads": raw["mamba_n_heads"],
        "n_groups": raw.get("mamba_n_groups", 1),
        "d_conv": raw.get("mamba_d_conv", 4),
        "chunk_size": raw.get("mamba_chunk_size", 256),
    }


def _attention_layer_count(spec: ModelSpec, n_layers: int, has_mamba: bool) -> int:
    if not has_mamba:
        return n_layers
    idx = spec.extra.get("attention_layer_indices")
    if idx is not None:
        return len(idx)
    layer_types = (spec.extra.get("config") or {}).get("layer_types") or []
    return sum(1 for t in layer_types if t == "attention") or n_layers


def _vision(spec: ModelSpec, h_text: int) -> dict:
    """Vision tower (CLIP/SigLIP encoder) and the LLaVA-NeXT projector of a VLM."""
    vc = spec.extra.get("vision_config") or (spec.extra.get("config") or {}).get("vision_config")
    if not spec.is_vision or not vc:
        return {}
    hv, iv, lv = vc.get("hidden_size", 1024), vc.get("intermediate_size", 4096), vc.get("num_hidden_layers", 24)
    patch, size = vc.get("patch_size", 14), vc.get("image_size", 336)
    feature_layers = vc.get("vision_feature_layer", -2)
    n_feat = len(feature_layers) if isinstance(feature_layers, list) else 1
    encoder = [
        Linear(name, d_in, d_out, lv, quantized=False)
        for name, d_in, d_out in (("q_proj", hv, hv), ("k_proj", hv, hv), ("v_proj", hv, hv), ("out_proj", hv, hv),
                                  ("fc1", hv, iv), ("fc2", iv, hv))
    ]  # fmt: skip
    # CLIP/SigLIP layer: 4 hv^2 + 2 hv iv weights, biases and 2 LayerNorms; embeddings: patch conv + positions.
    per_layer = 4 * hv * hv + 2 * hv * iv + 4 * hv + hv + iv + 4 * hv
    patches = (size // patch) ** 2
    tower = vc.get("params_without_head") or vc.get("params")
    tower = tower or (lv * per_layer + 3 * patch * patch * hv + patches * hv)
    projector = n_feat * hv * h_text + h_text + h_text * h_text + h_text  # linear_1, GELU, linear_2 (with biases)
    return {
        "hidden": hv,
        "intermediate": iv,
        "layers": lv,
        "heads": vc.get("num_attention_heads", 16),
        "patch": patch,
        "image_size": size,
        "patches_per_tile": patches,
        "params": int(tower + projector + h_text),  # + image_newline
        "tower_params": int(tower),
        "linears": tuple(encoder),
        "pinpoints": _extra(spec, "image_grid_pinpoints"),
    }


def _extra(spec: ModelSpec, key: str):
    """A catalog extra, or the same key of the model's config.json."""
    return spec.extra.get(key) or (spec.extra.get("config") or {}).get(key)


@functools.lru_cache(maxsize=256)
def arch_of(spec: ModelSpec) -> Arch:
    """The Arch of a model; InputError (field model_name) when its dimensions are unknown."""
    needed = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
    missing = [k for k in needed if getattr(spec, k) is None]
    if missing:
        raise InputError(
            "model_name",
            f"{spec.name} has unknown dimensions ({', '.join(missing)}); the planner cannot size it",
            allowed="a model with known dimensions, or a path to its config.json",
        )
    h, n_layers, heads = spec.hidden_size, spec.num_hidden_layers, spec.num_attention_heads
    kv = spec.num_key_value_heads or heads
    d = spec.head_dim or h // heads
    i, vocab = spec.intermediate_size, spec.vocab_size
    shared_i = int(_extra(spec, "shared_intermediate_size") or 0)
    mamba = _mamba_dims(spec)
    n_attn = _attention_layer_count(spec, n_layers, bool(mamba))
    linears = _attention_linears(spec, n_attn, h, heads, kv, d) + _mlp_linears(spec, n_layers, h, i, shared_i)
    other = (2 * n_layers + 1) * h  # two RMSNorms per layer and the final norm
    if mamba:
        n_mamba = n_layers - n_attn
        d_in, n_state, groups, n_h = mamba["d_inner"], mamba["d_state"], mamba["n_groups"], mamba["n_heads"]
        conv_dim = d_in + 2 * groups * n_state
        linears += [
            Linear("in_proj", h, 2 * d_in + 2 * groups * n_state + n_h, n_mamba),
            Linear("out_proj", d_in, h, n_mamba),
        ]
        # depthwise conv1d (weight + bias), dt_bias, A_log, D, gated RMSNorm
        other += n_mamba * (conv_dim * mamba["d_conv"] + conv_dim + 3 * n_h + d_in)
    if spec.model_type in PLAIN_MLP_TYPES:
        # LayerNorms carry a bias (2h each), and every linear a bias of its output width
        other += (2 * n_layers + 1) * h + sum(lin.d_out * lin.count for lin in linears)
    elif spec.extra.get("attention_bias"):
        other += sum(lin.d_out * lin.count for lin in linears if lin.name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    if spec.extra.get("mlp_bias"):
        other += sum(lin.d_out * lin.count for lin in linears if lin.name in ("gate_proj", "up_proj", "down_proj"))
    embedding = vocab * h
    if spec.model_type == "gpt_bigcode":
        embedding += (spec.max_position_embeddings or 0) * h  # learned absolute positions (wpe)
    if spec.model_type == "bloom":
        other += 2 * h  # word_embeddings_layernorm
    # lm_head: a separate matrix unless tied to the input embedding (then shared storage, no new params)
    linears.append(Linear("lm_head", h, vocab, 1, quantized=False))
    lm_head_shared = vocab * h if spec.tie_word_embeddings else 0
    return Arch(
        name=spec.name,
        model_type=spec.model_type,
        hidden=h,
        layers=n_layers,
        heads=heads,
        kv_heads=kv,
        head_dim=d,
        intermediate=i,
        vocab=vocab,
        tied=bool(spec.tie_word_embeddings),
        max_position=spec.max_position_embeddings,
        experts=spec.num_local_experts or 0,
        top_k=spec.num_experts_per_tok or 0,
        shared_intermediate=shared_i,
        attention_layers=n_attn,
        mamba=mamba,
        linears=tuple(linears),
        embedding_params=embedding - lm_head_shared,  # tied: the lm_head Linear holds the shared matrix
        other_params=other,
        vision=_vision(spec, h),
    )


def image_tiles(arch: Arch, width: int, height: int) -> int:
    """Vision tiles one image becomes in LLaVA-NeXT 'anyres': the best grid pinpoint's tiles + 1 base.

    transformers llava_next ``select_best_resolution``: the pinpoint that keeps the most effective
    resolution, then wastes the least; without a pinpoint list, a grid of image_size tiles.
    """
    size = arch.vision.get("image_size", 336)
    pins = arch.vision.get("pinpoints")
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
