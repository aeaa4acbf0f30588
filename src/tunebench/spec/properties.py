"""Entity properties of the SFTTrainer spec: names, types, defaults and domains, and how values parse.

Every property name is the spec's, verbatim (model_name, model_max_length, number_gpus, batch_size,
...). Where the reference narrows a domain more than real jobs need (LoRA r <= 32, 32 GPUs, 8 nodes,
batch <= 4096) the domain here is open and validity/planning judge the entity instead.

A value outside a property's *domain* is an input error (InputError). A value inside the domain that
breaks a validity rule (e.g. batch_size 0, rule 4) is a valid request with is_valid false: see
``tunebench.spec.validity``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunebench.errors import InputError, has_control_characters, one_of, parse_json, shown, suggest

REQUIRED = object()  # sentinel default of a required property

# the SFTTrainer spec "optim": the optimizer names the experiments accept (HF TrainingArguments.optim).
OPTIMIZERS = (
    "adamw_hf", "adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused",
    "adamw_apex_fused", "adafactor", "adamw_anyprecision", "adamw_torch_4bit", "ademamix", "sgd",
    "adagrad", "adamw_bnb_8bit", "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit",
    "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop", "rmsprop_bnb", "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit", "galore_adamw", "galore_adamw_8bit", "galore_adafactor",
    "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "lomo",
    "adalomo", "grokadamw", "schedule_free_adamw", "schedule_free_sgd",
)  # fmt: skip

# the SFTTrainer spec "fms_hf_tuning_version": available options (the reference's pinned stacks), after the
# releases published since (3.2.0-3.2.2, on the package index), which the fms-hf-tuning actuator runs too.
FMS_HF_TUNING_VERSIONS = (
    "3.2.2", "3.2.1", "3.2.0", "3.1.0", "3.0.0.1", "3.0.0", "2.8.2", "2.7.1", "2.6.0", "2.5.0", "2.4.0", "2.3.1", "2.2.1",
    "2.1.2", "2.1.0", "2.0.1",
)  # fmt: skip

# the SFTTrainer spec "fsdp_sharding_strategy": [1]..[5]; the numbers are accepted as the spec writes them.
FSDP_SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
FSDP_STATE_DICT_TYPES = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
# the SFTTrainer spec "torch_dtype": the benchmark experiments take "One of bfloat16, float32, float16"; the stability
# experiment "any valid torch_dtype value e.g. float32, bfloat16, float16, etc": of torch's dtypes, those a model can be
# loaded in and trained (gradients need a floating dtype; float8 has no training kernels in torch or transformers).
SPEC_TORCH_DTYPES = ("bfloat16", "float32", "float16")
TORCH_DTYPES = (*SPEC_TORCH_DTYPES, "float64")
TORCH_DTYPE_ALIASES = {"float": "float32", "half": "float16", "double": "float64"}  # torch.float, torch.half, ...
MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")
DISTRIBUTED_BACKENDS = ("FSDP", "DDP", "DeepSpeed", None)  # DeepSpeed: tunebench extension (planning only)
AUTO_STOP_METHODS = (None, "WARMUP_60S_STABLE_120S_OR_10_STEPS")

# --- tunebench extensions: the stack settings the planner takes (docs/experiments.md "Stack settings") ---
# Each defaults to None = what fms-hf-tuning runs (transformers + peft + accelerate), so entity ids
# without them are unchanged. Names are the libraries' own where one exists.
# transformers `attn_implementation` (modeling_utils.PreTrainedModel._check_and_adjust_attn_implementation).
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3")


def class_attentions(model: Any) -> tuple[str, ...]:
    """The attn_implementations a transformers model class (or model) supports, by its flags: eager always, sdpa
    (``_supports_sdpa``), flash_attention_2 (``_supports_flash_attn``; ``_supports_flash_attn_2`` before
    transformers 5), whose flag covers flash_attention_3 too. Read by the planner (plan.meta_model) and the
    native engine's rules (engines.support) alike."""
    out = ["eager"]
    if getattr(model, "_supports_sdpa", False):
        out.append("sdpa")
    if getattr(model, "_supports_flash_attn", False) or getattr(model, "_supports_flash_attn_2", False):
        out.append("flash_attention_2")
    return tuple(out)


