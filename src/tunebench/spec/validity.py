"""Validity of an entity: the SFTTrainer spec "is_valid logic", all rules in one place.

An entity that breaks a rule is a *valid request* whose result is ``is_valid = 0``: it is recorded
(and memoised), never run. Rules 1-7 are the spec's; the two after them are rules the reference
enforces in code (ado-sfttrainer.md §5.1) and that the spec implies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from tunebench.catalog import get_model
from tunebench.catalog.gpus import get_gpu, is_mig
from tunebench.datasets.ids import parse_dataset_id
from tunebench.errors import InputError
from tunebench.spec.experiments import Entity, Experiment, effective_values

# the SFTTrainer spec note on --fast_moe: "only supported for fms-hf-tuning v2.4.0+".
FAST_MOE_MIN_VERSION = (2, 4, 0)


@dataclass(frozen=True)
class Validity:
    """is_valid and, when false, one reason per broken rule."""

    is_valid: bool
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # platform notes (platform_notes): warn, never invalidate

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"is_valid": self.is_valid, "reasons": list(self.reasons)}
        if self.notes:  # only when there are some: the long-standing two-key form otherwise
            out["notes"] = list(self.notes)
        return out


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def check_values(values: dict[str, Any], *, single_node_only: bool = False) -> Validity:
    """Apply every rule to a full set of effective property values."""
    reasons: list[str] = []
    gpus = values["number_gpus"]
    batch = values["batch_size"]
    nodes = values.get("number_nodes", 1)
    fast_moe = values.get("fast_moe", 0) or 0

    # 1. batch_size % number_gpus != 0. The literal text divides by zero on the CPU; the spec's batch_size "will be
    # evenly distributed to max(1, number_gpus) devices", so a CPU run counts as one device. With tunebench's
    # tensor/sequence parallelism the batch is spread over the data-parallel ranks, number_gpus / (tp x sp)
    ranks = data_parallel_ranks(values)
    if batch % ranks != 0:
        over = (
            f"number_gpus {gpus}" if ranks == max(1, gpus) else f"the {ranks} data-parallel ranks of number_gpus {gpus}"
        )
        reasons.append(f"rule 1: batch_size {batch} is not divisible by {over}")
    # 2. number_gpus % number_nodes != 0, as the spec writes it: 0 GPUs divide over any number of nodes (the
    # reference's code tests max(1, number_gpus) instead; docs/experiments.md "Validity")
    if nodes > 0 and gpus % nodes != 0:
        reasons.append(f"rule 2: number_gpus {gpus} is not divisible by number_nodes {nodes}")
    # 3. number_nodes must be greater than 0
    if nodes <= 0:
        reasons.append(f"rule 3: number_nodes must be greater than 0 (got {nodes})")
    # 4. batch_size must be greater than 0
    if batch <= 0:
        reasons.append(f"rule 4: batch_size must be greater than 0 (got {batch})")
    # 5. number_gpus > 0 needs a non-empty gpu_model
    if gpus > 0 and not values.get("gpu_model"):
        reasons.append(f"rule 5: number_gpus is {gpus} but gpu_model is empty")
    if fast_moe > 0:
        # 6. number_gpus not divisible by fast_moe
        if gpus % fast_moe != 0:
            reasons.append(f"rule 6: number_gpus {gpus} is not divisible by fast_moe {fast_moe}")
        # 7. num_local_experts not divisible by fast_moe (fast_moe is ep_degree in fms-hf-tuning)
        experts = get_model(values["model_name"]).num_local_experts
        if not experts:
            reasons.append(
                f"rule 7: fast_moe {fast_moe} needs a Mixture-of-Experts model; {values['model_name']} has none"
            )
        elif experts % fast_moe != 0:
            reasons.append(f"rule 7: num_local_experts {experts} is not divisible by fast_moe {fast_moe}")
        # reference: fast_moe is only supported by fms-hf-tuning 2.4.0+ (the SFTTrainer spec note)
        version = values.get("fms_hf_tuning_version")
        if version and _version(version) < FAST_MOE_MIN_VERSION:
            reasons.append(f"fast_moe needs fms_hf_tuning_version >= 2.4.0 (got {version})")
    # reference: a single-node experiment cannot use several nodes (ado-sfttrainer.md §5.1)
    if single_node_only and nodes > 1:
        reasons.append(f"this experiment runs on one node; number_nodes is {nodes}")
    reasons += stack_reasons(values)
    return Validity(is_valid=not reasons, reasons=reasons)


def data_parallel_ranks(values: dict[str, Any]) -> int:
    """The ranks batch_size is spread over (rule 1): max(1, number_gpus), or number_gpus / (tp x sp) where tensor
    or sequence parallelism groups GPUs that process the same samples (and divides number_gpus)."""
    gpus = max(1, int(values.get("number_gpus") or 0))
    group = (values.get("tensor_parallel_degree") or 1) * (values.get("sequence_parallel_degree") or 1)
    return gpus // group if group > 1 and gpus % group == 0 else gpus


def stack_reasons(values: dict[str, Any]) -> list[str]:
    """tunebench's rules for its stack settings (docs/experiments.md "Stack settings"), in order."""
    reasons = []
    backend = values.get("distributed_backend")
    stage = values.get("deepspeed_zero_stage", 2)
    opt_dev = values.get("offload_optimizer_device") or "none"
    param_dev = values.get("offload_param_device") or "none"
    # DeepSpeed docs, zero_optimization: offload_optimizer "valid only with stage 1, 2 and 3";
    # offload_param "valid only with stage 3"; NVMe offload is ZeRO-Infinity, stage 3 only.
    if opt_dev != "none" and backend != "DeepSpeed":
        reasons.append(f"offload_optimizer_device {opt_dev} needs distributed_backend DeepSpeed (got {backend})")
    elif opt_dev != "none" and stage < 1:
        reasons.append(f"offload_optimizer_device {opt_dev} needs deepspeed_zero_stage >= 1 (got {stage})")
    elif opt_dev == "nvme" and stage < 3:
        reasons.append(f"offload_optimizer_device nvme needs deepspeed_zero_stage 3 (got {stage})")
    # a ZeRO stage other than accelerate's default (2) is a DeepSpeed setting: under FSDP or DDP it would be
    # silently ignored (the default cannot be told apart from an explicit 2, so it never counts)
    if stage != 2 and backend != "DeepSpeed":
        reasons.append(f"deepspeed_zero_stage {stage} needs distributed_backend DeepSpeed (got {backend})")
    if param_dev != "none" and (backend != "DeepSpeed" or stage != 3):
        reasons.append(
            f"offload_param_device {param_dev} needs distributed_backend DeepSpeed with deepspeed_zero_stage 3"
        )
    # accelerate fsdp_config fsdp_offload_params: an FSDP setting
    if values.get("fsdp_offload_params") and backend != "FSDP":
        reasons.append(f"fsdp_offload_params needs distributed_backend FSDP (got {backend})")
    # transformers device_map="auto" places one process's model over all its GPUs: no data-parallel backend
    if values.get("device_map") and backend is not None and values.get("number_gpus", 0) > 1:
        reasons.append(
            f"device_map {values['device_map']} runs one process over the GPUs: set distributed_backend None (got {backend})"
        )
    if values.get("device_map") and values.get("number_nodes", 1) > 1:
        reasons.append(
            f"device_map {values['device_map']} runs one process, on one node: it cannot span number_nodes "
            f"{values['number_nodes']}"
        )
    tp, sp = values.get("tensor_parallel_degree") or 1, values.get("sequence_parallel_degree") or 1
    if tp * sp > 1 and values.get("number_gpus", 0) < 1:
        reasons.append(f"tensor_parallel_degree x sequence_parallel_degree {tp} x {sp} needs GPUs (number_gpus is 0)")
    elif tp * sp > 1 and values.get("number_gpus", 0) % (tp * sp) != 0:
        reasons.append(
            f"number_gpus {values.get('number_gpus')} is not divisible by tensor_parallel_degree x "
            f"sequence_parallel_degree {tp} x {sp}"
        )
    if tp > 1:
        # each rank keeps whole attention heads (Megatron-LM arguments.py: num_attention_heads divisible by
        # tensor_model_parallel_size; torchtitan's colwise q/k/v split likewise); key/value heads are split
        # too, or, fewer than the ranks, copied to each (the bigcode Megatron fork's multi-query attention)
        model = get_model(values["model_name"])
        heads, kv = model.num_attention_heads, model.num_key_value_heads
        if heads and heads % tp != 0:
            reasons.append(f"tensor_parallel_degree {tp} does not divide the model's num_attention_heads {heads}")
        if kv and kv % tp != 0 and tp % kv != 0:
            reasons.append(
                f"tensor_parallel_degree {tp} neither divides nor is a multiple of the model's num_key_value_heads {kv}"
            )
    if tp * sp > 1 and values.get("device_map"):
        reasons.append("device_map runs one process: it cannot be combined with tensor or sequence parallelism")
    attn = values.get("attn_implementation")
    if values.get("flash_attn") is True and attn in ("eager", "sdpa"):
        reasons.append(f"flash_attn 1 contradicts attn_implementation {attn}")
    # Dao-AILab/flash-attention README: FlashAttention-2 needs Ampere, Ada or Hopper (Turing "coming soon";
    # ROCm: MI200/MI300); FlashAttention-3 needs Hopper (H100/H800). Looked up only when asked for explicitly
    # (a catalog lookup per entity would slow 100,000-entity plans)
    flash2 = attn == "flash_attention_2" or (values.get("flash_attn") is True and attn is None)
    flash = flash2 or attn == "flash_attention_3"
    if flash and values.get("number_gpus", 0) < 1:
        what = f"attn_implementation {attn}" if attn else "flash_attn 1"
        reasons.append(
            f"{what}: flash-attention needs an NVIDIA GPU (number_gpus is 0): use attn_implementation sdpa or eager "
            "on the CPU"
        )
    elif flash:
        arch = _architecture(values)
        if flash2 and arch in ("Volta", "Turing"):
            fix = "attn_implementation sdpa" if attn == "flash_attention_2" else "flash_attn 0"
            reasons.append(f"flash-attention 2 does not run on {arch} GPUs ({values['gpu_model']}): set {fix}")
        if attn == "flash_attention_3" and arch is not None and arch not in ("Hopper", "Custom"):
            reasons.append(f"flash_attention_3 runs on Hopper GPUs only (got {arch}, {values['gpu_model']})")
    if values.get("padding_free"):
        reasons += _padding_free_reasons(values)
    return reasons


