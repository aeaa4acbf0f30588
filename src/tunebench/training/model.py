"""The model of a measured run: pretrained weights resolved locally, or random weights from an architecture.

``weights``: ``pretrained`` loads a local path or the local HF cache
(``local_files_only``, never a download); ``random`` instantiates the architecture (a catalog entry
of tunebench.catalog or a config.json) with random initialisation directly in the target dtype and
on the target device (throughput and memory do not depend on weight values); ``auto`` is
pretrained when the weights resolve locally, else random. ``tiny=True`` shrinks an architecture to
a test model (hf-stack.md §4.1 shapes) keeping its type and features (MoE, MQA, hybrid layers).

Hardware checks fail early with a clear reason: flash-attention, QLoRA (bitsandbytes NF4) and
GPTQ need an NVIDIA GPU and their packages.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from tunebench.catalog import ModelSpec, get_model
from tunebench.catalog.hf_config import config_dict
from tunebench.spec.properties import FLASH_ATTENTION_PACKAGES

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}

# hf-stack.md §4.1 tiny test shapes: hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads;
# MoE 4 experts top-2. Vocabulary: the tokenizer's (set by the caller).
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
}
TINY_MAMBA = {  # granitemoehybrid: d_inner = expand * hidden = n_heads * d_head
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_d_state": 16,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 16,
}
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


class HardwareError(RuntimeError):
    """A method or option this machine cannot run (recorded as a failed measurement, with this reason)."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    weights: str  # "pretrained" | "random"
    source: str  # path the weights came from, or the architecture's name / config path
    architecture: str | None  # catalog name or config path (random weights)
    quantization: str | None  # "bnb-nf4-double" | "gptq" | None


# ---------------------------------------------------------------------------------------------- checks


def cuda_available(use_cpu: bool = False) -> bool:
    return not use_cpu and torch.cuda.is_available()


def check_hardware(
    *,
    on_gpu: bool,
    use_flash_attn: bool,
    peft_method: str,
    auto_gptq: list[str] | None,
    weights: str,
    attn: str | None = None,
) -> None:
    """Fail before loading anything when the requested method/options cannot run here."""
    chosen = attn_implementation(use_flash_attn, attn)
    module, package = FLASH_ATTENTION_PACKAGES.get(chosen or "", (None, None))
    if module and not (on_gpu and importlib.util.find_spec(module)):
        via = f"attn_implementation={chosen}" if attn else "use_flash_attn=True"
        raise HardwareError(f"flash-attention needs an NVIDIA GPU and the {package} package ({via})")
    if peft_method == "qlora":
        if not on_gpu:
            raise HardwareError("QLoRA (bitsandbytes NF4, double quantisation) needs an NVIDIA GPU; none is in use")
        if not importlib.util.find_spec("bitsandbytes"):
            raise HardwareError("QLoRA needs the bitsandbytes package, which is not installed")
    if auto_gptq:
        if not on_gpu:
            raise HardwareError(f"GPTQ-LoRA (auto_gptq {' '.join(auto_gptq)}) needs an NVIDIA GPU; none is in use")
        if not (importlib.util.find_spec("gptqmodel") or importlib.util.find_spec("auto_gptq")):
            raise HardwareError("GPTQ-LoRA needs the gptqmodel package (transformers' GPTQ backend), not installed")
        if weights == "random":
            raise HardwareError("GPTQ-LoRA needs a GPTQ-quantized checkpoint; weights=random cannot provide one")


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX). Without it torch emulates bf16
    matrix products, about 50x slower than fp32 (measured on an AVX2 EPYC: 3.5 s against 0.065 s for a
    1024 x 1024 product)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def check_cpu_precision(fp16: bool, on_gpu: bool) -> None:
    """HardwareError for the one precision a CPU run cannot honour: fp16 autocast (accelerate turns AMP on
    for fp16 only on accelerators, accelerate.Accelerator.__init__, so the run would train float32 under
    the fp16 entity's name). bf16 autocast and 16-bit weights run as asked on a CPU."""
    if fp16 and not on_gpu:
        raise HardwareError(
            "fp16 autocast needs a GPU: accelerate applies no fp16 mixed precision on a CPU (use bf16, or "
            "torch_dtype float16)"
        )


