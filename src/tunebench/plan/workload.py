"""What the planner computes with: an entity's settings resolved into a Workload.

A Workload is a group of entities that share the model, the method and every categorical setting
(dtype, optimizer, backend, sharding, checkpointing, kernels, GPU, data set); their numeric
properties (GPUs, nodes, batch, sequence length, accumulation, LoRA rank, steps) are numpy arrays,
so one pass of the memory and throughput formulas plans a whole group. ``predict`` plans a group
of one; ``predict_many`` groups a space first. Same code path, so batch equals single by design.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from tunebench.catalog import GPUSpec, ModelSpec, get_gpu, get_model
from tunebench.datasets import parse_dataset_id
from tunebench.datasets.ids import DatasetId
from tunebench.errors import InputError
from tunebench.plan.lengths import SampleLengths
from tunebench.plan.structure import Structure, image_tiles, structure_of
from tunebench.plan.trace import (
    FOAK_LORA_MODELS,
    LIGER_LAYER_MODELS,
    MAMBA2_KERNEL_MODELS,
    ActivationProfile,
    TraceRequest,
    profile,
)
from tunebench.spec.properties import SPEC_TORCH_DTYPES, attention_asked

# Numeric entity properties, vectorised per group (the SFTTrainer spec names).
NUMERIC = (
    "number_gpus", "number_nodes", "batch_size", "model_max_length", "gradient_accumulation_steps",
    "r", "max_steps", "num_train_epochs", "stop_after_seconds",
)  # fmt: skip
NUMERIC_DEFAULTS = {"number_nodes": 1, "gradient_accumulation_steps": 1, "r": 0, "max_steps": -1,
                    "num_train_epochs": 1.0, "stop_after_seconds": -1.0}  # fmt: skip
# Categorical settings that define a group (with model_name and method).
CATEGORICAL = (
    "target_modules", "torch_dtype", "bf16", "fp16", "accelerate_config_mixed_precision", "optim",
    "distributed_backend", "fsdp_sharding_strategy", "gradient_checkpointing", "fast_kernels", "gpu_model",
    "dataset_id", "fast_moe", "enable_roce", "lora_dropout", "num_virtual_tokens", "auto_stop_method",
    "loss_implementation", "flash_attn", "gradient_checkpointing_use_reentrant", "_kbit_upcast", "_gptq_kernel",
    "_network_gbps", "_flce_chunk_upcast", "attn_implementation", "adapter_dtype", "gradient_checkpointing_mode",
    "torch_compile", "deepspeed_zero_stage", "offload_optimizer_device", "offload_param_device",
    "fsdp_offload_params", "device_map", "tensor_parallel_degree", "sequence_parallel_degree", "liger_kernels",
    "fused_lora", "_ds_bucket_elements", "padding_free",
)  # fmt: skip

# Where a GPTQ run dequantises (Workload.dequantization): fms-acceleration's fused triton_v2 kernels (the spec's
# gptq-lora), or AutoGPTQ's QuantLinear in torch ops (transformers' GPTQ integration with exllama disabled).
GPTQ_KERNELS = ("triton_fused", "autogptq_torch")

# Tokens per entry of tunebench's synthetic data sets (tunebench.datasets.entries):
# news-tokens-Kplus: a response of >= K words at 1.20-1.33 tokens per word (entries.py docstring),
# plus ~30 tokens of prompt template; news-chars-N: 2N characters + the 127-character template at
# 4.68-5.12 characters per token (datasets/resolve.py, measured on tunebench prose), + BOS/EOS.
TOKENS_PER_WORD = 1.27
TEMPLATE_TOKENS = 30
CHARS_PER_TOKEN = 4.9
TEMPLATE_CHARS = 127
VISION_USER_WORDS = 38  # entries.py: the user turn of a vision row
# tokenizer model_max_length of models whose tokenizer truncates below the requested length
# (the ado file sfttrainer_model_hashes.json, docs/reference/published-runs.md §2; 1e30 / int64-max sentinels mean "none").
TOKENIZER_MAX_LENGTH = {"granite-13b-v2": 8192, "granite-20b-v2": 8192, "granite-34b-code-base": 8192}


@dataclass
class Workload:
    """A group of entities: shared categorical settings, numeric properties as float arrays."""

    model: ModelSpec
    structure: Structure
    method: str  # full | lora | qlora | gptq-lora | pt
    gpu: GPUSpec | None
    dataset: DatasetId
    settings: dict[str, Any]
    gpus: np.ndarray
    nodes: np.ndarray
    batch: np.ndarray
    max_length: np.ndarray
    grad_accum: np.ndarray
    rank: np.ndarray
    max_steps: np.ndarray
    epochs: np.ndarray
    stop_after_seconds: np.ndarray
    lora_params_per_rank: int = 0
    unmatched_target_modules: tuple[str, ...] = ()
    derived: dict[str, np.ndarray] = field(default_factory=dict)
    lengths: SampleLengths | None = None  # the user's own sample lengths (plan.lengths), else the data set's

    # --- settings --------------------------------------------------------------------------------
    @property
    def peft(self) -> bool:
        return self.method != "full"

    @property
    def checkpointing(self) -> bool:
        return bool(self.settings.get("gradient_checkpointing", True))

    @property
    def torch_dtype(self) -> str:
        return self.settings.get("torch_dtype") or "bfloat16"

    @property
    def autocast(self) -> str | None:
        """The autocast dtype under AMP (HF bf16/fp16 flags, accelerate mixed_precision), else None."""
        mp = self.settings.get("accelerate_config_mixed_precision") or "no"
        if self.settings.get("bf16") or mp == "bf16":
            return "bfloat16"
        if self.settings.get("fp16") or mp == "fp16":
            return "float16"
        return None

    @property
    def on_gpu(self) -> bool:
        """Whether the group runs on GPUs (predict_values never mixes CPU and GPU entities in a group)."""
        return bool(self.gpus.size and self.gpus[0] >= 1)

    @property
    def flash_asked(self) -> bool:
        """Whether the entity asks for flash-attention (2 or 3), explicitly or by flash_attn's default."""
        asked = attention_asked({**self.settings, "number_gpus": int(self.on_gpu)})
        return asked is not None and asked.startswith("flash_attention")

    @property
    def attention(self) -> str:
        """The attention implementation the run uses: 'flash' (flash-attention 2 or 3), 'sdpa' or 'eager'.

        attn_implementation when given; else flash_attn (None means on with GPUs, off on the CPU,
        tunebench.spec.properties). A model class without flash-attention 2 (or sdpa) support runs
        transformers' default for it. FA3 keeps the same tensors as FA2 (output and log-sum-exp).
        """
        explicit = self.settings.get("attn_implementation")
        if explicit == "eager":
            return "eager"
        if self.flash_asked and "flash_attention_2" in self.structure.attention:
            return "flash"
        if explicit == "sdpa" and "sdpa" in self.structure.attention:
            return "sdpa"
        return "sdpa" if self.structure.default_attention == "sdpa" else "eager"

    @property
    def padding_free(self) -> bool:
        """Micro-batches flattened into one row of the samples' own tokens (``padding_free``): no padding is
        processed, and attention runs over that row with the samples' boundaries (flash-attention per sample;
        eager and sdpa under a block-diagonal mask of the whole row)."""
        return bool(self.settings.get("padding_free"))

    def rows(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, tokens per row) of a micro-batch of samples of ``tokens`` each, as the model sees it: per-device
        batch rows, or with padding_free one row of them all (its attention's s^2 terms are the row's)."""
        if self.padding_free:
            return np.ones_like(self.per_device_batch), self.per_device_batch * tokens
        return self.per_device_batch, tokens

    @property
    def reentrant_checkpointing(self) -> bool:
        """torch.utils.checkpoint's reentrant variant (``gradient_checkpointing_use_reentrant``): what
        transformers 4.35-4.x gave the Trainer's checkpointing when no kwargs were passed, and transformers
        5 and tunebench's worker do not (use_reentrant=False)."""
        return self.checkpointing and bool(self.settings.get("gradient_checkpointing_use_reentrant"))

    @property
    def selective_checkpointing(self) -> bool:
        """Op-level selective activation checkpointing (torchtitan's 'selective' mode, op policy)."""
        return self.checkpointing and self.settings.get("gradient_checkpointing_mode") == "selective"

    @property
    def compiled(self) -> bool:
        return bool(self.settings.get("torch_compile"))

    @property
    def adapter_bytes(self) -> float:
        """Bytes per trainable adapter weight: fp32 unless adapter_dtype says otherwise (peft's
        get_peft_model(autocast_adapter_dtype=True) upcasts 16-bit adapters to fp32)."""
        return 4.0 if (self.settings.get("adapter_dtype") or "float32") == "float32" else 2.0

    @property
    def deepspeed_16bit(self) -> str | None:
        """The 16-bit dtype DeepSpeed casts the whole model to, adapters included, when its bf16/fp16 is on
        (deepspeed runtime/engine.py _configure_distributed_model: module.bfloat16() / .half(); the HF
        Trainer turns it on from its bf16/fp16 flags), else None. accelerate does not autocast under
        DeepSpeed (Accelerator.native_amp excludes it): the forward runs in that dtype, not under AMP."""
        if self.backend != "DeepSpeed" or not self.on_gpu:
            return None
        return self.autocast

    @property
    def forward_16bit(self) -> str | None:
        """The 16-bit dtype every weight is cast to for the forward, whatever it is stored in: DeepSpeed's
        (deepspeed_16bit), or FSDP's mixed precision, which accelerate sets from bf16/fp16 (its FSDP plugin's
        set_mixed_precision: MixedPrecision(param_dtype=...)) so gathered units compute in 16 bits; torchtitan's
        FSDP2 MixedPrecisionPolicy does the same. None: the forward runs in torch_dtype (under autocast with
        AMP). Traced without autocast: FSDP keeps it on, which only moves softmax/norm outputs to fp32 (eager
        attention), not the residual stream. Groups hold one GPU count class (group_key, build_workload checks)."""
        if self.deepspeed_16bit:
            return self.deepspeed_16bit
        if self.backend == "FSDP" and self.multi_gpu.size and bool(self.multi_gpu[0]):
            return self.autocast
        return None

    def trace_request(self) -> TraceRequest:
        """What the activation profile of this group depends on (plan.trace)."""
        targets = self.settings.get("target_modules")
        lora = self.method in ("lora", "qlora", "gptq-lora")
        dtype = self.forward_16bit or self.torch_dtype
        adapter_dtype = self.settings.get("adapter_dtype") or "float32"
        if self.forward_16bit and lora:
            adapter_dtype = self.forward_16bit  # cast with the model; fp32 copies are stored, not computed with
        return TraceRequest(
            config_key=self.structure.config_key,
            method="lora" if lora else self.method,
            kbit_upcast=self.kbit_upcast and not self.forward_16bit,
            checkpointing=self.checkpointing,
            reentrant=self.reentrant_checkpointing,
            dtype=dtype,
            autocast=self.autocast if self.autocast and self.autocast != dtype else None,
            attention=self.attention,
            target_modules=self.structure.stand_in_targets(
                tuple(targets) if isinstance(targets, (list, tuple)) else targets
            )
            if lora
            else None,
            lora_dropout=lora and (self.settings.get("lora_dropout") or 0) > 0,
            virtual_tokens=int(self.settings.get("num_virtual_tokens") or 8) if self.method == "pt" else 0,
            selective=self.selective_checkpointing,
            loss=self.loss_implementation if self.loss_implementation in ("chunked", "model_dtype") else "upcast",
            adapter_dtype=adapter_dtype if self.method != "full" else "float32",
            liger=bool(self.settings.get("liger_kernels")) and self.structure.model_type in LIGER_LAYER_MODELS,
            fused_lora=self.fused_lora,
            mamba_kernel=self.mamba_kernel,
        )

    @property
    def mamba_kernel(self) -> bool:
        """Mamba-2 layers run mamba_ssm's fused kernel: on GPUs, for the model types whose transformers code calls
        it (plan.trace.MAMBA2_KERNEL_MODELS; fms-hf-tuning 3.1.0 installs mamba_ssm)."""
        return self.on_gpu and self.structure.model_type in MAMBA2_KERNEL_MODELS

    @property
    def fused_lora(self) -> bool:
        """fms-acceleration-foak's fused LoRA ops run (``fused_lora``: base layer, then the flag): on a 4-bit
        base (bitsandbytes or auto_gptq) only, where foak swaps the adapted projections' forward (its
        fused_ops/unsloth_lora) of the model types it has rules for (plan.trace.FOAK_LORA_MODELS); the gptq-lora
        experiment hardcodes it on (the SFTTrainer spec)."""
        value = self.settings.get("fused_lora")
        if self.method not in ("qlora", "gptq-lora") or not value or self.structure.model_type not in FOAK_LORA_MODELS:
            return False
        flag = value[-1] if isinstance(value, (list, tuple)) else value
        return str(flag).lower() in ("true", "1")

    @property
    def kbit_upcast(self) -> bool:
        """QLoRA prepared by peft's prepare_model_for_kbit_training (tunebench's worker, HF's recipe): the
        weights that are not 4-bit run in fp32. fms-acceleration's bnb plugin skips that upcast (its
        README: the Unsloth fix); calibration records of its runs say so (``_kbit_upcast`` False)."""
        if self.deepspeed_16bit:  # DeepSpeed casts the upcast weights back to 16-bit (deepspeed_16bit)
            return False
        return self.method == "qlora" and self.settings.get("_kbit_upcast", True) is not False

    @property
    def flce_upcasts_chunks(self) -> bool:
        """Liger's fused linear cross-entropy as released before liger-kernel #406 (Nov 2024), which upcasts each
        chunk of logits outside its kernel (plan.memory.fused_linear_forward_bytes): the copy fms-acceleration's
        foak plugin vendors, so with ``fast_kernels``; records of runs of such a release say so
        (``_flce_chunk_upcast``)."""
        if self.loss_implementation != "fused_linear":
            return False
        return any(self.fast_kernels) or bool(self.settings.get("_flce_chunk_upcast"))

    @property
    def dequantization(self) -> str | None:
        """Where 4-bit weights are dequantised (plan.throughput.dequant_seconds): 'bitsandbytes' (QLoRA: a
        dequantize_4bit kernel before each matmul), 'triton_fused' (GPTQ as the spec runs it: fms-acceleration's
        triton_v2 kernels dequantise inside the matmul) or 'autogptq_torch' (AutoGPTQ's QuantLinear through
        transformers with exllama disabled: torch element-wise ops; records of such runs say ``_gptq_kernel``)."""
        if self.method == "qlora":
            return "bitsandbytes"
        if self.method != "gptq-lora":
            return None
        kernel = self.settings.get("_gptq_kernel") or "triton_fused"
        if kernel not in GPTQ_KERNELS:
            raise InputError("_gptq_kernel", f"unknown GPTQ kernel {kernel!r}", allowed=", ".join(GPTQ_KERNELS))
        return kernel

    @cached_property
    def activations(self) -> ActivationProfile:
        """Traced activation memory of this group's model and set-up (cached on disk)."""
        return profile(self.structure, self.trace_request())

    @property
    def amp(self) -> bool:
        """Automatic mixed precision: HF bf16/fp16 flags or accelerate mixed_precision (SFTTrainer spec)."""
        return self.autocast is not None

    @property
    def compute_bytes(self) -> int:
        """Bytes of an activation element: fp32 only when weights are fp32 and no autocast."""
        return 4 if self.torch_dtype == "float32" and not self.amp else 2

    @property
    def fast_kernels(self) -> tuple[bool, bool, bool]:
        fk = self.settings.get("fast_kernels") or (False, False, False)
        return tuple(bool(x) for x in fk)  # type: ignore[return-value]

    @property
    def loss_implementation(self) -> str:
        """'upcast' (transformers: fp32 logits), 'chunked' (16-bit logits, fp32 a chunk at a time) and
        'model_dtype' (the logits' own dtype; both traced with tunebench.training.loss), 'fused_linear' (Liger
        FLCE, no logits) or 'fast_loss'
        (fms-acceleration's fused cross-entropy kernel, fast_kernels[0], when no loss_implementation is given)."""
        explicit = self.settings.get("loss_implementation")
        if explicit:
            return explicit
        return "fast_loss" if self.fast_kernels[0] else "upcast"

    @property
    def backend(self) -> str | None:
        return self.settings.get("distributed_backend")

    @property
    def tp(self) -> int:
        """Tensor-parallel degree: each layer's matrices (and activations, with sequence-parallel norms) / tp."""
        return int(self.settings.get("tensor_parallel_degree") or 1)

    @property
    def sp(self) -> int:
        """Sequence-parallel degree: each sample's tokens split over sp GPUs (Ulysses, ring attention)."""
        return int(self.settings.get("sequence_parallel_degree") or 1)

    @property
    def zero_stage(self) -> int:
        """DeepSpeed ZeRO stage (0 when the backend is not DeepSpeed)."""
        return int(self.settings.get("deepspeed_zero_stage") or 0) if self.backend == "DeepSpeed" else 0

    @property
    def offload_optimizer(self) -> str:
        """Where optimizer states live: 'gpu', 'cpu' or 'nvme' (DeepSpeed offload_optimizer, FSDP CPU offload).
        A CPU run's states are in host memory already: nothing is offloaded ('gpu': where the run computes)."""
        if not self.on_gpu:
            return "gpu"
        if self.backend == "FSDP" and self.settings.get("fsdp_offload_params"):
            return "cpu"
        device = self.settings.get("offload_optimizer_device") or "none"
        return "gpu" if device == "none" or self.backend != "DeepSpeed" else device

    @property
    def offload_params(self) -> str:
        """Where parameters live at rest: 'gpu', 'cpu' or 'nvme' (ZeRO-3 offload_param, FSDP CPU offload);
        'gpu' on a CPU run, as offload_optimizer."""
        if not self.on_gpu:
            return "gpu"
        if self.backend == "FSDP" and self.settings.get("fsdp_offload_params"):
            return "cpu"
        device = self.settings.get("offload_param_device") or "none"
        return "gpu" if device == "none" or self.zero_stage != 3 else device

    @property
    def sharding(self) -> str:
        return self.settings.get("fsdp_sharding_strategy") or "FULL_SHARD"

    @property
    def optim(self) -> str:
        return self.settings.get("optim") or "adamw_torch"

    @property
    def fast_moe(self) -> int:
        return int(self.settings.get("fast_moe") or 0)

    @property
    def size(self) -> int:
        return len(self.gpus)

    # --- derived arrays ----------------------------------------------------------------------------
    @cached_property
    def devices(self) -> np.ndarray:
        """Processes sharing the batch: max(1, number_gpus) (CPU counts as one device)."""
        return np.maximum(self.gpus, 1)

    @cached_property
    def per_device_batch(self) -> np.ndarray:
        """Samples per micro-batch of one process: the batch over the devices; the whole batch when one
        process spreads the model over its GPUs (device_map)."""
        return np.where(self.mode() == "PP", self.batch, self.batch / self.data_parallel)

    @cached_property
    def data_parallel(self) -> np.ndarray:
        """Data-parallel ranks: the devices over the tensor- and sequence-parallel group size."""
        return np.maximum(self.devices / (self.tp * self.sp), 1)

    @cached_property
    def multi_gpu(self) -> np.ndarray:
        return self.gpus >= 2

    def mode(self) -> np.ndarray:
        """Per entity: 'FSDP', 'DDP', 'DeepSpeed', 'DP' (one process, torch DataParallel), 'PP' (one
        process, layers split over its GPUs by device_map) or 'single'. DeepSpeed applies on one GPU
        too (offload, ZeRO's fp32 master weights)."""
        return self._mode

    @cached_property
    def _mode(self) -> np.ndarray:
        if self.backend == "DeepSpeed":
            return np.where(self.gpus >= 1, "DeepSpeed", "single")
        if self.backend in ("FSDP", "DDP"):
            return np.where(self.multi_gpu, self.backend, "single")
        if self.settings.get("device_map"):
            return np.where(self.multi_gpu, "PP", "single")
        return np.where(self.multi_gpu, "DP", "single")

    @cached_property
    def gpus_per_node(self) -> np.ndarray:
        return self.devices / np.maximum(self.nodes, 1)

    def sample_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """(real tokens per sample, padded tokens per sample) after truncation.

        Real tokens are what dataset_tokens_per_second counts (ado-sfttrainer.md §7.3); padded tokens
        are what the GPU processes (right padding to the longest sample of the batch). The synthetic
        entries of one data set have nearly equal lengths, so padding adds little (1 %).
        """
        if "real" in self.derived:
            return self.derived["real"], self.derived["padded"]
        limit = self.length_limit()
        virtual = (self.settings.get("num_virtual_tokens") or 8) if self.method == "pt" else 0
        if self.lengths is not None:  # the user's samples: their mean, padded to a micro-batch's longest
            real = self.lengths.real(limit)
            padded = real if self.padding_free else self.lengths.padded(limit, self.per_device_batch) + virtual
            self.derived["real"], self.derived["padded"] = real, padded
            return real, padded
        ds = self.dataset
        if ds.kind == "tokens":
            entry = TOKENS_PER_WORD * ds.min_tokens + TEMPLATE_TOKENS
            pad = 1.0
        elif ds.kind == "chars":
            entry = (2 * ds.chars + TEMPLATE_CHARS) / CHARS_PER_TOKEN + 2
            pad = 1.01
        else:  # vision: text of the chat + the image's visual tokens
            entry = TOKENS_PER_WORD * (ds.min_tokens + VISION_USER_WORDS) + self.image_tokens()
            pad = 1.0
        real = np.minimum(limit, entry)
        if self.padding_free:  # one row of the samples' own tokens: nothing padded (pt is invalid with it)
            padded = real
        elif self.method == "pt":
            padded = np.minimum(limit, entry) * pad + virtual  # prompt tuning prepends virtual tokens
        else:
            padded = np.minimum(limit, entry * pad)
        self.derived["real"], self.derived["padded"] = real, padded
        return real, padded

    def attended_tokens(self) -> np.ndarray:
        """Tokens each token's attention spans, on average, as the attention FLOPs count them: the padded length
        (every sample of a micro-batch padded to its longest); with padding_free and flash-attention each sample
        alone (E[s^2] / E[s] of the user's lengths; the data set's near-equal samples: their length); with
        padding_free and eager or sdpa the whole flattened row (the mask is block-diagonal, the kernel
        multiplies the row's square all the same)."""
        real, padded = self.sample_tokens()
        if not self.padding_free:
            return padded
        if self.attention != "flash":
            return self.per_device_batch * real
        return real if self.lengths is None else self.lengths.attended(self.length_limit())

    def length_limit(self) -> np.ndarray:
        """Tokens a sample is cut at: model_max_length, or the tokenizer's own limit when smaller."""
        cap = self.tokenizer_max_length()
        return self.max_length if cap is None else np.minimum(self.max_length, cap)

    def memory_tokens(self) -> np.ndarray:
        """Padded tokens per sample that peak memory is sized for: sample_tokens' padded length, except with
        the user's own lengths (plan.lengths), whose mean sets time but whose longest sample (unknown with a
        mean only: model_max_length) sets the peak; padding-free, the largest of the run's rows (all micro-batches
        of every rank: steps x accumulation x data-parallel ranks) drawn from them, per sample of the row."""
        if self.lengths is None:
            return self.sample_tokens()[1]
        if "memory" not in self.derived:  # the row's draws are made once per workload (memory, then the notes)
            if self.padding_free:  # one row of b samples: the largest of the run's rows, per sample (Workload.rows)
                largest = self.lengths.largest_row(self.length_limit(), self.per_device_batch, self.micro_batches())
                self.derived["memory"] = largest / self.per_device_batch
            else:
                virtual = (self.settings.get("num_virtual_tokens") or 8) if self.method == "pt" else 0
                self.derived["memory"] = self.lengths.longest(self.length_limit()) + virtual
        return self.derived["memory"]

    def micro_batches(self) -> np.ndarray:
        """Micro-batches of the whole run, every rank's: optimizer steps x accumulation x data-parallel ranks."""
        return total_steps(self) * self.grad_accum * np.maximum(self.batch / self.per_device_batch, 1)

    def image_tokens(self) -> float:
        """Visual tokens of the row's image in the language sequence (LLaVA-NeXT anyres tiles)."""
        if not self.structure.vision or self.dataset.kind != "vision":
            return 0.0
        tiles = image_tiles(self.structure, self.dataset.width, self.dataset.height)
        return float(tiles * self.structure.vision["patches_per_tile"])

    def image_encoder_tokens(self) -> float:
        """Tokens the vision tower encodes per sample (every tile, base image included)."""
        return self.image_tokens()

    def tokenizer_max_length(self) -> int | None:
        return self.model.extra.get("tokenizer_model_max_length") or TOKENIZER_MAX_LENGTH.get(self.model.name)