def _padding_free_reasons(values: dict[str, Any]) -> list[str]:
    """A flattened micro-batch is one row of the samples' tokens (transformers DataCollatorWithFlattening):
    prompt tuning would prepend its virtual tokens once to the row, not to each sample (peft
    PeftModelForCausalLM.forward concatenates them per batch row), and fms-hf-tuning refuses images with it
    ("Vision model tuning does not support packing or padding_free tuning", tuning/data/data_preprocessing_utils.py)."""
    reasons = []
    if values.get("peft_method") == "pt":
        reasons.append(
            "padding_free flattens a micro-batch into one row: prompt tuning would prepend its virtual tokens to the "
            "row once, not to each sample; set padding_free false"
        )
    dataset = values.get("dataset_id")
    if dataset and _is_vision(str(dataset)):
        reasons.append(f"padding_free does not flatten image-text samples ({dataset}); set padding_free false")
    # one process over several GPUs is the Trainer's DataParallel, which splits a batch by rows: a flattened
    # micro-batch is one row, so one GPU would take it all (torch.nn.DataParallel scatter)
    gpus = values.get("number_gpus") or 0
    if gpus > 1 and values.get("distributed_backend") is None and not values.get("device_map"):
        reasons.append(
            f"padding_free with number_gpus {gpus} and distributed_backend None: DataParallel splits a batch by "
            "rows and a flattened micro-batch is one row; set distributed_backend FSDP or DDP"
        )
    return reasons