# The module transformers imports for each flash-attention (transformers.utils.import_utils) and its package.
FLASH_ATTENTION_PACKAGES = {"flash_attention_2": ("flash_attn", "flash-attn"),
                            "flash_attention_3": ("flash_attn_interface", "flash-attn 3")}  # fmt: skip
# The loss path: transformers upcasts the logits to fp32 (ForCausalLMLoss); chunked / in-place kernels keep
# 16-bit logits (fms-acceleration fast_loss, torchtune CEWithChunkedOutputLoss, Unsloth); Liger's fused
# linear cross-entropy never materialises the logits (liger_kernel.transformers LigerFusedLinearCrossEntropyLoss);
# model_dtype: nn.CrossEntropyLoss on the logits in the model's dtype, no fp32 copy (what remote-code heads
# such as Qwen (v1)'s modeling_qwen.py QWenLMHeadModel.forward run without AMP).
LOSS_IMPLEMENTATIONS = ("upcast", "chunked", "fused_linear", "model_dtype")
# chunked: tokens per chunk of the flattened micro-batch, one chunk's fp32 values alive at a time (training.loss runs
# it; the planner sizes a shorter micro-batch's one chunk by its own tokens: plan.memory)
LOSS_CHUNK_TOKENS = 1024
# Trainable adapter weights: peft keeps them in fp32 (get_peft_model(autocast_adapter_dtype=True));
# False, or litgpt's bf16-true, keeps them in the base dtype.
ADAPTER_DTYPES = ("float32", "bfloat16", "float16")
# torchtitan activation_checkpoint.mode: full (every block's input kept, the block recomputed) or
# selective (op-level: matmul outputs kept, cheap element-wise ops recomputed).
CHECKPOINTING_MODES = ("full", "selective")

# fms-hf-tuning --padding_free: the methods its PaddingFree config takes ("only 'huggingface' method currently
# supported", tuning/config/acceleration_configs/attention_and_distributed_packing.py)
PADDING_FREE_METHODS = ("huggingface",)
# Model types whose transformers (5.x, the native worker's) code keeps the samples of a flattened row apart: their
# masks are built from the packed position ids (masking_utils.find_packed_sequence_indices; flash-attention's varlen
# kernel likewise), so a sample attends to itself only. Checked on tiny models of each type
# (tests/plan/test_stack_settings.py), which also shows that others mix them: bloom (ALiBi and its mask without
# position ids), falcon (its mask without position ids), granitemoehybrid (its Mamba layers need seq_idx).
PADDING_FREE_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "granite", "granitemoe", "granitemoeshared", "gpt_bigcode", "qwen2", "qwen2_moe",
    "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "gpt_neox", "olmo", "olmo2", "starcoder2",
    "cohere", "stablelm", "smollm3",
)  # fmt: skip

# accelerate deepspeed_config offload_optimizer_device / offload_param_device (DeepSpeed zero_optimization
# offload_optimizer.device / offload_param.device).
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# transformers from_pretrained(device_map="auto"): the layers split over the process's GPUs (naive pipeline).
DEVICE_MAPS = (None, "auto")


def fast_loss_on(fast_kernels: Any) -> bool:
    """fast_kernels' first flag, fms-acceleration-foak's fast cross-entropy (entity values are bools,
    the worker's command line passes "True"/"False")."""
    return bool(fast_kernels) and str(fast_kernels[0]).lower() in ("true", "1")


def loss_path(loss_implementation: str | None, fast_kernels: Any) -> str:
    """The loss implementation a run uses: loss_implementation, else chunked with fast_kernels' fast_loss
    (the property's None), else transformers' upcast."""
    return loss_implementation or ("chunked" if fast_loss_on(fast_kernels) else "upcast")


def flash_attn_on(values: dict[str, Any]) -> bool:
    """The flash_attn property as run: None = on with GPUs, off on the CPU (tunebench.actuators.launch)."""
    flash = values.get("flash_attn")
    return bool(values.get("number_gpus", 0) > 0) if flash is None else bool(flash)


def attention_asked(values: dict[str, Any]) -> str | None:
    """The attention implementation asked for: attn_implementation, else flash_attention_2 when flash_attn is on,
    else None (transformers' default for the model: sdpa where it has it, else eager)."""
    attn = values.get("attn_implementation")
    if attn is not None:
        return attn
    return "flash_attention_2" if flash_attn_on(values) else None