def gpu_class(number_gpus: Any) -> int:
    """0 (CPU), 1 (one GPU) or 2 (several): entities of one Workload share it, since the forward's dtype
    depends on it (Workload.forward_16bit: FSDP's mixed precision needs several)."""
    return int(min(number_gpus or 0, 2))


def group_key(values: Mapping[str, Any], method: str) -> tuple:
    """The categorical identity of an entity's settings (what a Workload shares)."""
    get = values.get
    return (
        values["model_name"],
        method,
        gpu_class(get("number_gpus")),
        *[_hashable(get(name)) for name in CATEGORICAL],
    )


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def build_workload(
    method: str, rows: list[Mapping[str, Any]], model: ModelSpec | None = None, lengths: SampleLengths | None = None
) -> Workload:
    """One Workload from effective-value dicts that share group_key (the first row's settings); lengths: the
    user's own sample lengths for this model's tokenizer (plan.lengths), None for the data set's."""
    first = rows[0]
    spec = model or get_model(first["model_name"])
    structure = structure_of(spec)
    gpu_label = first.get("gpu_model")
    gpu = get_gpu(gpu_label) if gpu_label else None
    settings = {name: first.get(name) for name in CATEGORICAL}
    if settings.get("torch_dtype") == "float64":  # the stability experiment accepts it (spec.properties TORCH_DTYPES)
        raise InputError(
            "torch_dtype",
            "float64: the planner sizes 16- and 32-bit weights only (its formulas and "
            "calibration have no float64 run); measure the entity instead",
            allowed=", ".join(SPEC_TORCH_DTYPES),
        )
    cols = {}
    for name in NUMERIC:
        default = NUMERIC_DEFAULTS.get(name, 0)
        col = [r.get(name) for r in rows]
        cols[name] = np.array([default if v is None else v for v in col], dtype=float)
    if len({gpu_class(n) for n in cols["number_gpus"]}) > 1:
        raise ValueError("build_workload: rows of one Workload must share group_key (CPU, one GPU or several)")
    per_rank, unmatched = (0, ())
    if method in ("lora", "qlora", "gptq-lora"):
        targets = first.get("target_modules")
        per_rank, unmatched = structure.lora_params_per_rank(tuple(targets) if isinstance(targets, list) else targets)
    return Workload(
        model=spec,
        structure=structure,
        method=method,
        gpu=gpu,
        dataset=parse_dataset_id(first.get("dataset_id") or "news-tokens-16384plus-entries-4096"),
        settings=settings,
        gpus=cols["number_gpus"],
        nodes=np.maximum(cols["number_nodes"], 1),
        batch=cols["batch_size"],
        max_length=cols["model_max_length"],
        grad_accum=np.maximum(cols["gradient_accumulation_steps"], 1),
        rank=cols["r"],
        max_steps=cols["max_steps"],
        epochs=cols["num_train_epochs"],
        stop_after_seconds=cols["stop_after_seconds"],
        lora_params_per_rank=per_rank,
        unmatched_target_modules=unmatched,
        derived=_known_tokens(rows),
        lengths=lengths,
    )


def _known_tokens(rows: list[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Measured tokens per sample (calibration records of unpacked runs carry them), else nothing."""
    if not all(r.get("_tokens_per_sample") for r in rows):
        return {}
    tokens = np.array([float(r["_tokens_per_sample"]) for r in rows])
    return {"real": tokens, "padded": tokens}


def steps_per_epoch(entries: int, batch: np.ndarray, grad_accum: np.ndarray) -> np.ndarray:
    """Optimizer steps in one epoch, as HF Trainer counts them: len(dataloader) // GA, at least 1.

    batch is ado's effective batch (per-device x devices), so one dataloader pass has
    ceil(entries / batch) micro-batches per process (transformers Trainer._inner_training_loop).
    """
    micro = np.ceil(entries / np.maximum(batch, 1))
    return np.maximum(np.floor(micro / grad_accum), 1)


def total_steps(w: Workload) -> np.ndarray:
    """max_steps if set, else ceil(epochs x steps per epoch) (HF TrainingArguments semantics)."""
    per_epoch = steps_per_epoch(w.dataset.entries, w.batch, w.grad_accum)
    by_epochs = np.ceil(w.epochs * per_epoch)
    return np.where(w.max_steps > 0, w.max_steps, by_epochs)
