"""The planner's free coefficients: what calibration fits, with physically motivated defaults.

Everything else in the model is arithmetic on shapes and datasheet numbers. These few numbers absorb
what the arithmetic cannot know (allocator behaviour, kernel efficiency, framework copies) and are
fitted to measurements by ``tunebench.plan.calibration`` (estimation.md §11 steps 4 and 6). The
defaults below are the starting points of the fit, from estimation.md; the shipped values live in
``plan/data/default_calibration.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tunebench.paths import write_atomic

DATA = Path(__file__).parent / "data"
DEFAULT_FILE = DATA / "default_calibration.json"


@dataclass(frozen=True)
class Coefficients:
    """Free coefficients of the memory and throughput models (units in the names)."""

    # --- memory: what tracing cannot see -----------------------------------------------------
    # Bytes per vocabulary entry per token the fused cross-entropy kernel (fast_kernels[0] = fast_loss,
    # fms-acceleration foak) keeps, against the traced ~12 B of transformers' loss. foak's Fast_CrossEntropyLoss
    # (kernels/unsloth/cross_entropy_loss.py) saves the fp32 logits it is given and writes their gradient into
    # them in place; what it is given is a shifted contiguous copy of the fp32 upcast (4 B). Besides it the
    # upcast logits (transformers < 4.46: LlamaForCausalLM.forward returns them, 4 B) or the model's bf16 logits
    # (>= 4.46, FastForCausalLMLoss in place of ForCausalLMLoss: 2 B, with the 4 B upcast alive during the
    # loss): 8 B held, up to 10 B in passing. The backward holds the in-place gradient (4 B), the slice's fp32
    # gradient (4 B) and, briefly, its bf16 cast (2 B).
    fused_loss_bytes_per_vocab: float = 8.0
    # Share of the traced (non-loss) activations left with fms-acceleration's fused RMSNorm and RoPE
    # kernels (fast_kernels[1], [2]): Triton kernels keep fewer intermediates than transformers' fp32
    # norm upcasts and rotate_half copies, and tracing on the CPU cannot run them. The prior is what tracing the
    # kernels' autograd functions as they save (the input, the weight and one fp32 number per row; queries and keys
    # rotated in place: foak kernels/unsloth rms_layernorm.py, rope_embedding.py) takes off Mistral-7B's last-layer
    # working set, 7 % (docs/planner.md section 10); fitted 0.94 on the shipped runs.
    fast_kernels_activation_fraction: float = 0.93
    # The same for torch.compile (inductor fuses those element-wise chains too): its own coefficient, so
    # compiled runs of other stacks never move fms-acceleration's kernel share (prior 0.85, a guess that
    # inductor keeps 15 % fewer intermediates; nothing traces inductor's kernels on the CPU).
    compile_activation_fraction: float = 0.85
    # Extra copies of the checkpointed layer inputs (h L residual-stream elements per token) that PEFT methods keep
    # under multi-GPU FSDP with reentrant checkpointing (measured: fms-acceleration LoRA/QLoRA slopes rise ~1.45x
    # from 1 to 2 GPUs, and PEFT's reentrant FSDP QLoRA guides need them; PEFT's non-reentrant FSDP guide and
    # torchtune's non-reentrant LoRA runs are 14-70 % over with them, within 5 % / closer without).
    fsdp_peft_checkpoint_copies: float = 1.0
    # --- memory: allocator and driver -----------------------------------------------------------
    # CUDA context, cuBLAS/cuDNN workspaces: invisible to torch, visible to nvidia-smi (estimation.md §5).
    # On AMD GPUs (ROCm) the HIP context and rocBLAS/hipBLASLt workspaces take its place and the same
    # coefficient applies; it is fitted on NVIDIA runs only.
    cuda_context_gib: float = 0.6
    # NCCL communicator buffers per process in multi-GPU runs (estimation.md §5: hundreds of MB to >1 GiB);
    # RCCL's on ROCm, the same coefficient.
    nccl_gib: float = 0.6
    # Caching-allocator slack: reserved - allocated = fixed + fraction of the transient bytes
    # (activations and loss tensors are freed and re-allocated every step, fragmenting the pool).
    reserve_fixed_gib: float = 1.0
    reserve_transient_fraction: float = 0.15
    reserve_loss_fraction: float = 0.5
    # Fragmentation of live segments the allocator cannot give back when the device is full, as a
    # fraction of the transient bytes: out of memory when allocated + this > usable memory.
    oom_fragmentation_fraction: float = 0.05
    # Log-error (standard deviation of ln(measured / predicted)) of the allocated peak: the
    # uncertainty of the out-of-memory probability; set by calibration from leave-one-model-out errors.
    peak_log_sigma: float = 0.08
    # --- throughput ------------------------------------------------------------------------------
    # Hardware FLOPs utilisation of dense bf16 tensor work at large matrices (HFU, recomputation
    # counted). estimation.md §8: HF fine-tuning reaches ~45-60 % of A100 peak.
    hfu_max: float = 0.62
    # Matrix size at which efficiency is half of hfu_max: eta = hfu_max * h / (h + hidden_half).
    hidden_half: float = 600.0
    # Relative speed of method implementations (1 = dense bf16 LoRA/full with HF kernels).
    # (4-bit dequantisation outside the matmul is memory traffic of its own, plan.throughput.dequant_seconds;
    # these are what else slows the method down: the prior is none for bitsandbytes, whose matmul is a 16-bit
    # one, and fms-acceleration's fused triton GPTQ kernels' own efficiency)
    qlora_speed: float = 1.0  # HF PEFT + bitsandbytes NF4 beyond the dequantisation traffic
    gptq_speed: float = 0.95  # fms-acceleration GPTQ triton kernels
    fast_kernels_speed: float = 1.12  # fused loss, RMSNorm and RoPE (fms-acceleration "foak")
    compile_speed: float = 1.12  # torch.compile's fused element-wise kernels (starts at the foak value)
    # HBM passes over every byte the traced step creates (written once, read back at least once):
    # memory-bound time = bytes created x passes / HBM bandwidth.
    elementwise_passes: float = 2.0
    # Fixed time per decoder layer per micro-batch (kernel launches, host syncs), seconds.
    layer_overhead_s: float = 0.0006
    # Fixed time per sharded unit (decoder layer) per micro-batch on top of it, FSDP and ZeRO-3: the host
    # hooks that gather a unit before its forward and backward and release and reduce-scatter after
    # (torch fsdp/_runtime_utils.py _pre_forward_unshard, _post_backward_hook; DeepSpeed
    # zero/parameter_offload.py hooks on every submodule, partitioned_param_coordinator.fetch_sub_module).
    sharded_unit_overhead_s: float = 0.0006
    # Fixed time per expert per MoE layer per micro-batch for eager (looped) MoE, seconds.
    expert_overhead_s: float = 0.0008
    # Latency of one expert-parallel all-to-all including its host sync (fast_moe > 1), seconds.
    alltoall_latency_s: float = 0.0005
    # Share of FSDP/DDP communication time not hidden behind compute.
    comm_exposed_fraction: float = 0.3
    # Achieved fraction of the link's nominal bandwidth for collectives.
    link_efficiency: float = 0.7
    # CPU training (number_gpus = 0): achieved TFLOP/s of the host (ado CPU example, smollm2-135m).
    cpu_tflops: float = 2.5

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Coefficients:
        known = {f.name for f in fields(cls)}
        values = {k: float(v) for k, v in data.items() if k in known}
        if "layer_overhead_s" in values and "sharded_unit_overhead_s" not in values:
            # a calibration fitted before the sharded term: its layer_overhead_s already holds that cost
            values["sharded_unit_overhead_s"] = 0.0
        return cls(**values)

    def replace(self, **changes: float) -> Coefficients:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown coefficients: {', '.join(sorted(unknown))}")
        return Coefficients.from_dict({**self.to_dict(), **changes})


@dataclass(frozen=True)
class Calibration:
    """Coefficients plus where they came from and how well they did (leave-one-model-out)."""

    coefficients: Coefficients = field(default_factory=Coefficients)
    source: str = "defaults (estimation.md)"
    records: int = 0
    models: tuple[str, ...] = ()
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "coefficients": self.coefficients.to_dict(),
            "source": self.source,
            "records": self.records,
            "models": list(self.models),
            "metrics": self.metrics,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        return cls(
            coefficients=Coefficients.from_dict(data.get("coefficients", {})),
            source=data.get("source", "?"),
            records=int(data.get("records", 0)),
            models=tuple(data.get("models", ())),
            metrics=data.get("metrics", {}),
        )

    def save(self, path: str | Path) -> None:
        """Write the JSON; path is replaced only once the new file is complete (tunebench.paths.atomic_path)."""
        write_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        return cls.from_dict(json.loads(Path(path).read_text()))


_DEFAULT: Calibration | None = None


def default_calibration() -> Calibration:
    """The shipped calibration (fitted on the fms-acceleration runs), or the defaults if absent."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Calibration.load(DEFAULT_FILE) if DEFAULT_FILE.exists() else Calibration()
    return _DEFAULT
