"""Peak GPU memory per device: model states by arithmetic, activations by tracing, allocator overheads.

Per GPU, in bytes:

    weights      trainable + frozen parameters at rest, / sharding degree (4-bit bases by their bits)
    gathered     FSDP all-gathered units during compute (FULL/HYBRID: root + 2 blocks; SHARD_GRAD_OP:
                 everything)
    gradients    trainable x gradient bytes, / degree (FSDP no_sync with accumulation: unsharded)
    optimizer    trainable x state bytes, / degree; + step transient (foreach temporaries)
    activations  traced on the reduced model (plan.trace): at each candidate moment of the step, the
                 activation bytes and the share of gradients alive; + the vision tower's, LoRA-free
                 dequantisation of one 4-bit weight, fused-loss kernels
    DeepSpeed    ZeRO stage z over the data-parallel world N (Rajbhandari et al. 2020, Fig. 1): 16-bit
                 params (/N at z3), 16-bit grads (/N from z2), fp32 master + states (/N from z1); z3
                 gathers like FSDP; offload moves states (and z3 params) to the host or NVMe
    offload      FSDP CPU offload and DeepSpeed offload: what leaves the GPU is host memory per node
    device_map   one process, the layers split over its GPUs: states and activations / GPUs, the loss
                 on the last GPU
    peaks        forward/backward = weights + gathered + optimizer states + max over the moments of
                 (activations + gradients alive); optimizer step = weights + gradients + optimizer +
                 step transient; allocated = the larger; reserved = allocated + caching slack;
                 nvidia-smi = reserved + CUDA context (+ NCCL)

Every array is per entity of a Workload (numpy broadcasting); coefficients come from calibration.
The probability of running out of memory compares the predicted peak with the memory the device
can give, on the planner's calibrated log-error (``oom_probability``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tunebench.plan.coefficients import Coefficients
from tunebench.plan.workload import Workload
from tunebench.spec.properties import LOSS_CHUNK_TOKENS
from tunebench.units import GIB


@dataclass(frozen=True)
class OptimizerMemory:
    """Memory of one optimizer per trainable parameter."""

    state_copies: float = 0.0  # states in the parameter's dtype (torch optimizers create them like the param)
    state_bytes: float = 0.0  # states of fixed width (bitsandbytes 8-bit / 32-bit, torchao 4-bit), bytes
    step_copies: float = 0.0  # optimizer.step() temporaries, in copies of the parameter bytes
    keeps_gradients: bool = True  # False: update fused into backward (LOMO), no gradient buffers


_ADAM = OptimizerMemory(2, 0, 1)  # torch AdamW foreach: m, v; one param-sized temporary (sqrt(v)) in step
_FUSED_ADAM = OptimizerMemory(2, 0, 0)  # fused kernels work in place
# HF TrainingArguments.optim values (the SFTTrainer spec "optim"). Sources: torch/optim/adamw.py (_multi_tensor_adamw),
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


def _where(cond, a, b) -> np.ndarray:
    return np.where(cond, a, b).astype(float)


def trainable_params(w: Workload) -> np.ndarray:
    """Trainable parameters per entity: all (full), r x sum(d_in + d_out) (LoRA), virtual tokens x h (pt)."""
    ones = np.ones(w.size)
    if w.method == "full":
        return ones * w.structure.total_params
    if w.method == "pt":
        return ones * (w.settings.get("num_virtual_tokens") or 8) * w.structure.hidden
    return w.rank * w.lora_params_per_rank


def load_bytes(w: Workload) -> float:
    """Bytes per parameter as loaded (torch_dtype: float32, else a 16-bit dtype)."""
    return 4.0 if w.torch_dtype == "float32" else 2.0


def residual_bytes(w: Workload) -> float:
    """Bytes of an element of the residual stream, the layer inputs checkpointing keeps: the 16-bit dtype where
    every weight is cast for the forward (Workload.forward_16bit: DeepSpeed, FSDP's mixed precision), else the
    weights' as loaded, fp32 where peft's prepare_model_for_kbit_training upcast a QLoRA model's embeddings
    (Workload.kbit_upcast). Autocast casts only the inputs of matmuls, so an fp32 embedding output stays an
    fp32 stream: adding a 16-bit layer output to it gives fp32 by torch's type promotion (add runs outside
    autocast's cast lists); the traced moments measure the same."""
    if w.forward_16bit:
        return 2.0
    return 4.0 if w.kbit_upcast else load_bytes(w)


def frozen_bytes(w: Workload) -> float:
    """Bytes of the frozen base of a PEFT method (0 for full fine-tuning).

    4-bit bases keep the layers that are not quantised (embeddings, output layer, norms) in 16 bits
    (GPTQ; fms-acceleration's bnb plugin), or in fp32 after peft's prepare_model_for_kbit_training
    (QLoRA as tunebench's worker and the HF recipe run it).
    """
    m = w.structure
    base = load_bytes(w)
    if w.method == "full":
        return 0.0
    if w.method == "qlora":
        upcast = 4 if w.kbit_upcast else 2  # peft prepare_model_for_kbit_training: the rest in fp32
        return m.quantized_params * NF4_DQ_BYTES + (m.total_params - m.quantized_params) * upcast
    if w.method == "gptq-lora":
        return m.quantized_params * GPTQ_BYTES + (m.total_params - m.quantized_params) * 2
    return m.total_params * base


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
    if s in ("FULL_SHARD", "SHARD_GRAD_OP"):  # over data- and sequence-parallel ranks (torchtitan dp_shard x cp)
        deg = w.devices / w.tp
    elif s in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        deg = np.maximum(w.gpus_per_node / w.tp, 1)
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
        return np.full(w.size, w.adapter_bytes)
    load = load_bytes(w)
    upcast = (w.mode() == "FSDP") & w.amp
    return _where(upcast, 4.0, load)


def expert_fraction(w: Workload) -> float:
    """Share of parameters in expert-parallel experts (fast_moe: ScatterMoE splits them ep ways and
    FSDP leaves them alone; fms-acceleration accelerated-moe plugin), else 0."""
    m = w.structure
    if not (w.fast_moe and m.experts):
        return 0.0
    return m.expert_params / m.total_params


def activation_moments(w: Workload, c: Coefficients) -> dict[str, tuple[np.ndarray, float, np.ndarray]]:
    """Per traced moment: (activation bytes per GPU, share of gradients alive then, loss bytes among them).

    Traced bytes (plan.trace) for the entity's micro-batch and padded length, adjusted for what the
    trace cannot run: fused loss kernels (fast_loss keeps ``fused_loss_bytes_per_vocab`` per vocabulary
    entry and token; Liger's fused linear cross-entropy no logits, but the gradient buffers its forward
    fills, fused_linear_forward_bytes), fused RMSNorm/RoPE kernels (a calibrated share of each layer's
    working set; the checkpointed layer inputs stay whole), the extra checkpoint copies PEFT keeps
    under multi-GPU FSDP with reentrant checkpointing, the vision tower, and one 4-bit weight
    dequantised to 16 bits.
    """
    m = w.structure
    padded = w.memory_tokens()  # the longest sample (plan.lengths); time uses the mean
    batch = w.per_device_batch
    tokens = batch * padded
    impl = w.loss_implementation  # upcast, chunked, model_dtype are traced; the other two keep a fixed budget:
    keep = {"fused_linear": 0.0, "fast_loss": c.fused_loss_bytes_per_vocab}.get(impl)
    flce = fused_linear_forward_bytes(w, tokens) if impl == "fused_linear" else 0.0  # per GPU
    pipeline = w.mode() == "PP"  # device_map: each GPU holds its layers' activations, the last the loss
    extra = np.zeros(w.size)
    # multi-GPU FSDP + PEFT with reentrant checkpoints keeps the layer inputs again (measured, not traced: fms-
    # acceleration's runs and PEFT's reentrant QLoRA guides show it; the non-reentrant runs of PEFT's FSDP guide
    # and torchtune do not); Coefficients.fsdp_peft_checkpoint_copies
    fsdp_peft = (w.mode() == "FSDP") & w.peft & (w.devices > 1) & w.reentrant_checkpointing
    if w.checkpointing:
        # layer-input checkpoints (h residual-stream elements per token per layer), copied again (above)
        extra = extra + _where(
            fsdp_peft,
            c.fsdp_peft_checkpoint_copies * tokens * m.hidden * m.layers * residual_bytes(w) / (w.tp * w.sp),
            0.0,
        )
    if m.vision and w.dataset.kind == "vision":
        extra = extra + vision_tower_bytes(w)
    if w.method in ("qlora", "gptq-lora"):  # one dequantised 16-bit weight at a time (estimation.md §5)
        extra = extra + m.largest_linear_params * 2.0
    # fused RMSNorm/RoPE kernels (fms-acceleration) and torch.compile fuse element-wise chains (norm upcasts,
    # RoPE, activation products): a calibrated share of the traced activations is left
    fused_layers = any(w.fast_kernels[1:])
    share = c.fast_kernels_activation_fraction if fused_layers else c.compile_activation_fraction
    out = {}
    # sequence parallelism: each GPU holds 1/sp of the tokens, and of the attention scores (Ulysses: all
    # tokens for 1/sp of the heads; ring attention: 1/sp of the queries); tensor parallelism with
    # sequence-parallel norms and a vocabulary-parallel loss: 1/tp of everything (Korthikanti et al. 2022)
    split = w.tp * w.sp
    checkpoints = tokens * m.hidden * m.layers * residual_bytes(w) / split if w.checkpointing else tokens * 0.0
    # padding_free: one row of batch x padded tokens, whose attention spans the whole row under a block-diagonal
    # mask (transformers masking_utils, from the packed position ids): the s^2 terms (eager's score matrices and
    # float mask, sdpa's bool mask; flash-attention's varlen kernel has none) are the row's (Workload.rows)
    rows, length = w.rows(padded)
    # chunked loss: one chunk of LOSS_CHUNK_TOKENS tokens is traced in the level (a0); a micro-batch of fewer tokens
    # (per GPU: sequence parallelism splits them) is one chunk of its own tokens (training.loss). Only a moment that
    # holds the logits (vocab_bytes) holds a chunk: the level of one that does not changes with the vocabulary by a
    # weight's gradient (a full fine-tuning's embedding backward: vocab x hidden), whatever the tokens
    short_chunk = 1.0 - np.minimum(tokens / w.sp, LOSS_CHUNK_TOKENS) / LOSS_CHUNK_TOKENS
    for name, moment in w.activations.moments.items():
        acts = moment.a0 + rows * (moment.a1 * length + moment.a2 * length**2) / split
        if impl == "chunked" and moment.vocab_bytes > 0:
            acts = acts - m.vocab * moment.vocab_level_bytes / w.tp * short_chunk
        loss = tokens * m.vocab * moment.vocab_bytes / split
        if keep is not None and moment.vocab_bytes > keep:
            loss = tokens * m.vocab * keep / split
        rest = np.maximum(acts - tokens * m.vocab * moment.vocab_bytes / split, 0.0)
        if fused_layers or w.compiled:  # the layer inputs kept by checkpointing are not element-wise chains
            kept = np.minimum(rest, checkpoints)
            rest = kept + (rest - kept) * share
        rest = np.where(pipeline, rest / np.maximum(w.gpus, 1), rest)
        if name == "forward":  # Liger computes the head's gradients inside the forward (on the loss's GPU)
            rest = rest + flce
        out[name] = (rest + loss + extra, moment.grad_share, loss)
    return out


def fused_linear_forward_bytes(w: Workload, tokens: np.ndarray) -> np.ndarray:
    """Bytes per GPU Liger's fused linear cross-entropy adds at its peak, inside the forward (liger-kernel
    ops/fused_linear_cross_entropy.py, fused_linear_cross_entropy_forward). It walks a rank's tokens in chunks
    of next_power_of_2(ceil(tokens / ceil(vocab / hidden))) rows, at most the tokens (about tokens x hidden
    logits), in the matmul's dtype (Workload.compute_bytes):

    - kept to the end of the forward: the input's gradient (tokens x hidden, the residual stream's dtype) and,
      when the output layer trains, its gradient (vocab x hidden in the weight's dtype as the forward sees it);
    - current releases (v0.6.2 on): the kernel upcasts inside and the previous chunk is its own gradient, alive
      while the next matmul writes (two chunks, #420); a training output layer's gradient is accumulated per
      chunk through a vocab x hidden product and its fp32 copy (``grad_weight += torch.mm(...).float()``,
      #830) beside one chunk, except an fp32 gradient of 16-bit logits, which addmm accumulates in place
      (``out_dtype``, #1239: torch >= 2.8 on sm80+);
    - releases before #406 (Nov 2024, to v0.4), whose code fms-acceleration's foak plugin vendors
      (fused_ops/liger_ce, with its own lce_forward; Workload.flce_upcasts_chunks): each chunk is upcast to
      fp32 outside the kernel, cast back and scaled into a separate gradient, so at the next matmul the
      previous chunk, its gradient and the new chunk are alive, and at the upcast the previous gradient, the
      new chunk and its fp32 copy; the model's forward passes a contiguous copy of the shifted hidden states;
    - an fp32 output layer under autocast is cast to 16 bits for each chunk's matmul (a view of the weight,
      which autocast does not cache).

    In the backward the input gradient is the hidden states' gradient and the head's its .grad, which the
    traced backward moments already hold. Tokens are split over tensor- and sequence-parallel ranks, the
    vocabulary over tensor-parallel ones."""
    m = w.structure
    t = tokens / (w.tp * w.sp)  # tokens per rank
    rows = np.ceil(t / math.ceil(m.vocab / m.hidden))
    chunk = np.minimum(2.0 ** np.ceil(np.log2(np.maximum(rows, 1.0))), t)
    several = t > chunk  # a previous chunk exists while the next is computed
    mm = w.compute_bytes
    upcast = 4.0 if mm < 4 else 0.0  # .float() of an fp32 chunk is the chunk itself
    logits = chunk * m.vocab  # elements of one chunk
    residual = t * m.hidden * residual_bytes(w)
    full = w.method == "full"
    # the output layer as the forward sees it: training, FSDP's compute copy or as stored; frozen, in the
    # dtype of the embeddings (the residual stream's: 16-bit under a 16-bit forward, fp32 after kbit upcast)
    if full:
        weight_bytes = _where(w.mode() == "FSDP", compute_param_bytes(w), param_bytes(w))
    else:
        weight_bytes = np.full(w.size, residual_bytes(w))
    head = m.lm_head_params / w.tp
    head_grad = head * weight_bytes if full else 0.0
    # an fp32 weight under autocast: its 16-bit copy at each matmul; autocast caches the copy of a weight that
    # trains (a leaf requiring grad) for the rest of the forward, so then it stays alive throughout
    fp32_weight_16bit_logits = (weight_bytes == 4) & (mm < 4)
    cast = head * 2.0 * fp32_weight_16bit_logits
    kept_cast = cast if full else 0.0
    if w.flce_upcasts_chunks:
        at_matmul = logits * np.where(several, 3 * mm, mm) + cast
        at_upcast = logits * (np.where(several, 2 * mm, mm) + upcast) + kept_cast
        at_input_grad = logits * 2 * mm + cast  # grad_input = grad_logits_chunk @ weight
        loop = np.maximum(np.maximum(at_matmul, at_upcast), at_input_grad) + residual  # + shifted hidden states
    else:
        at_matmul = logits * mm * np.where(several, 2.0, 1.0) + cast
        # an fp32 gradient of 16-bit logits is accumulated in place (addmm with out_dtype)
        head_temp = np.where(fp32_weight_16bit_logits, 0.0, head * (mm + upcast)) if full else 0.0
        loop = np.maximum(at_matmul, logits * mm + head_temp + kept_cast)
    return residual + head_grad + loop


def vision_tower_bytes(w: Workload) -> np.ndarray:
    """Activations of a CLIP/SigLIP vision tower over every tile of the sample's image (16-bit).

    Per layer and patch: norm inputs, q/k/v, attention output, MLP input and GELU pair
    (7 h + 2 heads + 2 h + 2 i elements; Korthikanti et al. 2022 per-layer count without dropout);
    with checkpointing only each layer's input is kept, plus one layer's working set.
    """
    v = w.structure.vision
    width = 7 * v["hidden"] + 2 * v["heads"] + 2 * v["hidden"] + 2 * v["intermediate"]
    stored = v["hidden"] * v["layers"] + width if w.checkpointing else width * v["layers"]
    return w.per_device_batch * w.image_encoder_tokens() * stored * w.compute_bytes


def compute_param_bytes(w: Workload) -> float:
    """Bytes per parameter of the copy a 16-bit (or fp32 without autocast) forward computes with."""
    return 4.0 if (w.torch_dtype == "float32" and not w.amp) else 2.0


def gathered_weights(w: Workload, degree: np.ndarray, gathers_all: np.ndarray, offloaded: bool = False) -> np.ndarray:
    """Bytes per GPU of the compute copies FSDP all-gathers (estimation.md §3; torchtitan FSDPMemTracker):
    the whole model where it gathers everything, else the root unit plus the current and prefetched
    block (BACKWARD_PRE); 16-bit (mixed precision or pure) unless float32 without autocast. The GPU's own
    shard is resident, so (1 - 1/degree) of a unit is gathered; with CPU offload (a sharded degree) the
    whole unit is copied in."""
    m = w.structure
    compute_param = compute_param_bytes(w)
    if w.method == "qlora":
        compute_param = NF4_DQ_BYTES
    elif w.method == "gptq-lora":
        compute_param = GPTQ_BYTES
    units = m.root_params + 2 * m.largest_layer_params
    gathered_share = np.where(offloaded & (degree > 1), 1.0, 1 - 1 / degree)
    return np.where(gathers_all, m.total_params, units) * compute_param * gathered_share


def _largest_moment(w: Workload, c: Coefficients, base, grads, grads_accumulated) -> tuple[np.ndarray, ...]:
    """Forward/backward peak over the traced moments: (total, activations, loss, live gradients, moment
    name) at the largest one, per entity. With accumulation all gradients are alive from the start."""
    forward_backward = np.zeros(w.size)
    acts_at_peak = np.zeros(w.size)
    loss_at_peak = np.zeros(w.size)
    grads_at_peak = np.zeros(w.size)
    moment_at_peak = np.full(w.size, "", dtype=object)
    for name, (acts, share, loss) in activation_moments(w, c).items():
        alive = np.maximum(grads_accumulated, share * grads)
        total = base + acts + alive
        higher = total > forward_backward
        forward_backward = np.where(higher, total, forward_backward)
        acts_at_peak = np.where(higher, acts, acts_at_peak)
        loss_at_peak = np.where(higher, loss, loss_at_peak)
        grads_at_peak = np.where(higher, alive, grads_at_peak)
        moment_at_peak = np.where(higher, name, moment_at_peak)
    return forward_backward, acts_at_peak, loss_at_peak, grads_at_peak, moment_at_peak


# DeepSpeed ZeRO-1/2 gradient buckets: backward() allocates the contiguous-gradients (ipg) buffer of
# reduce_bucket_size elements in the 16-bit dtype, and a second one with overlap_comm, at any world size
# (zero/stage_1_and_2.py backward); transformers' "auto" config sets reduce_bucket_size = hidden^2
# (integrations/deepspeed.py trainer_config_finalize). A record of a run whose config sized it states
# ``_ds_bucket_elements``.
DS_BUCKETS = 2
# ZeRO-3 stage3_max_live_parameters default (DeepSpeed zero/config.py): gathered parameters kept at once.
DS_MAX_LIVE_PARAMS = 1e9
DS_SUB_GROUP_PARAMS = 1e9  # zero_optimization sub_group_size default (DeepSpeed zero/config.py)


def torch_states(w: Workload, opt: OptimizerMemory) -> dict[str, np.ndarray]:
    """Model states per GPU (bytes) under torch: single, DataParallel, DDP, FSDP (optionally CPU offload),
    device_map; plus what FSDP CPU offload keeps on the host per process."""
    mode = w.mode()
    fsdp = mode == "FSDP"
    degree, gathers_all = sharding_degree(w)
    n_train = trainable_params(w)
    pbytes = param_bytes(w)
    train_bytes = n_train * pbytes
    frozen = frozen_bytes(w)
    expert_share = expert_fraction(w)
    ep = max(1, w.fast_moe)

    def shard(total: np.ndarray | float) -> np.ndarray:
        return total * (1 - expert_share) / degree + total * expert_share / ep

    weights = shard(train_bytes + frozen)
    offloaded = w.offload_params == "cpu" and w.backend == "FSDP"
    gathered = _where(fsdp, gathered_weights(w, degree, gathers_all, offloaded), 0.0)
    grad_full = train_bytes if opt.keeps_gradients else train_bytes * 0
    grads = shard(grad_full)
    # FSDP.no_sync (HF Trainer + accelerate use it on non-final micro-batches unless sync_each_batch):
    # "FSDP will accumulate the full model gradients (instead of gradient shards)" (torch FSDP docs).
    # (expert-parallel experts are not FSDP-managed: they keep their ep-way split)
    unsharded = grad_full * (1 - expert_share) + grad_full * expert_share / ep
    grads_accumulated = _where(w.grad_accum > 1, _where(fsdp, unsharded, grads), 0.0)
    states = shard(n_train * (opt.state_copies * pbytes + opt.state_bytes))
    step_tmp = shard(n_train * opt.step_copies * pbytes)
    host = np.zeros(w.size)
    if offloaded:
        # FSDP CPUOffload(offload_params=True): shards, their gradients and the optimizer step live on the
        # host; each unit is copied in and gathered whole for compute (torch FSDP docs, CPUOffload)
        host = weights + grads + states + step_tmp
        weights, grads, states, step_tmp = (np.zeros(w.size),) * 4
    # device_map="auto": accelerate places whole layers so every GPU holds ~1/g of the model
    split = np.where(mode == "PP", np.maximum(w.gpus, 1), 1.0)
    weights, grads, grads_accumulated = weights / split, grads / split, grads_accumulated / split
    states, step_tmp = states / split, step_tmp / split
    ddp_buckets = _where(mode == "DDP", grad_full, 0.0)  # DDP gradient_as_bucket_view=False copy
    states_per_gpu = {
        "weights": weights,
        "gathered": gathered,
        "grads": grads,
        "grads_accumulated": grads_accumulated,
        "states": states,
        "step_tmp": step_tmp,
        "buffers": ddp_buckets,
        "host": host,
    }
    return {**{k: v / w.tp for k, v in states_per_gpu.items()}, "nvme": np.zeros(w.size)}


def state_partitions(w: Workload) -> np.ndarray:
    """Ways one trainable parameter's optimizer state is split over GPUs, as torch_states and
    deepspeed_states divide it: the tensor-parallel degree times ZeRO's data-parallel ranks (from stage
    1) or FSDP's sharding degree; a device_map split spreads whole layers over every GPU."""
    if w.backend == "DeepSpeed":
        data = np.where(w.zero_stage >= 1, w.devices / w.tp, 1.0)
    else:
        data = sharding_degree(w)[0]
    return data * w.tp * np.where(w.mode() == "PP", np.maximum(w.gpus, 1), 1.0)


def deepspeed_states(w: Workload, opt: OptimizerMemory) -> dict[str, np.ndarray]:
    """Model states per GPU (bytes) under DeepSpeed ZeRO, and what offload keeps on the host or NVMe.

    ZeRO paper (Rajbhandari et al. 2020, Fig. 1), mixed precision: 16-bit parameters and gradients and
    K = 12 bytes of fp32 master weights and Adam states per parameter; stage 1 partitions the states,
    stage 2 also the gradients, stage 3 also the parameters, over the N data-parallel ranks. With bf16
    or fp16 enabled DeepSpeed converts the module to 16 bits (runtime/engine.py) and keeps the fp32
    master copy in the optimizer; without, trainable parameters stay as stored (PEFT's fp32 adapters on a
    16-bit base: param_bytes) and their gradients and states take that dtype. Frozen (PEFT)
    weights are partitioned only at stage 3. ZeRO-Offload moves the fp32 states, master weights and
    gradient partitions to the host (CPU Adam); ZeRO-Infinity (stage 3) moves the 16-bit parameters too.
    """
    n = w.devices / w.tp  # ZeRO partitions over every rank of a tensor-parallel slice (Ulysses ranks included)
    z = w.zero_stage
    p16 = compute_param_bytes(w)
    master = 4.0 if (w.amp and p16 == 2.0) else 0.0
    # bf16/fp16 on: the module is cast, adapters included (deepspeed_16bit); off: each keeps its stored dtype
    train = p16 + np.zeros(w.size) if w.amp else param_bytes(w)
    state_elem = 4.0 if w.amp else train
    n_train = trainable_params(w)
    n_frozen = w.structure.total_params - n_train if w.peft else 0.0
    if w.method in ("qlora", "gptq-lora"):
        frozen = frozen_bytes(w) + np.zeros(w.size)
    else:
        frozen = n_frozen * p16 + np.zeros(w.size)
    by = lambda stage: np.where(z >= stage, n, 1.0)  # noqa: E731 - the divisor of a stage's partitioning
    weights = (n_train * train + frozen) / by(3)
    grads = (n_train * train if opt.keeps_gradients else n_train * 0) / by(2)
    states = n_train * (opt.state_copies * state_elem + opt.state_bytes + master) / by(1)
    # the step converts each 16-bit gradient partition to an fp32 copy for the fp32 master weights
    # (zero/stage_1_and_2.py step: single_grad_partition .to(fp32)); stage 3 steps one sub-group of
    # sub_group_size parameters at a time (stage3.py _prepare_fp32_grad_for_sub_group; default 1e9)
    stepped = np.where(z == 3, np.minimum(n_train / by(1), DS_SUB_GROUP_PARAMS), n_train / by(1))
    step_tmp = stepped * (opt.step_copies * state_elem + master)
    units = np.minimum(w.structure.root_params + 2 * w.structure.largest_layer_params, DS_MAX_LIVE_PARAMS)
    gathered = np.where(z == 3, units * p16 * (1 - 1 / n), 0.0)
    bucket = float(w.settings.get("_ds_bucket_elements") or w.structure.hidden**2)
    buffers = np.where((z >= 1) & (z <= 2), DS_BUCKETS * bucket * p16, 0.0) + np.zeros(w.size)
    host = np.zeros(w.size)
    nvme = np.zeros(w.size)
    if w.offload_optimizer != "gpu":
        # CPU Adam on the host: fp32 master, states and fp32 gradient partitions (ZeRO-Offload, Ren et al. 2021)
        moved = states + n_train * 4.0 / by(1)  # CPU Adam updates in place: no step temporaries
        if w.offload_optimizer == "cpu":
            host = host + moved
        else:
            nvme = nvme + moved
        states, step_tmp = np.zeros(w.size), np.zeros(w.size)
        # stage 2-3 reduce each gradient into its host partition as backward produces it; stage 1 keeps the
        # whole 16-bit gradients in param.grad until the step's reduce, which then copies the rank's partition
        # to the host (zero/stage_1_and_2.py: partition_gradients False, reduce_gradients, copy_grads_in_partition)
        grads = np.where(z >= 2, 0.0, grads)
    if w.offload_params != "gpu":
        if w.offload_params == "cpu":
            host = host + weights
        else:
            nvme = nvme + weights
        gathered = np.where(z == 3, units * p16, gathered)  # the local shard is not resident either
        weights = np.zeros(w.size)
    states_per_gpu = {
        "weights": weights,
        "gathered": gathered,
        "grads": grads,
        "grads_accumulated": grads,
        "states": states,
        "step_tmp": step_tmp,
        "buffers": buffers,
        "host": host,
        "nvme": nvme,
    }
    return {k: v / w.tp for k, v in states_per_gpu.items()}


def memory_breakdown(w: Workload, c: Coefficients) -> dict[str, np.ndarray]:
    """Bytes per GPU of every component and the phase peaks (arrays over the workload's entities)."""
    opt = OPTIMIZERS.get(w.optim, _ADAM)
    # --- model states (estimation.md §3) ---------------------------------------------------------
    ms = deepspeed_states(w, opt) if w.backend == "DeepSpeed" and w.on_gpu else torch_states(w, opt)
    grads_accumulated = _where(w.grad_accum > 1, ms["grads_accumulated"], 0.0)
    # --- forward/backward: the largest traced moment ----------------------------------------------
    base = ms["weights"] + ms["gathered"] + ms["states"] + ms["buffers"]
    forward_backward, acts_at_peak, loss_at_peak, grads_at_peak, moment_at_peak = _largest_moment(
        w, c, base, ms["grads"], grads_accumulated
    )
    optimizer_step = ms["weights"] + ms["grads"] + ms["states"] + ms["step_tmp"] + ms["buffers"]
    allocated = np.maximum(forward_backward, optimizer_step)
    return {
        "weights": ms["weights"],
        "gathered_weights": ms["gathered"],
        "gradients": np.maximum(grads_accumulated, ms["grads"]),
        "optimizer_states": ms["states"],
        "optimizer_step_transient": ms["step_tmp"],
        "ddp_buckets": ms["buffers"],
        "activations": acts_at_peak - loss_at_peak,
        "loss": loss_at_peak,
        "gradients_at_peak": grads_at_peak,
        "peak_forward_backward": forward_backward,
        "peak_optimizer_step": optimizer_step,
        "allocated": allocated,
        "transient": acts_at_peak + ms["gathered"],
        "moment": moment_at_peak,
        "host_per_process": ms["host"],
        "nvme_per_process": ms["nvme"],
    }


@dataclass
class MemoryPrediction:
    """Per-GPU peaks in GiB (arrays), the out-of-memory verdict and the breakdown that explains them."""

    allocated_gib: np.ndarray
    reserved_gib: np.ndarray
    nvidia_smi_gib: np.ndarray
    utilization_pct: np.ndarray
    capacity_gib: float | None
    usable_gib: np.ndarray  # what the allocator can hand out: CUDA's total - CUDA context - NCCL buffers
    required_gib: np.ndarray  # allocated peak + the fragmentation the allocator cannot give back
    oom_probability: np.ndarray
    fits: np.ndarray  # oom_probability <= 0.5
    host_gib: np.ndarray  # host memory per node that offload needs (FSDP CPU offload, DeepSpeed offload)
    nvme_gib: np.ndarray  # NVMe per node that DeepSpeed's NVMe offload needs
    peak_phase: np.ndarray
    peak_moment: np.ndarray
    breakdown_gib: dict[str, np.ndarray]


_ERFC = np.vectorize(math.erfc, otypes=[float])


def processes_per_node(w: Workload) -> np.ndarray:
    """Training processes on one node: one per GPU, one in all for DataParallel and device_map."""
    one = (w.mode() == "DP") | (w.mode() == "PP")
    return np.where(one, 1.0, w.gpus_per_node)


def oom_probability(required: np.ndarray, usable: np.ndarray | float, sigma: float) -> np.ndarray:
    """P(the run does not fit): the log-ratio of predicted need to usable memory on a normal error.

    The planner's log-error of the peak (``peak_log_sigma``, measured leave-one-model-out) is the
    uncertainty: P = Phi(ln(required / usable) / sigma). Above 0.5 the prediction says it does not fit.
    """
    ratio = np.log(np.maximum(required, 1.0) / np.maximum(usable, 1.0))
    # Phi(x) = erfc(-x / sqrt 2) / 2: the same as (1 + erf(x / sqrt 2)) / 2, without its cancellation far below
    # the limit (4.4e-16 of rounding noise where the probability is 1e-30)
    return 0.5 * _ERFC(-ratio / (max(sigma, 1e-6) * math.sqrt(2.0)))


def predict_memory(w: Workload, c: Coefficients) -> MemoryPrediction:
    """Allocated, reserved and nvidia-smi peaks per GPU, the out-of-memory probability and the breakdown."""
    b = memory_breakdown(w, c)
    on_gpu = w.gpus >= 1
    multi = w.gpus >= 2
    allocated = b["allocated"]
    context = _where(on_gpu, c.cuda_context_gib * GIB, 0.0)
    nccl = _where(multi & (w.mode() != "DP") & (w.mode() != "PP"), c.nccl_gib * GIB, 0.0)
    # Caching-allocator slack: what torch keeps reserved beyond the live tensors at the peak.
    # Large vocab-sized loss tensors of changing size fragment the pool most (estimation.md §5).
    slack = (
        c.reserve_fixed_gib * GIB + c.reserve_transient_fraction * b["transient"] + c.reserve_loss_fraction * b["loss"]
    )
    reserved = allocated + _where(on_gpu, slack, 0.0)
    # On a full device the allocator frees its cached blocks and retries before it fails
    # (c10 CUDACachingAllocator), so only the fragmentation of live segments adds to the need: each phase
    # needs its own peak plus a share of its own transient tensors (forward/backward: activations, the loss,
    # gathered weights; the optimizer step: its foreach temporaries), and the run the larger of the two
    required = np.maximum(
        b["peak_forward_backward"] + c.oom_fragmentation_fraction * (b["transient"] + b["loss"]),
        b["peak_optimizer_step"] + c.oom_fragmentation_fraction * b["optimizer_step_transient"],
    )
    capacity = w.gpu.memory_bytes if (w.gpu is not None) else None  # nvidia-smi's total
    if capacity is not None:
        # the allocator can hand out what CUDA gives the process (less than nvidia-smi's total: the
        # driver keeps some, catalog.gpus cuda_memory_mib) minus the CUDA context and NCCL's buffers
        usable = _where(on_gpu, w.gpu.cuda_memory_bytes - context - nccl, np.nan)  # a CPU run: no GPU to fill
        reserved = np.fmin(reserved, np.fmax(allocated, usable))  # fmax/fmin: a CPU run's NaN usable caps nothing
        p_oom = _where(on_gpu, oom_probability(required, usable, c.peak_log_sigma), 0.0)
        smi = reserved + context + nccl
        utilization = _where(on_gpu, 100.0 * smi / capacity, 0.0)
    else:
        usable = np.full(w.size, np.nan)
        p_oom = np.zeros(w.size)
        smi = reserved + context + nccl
        utilization = np.zeros(w.size)
    phase = np.where(b["peak_optimizer_step"] >= b["peak_forward_backward"], "optimizer_step", "forward_backward")
    keys = (
        "weights",
        "gathered_weights",
        "gradients",
        "optimizer_states",
        "optimizer_step_transient",
        "ddp_buckets",
        "activations",
        "loss",
    )
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
        usable_gib=usable / GIB,
        required_gib=required / GIB,
        oom_probability=p_oom,
        fits=p_oom <= 0.5,
        host_gib=b["host_per_process"] * processes_per_node(w) / GIB,
        nvme_gib=b["nvme_per_process"] * processes_per_node(w) / GIB,
        peak_phase=phase,
        peak_moment=np.where(phase == "optimizer_step", "optimizer_step", b["moment"]),
        breakdown_gib=breakdown,
    )