@functools.lru_cache(maxsize=256)  # per entity on the planner's path; the data set ids are few
def _is_vision(dataset_id: str) -> bool:
    try:
        return parse_dataset_id(dataset_id).is_vision
    except InputError:  # the dataset_id property's own check names it
        return False


def _architecture(values: dict[str, Any]) -> str | None:
    """The architecture of the entity's GPU (catalog.gpus), or None: a CPU run, or a label the catalog lacks."""
    if values.get("number_gpus", 0) < 1 or not values.get("gpu_model"):
        return None
    try:
        return get_gpu(str(values["gpu_model"])).architecture
    except InputError:  # any node label is a gpu_model (the spec); planning asks for its numbers separately
        return None


def check(experiment: Experiment, entity: Entity) -> Validity:
    """Validity of an entity under an experiment (defaults and parameters applied), with its platform notes."""
    values = effective_values(experiment, entity)
    validity = check_values(values, single_node_only=experiment.single_node_only)
    notes = platform_notes(experiment.method, values)
    for reason in cannot_run_reasons(values):  # valid by the spec's rules, yet nothing can run or plan it
        notes.append(f"the spec's rules allow it, but the measuring engines and the planner refuse it: {reason}")
    return Validity(validity.is_valid, validity.reasons, notes)


def cannot_run_reasons(values: dict[str, Any]) -> list[str]:
    """Why a job the spec's rules allow cannot be made (no process on any node, one process for several nodes,
    images for a text model), in that order; empty where it can. The measuring engines (engines.support) and the
    planner (plan.predictor) judge them alike."""
    reasons = (
        cpu_nodes_reason(values),
        one_process_nodes_reason(values),
        vision_data_reason(values),
        gpu_kernels_reason(values),
    )
    return [r for r in reasons if r is not None]