# The most GPUs (and nodes) an entity may name: the largest published training job, Llama 3 405B on 16,384
# H100s (Llama Team, "The Llama 3 Herd of Models", 2024, §3.3). More is surely a typo, and a launch plan
# or a recommendation would enumerate every one of them.
MAX_GPUS = 16_384
# GPUs of one node, as recommend lays jobs out and the planner's notes expect: an HGX/DGX node holds 8 SXM GPUs
# on one NVLink switch (NVIDIA DGX H100 and DGX B200 user guides); PCIe servers hold 8-10
NODE_GPUS = 8
# Integers are stored in 64-bit INTEGER columns (and computed on as int64): the machine's bounds.
INT_MAX = 2**63 - 1
INT_MIN = -(2**63)
# Names that reach the worker's command line as values: never a flag (no leading '-'), no spaces,
# no control characters. Module names: q_proj, model.layers.0.mlp, all-linear; class names: LlamaDecoderLayer.
_NAME = r"[A-Za-z_][A-Za-z0-9_.\-]*"
MODULE_NAMES = (_NAME, "module names (letters, digits, _ . -; first a letter or _)")
FIELD_NAME = (_NAME, "a field name (letters, digits, _ . -; first a letter or _)")
CLASS_NAMES = (r"[A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*", "class names, comma separated")

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}
_NONE = {"none", "null", ""}


@dataclass(frozen=True)
class Property:
    """One entity property: its type, default and domain.

    kind is one of int, float, bool, choice, str, list, bool_list, model, gpu, dataset.
    """

    name: str
    kind: str
    description: str
    default: Any = REQUIRED
    choices: tuple = ()
    minimum: float | None = None  # inclusive lower bound of int/float
    maximum: float | None = None  # inclusive upper bound of int/float
    special: tuple = ()  # extra allowed values outside [minimum, maximum], e.g. -1 = "off"
    nullable: bool = False
    pattern: tuple[str, str] | None = None  # str/list: (regex every name must match, what it allows)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def domain(self) -> str:
        """Human-readable domain, as printed by `describe` and in input errors."""
        if self.kind == "choice":
            return one_of("None" if c is None else c for c in self.choices)
        if self.kind in ("int", "float"):
            noun = "an integer" if self.kind == "int" else "a number"
            if self.minimum is None and self.maximum is None:
                text = noun
            elif self.maximum is None:
                text = f"{noun} >= {_fmt(self.minimum)}"
            elif self.minimum is None:
                text = f"{noun} <= {_fmt(self.maximum)}"
            else:
                text = f"{noun} in [{_fmt(self.minimum)}, {_fmt(self.maximum)}]"
            if self.special:
                text += " or " + ", ".join(_fmt(s) for s in self.special)
            return text + (" or None" if self.nullable else "")
        none = " or None" if self.nullable else ""
        return {
            "bool": "true, false",
            "str": (self.pattern[1] if self.pattern else "a string") + none,
            "list": f"a list of {self.pattern[1] if self.pattern else 'names'} (comma or space separated, or JSON)"
            + none,
            "bool_list": "a list of 3 booleans [fast_loss, fast_rms_layernorm, fast_rope_embeddings] or None",
            "model": "a name from `tunebench models`, a Hugging Face id of one, or a path to a config.json",
            "gpu": "a GPU label from `tunebench gpus` (or an alias), any other node label (planning then needs "
            "its numbers), or None",
            "dataset": "a dataset id from `tunebench datasets list` or the forms news-chars-N-entries-M, "
            "news-tokens-Kplus-entries-M, vision-WxH-Kplus-entries-M",
        }[self.kind]

    def parse(self, raw: Any) -> Any:
        """Parse a CLI string or a YAML/JSON value into the property's canonical Python value."""
        if isinstance(raw, str) and has_control_characters(raw):
            raise self.error(raw, "contains control characters")
        if self.nullable and (raw is None or (isinstance(raw, str) and raw.strip().lower() in _NONE)):
            return None
        if raw is None and self.kind in ("int", "float", "bool"):  # JSON null, YAML ~: not 'None is not an integer'
            raise self.error(raw, "a value is required (got null)")
        parser: Callable[[Property, Any], Any] = _PARSERS[self.kind]
        return parser(self, raw)

    def error(self, raw: Any, why: str = "") -> InputError:
        return InputError(self.name, why or f"invalid value {shown(raw)}", allowed=self.domain())


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _parse_bool(prop: Property, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise prop.error(raw, f"{raw!r} is not a boolean")


def _check_range(prop: Property, value: float, raw: Any) -> None:
    if prop.kind == "int" and not INT_MIN <= value <= INT_MAX:
        raise prop.error(raw, f"{raw!r} does not fit a 64-bit integer (what the store holds)")
    if value in prop.special:
        return
    if (prop.minimum is not None and value < prop.minimum) or (prop.maximum is not None and value > prop.maximum):
        raise prop.error(raw, f"{raw!r} is outside the domain")


def _parse_int(prop: Property, raw: Any) -> int:
    if isinstance(raw, bool):
        raise prop.error(raw, f"{raw!r} is not an integer")
    if isinstance(raw, str) and "," in raw:  # 1,024 is a thousands separator; KEY=1024,2048 a list, what --grid sweeps
        text = raw.strip()
        how = (
            f"write it without separators, {text.replace(',', '')}"
            if re.fullmatch(r"\d{1,3}(,\d{3})+", text)
            else f"one value; plan --grid {prop.name}={text} sweeps a list"
        )
        raise prop.error(raw, f"{raw!r} is not an integer ({how})")
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, str):
        text = raw.strip()
        if "_" in text:  # Python's int() reads 1_0 as 10: a typo, not a number anyone writes here
            raise prop.error(raw, f"{raw!r} is not an integer")
        try:
            value = int(text)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                raise prop.error(raw, f"{raw!r} is not an integer") from None
            if not as_float.is_integer():
                raise prop.error(raw, f"{raw!r} is not an integer") from None
            value = int(as_float)
    elif isinstance(raw, int):
        value = raw
    else:
        raise prop.error(raw, f"{raw!r} is not an integer")
    _check_range(prop, value, raw)
    return value


