"""Step time, throughput, runtime and cost.

    FLOPs per token  full 6N, PEFT 4N (no weight gradients), + 2N when checkpointing recomputes the
                     forward, + the attention core (estimation.md §6; Kaplan et al. 2020; PaLM App. B)
                     + Mamba-2 layers' SSD cores
    t_micro          FLOPs / (peak x efficiency) + fixed per-layer (and eager-MoE per-expert) overhead,
                     more per layer under FSDP and ZeRO-3 (their gather/release hooks)
                     + dequantisation of 4-bit weights outside the matmul (memory-bound, per micro-batch)
    t_comm           FSDP all-gathers and reduce-scatters, DDP all-reduces, DeepSpeed ZeRO's collectives,
                     over NVLink / PCIe / the network (RoCE or TCP), partly hidden behind compute
    t_optimizer      optimizer state traffic / HBM bandwidth (memory-bound)
    t_step           accumulation x t_micro + exposed comm + t_optimizer

Efficiency is a calibrated function of model width (small matrices run below peak), method
(bitsandbytes / GPTQ dequantisation) and fused kernels (estimation.md §8, §11 step 6).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tunebench.plan.coefficients import Coefficients
from tunebench.plan.memory import (
    _ADAM,
    OPTIMIZERS,
    expert_fraction,
    param_bytes,
    sharding_degree,
    state_partitions,
    trainable_params,
)
from tunebench.plan.workload import Workload, total_steps

# Network bandwidth per node for multi-node runs, GB/s per direction (assumptions, override with
# network_gbps): RoCE NICs at 200 Gb/s; without RoCE the reference sets NCCL_IB_DISABLE=1 and NCCL falls
# back to TCP sockets (ado-sfttrainer.md §9), which reach a fraction of a 100 GbE link.
ROCE_GBPS = 25.0
TCP_GBPS = 4.0


def flops_per_token(w: Workload) -> np.ndarray:
    """Hardware FLOPs per (padded) token of one training step, recomputation included."""
    a = w.structure
    mm = a.matmul_params_per_token
    body = mm - a.lm_head_params  # lm_head sits outside the checkpointed layers: never recomputed
    recompute = recompute_fraction(w)
    if w.method == "full":
        dense = 6 * mm + 2 * recompute * body  # fwd 2N + input grads 2N + weight grads 2N
    else:
        dense = 4 * mm + 2 * recompute * body  # frozen base: no weight-gradient GEMMs
        dense = dense + 6 * trainable_params(w)  # adapters: negligible, counted
    # attention core: forward attn_ctx * s (causal half), backward 2x, recompute 1x (llm-foundry, PaLM); flash and
    # SDPA's causal kernels skip the masked half, eager attention multiplies the whole s x s square (transformers
    # eager_attention_forward: torch.matmul(query, key.transpose(2, 3)), softmax, then torch.matmul with values).
    # A padding-free row under eager or sdpa has a block-diagonal mask (transformers masking_utils
    # find_packed_sequence_indices): no causal kernel, the whole row's square (Workload.attended_tokens)
    square = 2.0 if w.attention == "eager" or (w.padding_free and w.attention != "flash") else 1.0
    attention = a.attention_flops_per_token_per_context * w.attended_tokens() * (3 + recompute) * square
    # Mamba-2's SSD core: its chunked matmuls per token do not depend on the length (chunks of a fixed size);
    # backward twice the forward, as for the attention core (mamba_ssm _mamba_chunk_scan_combined_bwd: the
    # gradients of x, B, C and dt from the same chunk products), recompute once more
    ssd = a.ssd_flops_per_token * (3 + recompute)
    return dense + attention + ssd


def recompute_fraction(w: Workload) -> float:
    """Share of the forward matmuls the backward recomputes: all under full checkpointing, every second
    one under torchtitan's op-level selective policy (plan.trace.selective_checkpoint_context), none
    without checkpointing."""
    if not w.checkpointing:
        return 0.0
    return 0.5 if w.selective_checkpointing else 1.0


# HBM bytes moved per 4-bit weight each time a layer dequantises it outside the matmul:
# - bitsandbytes (bitsandbytes autograd/_functions.py MatMul4Bit: dequantize_4bit, then F.linear; again in
#   backward for the input gradient): read 0.5 B, write 2 B, the matmul reads the 2 B back: 4.5 B.
# - AutoGPTQ's QuantLinear with exllama disabled and desc_act False (auto_gptq utils/import_utils.py
#   dynamically_import_QuantLinear -> nn_modules/qlinear/qlinear_cuda_old.py; its forward takes the torch path at
#   >= kernel_switch_threshold = 128 rows, i.e. every training micro-batch): bitwise_right_shift of the int32
#   words (read 0.5, write 4), .to(int8) (read 4, write 1), bitwise_and in place (1, 1), minus the group's zeros
#   (read 1, write 1), times the group's fp16 scales (read 1, write 2), the matmul (read 2): 18.5 B. Autograd
#   keeps the fp16 weight for the backward, which reads it once more (2 B).
# - fms-acceleration's triton_v2 GPTQ kernels dequantise inside the matmul: no extra pass (gptq_speed).
DEQUANT_BYTES = {"bitsandbytes": 4.5, "autogptq_torch": 18.5, "triton_fused": 0.0}
AUTOGRAD_SAVED_READ_BYTES = 2.0
AUTOGPTQ_KERNEL_SWITCH_ROWS = 128  # qlinear_cuda_old kernel_switch_threshold: fewer rows run its fused CUDA kernel


def dequant_seconds(w: Workload, micro_tokens: np.ndarray) -> np.ndarray:
    """Seconds per micro-batch of dequantising 4-bit weights outside the matmul (memory-bound, DEQUANT_BYTES):
    in the forward and the recomputed forward, and in the backward (bitsandbytes dequantises again; AutoGPTQ
    reads the weight autograd kept). micro_tokens: the rows each linear layer sees per micro-batch."""
    kind = w.dequantization
    if kind is None or w.gpu is None or not DEQUANT_BYTES[kind]:
        return np.zeros(w.size)
    forwards = 1 + recompute_fraction(w)
    backward = DEQUANT_BYTES[kind] if kind == "bitsandbytes" else AUTOGRAD_SAVED_READ_BYTES
    per_weight = DEQUANT_BYTES[kind] * forwards + backward
    seconds = w.structure.quantized_params * per_weight / (w.gpu.memory_bandwidth_gbps * 1e9) / w.tp
    if kind == "autogptq_torch":
        seconds = np.where(micro_tokens >= AUTOGPTQ_KERNEL_SWITCH_ROWS, seconds, 0.0)
    return np.where(w.gpus >= 1, seconds, 0.0)


def peak_tflops(w: Workload) -> float:
    """Dense tensor peak for the compute dtype (catalog, datasheet values without sparsity)."""
    g = w.gpu
    if g is None:
        return 0.0
    if w.compute_bytes == 4:
        return g.fp32_tflops  # torch keeps TF32 off for matmuls by default
    if w.torch_dtype == "float16" or w.settings.get("fp16"):
        return g.fp16_tflops
    return g.bf16_tflops if g.bf16_tflops is not None else g.fp32_tflops  # no bf16 tensor cores: emulated


def efficiency(w: Workload, c: Coefficients) -> float:
    """Achieved fraction of peak: width-limited kernel efficiency x method and kernel factors."""
    width = w.structure.hidden / w.tp  # tensor parallelism splits every matrix tp ways
    eta = c.hfu_max * width / (width + c.hidden_half)
    if w.method == "qlora":
        eta *= c.qlora_speed
    elif w.method == "gptq-lora":
        eta *= c.gptq_speed
    if any(w.fast_kernels):
        eta *= c.fast_kernels_speed
    elif w.compiled:  # torch.compile's fused element-wise kernels
        eta *= c.compile_speed
    return eta


def network_rate(w: Workload, network_gbps: float | None) -> tuple[float, str]:
    """Inter-node bandwidth per node and direction (GB/s) and where it comes from: the option, else the network
    a calibration record states it ran on (``_network_gbps``), else the assumption by enable_roce."""
    if network_gbps is not None:
        return network_gbps, "network_gbps"
    if w.settings.get("_network_gbps"):
        return float(w.settings["_network_gbps"]), "the record's network"
    if w.settings.get("enable_roce"):
        return ROCE_GBPS, "enable_roce: RoCE, one 200 Gb/s NIC per node assumed"
    return TCP_GBPS, "enable_roce off: NCCL over TCP sockets assumed"


def _link_gbps(w: Workload, c: Coefficients, network_gbps: float | None, within_node: bool = False) -> np.ndarray:
    """Per-direction bandwidth (bytes/s) the collectives see: NVLink/PCIe within a node, the NIC across
    nodes (within_node: a collective among one node's GPUs only).

    The catalog's intra_node_bandwidth_gbps is bidirectional (NVLink 3 600 GB/s, PCIe 4.0 x16 64 GB/s),
    so one direction is half of it.
    """
    intra = (w.gpu.intra_node_bandwidth_gbps / 2) if w.gpu is not None else 1.0
    across = (w.nodes > 1) & (not within_node)
    bw = np.where(across, np.minimum(intra, network_rate(w, network_gbps)[0]), intra)
    return bw * c.link_efficiency * 1e9


def comm_seconds(w: Workload, c: Coefficients, network_gbps: float | None = None) -> np.ndarray:
    """Collective communication per optimizer step (ring algorithms: (D-1)/D of the payload per GPU)."""
    a = w.structure
    mode = w.mode()
    d = w.devices
    ring = (d - 1) / d
    degree, gathers_all = sharding_degree(w)
    n_train = trainable_params(w)
    grad_bytes = n_train * param_bytes(w)
    if w.method == "qlora":
        compute_param = 0.516
    elif w.method == "gptq-lora":
        compute_param = 0.52
    else:
        compute_param = 4.0 if w.compute_bytes == 4 else 2.0
    params = a.total_params * compute_param * (1 - expert_fraction(w))  # EP experts are never gathered
    ga = w.grad_accum
    # FSDP: all-gather parameters in forward and again in backward (FULL/HYBRID) or once
    # (SHARD_GRAD_OP), reduce-scatter gradients at each sync; HYBRID adds an all-reduce across nodes.
    gathers = np.where(gathers_all, 1.0, 2.0)
    fsdp = ga * gathers * params * (degree - 1) / np.maximum(degree, 1) + grad_bytes * ring
    allreduce = 2 * grad_bytes * ring  # DDP / NO_SHARD: one all-reduce per optimizer step
    dp = ga * params * ring + allreduce  # DataParallel: broadcasts weights every forward
    volume = np.where(mode == "FSDP", np.where(w.sharding == "NO_SHARD", allreduce, fsdp), 0.0)
    volume = np.where(mode == "DDP", allreduce, volume)
    volume = np.where(mode == "DP", dp, volume)
    # DeepSpeed converts the whole module to 16 bits under bf16/fp16 (adapters too) and then communicates
    # in it; without either its communication_data_type is fp32 (runtime/engine.py) and the parameters
    # it gathers keep their own dtype
    ds_reduce = n_train * (2.0 if w.deepspeed_16bit else 4.0)
    ds_gather = n_train * (2.0 if w.deepspeed_16bit else param_bytes(w))
    volume = np.where(mode == "DeepSpeed", deepspeed_comm_bytes(w, ds_reduce, ds_gather, params, ring), volume)
    seconds = volume / _link_gbps(w, c, network_gbps)
    if w.sharding.startswith("HYBRID"):
        # HYBRID_SHARD shards within a node (degree: its GPUs) and replicates across nodes (torch FSDP
        # ShardingStrategy docs): gathers and reduce-scatters stay on NVLink/PCIe; across nodes each GPU
        # all-reduces its gradient shard, and a node's GPUs share its NIC: 2 (n-1)/n of the whole gradient
        # per node, what DDP's all-reduce puts on the network
        within = ga * gathers * params + grad_bytes
        within = within * (degree - 1) / np.maximum(degree, 1) / _link_gbps(w, c, network_gbps, within_node=True)
        across = 2 * grad_bytes * (w.nodes - 1) / w.nodes / _link_gbps(w, c, network_gbps)
        seconds = np.where((mode == "FSDP") & (w.sharding != "NO_SHARD"), within + across, seconds)
    return seconds


def deepspeed_comm_bytes(w: Workload, grad_bytes, gather_bytes, params, ring) -> np.ndarray:
    """Bytes each GPU sends per optimizer step under ZeRO (Rajbhandari et al. 2020 §7: stages 1-2 move
    what DDP's all-reduce moves, stage 3 1.5x): stage 0-1 all-reduce or reduce-scatter the gradients
    once per step and stage 1 all-gathers the updated parameters; stage 2 reduce-scatters every
    micro-batch (partitioned gradients cannot accumulate unreduced); stage 3 also all-gathers the
    parameters in forward and in backward of every micro-batch. Stages 1-2 partition and all-gather
    only what the optimizer updates, the trainable parameters (zero/stage_1_and_2.py: bit16_groups
    keeps the params with requires_grad), so a PEFT run's frozen base never crosses the link; stage 3
    partitions every parameter (the frozen base too) and gathers them all."""
    z, ga = w.zero_stage, w.grad_accum
    if z == 0:
        return 2 * grad_bytes * ring
    if z == 1:
        return (grad_bytes + gather_bytes) * ring
    if z == 2:
        return (ga * grad_bytes + gather_bytes) * ring  # reduce-scatter per micro-batch + one all-gather
    return ga * (2 * params * ring + grad_bytes * ring)


def parallel_seconds(
    w: Workload, c: Coefficients, micro_tokens: np.ndarray, network_gbps: float | None = None
) -> np.ndarray:
    """Tensor- and sequence-parallel communication of one micro-batch, on the critical path.

    Tensor parallel with sequence-parallel norms: per layer an all-gather and a reduce-scatter before and
    after attention and the MLP in forward, the same in backward: 8 collectives of (tp-1)/tp of the
    micro-batch's hidden states (Korthikanti et al. 2022 §4.2.2). Ulysses sequence parallel: 4
    all-to-alls per layer in forward (q, k, v, output), 4 in backward, each moving (sp-1)/sp of the
    GPU's share (Jacobs et al. 2023). A group of tp x sp consecutive ranks stays within a node when the
    node holds it; larger, it spans nodes and its collectives run at the slower of NVLink/PCIe and the
    network (``tp_spans_nodes``)."""
    a = w.structure
    hidden_bytes = micro_tokens * a.hidden * 2.0
    link = np.where(tp_spans_nodes(w), _link_gbps(w, c, network_gbps), _link_gbps(w, c, network_gbps, within_node=True))
    tp, sp = w.tp, w.sp
    tensor = 8 * a.layers * hidden_bytes / sp * (tp - 1) / tp
    sequence = 8 * a.layers * hidden_bytes / (sp * tp) * (sp - 1) / sp
    return np.where(w.gpus >= 1, (tensor + sequence) / link, 0.0)


def tp_spans_nodes(w: Workload) -> np.ndarray:
    """Whether a tensor x sequence parallel group (tp x sp consecutive ranks, the innermost dimension of
    torch's DeviceMesh and Megatron's rank order) crosses a node's edge: it holds more GPUs than a node has,
    or a node's GPUs are not a whole number of groups (12 GPUs on 2 nodes, tp 4: ranks 4-7 straddle them)."""
    group = w.tp * w.sp
    return (w.nodes > 1) & ((group > w.gpus_per_node) | (np.mod(w.gpus_per_node, group) != 0))


# Host-side rates for offloaded optimizer steps (assumptions, stated in docs/planner.md): PCIe gen4 x16
# carries ~25 GB/s per direction in practice; DeepSpeed's CPU Adam is bound by host memory bandwidth,
# ~100 GB/s for the processes of one node; an NVMe RAID ~6 GB/s per node (ZeRO-Infinity, Rajbhandari et al. 2021).
PCIE_GBPS = 25.0
HOST_MEMORY_GBPS = 100.0
NVME_GBPS = 6.0
CPU_ADAM_BYTES = 28  # fp32 param, grad, m, v read (16 B) and param, m, v written (12 B) per parameter


def offload_seconds(w: Workload) -> np.ndarray:
    """Time per optimizer step that offload adds and nothing hides: gradients down and 16-bit parameters
    up over PCIe, the CPU optimizer step (all processes of a node share the host's bandwidth), NVMe
    reads and writes of the states, and ZeRO-3 parameter fetches per micro-batch."""
    if not w.on_gpu or (w.offload_optimizer == "gpu" and w.offload_params == "gpu"):
        return np.zeros(w.size)
    split = state_partitions(w)
    n = trainable_params(w) / split
    per_node = w.gpus_per_node
    t = np.zeros(w.size)
    if w.offload_optimizer != "gpu":
        t = t + n * (2 + 2) / (PCIE_GBPS * 1e9) + n * CPU_ADAM_BYTES * per_node / (HOST_MEMORY_GBPS * 1e9)
        if w.offload_optimizer == "nvme":
            t = t + n * 12 * 2 * per_node / (NVME_GBPS * 1e9)  # states read and written back
    if w.offload_params != "gpu":
        fetched = w.structure.total_params * 2 / split  # the local 16-bit shard, forward and backward
        t = t + w.grad_accum * 2 * fetched / (PCIE_GBPS * 1e9)
        if w.offload_params == "nvme":
            t = t + w.grad_accum * 2 * fetched * per_node / (NVME_GBPS * 1e9)
    return t


def optimizer_seconds(w: Workload, host_s_per_param: np.ndarray | float | None = None) -> np.ndarray:
    """Optimizer step: read param, grad and states, write param and states, over HBM (memory-bound). On the
    CPU: the trainable parameters x the seconds per parameter timed on this host (plan.host.entity_rate),
    else none (the calibrated cpu_tflops of another host's runs absorbs it)."""
    if w.gpu is None:
        per_param = 0.0 if host_s_per_param is None else host_s_per_param
        return trainable_params(w) * np.where(w.gpus >= 1, 0.0, per_param) * np.ones(w.size)
    if w.offload_optimizer != "gpu":
        return np.zeros(w.size)  # offloaded: offload_seconds
    opt = OPTIMIZERS.get(w.optim, _ADAM)
    pb = param_bytes(w)
    per_param = 3 * pb + 2 * (opt.state_copies * pb + opt.state_bytes)
    return trainable_params(w) / state_partitions(w) * per_param / (w.gpu.memory_bandwidth_gbps * 1e9)


@dataclass
class ThroughputPrediction:
    """Per-entity timing and rates (arrays)."""

    step_seconds: np.ndarray
    compute_seconds: np.ndarray
    comm_seconds: np.ndarray
    flops_per_token: np.ndarray
    mfu: np.ndarray  # model FLOPs utilisation (6N / 4N accounting, no recomputation)
    train_tokens_per_gpu_per_second: np.ndarray
    train_tokens_per_second: np.ndarray
    dataset_tokens_per_second: np.ndarray
    train_samples_per_second: np.ndarray
    train_steps_per_second: np.ndarray
    steps: np.ndarray
    train_runtime: np.ndarray


# Achieved share of the host probe's training rate (plan.host) that a CPU run reaches: 1, the probes
# train the entity's own layers in its dtype, autocast and checkpointing; measured on 2 EPYC cores,
# SmolLM2-135M runs of tunebench measure within -8 to +23 % of the prediction (docs/planner.md section 5).
CPU_EFFICIENCY = 1.0


def cpu_rate(c: Coefficients, host_flops: np.ndarray | float | None) -> np.ndarray | float:
    """FLOP/s of a CPU device (per entity when an array): the host's measured training rate x
    CPU_EFFICIENCY when given (the planner measures the host it runs on), else the calibrated cpu_tflops
    (the measurements' own host, for calibration records measured elsewhere)."""
    return host_flops * CPU_EFFICIENCY if host_flops is not None else c.cpu_tflops * 1e12


def micro_step_seconds(
    w: Workload, c: Coefficients, micro_flops: np.ndarray, padded, host_flops: np.ndarray | float | None = None
) -> np.ndarray:
    """Seconds of one micro-batch's forward and backward on one device: matmul FLOPs at the
    calibrated efficiency, memory-bound elementwise traffic and per-layer overheads (on the CPU: FLOPs
    at the host's rate, cpu_rate)."""
    a = w.structure
    if a.vision and w.dataset.kind == "vision":  # the tower encodes every tile of the sample's image
        tower = a.vision["tower_params"]
        per_token = 6 if w.method == "full" else 4
        micro_flops = micro_flops + w.per_device_batch * w.image_encoder_tokens() * tower * per_token
    on_gpu = w.gpus >= 1
    if w.gpu is not None:
        rate = peak_tflops(w) * 1e12 * efficiency(w, c)
    else:
        rate = cpu_rate(c, host_flops)
    rate = np.where(on_gpu, rate, cpu_rate(c, host_flops))
    split = w.tp * w.sp  # a micro-batch's work is shared by its tensor- and sequence-parallel group
    compute = micro_flops / rate / split
    if w.gpu is not None:
        # memory-bound elementwise work (norms, activations, RoPE, residual adds, casts): every tensor the
        # traced step creates is written and read back (``elementwise_passes`` times its bytes); scales
        # with HBM bandwidth, not tensor FLOPs: why small models and fast GPUs reach less of their peak
        traffic = w.activations.written.bytes(*w.rows(padded)) * c.elementwise_passes / split
        compute = compute + np.where(on_gpu, traffic / (w.gpu.memory_bandwidth_gbps * 1e9), 0.0)
    compute = compute + dequant_seconds(w, w.per_device_batch * padded / w.sp)  # rows each linear sees
    # kernel launches and host syncs per layer (GPU); on the CPU the host rate cpu_tflops absorbs them;
    # FSDP that shards (not NO_SHARD) and ZeRO-3 (on one GPU too) add their gather/release hooks per layer
    sharded = ((w.mode() == "FSDP") & (sharding_degree(w)[0] > 1)) | ((w.mode() == "DeepSpeed") & (w.zero_stage == 3))
    overhead = (c.layer_overhead_s + np.where(sharded, c.sharded_unit_overhead_s, 0.0)) * a.layers
    if a.experts and not w.fast_moe:  # eager MoE loops over experts in Python (modeling_mixtral/granitemoe)
        overhead += c.expert_overhead_s * a.layers * a.experts
    return compute + np.where(on_gpu, overhead, 0.0)


def predict_throughput(
    w: Workload,
    c: Coefficients,
    network_gbps: float | None = None,
    host_flops: np.ndarray | float | None = None,
    host_optimizer_s_per_param: np.ndarray | float | None = None,
) -> ThroughputPrediction:
    """Step time and the spec's throughput properties for every entity of a workload; CPU entities at
    ``host_flops`` (FLOP/s, per entity when an array) and ``host_optimizer_s_per_param`` (seconds per
    trainable parameter; plan.host.entity_rate) when given, else at the calibrated cpu_tflops."""
    a = w.structure
    real, padded = w.sample_tokens()
    micro_tokens = w.per_device_batch * padded
    fpt = flops_per_token(w)
    micro = micro_step_seconds(w, c, micro_tokens * fpt, padded, host_flops)
    on_gpu = w.gpus >= 1
    comm = np.where(on_gpu, comm_seconds(w, c, network_gbps), 0.0)
    step_compute = w.grad_accum * micro
    exposed = np.maximum(c.comm_exposed_fraction * comm, comm - step_compute)
    if a.experts and w.fast_moe >= 1:
        # ScatterMoE (fast_moe = ep degree): token sort/dispatch and combine in forward, recompute and
        # backward of every MoE layer (6 per layer), each behind a host sync for the split sizes; with
        # ep > 1 they are all-to-alls carrying top_k copies of each token, on the critical path
        ep = w.fast_moe
        per_a2a = micro_tokens * a.top_k * a.hidden * 2 * (ep - 1) / ep / _link_gbps(w, c, network_gbps)
        exposed = exposed + w.grad_accum * 6 * a.layers * (c.alltoall_latency_s + per_a2a)
    step = (
        step_compute
        + exposed
        + optimizer_seconds(w, host_optimizer_s_per_param)
        + offload_seconds(w)
        + w.grad_accum * parallel_seconds(w, c, micro_tokens, network_gbps)
    )

    samples_per_step = w.batch * w.grad_accum  # ado batch_size is already per-device x devices
    devices = w.devices
    # device_map: one process; its GPUs take turns on each micro-batch (naive pipeline), so each GPU
    # trains 1/g of the process's tokens
    tokens_gpu = w.grad_accum * micro_tokens / step / np.where(w.mode() == "PP", devices, 1.0) / (w.tp * w.sp)
    steps = total_steps(w)
    runtime = steps * step
    stop = w.stop_after_seconds
    runtime = np.where(stop > 0, np.minimum(runtime, np.ceil(stop / step) * step), runtime)
    if w.settings.get("auto_stop_method"):
        # WARMUP_60S_STABLE_120S_OR_10_STEPS: the measured window after a 60 s warm-up is the
        # longer of 120 s or 10 steps (ado-sfttrainer.md §8.2), never past the end of training
        runtime = np.minimum(np.maximum(120.0, 10 * step), np.maximum(runtime - 60.0, step))
    model_flops = (6 if w.method == "full" else 4) * a.matmul_params_per_token
    # a CPU run is rated against the host's own rate, whatever gpu_model names (number_gpus=0 uses no GPU)
    peak = np.where(on_gpu, peak_tflops(w) * 1e12 if w.gpu is not None else 1.0, cpu_rate(c, host_flops))
    mfu = tokens_gpu * model_flops / peak
    return ThroughputPrediction(
        step_seconds=step,
        compute_seconds=step_compute,
        comm_seconds=comm,
        flops_per_token=fpt,
        mfu=mfu,
        train_tokens_per_gpu_per_second=tokens_gpu,
        train_tokens_per_second=tokens_gpu * devices,
        dataset_tokens_per_second=samples_per_step * real / step,
        train_samples_per_second=samples_per_step / step,
        train_steps_per_second=1.0 / step,
        steps=steps,
        train_runtime=runtime,
    )
