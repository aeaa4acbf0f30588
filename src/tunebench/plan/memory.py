"""Peak GPU memory per device: model states, activations, loss, allocator and driver overheads.

Model (estimation.md §3-§5 and §11, steps 2-5), per GPU, in bytes:

    weights      trainable + frozen parameters at rest, / sharding degree
    gathered     FSDP all-gathered units during compute (FULL/HYBRID: root + 2 blocks; SHARD_GRAD_OP:
                 everything)
    gradients    trainable x gradient bytes, / degree (FSDP no_sync with accumulation: unsharded)
    optimizer    trainable x state bytes, / degree; + step transient (foreach temporaries)
    activations  checkpoints (h L per token) + one layer's working set, or every layer's without
                 checkpointing; the loss's vocab-sized tensors; the vision tower's
    peaks        forward/backward = weights + gathered + optimizer + (accumulated grads) + activations
                 optimizer step   = weights + gradients + optimizer + step transient
                 allocated        = the larger; reserved = allocated + caching slack;
                 nvidia-smi       = reserved + CUDA context (+ NCCL)

Every array is per entity of a Workload (numpy broadcasting); coefficients come from calibration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tunebench.plan.coefficients import Coefficients
from tunebench.plan.workload import Workload

GIB = 2**30


@dataclass(frozen=True)
class OptimizerMemory:
    """Memory of one optimizer per trainable parameter."""

    state_copies: float = 0.0  # states in the parameter's dtype (torch optimizers create them like the param)
    state_bytes: float = 0.0  # states of fixed width (bitsandbytes 8-bit / 32-bit, torchao 4-bit), bytes
    step_copies: float = 0.0  # optimizer.step() temporaries, in copies of the parameter bytes
    keeps_gradients: bool = True  # False: update fused into backward (LOMO), no gradient buffers


_ADAM = OptimizerMemory(2, 0, 1)  # torch AdamW foreach: m, v; one param-sized temporary (sqrt(v)) in step
_FUSED_ADAM = OptimizerMemory(2, 0, 0)  # fused kernels work in place
# HF TrainingArguments.optim values (spec 004 "optim"). Sources: torch/optim/adamw.py (_multi_tensor_adamw),
# bitsandbytes optim docs (8-bit: 1 byte per state + 2 fp32 statistics per 2048-value block; paged
# variants live in unified memory and page out only under pressure, counted here as on-GPU),
# torchao AdamW4bit, transformers optimization.py Adafactor (factored second moment, no first moment),
# LOMO/AdaLomo (arXiv:2306.09782: update fused into backward, no gradient storage), GaLore (low-rank
# projected states; a rough 1/4 of AdamW's states), ScheduleFree (z and v), AdEMAMix (m1, m2, v).
OPTIMIZERS: dict[str, OptimizerMemory] = {
    "adamw_torch": _ADAM,
    "adamw_hf": _FUSED_ADAM,  # per-parameter loop: temporaries of one tensor only
    "adamw_torch_fused": _FUSED_ADAM,
    "adamw_torch_xla": _ADAM,
    "adamw_torch_npu_fused": _FUSED_ADAM,
    "adamw_apex_fused": _FUSED_ADAM,
    "adamw_anyprecision": _FUSED_ADAM,
    "adamw_torch_4bit": OptimizerMemory(0, 1.0, 0),
    "ademamix": OptimizerMemory(3, 0, 1),
    "sgd": OptimizerMemory(0, 0, 0),  # HF default momentum 0
    "adagrad": OptimizerMemory(1, 0, 1),
    "adamw_bnb_8bit": OptimizerMemory(0, 2.008, 0),
    "adamw_8bit": OptimizerMemory(0, 2.008, 0),
    "ademamix_8bit": OptimizerMemory(0, 3.012, 0),
    "lion_8bit": OptimizerMemory(0, 1.004, 0),
    "lion_32bit": OptimizerMemory(0, 4, 0),
    "paged_adamw_32bit": OptimizerMemory(0, 8, 0),
    "paged_adamw_8bit": OptimizerMemory(0, 2.008, 0),
    "paged_ademamix_32bit": OptimizerMemory(0, 12, 0),
    "paged_ademamix_8bit": OptimizerMemory(0, 3.012, 0),
    "paged_lion_32bit": OptimizerMemory(0, 4, 0),
    "paged_lion_8bit": OptimizerMemory(0, 1.004, 0),
    "rmsprop": OptimizerMemory(1, 0, 1),
    "rmsprop_bnb": OptimizerMemory(0, 1.004, 0),
    "rmsprop_bnb_8bit": OptimizerMemory(0, 1.004, 0),
    "rmsprop_bnb_32bit": OptimizerMemory(0, 4, 0),
    "galore_adamw": OptimizerMemory(0.5, 0, 0),
    "galore_adamw_8bit": OptimizerMemory(0, 0.5, 0),
    "galore_adafactor": OptimizerMemory(0.05, 0, 0),
    "galore_adamw_layerwise": OptimizerMemory(0.5, 0, 0, keeps_gradients=False),
    "galore_adamw_8bit_layerwise": OptimizerMemory(0, 0.5, 0, keeps_gradients=False),
    "galore_adafactor_layerwise": OptimizerMemory(0.05, 0, 0, keeps_gradients=False),
    "adafactor": OptimizerMemory(0.05, 0, 0),
    "lomo": OptimizerMemory(0, 0, 0, keeps_gradients=False),
    "adalomo": OptimizerMemory(0.05, 0, 0, keeps_gradients=False),
    "grokadamw": OptimizerMemory(3, 0, 1),
    "schedule_free_adamw": OptimizerMemory(2, 0, 1),
    "schedule_free_sgd": OptimizerMemory(1, 0, 1),
}

# Bytes per parameter of 4-bit bases (estimation.md §3.3): bitsandbytes NF4 with double quantisation
# 4 + 8/64 + 32/(64*256) bits (Dettmers et al. 2023, arXiv:2305.14314); GPTQ 4 bits + fp16 scale and
# packed zero per group of 128 (+ g_idx), ~4.16 bits.
NF4_DQ_BYTES = (4 + 8 / 64 + 32 / (64 * 256)) / 8
GPTQ_BYTES = 0.52
ADAPTER_BYTES = 4  # PEFT keeps LoRA / prompt weights in fp32 (autocast_adapter_dtype=True)


def _where(cond, a, b) -> np.ndarray:
    return np.where(cond, a, b).astype(float)


def trainable_params(w: Workload) -> np.ndarray:
    """Trainable parameters per entity: all (full), r x sum(d_in + d_out) (LoRA), virtual tokens x h (pt)."""
    ones = np.ones(w.size)
    if w.method == "full":
        return ones * w.arch.total_params
    if w.method == "pt":
        return ones * (w.settings.get("num_virtual_tokens") or 8) * w.arch.hidden
    return w.rank * w.lora_params_per_rank


def frozen_bytes(w: Workload) -> float:
    """Bytes of the frozen base of a PEFT method (0 for full fine-tuning)."""
    a = w.arch
    base = 4 if w.torch_dtype == "float32" else 2
    if w.method == "full":
        return 0.0
    if w.method == "qlora":
        return a.quantized_params * NF4_DQ_BYTES + (a.total_params - a.quantized_params) * 2
    if w.method == "gptq-lora":
        return a.quantized_params * GPTQ_BYTES + (a.total_params - a.quantized_params) * 2
    return a.total_params * base


def sharding_degree(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """(degree, gathers_everything) per entity.

    degree: how many ways FSDP splits parameters, gradients and optimizer states (FULL_SHARD and
    SHARD_GRAD_OP over all GPUs, HYBRID_* within a node, NO_SHARD / DDP / DP / single: 1).
    gathers_everything: SHARD_GRAD_OP and HYBRID_SHARD_ZERO2 keep parameters unsharded from forward
    to the end of backward (torch FSDP ShardingStrategy docs; ZeRO-2).
    """
    mode = w.mode()
    fsdp = mode == "FSDP"
    s = w.sharding
    if s in ("FULL_SHARD", "SHARD_GRAD_OP"):
        deg = w.devices
    elif s in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        deg = w.gpus_per_node
    else:
        deg = np.ones(w.size)
    degree = _where(fsdp, deg, 1)
    everything = fsdp & (s in ("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2")) & (degree > 1)
    return degree, everything


def param_bytes(w: Workload) -> np.ndarray:
    """Bytes per trainable parameter as stored (and per gradient element, and per state copy).

    Adapters: fp32 (PEFT). Full fine-tuning: the load dtype; fp32 when the weights are fp32, or when
    multi-GPU FSDP runs with mixed precision: accelerate then upcasts low-precision flat parameters to
    fp32 ('FSDP upcast', accelerate/accelerator.py prepare_model), which the fms-acceleration runs with
    bf16=True show as 16 B/param over 2 and 4 GPUs.
    """
    if w.method != "full":
        return np.full(w.size, float(ADAPTER_BYTES))
    load = 4.0 if w.torch_dtype == "float32" else 2.0
    upcast = (w.mode() == "FSDP") & w.amp
    return _where(upcast, 4.0, load)


def expert_fraction(w: Workload) -> float:
    """Share of parameters in expert-parallel experts (fast_moe: ScatterMoE splits them ep ways and
    FSDP leaves them alone; fms-acceleration accelerated-moe plugin), else 0."""
    a = w.arch
    if not (w.fast_moe and a.experts):
        return 0.0
    return sum(lin.params for lin in a.linears if lin.active_fraction < 1) / a.total_params


def memory_breakdown(w: Workload, c: Coefficients) -> dict[str, np.ndarray]:
    """Bytes per GPU of every component and the phase peaks (arrays over the workload's entities)."""
    a = w.arch
    n = w.size
    mode = w.mode()
    fsdp = mode == "FSDP"
    degree, gathers_all = sharding_degree(w)
    opt = OPTIMIZERS.get(w.optim, _ADAM)

    # --- model states (estimation.md §3) ---------------------------------------------------------
    n_train = trainable_params(w)
    pbytes = param_bytes(w)
    train_bytes = n_train * pbytes
    frozen = frozen_bytes(w)
    expert_share = expert_fraction(w)
    ep = max(1, w.fast_moe)

    def shard(total: np.ndarray | float) -> np.ndarray:
        return total * (1 - expert_share) / degree + total * expert_share / ep

    weights = shard(train_bytes + frozen)
    # compute copies gathered by FSDP: 16-bit (mixed precision or pure) unless fp32 without autocast
    compute_param = 4.0 if (w.torch_dtype == "float32" and not w.amp) else 2.0
    if w.method == "qlora":
        compute_param = NF4_DQ_BYTES
    elif w.method == "gptq-lora":
        compute_param = GPTQ_BYTES
    root = a.embedding_params + a.lm_head_params + a.hidden
    units = root + 2 * a.largest_layer_params  # root unit + current and prefetched block (BACKWARD_PRE)
    gathered = _where(fsdp, np.where(gathers_all, a.total_params, units) * compute_param * (1 - 1 / degree), 0.0)

    grad_full = train_bytes if opt.keeps_gradients else train_bytes * 0
    grads = shard(grad_full)
    accumulating = w.grad_accum > 1
    # FSDP.no_sync (HF Trainer + accelerate use it on non-final micro-batches unless sync_each_batch):
    # "FSDP will accumulate the full model gradients (instead of gradient shards)" (torch FSDP docs).
    # (expert-parallel experts are not FSDP-managed: they keep their ep-way split)
    unsharded = grad_full * (1 - expert_share) + grad_full * expert_share / ep
    grads_accumulated = _where(accumulating, _where(fsdp, unsharded, grads), 0.0)
    ddp_buckets = _where(mode == "DDP", grad_full, 0.0)  # DDP gradient_as_bucket_view=False copy
    states = shard(n_train * (opt.state_copies * pbytes + opt.state_bytes))
    step_tmp = shard(n_train * opt.step_copies * pbytes)

    # --- activations (estimation.md §4.2) --------------------------------------------------------
    _, padded = w.sample_tokens()
    tokens = w.per_device_batch * padded
    ab = w.compute_bytes
    dropout = 0.0
    if w.method in ("lora", "qlora", "gptq-lora") and (w.settings.get("lora_dropout") or 0) > 0:
        # LoRA dropout stores dropout(x) for each adapted linear's input (estimation.md §3.3)
        per_layer = {}
        for lin in a.linears:
            if lin.name in (w.settings.get("target_modules") or ()):
                per_layer[lin.name] = lin.d_in * lin.count / max(1, a.layers)
        dropout = sum(per_layer.values())
    if w.checkpointing:
        extra = _where(fsdp & w.peft, c.fsdp_peft_checkpoint_copies, 0.0)
        checkpoints = tokens * a.hidden * a.layers * ab * (1 + extra)
        layer = tokens * (a.layer_width + dropout) * ab
    else:
        checkpoints = np.zeros(n)
        layer = tokens * (a.stack_width + a.layers * dropout) * ab
    checkpoints = checkpoints * c.activation_scale
    layer = layer * c.activation_scale

    impl = w.loss_implementation
    if impl == "fused_linear":  # Liger / chunked fused linear-cross-entropy: no full logits
        per_vocab = 0.0
    else:
        per_vocab = (c.fused_loss_bytes_per_vocab if impl == "fused" else c.loss_bytes_per_vocab) + 2 * a.logits_copies
    loss = tokens * a.vocab * per_vocab

    vision = np.zeros(n)
    if a.vision and w.dataset.kind == "vision":
        v = a.vision
        width = (7 * v["hidden"] + 2 * v["heads"] + 2 * v["hidden"] + 2 * v["intermediate"])
        stored = v["hidden"] * v["layers"] + width if w.checkpointing else width * v["layers"]
        vision = w.per_device_batch * w.image_encoder_tokens() * stored * ab * c.activation_scale

    quant = 0.0
    if w.method in ("qlora", "gptq-lora"):  # one dequantised 16-bit weight at a time (estimation.md §5)
        quant = a.largest_linear_params * 2.0
    quant = np.full(n, quant)

    # --- phase peaks (estimation.md §11 step 4) --------------------------------------------------
    base = weights + gathered + states + ddp_buckets
    acts = checkpoints + layer + loss + vision + quant
    forward_backward = base + grads_accumulated + acts
    end_of_backward = base + np.maximum(grads_accumulated, grads) + layer + quant
    optimizer_step = weights + grads + states + step_tmp + ddp_buckets
    allocated = np.maximum(np.maximum(forward_backward, end_of_backward), optimizer_step)
    return {
        "weights": weights,
        "gathered_weights": gathered,
        "gradients": np.maximum(grads_accumulated, grads),
        "optimizer_states": states,
        "optimizer_step_transient": step_tmp,
        "ddp_buckets": ddp_buckets,
        "activation_checkpoints": checkpoints,
        "layer_activations": layer,
        "loss": loss,
        "vision_tower": vision,
        "quantization_transient": quant,
        "peak_forward_backward": forward_backward,
        "peak_optimizer_step": optimizer_step,
        "allocated": allocated,
        "transient": acts - loss + gathered,
    }


@dataclass
class MemoryPrediction:
    """Per-GPU peaks in GiB (arrays) and the breakdown used to explain them."""

    allocated_gib: np.ndarray
    reserved_gib: np.ndarray
    nvidia_smi_gib: np.ndarray
    utilization_pct: np.ndarray
    capacity_gib: float | None
    fits: np.ndarray
    peak_phase: np.ndarray
    breakdown_gib: dict[str, np.ndarray]


def predict_memory(w: Workload, c: Coefficients) -> MemoryPrediction:
    """Allocated, reserved and nvidia-smi peaks per GPU, fit on the GPU, and the breakdown."""
    b = memory_breakdown(w, c)
    on_gpu = w.gpus >= 1
    multi = w.gpus >= 2
    allocated = b["allocated"]
    context = _where(on_gpu, c.cuda_context_gib * GIB, 0.0)
    nccl = _where(multi & (w.mode() != "DP"), c.nccl_gib * GIB, 0.0)
    # Caching-allocator slack: what torch keeps reserved beyond the live tensors at the peak.
    # Large vocab-sized loss tensors of changing size fragment the pool most (estimation.md §5).
    slack = (
        c.reserve_fixed_gib * GIB
        + c.reserve_transient_fraction * b["transient"]
        + c.reserve_loss_fraction * b["loss"]
    )
    reserved = allocated + _where(on_gpu, slack, 0.0)
    capacity = w.gpu.memory_mib * 2**20 if (w.gpu is not None) else None
    if capacity is not None:
        usable = capacity - context - nccl
        # on a full device the allocator frees cached blocks and retries before failing, so
        # reserved never exceeds what the device can hold (c10 CUDACachingAllocator)
        reserved = np.minimum(reserved, np.maximum(allocated, usable))
        fits = (allocated + c.oom_margin_gib * GIB <= usable) | ~on_gpu
        smi = reserved + context + nccl
        utilization = _where(on_gpu, 100.0 * smi / capacity, 0.0)
    else:
        fits = np.ones(w.size, dtype=bool)
        smi = reserved + context + nccl
        utilization = np.zeros(w.size)
    phase = np.where(b["peak_optimizer_step"] >= b["peak_forward_backward"], "optimizer_step", "forward_backward")
    keys = ("weights", "gathered_weights", "gradients", "optimizer_states", "optimizer_step_transient",
            "ddp_buckets", "activation_checkpoints", "layer_activations", "loss", "vision_tower",
            "quantization_transient")  # fmt: skip
    breakdown = {k: b[k] / GIB for k in keys}
    breakdown["allocator_reserve"] = (reserved - allocated) / GIB
    breakdown["cuda_context"] = context / GIB
    breakdown["nccl"] = nccl / GIB
    return MemoryPrediction(
        allocated_gib=allocated / GIB,
        reserved_gib=reserved / GIB,
        nvidia_smi_gib=smi / GIB,
        utilization_pct=utilization,
        capacity_gib=(capacity / GIB) if capacity is not None else None,
        fits=fits,
        peak_phase=phase,
        breakdown_gib=breakdown,
    )