def _parse_float(prop: Property, raw: Any) -> float:
    if isinstance(raw, bool):
        raise prop.error(raw, f"{raw!r} is not a number")
    if isinstance(raw, str) and "_" in raw:  # float() reads 1_0.5 as 10.5
        raise prop.error(raw, f"{raw!r} is not a number")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise prop.error(raw, f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise prop.error(raw, f"{raw!r} is not a finite number")
    _check_range(prop, value, raw)
    return value


def _parse_choice(prop: Property, raw: Any) -> Any:
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in _NONE):
        if None in prop.choices:
            return None
        if "none" in prop.choices:  # a domain that spells its off value "none" (OFFLOAD_DEVICES): None is it too
            return "none"
        raise prop.error(raw, "a value is required")
    text = str(raw).strip()
    if prop.name == "torch_dtype":
        text = TORCH_DTYPE_ALIASES.get(text.lower().removeprefix("torch."), text.removeprefix("torch."))
    if prop.name == "fsdp_sharding_strategy" and text.isdigit() and 1 <= int(text) <= len(prop.choices):
        return prop.choices[int(text) - 1]  # the SFTTrainer spec: "[1] FULL_SHARD ... [5] HYBRID_SHARD_ZERO2"
    if text in prop.choices:
        return text
    by_lower = {str(c).lower(): c for c in prop.choices if c is not None}
    if text.lower() in by_lower:
        return by_lower[text.lower()]
    names = [str(c) for c in prop.choices if c is not None]
    hint = suggest(text, names)  # " Did you mean ...?" or ""
    raise prop.error(raw, f"unknown value {text!r}" + (f".{hint}" if hint else ""))


def _parse_str(prop: Property, raw: Any) -> str:
    if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
        raise prop.error(raw, f"{raw!r} is not a string")
    text = str(raw).strip()
    if prop.pattern and not re.fullmatch(prop.pattern[0], text):
        raise prop.error(raw, f"{text!r} is not allowed")
    return text


def _split_list(raw: Any) -> list[Any]:
    if isinstance(raw, (list, tuple)):
        return list(raw)
    text = str(raw).strip()
    if text.startswith("["):
        try:
            loaded = parse_json(text)
        except ValueError:
            loaded = None
        if isinstance(loaded, list):
            return loaded
        if not text.endswith("]") or '"' in text:  # broken JSON; ['a', 'b'] (a Python list) still reads
            return []
        text = text.strip("[]")
    return [part.strip().strip("'\"") for part in text.replace(",", " ").split() if part.strip()]