# Settings that switch on kernels written for GPUs only: fms-acceleration's plugins (foak's fast_kernels and
# fused_lora and auto_gptq's triton_v2 are Triton kernels, fast_moe is ScatterMoE's: fms-acceleration READMEs,
# "GPU" in each plugin's requirements) and Liger's (Triton: liger-kernel README, "GPU" in its requirements).
GPU_KERNEL_FLAGS = ("fast_moe", "fast_kernels", "fused_lora", "auto_gptq")


def flag_on(flag: str, value: Any) -> bool:
    """Whether an fms-acceleration setting switches its plugin on: fast_kernels' flags (any true), fused_lora's
    (base layer, flag) pair by its flag (spec 004: "fused_lora is set to auto_gptq True"), auto_gptq's kernel name;
    a comma-separated text as its parsed list."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    elif not isinstance(value, list | tuple):
        value = [value]
    if flag == "fused_lora":
        value = list(value)[-1:]
    return any(v not in (None, False, 0, "False", "false", "0", "") for v in value)


def gpu_kernel_settings(values: dict[str, Any]) -> list[str]:
    """The settings of these values that ask for GPU-only kernels, as 'name value' (empty: none asked)."""
    used = []
    if int(values.get("fast_moe") or 0) > 0:
        used.append(f"fast_moe {values['fast_moe']}")
    for flag in GPU_KERNEL_FLAGS[1:]:
        if flag_on(flag, values.get(flag)):
            value = values[flag]
            shown = ",".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)
            used.append(f"{flag} {shown}")
    if values.get("liger_kernels"):
        used.append("liger_kernels true")
    if values.get("loss_implementation") == "fused_linear":
        used.append("loss_implementation fused_linear")
    return used


def gpu_kernels_reason(values: dict[str, Any]) -> str | None:
    """Why a CPU job (number_gpus 0) that asks for GPU-only kernels cannot be made, or None: the GPTQ-LoRA
    experiment sets three of them (spec 004: auto_gptq triton_v2, fused_lora, fast_kernels)."""
    if int(values.get("number_gpus") or 0) > 0:
        return None
    used = gpu_kernel_settings(values)
    if not used:
        return None
    return (
        f"{'; '.join(used)} with number_gpus 0: these are Triton/CUDA kernels that run on a GPU only; "
        "give number_gpus and a gpu_model"
    )


def cpu_nodes_reason(values: dict[str, Any]) -> str | None:
    """Why a CPU job over several nodes cannot be made, or None. Not one of the spec's rules (rule 2 holds: 0 %
    number_nodes == 0), but the SFTTrainer spec runs "number_gpus/number_nodes GPUs ... 1 process for each GPU"
    on each node: without GPUs, no process on any node. The measuring engines (engines.support) and the
    planner (plan.predictor) judge it alike."""
    nodes = int(values.get("number_nodes") or 1)
    if int(values.get("number_gpus") or 0) == 0 and nodes > 1:
        return (
            f"number_nodes {nodes} with number_gpus 0: each node would run number_gpus / number_nodes = 0 "
            "processes; a CPU run runs on one machine: set number_nodes 1"
        )
    return None


def one_process_nodes_reason(values: dict[str, Any]) -> str | None:
    """Why a GPU job with distributed_backend None over several nodes cannot be made, or None. Without a backend
    one process drives every GPU (transformers' Trainer wraps the model in torch DataParallel, a single-process
    module, torch.nn.DataParallel docs), and one process runs on one machine; the launch plan starts it on one node
    (actuators.launch). device_map's own rule (stack_reasons) says the same for device_map."""
    nodes = int(values.get("number_nodes") or 1)
    one_process = values.get("distributed_backend") is None and not values.get("device_map")
    if one_process and int(values.get("number_gpus") or 0) > 0 and nodes > 1:
        return (
            f"number_nodes {nodes} with distributed_backend None: one process (torch DataParallel) drives every GPU, "
            "and a process runs on one machine; set distributed_backend FSDP or DDP, or number_nodes 1"
        )
    return None