def cpu_precision_note(torch_dtype: str, bf16: bool, on_gpu: bool) -> str | None:
    """A note for the record when a CPU run computes in a 16-bit type this CPU has no native instructions
    for (bfloat16 without AVX512-BF16/AMX, float16 without AMX-FP16): it runs as asked, far slower than on
    a CPU that has them. None on a GPU, in float32, or with native support."""
    if on_gpu:
        return None
    native = {"bfloat16": cpu_has_fast_bf16(), "float16": bool(torch.cpu._is_amx_fp16_supported())}
    wanted = {torch_dtype} - {"float32", "float64"} | ({"bfloat16"} if bf16 else set())  # fp32/fp64: native
    slow = sorted(d for d in wanted if not native[d])
    if not slow:
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"{' and '.join(slow)} trained as asked; this CPU ({capability}) has no native {' or '.join(slow)} "
        "instructions, so torch computes them through float32 (far slower than on a CPU that has them)"
    )


def attn_implementation(use_flash_attn: bool, requested: str | None = None) -> str | None:
    """The requested attn_implementation; else flash_attention_2 when use_flash_attn (both checked by
    check_hardware), else None: transformers' default for the model (sdpa where it has it, else eager)."""
    return requested or ("flash_attention_2" if use_flash_attn else None)


# ---------------------------------------------------------------------------------------------- weights


def resolve_pretrained(name_or_path: str | None) -> str | None:
    """Local directory holding config.json and weights for a path or HF id, or None (never downloads)."""
    if not name_or_path:
        return None
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path) if _has_weights(path) else None
    if path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        snap = Path(snapshot_download(name_or_path, local_files_only=True))
    except Exception:  # not in the local cache, or not an HF id at all
        return None
    return str(snap) if _has_weights(snap) else None


def _has_weights(path: Path) -> bool:
    return (path / "config.json").is_file() and any(any(path.glob(p)) for p in WEIGHT_FILES)


def architecture_spec(tunebench_model: str | None, model_name_or_path: str | None) -> ModelSpec:
    """The architecture for random weights: --tunebench_model, else the model name/path itself."""
    value = tunebench_model or model_name_or_path
    if not value:
        raise ValueError("random weights need an architecture: pass --tunebench_model NAME_OR_CONFIG")
    path = Path(value).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        value = str(path / "config.json")
    return get_model(value)


# ---------------------------------------------------------------------------------------------- configs


def config_dict_from_spec(spec: ModelSpec) -> dict[str, Any]:
    """transformers config kwargs of an architecture (tunebench.catalog.hf_config); vision models not yet."""
    if spec.model_type == "llava_next" and not spec.extra.get("config"):
        raise NotImplementedError("vision models (llava_next) train on a vision data set (dataset_image_field)")
    return config_dict(spec)


def context_length(spec: ModelSpec | None, tiny: bool = False) -> int | None:
    """Positions the random-weights model has (shrink() caps them for tiny models); None if unknown."""
    if spec is None or not spec.max_position_embeddings:
        return None
    return min(spec.max_position_embeddings, TINY["max_position_embeddings"]) if tiny else spec.max_position_embeddings


def shrink(cfg: dict[str, Any]) -> dict[str, Any]:
    """A tiny version of an architecture: same type and features, test-sized (TINY)."""
    cfg = dict(cfg)
    mt = cfg["model_type"]
    if mt == "gpt_bigcode":
        cfg.update(n_embd=TINY["hidden_size"], n_inner=TINY["intermediate_size"], n_layer=2, n_head=4, n_positions=4096)
        return cfg
    if mt == "bloom":
        cfg.update(hidden_size=TINY["hidden_size"], n_layer=2, n_head=4)
        cfg.pop("n_embed", None)
        return cfg
    mqa = cfg.get("num_key_value_heads") == 1
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim"):
        cfg[k] = TINY[k]
    cfg["num_key_value_heads"] = 1 if mqa else TINY["num_key_value_heads"]
    cfg["max_position_embeddings"] = min(cfg.get("max_position_embeddings") or TINY["max_position_embeddings"], 4096)
    if cfg.get("num_local_experts"):
        cfg.update(num_local_experts=TINY["num_local_experts"], num_experts_per_tok=TINY["num_experts_per_tok"])
    if "shared_intermediate_size" in cfg:
        cfg["shared_intermediate_size"] = TINY["intermediate_size"]
    if mt == "granitemoehybrid":
        cfg.update(TINY_MAMBA)
        cfg["layer_types"] = ["mamba", "attention"]  # keep the hybrid: one layer of each
    return cfg