def _parse_list(prop: Property, raw: Any) -> tuple[str, ...]:
    items = _split_list(raw)
    if not items or not all(isinstance(i, str) and i for i in items):
        raise prop.error(raw, f"{shown(raw)} is not a list of names")
    for item in items:
        if has_control_characters(item) or (prop.pattern and not re.fullmatch(prop.pattern[0], item)):
            raise prop.error(raw, f"{shown(item)} is not a name")
    return tuple(items)


def _parse_bool_list(prop: Property, raw: Any) -> tuple[bool, ...]:
    items = _split_list(raw)
    if len(items) != 3:
        raise prop.error(raw, f"{raw!r} must hold exactly 3 booleans")
    return tuple(_parse_bool(prop, i) for i in items)


def _parse_model(prop: Property, raw: Any) -> str:
    from tunebench.catalog import get_model

    if raw is not None and not isinstance(raw, str):  # a JSON list or number where a name belongs
        raise prop.error(raw, f"{raw!r} is not a model name (a text)")
    if raw is None or not raw.strip():
        raise prop.error(raw, "a model name is required")
    return get_model(raw).name  # canonical: the catalog's short name, or the absolute config.json path


def _parse_gpu(prop: Property, raw: Any) -> str | None:
    """A catalog GPU's canonical label (aliases resolved), else any node label as given: the spec takes
    any nvidia.com/gpu.product value; planning then needs the GPU's numbers (catalog.user_gpus)."""
    from tunebench.catalog.gpus import LABEL, get_gpu, is_known_gpu

    text = str(raw).strip()
    if not text:
        return None  # empty is in the domain; rule 5 judges it when number_gpus > 0
    if is_known_gpu(text):
        return get_gpu(text).name
    if not LABEL.match(text):
        raise prop.error(raw, f"{text!r} is not a node label (letters, digits, '.', '_', '-')")
    return text


def _parse_dataset(prop: Property, raw: Any) -> str:
    from tunebench.datasets import parse_dataset_id

    return parse_dataset_id(str(raw)).id


_PARSERS: dict[str, Callable[[Property, Any], Any]] = {
    "int": _parse_int,
    "float": _parse_float,
    "bool": _parse_bool,
    "choice": _parse_choice,
    "str": _parse_str,
    "list": _parse_list,
    "bool_list": _parse_bool_list,
    "model": _parse_model,
    "gpu": _parse_gpu,
    "dataset": _parse_dataset,
}


def _p(name: str, kind: str, description: str, default: Any = REQUIRED, **kw: Any) -> Property:
    return Property(name=name, kind=kind, description=description, default=default, **kw)