def vision_data_reason(values: dict[str, Any]) -> str | None:
    """Why an image-text data set cannot train the entity's model, or None: a model without a vision tower has no
    image input (the worker's vision path raises "a vision data set ... needs a vision model", worker/train.py),
    where the planner would plan the chat's text alone. A model the catalog cannot read is its own error."""
    dataset = values.get("dataset_id")
    if not dataset or not _is_vision(str(dataset)):
        return None
    try:
        model = get_model(str(values["model_name"]))
    except InputError:  # the model_name property's own check names it
        return None
    if model.is_vision:
        return None
    return (
        f"dataset_id {dataset} is image-text: {values['model_name']} has no vision tower to take its images; "
        "use a vision model (tunebench models) or a text data set"
    )


# watsonx.ai 'Planning for foundation model tuning' (IBM watsonx.ai documentation, "Supported GPUs"):
# QLoRA fine tuning is listed for NVIDIA A100, H100 and H200 only (full and LoRA also for L40S),
# "You cannot tune foundation models with Intel Gaudi 3 AI Accelerator GPUs", and "Regardless of the tuning
# method that you choose, you cannot partition any of the GPUs that will be used for tuning" (NVIDIA MIG;
# 'Partitioning GPU processors': MIG allows no GPU peer-to-peer and restricts a task to one GPU instance).
WATSONX_QLORA_GPUS = ("A100", "H100", "H200")
WATSONX_GUIDE = "watsonx.ai 'Planning for foundation model tuning'"


def platform_notes(method: str, values: dict[str, Any]) -> list[str]:
    """Warnings from the watsonx.ai tuning guide for the entity's method and gpu_model.

    Notes, not validity rules: the SFTTrainer spec's is_valid logic is normative and fms-hf-tuning itself runs
    these entities (bitsandbytes QLoRA works on an L40S); the guide restricts what the watsonx.ai
    service offers, which is what a user planning for it needs to know.
    """
    gpu = str(values.get("gpu_model") or "").upper().replace("_", "-").replace(" ", "-")
    if not gpu or values.get("number_gpus", 0) <= 0:
        return []
    notes = []
    if "GAUDI" in gpu:
        notes.append(f"{WATSONX_GUIDE}: foundation models cannot be tuned on Intel Gaudi 3 accelerators")
    elif method == "qlora" and "L40S" in gpu:
        notes.append(
            f"{WATSONX_GUIDE}: QLoRA fine tuning is not supported on NVIDIA L40S "
            f"(supported: NVIDIA {', '.join(WATSONX_QLORA_GPUS)})"
        )
    if is_mig(values.get("gpu_model")):
        notes.append(
            f"{WATSONX_GUIDE}: the GPUs used for tuning cannot be partitioned; {values['gpu_model']} "
            "is a MIG slice (no peer-to-peer between slices; planned with the slice's own memory and "
            "share)"
        )
    return notes