def build_config(
    spec: ModelSpec, tiny: bool, tokenizer_vocab: int, special_ids: dict[str, int | None]
) -> PretrainedConfig:
    """transformers config of the architecture; vocabulary at least the tokenizer's (tiny: exactly)."""
    from transformers import CONFIG_MAPPING

    cfg = training_config_dict(config_dict_from_spec(spec), tiny, tokenizer_vocab, special_ids)
    mt = cfg.pop("model_type")
    return CONFIG_MAPPING[mt].from_dict(cfg)


def training_config_dict(
    cfg: dict[str, Any], tiny: bool, tokenizer_vocab: int, special_ids: dict[str, int | None]
) -> dict[str, Any]:
    """A (language) model's config dict as a run trains it: shrunk when tiny, a vocabulary of at least
    the tokenizer's (tiny: exactly), the tokenizer's special ids, and no KV cache."""
    if tiny:
        cfg = shrink(cfg)
        cfg["vocab_size"] = tokenizer_vocab
    else:
        cfg = dict(cfg, vocab_size=max(int(cfg.get("vocab_size") or 0), tokenizer_vocab))
    cfg.update({k: v for k, v in special_ids.items() if v is not None})
    cfg["use_cache"] = False  # fms-hf-tuning loads with use_cache=False (training)
    return cfg


# ---------------------------------------------------------------------------------------------- loading


def _fsdp_enabled() -> bool:
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")


def target_device(on_gpu: bool) -> torch.device:
    """cuda:<LOCAL_RANK> on GPU (CPU under FSDP: accelerate shards and moves it), else cpu."""
    if on_gpu and not _fsdp_enabled():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def bnb_config(dtype: torch.dtype) -> Any:
    """QLoRA quantisation: bitsandbytes NF4 with double quantisation, compute in the run's dtype."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
    )


def quantization_of(peft_method: str, auto_gptq: list[str] | None) -> str | None:
    """How the base weights are quantised: QLoRA's bitsandbytes NF4, GPTQ, or not at all."""
    return "bnb-nf4-double" if peft_method == "qlora" else ("gptq" if auto_gptq else None)


def load_model(
    *,
    torch_dtype: str,
    use_flash_attn: bool,
    quantization: str | None,
    on_gpu: bool,
    tokenizer_vocab: int,
    special_ids: dict[str, int | None],
    pretrained_path: str | None,
    architecture: ModelSpec | None,
    tiny: bool = False,
    attn: str | None = None,
) -> LoadedModel:
    """Build or load the model in the target dtype and device (see module docstring).

    pretrained_path: a local checkpoint to load; else ``architecture`` (architecture_spec) is built with
    random weights (``tiny``: shrunk to a test model).
    """
    dtype = DTYPES[torch_dtype]
    device = target_device(on_gpu)
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": attn_implementation(use_flash_attn, attn)}
    if pretrained_path:
        if quantization == "bnb-nf4-double":
            kwargs["quantization_config"] = bnb_config(dtype)
        if device.type == "cuda":
            kwargs["device_map"] = {"": device.index}
        model = AutoModelForCausalLM.from_pretrained(pretrained_path, local_files_only=True, use_cache=False, **kwargs)
        return LoadedModel(model, "pretrained", pretrained_path, None, quantization)

    if architecture is None:
        raise ValueError("random weights need an architecture: pass --tunebench_model NAME_OR_CONFIG")
    config = build_config(architecture, tiny, tokenizer_vocab, special_ids)
    if quantization == "bnb-nf4-double":
        # bitsandbytes quantises while loading: save the random model once, load it quantised.
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        with tempfile.TemporaryDirectory(prefix="tunebench-random-") as tmp:
            model.save_pretrained(tmp)
            del model
            model = AutoModelForCausalLM.from_pretrained(
                tmp, quantization_config=bnb_config(dtype), device_map={"": device.index or 0}, **kwargs
            )
    else:
        with device:  # random init directly on the target device and in the target dtype
            model = AutoModelForCausalLM.from_config(config, **kwargs)
    return LoadedModel(model, "random", architecture.config_path or architecture.name, architecture.name, quantization)


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Unique parameters (tied weights once), total and trainable."""
    seen, total, trainable = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.numel() * (2 if type(p).__name__ == "Params4bit" else 1)  # 4-bit params pack two per element
        total += n
        trainable += n if p.requires_grad else 0
    return {"total": total, "trainable": trainable}