# Every property any experiment uses, with the spec's default. Experiments pick subsets and may
# override a default (GPTQ-LoRA: torch_dtype float16). Descriptions paraphrase the SFTTrainer spec.
PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in (
        _p("model_name", "model", "The model to fine-tune (catalog name, HF id of one, or a config.json path)."),
        _p(
            "model_max_length",
            "int",
            "Maximum sequence length in tokens; sequences are right padded and truncated.",
            minimum=1,
        ),
        _p(
            "number_gpus",
            "int",
            "The effective number of GPUs, evenly distributed to number_nodes machines; 0 = CPU.",
            minimum=0,
            maximum=MAX_GPUS,
        ),
        _p(
            "batch_size",
            "int",
            "The effective batch size, evenly distributed to max(1, number_gpus) devices "
            "(excludes gradient accumulation).",
        ),
        _p(
            "gpu_model",
            "gpu",
            "Kubernetes node label nvidia.com/gpu.product of the GPUs, e.g. NVIDIA-A100-80GB-PCIe; "
            "must be non-empty when number_gpus > 0 (rule 5).",
            default=None,
            nullable=True,
        ),
        _p(
            "dataset_id",
            "dataset",
            "The artificial data set to train on.",
            default="news-tokens-16384plus-entries-4096",
        ),
        _p(
            "gradient_checkpointing", "bool", "Recompute activations in the backward pass to save memory.", default=True
        ),
        _p("gradient_accumulation_steps", "int", "Micro-batches accumulated per optimizer step.", default=4, minimum=1),
        _p("torch_dtype", "choice", "dtype the weights are loaded in.", default="bfloat16", choices=TORCH_DTYPES),
        _p(
            "max_steps",
            "int",
            "Optimizer steps to run; -1 (or 0: transformers runs max_steps only when > 0) "
            "respects num_train_epochs instead.",
            default=-1,
            minimum=-1,
        ),
        _p("num_train_epochs", "float", "Epochs to run; ignored if max_steps > 0.", default=1.0, minimum=1e-9),
        _p(
            "stop_after_seconds",
            "float",
            "Ask the trainer to stop after this many seconds (checked at each step "
            "end); -1 (the default) or any value <= 0 = off.",
            default=-1.0,
            minimum=-1.0,
        ),
        _p(
            "auto_stop_method",
            "choice",
            "Automatic stop: WARMUP_60S_STABLE_120S_OR_10_STEPS excludes a 60 s warm-up "
            "and then runs the longer of 120 s or 10 steps.",
            default=None,
            choices=AUTO_STOP_METHODS,
        ),
        _p(
            "distributed_backend",
            "choice",
            "Backend for multi-GPU runs (FSDP or DDP; DeepSpeed for planning); single-GPU runs use none.",
            default="FSDP",
            choices=DISTRIBUTED_BACKENDS,
        ),
        _p(
            "number_nodes",
            "int",
            "Machines to spread number_gpus over; each uses number_gpus/number_nodes GPUs.",
            default=1,
            maximum=MAX_GPUS,
        ),
        _p(
            "fms_hf_tuning_version",
            "choice",
            "Version of the reference trainer stack the measurement corresponds "
            "to (recorded; gates --fast_moe, which needs 2.4.0+).",
            default="2.1.2",
            choices=FMS_HF_TUNING_VERSIONS,
        ),
        _p("enable_roce", "bool", "RDMA over Converged Ethernet for multi-node runs.", default=False),
        _p(
            "fast_moe",
            "int",
            "Expert-parallel degree (ep_degree) of fast MoE; 0 = off. number_gpus and the model's "
            "num_local_experts must be divisible by it.",
            default=0,
            minimum=0,
        ),
        _p(
            "fast_kernels",
            "bool_list",
            "Fast kernels [fast_loss, fast_rms_layernorm, fast_rope_embeddings].",
            default=None,
            nullable=True,
        ),
        _p("optim", "choice", "The optimizer.", default="adamw_torch", choices=OPTIMIZERS),
        _p("bf16", "bool", "bf16 mixed precision (AMP) instead of training in the load dtype.", default=False),
        _p(
            "gradient_checkpointing_use_reentrant",
            "bool",
            "Use the reentrant activation-checkpoint variant.",
            default=False,
        ),
        _p(
            "fsdp_sharding_strategy",
            "choice",
            "FSDP sharding strategy ([1]..[5] accepted).",
            default="FULL_SHARD",
            choices=FSDP_SHARDING_STRATEGIES,
        ),
        _p(
            "fsdp_state_dict_type",
            "choice",
            "FSDP state dict type.",
            default="FULL_STATE_DICT",
            choices=FSDP_STATE_DICT_TYPES,
        ),
        _p(
            "fsdp_use_orig_params",
            "bool",
            "Allow non-uniform requires_grad (frozen and trainable params) under FSDP.",
            default=True,
        ),
        _p(
            "accelerate_config_mixed_precision",
            "choice",
            "accelerate mixed precision.",
            default="no",
            choices=MIXED_PRECISION,
        ),
        _p(
            "accelerate_config_fsdp_transformer_layer_cls_to_wrap",
            "str",
            "Layer classes FSDP wraps (comma separated); None takes them from the catalog.",
            default=None,
            nullable=True,
            pattern=CLASS_NAMES,
        ),
        _p(
            "dataset_text_field",
            "str",
            "Data set field holding the text; None = output.",
            default=None,
            nullable=True,
            pattern=FIELD_NAME,
        ),
        _p(
            "dataset_image_field",
            "str",
            "Data set field holding images (vision models).",
            default=None,
            nullable=True,
            pattern=FIELD_NAME,
        ),
        _p("remove_unused_columns", "bool", "Remove columns the model does not use.", default=True),
        _p("dataset_kwargs_skip_prepare_dataset", "bool", "Ask trl to skip preparing the data set.", default=False),
        _p(
            "flash_attn",
            "bool",
            "Use flash-attention 2 (tunebench: None = on with GPUs, off on the CPU, where it cannot run).",
            default=None,
            nullable=True,
        ),
        # --- tunebench extensions (docs/experiments.md "Stack settings"): planning inputs ----------
        _p(
            "attn_implementation",
            "choice",
            "Attention kernel (transformers attn_implementation); None follows flash_attn.",
            default=None,
            choices=(None, *ATTN_IMPLEMENTATIONS),
        ),
        _p(
            "loss_implementation",
            "choice",
            "Cross-entropy: upcast (fp32 logits), chunked (fp32 a chunk at a time), fused_linear "
            "(Liger, no logits), model_dtype (16-bit, no fp32 copy); None = upcast, or foak's with fast_loss.",
            default=None,
            choices=(None, *LOSS_IMPLEMENTATIONS),
        ),
        _p(
            "adapter_dtype",
            "choice",
            "dtype of trainable adapter weights; None = float32 (peft's autocast_adapter_dtype).",
            default=None,
            choices=(None, *ADAPTER_DTYPES),
        ),
        _p(
            "gradient_checkpointing_mode",
            "choice",
            "Activation checkpointing granularity when "
            "gradient_checkpointing is on: full (whole blocks) or selective (op-level); None = full.",
            default=None,
            choices=(None, *CHECKPOINTING_MODES),
        ),
        _p(
            "torch_compile",
            "bool",
            "Compile the model with torch.compile (fewer intermediates, faster element-wise work).",
            default=False,
        ),
        _p(
            "liger_kernels",
            "bool",
            "Liger-Kernel's RMSNorm, RoPE and SwiGLU kernels, as its apply_liger_kernel_to_* patches (the "
            "Trainer's use_liger_kernel) put them in; its loss is loss_implementation=fused_linear. Planning only.",
            default=False,
        ),
        _p(
            "padding_free",
            "bool",
            "Flatten each micro-batch into one row without padding (fms-hf-tuning's --padding_free huggingface, "
            "transformers' DataCollatorWithFlattening): the GPU processes the samples' own tokens.",
            default=False,
        ),
        _p(
            "deepspeed_zero_stage",
            "int",
            "DeepSpeed ZeRO stage when distributed_backend is DeepSpeed (accelerate's default 2).",
            default=2,
            minimum=0,
            maximum=3,
        ),
        _p(
            "offload_optimizer_device",
            "choice",
            "DeepSpeed: where optimizer states live (ZeRO-Offload).",
            default="none",
            choices=OFFLOAD_DEVICES,
        ),
        _p(
            "offload_param_device",
            "choice",
            "DeepSpeed ZeRO-3: where parameters live (ZeRO-Infinity).",
            default="none",
            choices=OFFLOAD_DEVICES,
        ),
        _p(
            "fsdp_offload_params",
            "bool",
            "FSDP CPU offload: parameters, gradients and the optimizer step on the host.",
            default=False,
        ),
        _p(
            "device_map",
            "choice",
            "auto: one process splits the model's layers over its GPUs (naive "
            "pipeline, transformers device_map); None = one replica per GPU.",
            default=None,
            choices=DEVICE_MAPS,
        ),
        _p(
            "tensor_parallel_degree",
            "int",
            "GPUs each layer's matrices are split over (Megatron-style tensor "
            "parallelism with sequence-parallel norms, torchtitan's tp); 1 = off.",
            default=1,
            minimum=1,
        ),
        _p(
            "sequence_parallel_degree",
            "int",
            "GPUs each sample's tokens are split over (DeepSpeed Ulysses, ring "
            "attention, torchtitan's context parallel); 1 = off.",
            default=1,
            minimum=1,
        ),
        _p("r", "int", "The LoRA rank.", default=4, minimum=1, maximum=1024),
        _p("lora_alpha", "int", "The LoRA scaling numerator.", default=16, minimum=1),
        _p(
            "target_modules",
            "list",
            "LoRA target modules; None takes the experiment's per-model map.",
            default=None,
            nullable=True,
            pattern=MODULE_NAMES,
        ),
    )
}


def get_property(name: str) -> Property:
    """A property by its spec name; InputError with a suggestion if unknown."""
    try:
        return PROPERTIES[name]
    except KeyError:
        raise InputError(name, "unknown property." + suggest(name, PROPERTIES), allowed=one_of(PROPERTIES)) from None


def render_value(value: Any) -> str:
    """Compact, stable text of a value for identifiers (ado style: booleans as 0/1)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return _fmt(value)
    if isinstance(value, (list, tuple)):
        return ",".join(render_value(v) for v in value)
    return str(value)
