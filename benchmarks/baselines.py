"""The naive estimators tunebench is compared with (estimation.md §9), as their authors define them.

- HF accelerate ``estimate-memory`` (huggingface/accelerate src/accelerate/commands/estimate.py,
  ``estimate_training_usage``): bytes per parameter of the whole model, the *largest* training stage,
  batch size 1, no activations, no sharding, no PEFT: 16 B/param for fp32, 8 B/param for 16-bit.
- DeepSpeed ZeRO-3 model-state estimator (deepspeed/runtime/zero/stage3.py
  ``estimate_zero3_model_states_mem_needs``, no offload, after PR #5099): per GPU
  ``4 * largest_layer_params + 18 * total_params / gpus``; every parameter counted as trainable.
- The rule-of-thumb throughput ``tokens/s/GPU = 40 % x peak / (6N)`` (4N for PEFT), estimation.md §1.

None of them models activations, the loss, the allocator or nvidia-smi; they are scored against the
same measurements as the planner in benchmarks/planner_accuracy.py.
"""

from __future__ import annotations

import numpy as np

from tunebench.plan.workload import Workload
from tunebench.units import GIB


def accelerate_estimate_gib(w: Workload) -> np.ndarray:
    """accelerate estimate-memory's training figure for the model's dtype (same for every GPU count)."""
    per_param = 16.0 if w.torch_dtype == "float32" else 8.0
    return np.full(w.size, w.structure.total_params * per_param / GIB)


def deepspeed_zero3_gib(w: Workload) -> np.ndarray:
    """DeepSpeed's ZeRO-3 (no offload) model-state estimate per GPU."""
    n = w.structure.total_params
    return (4.0 * w.structure.largest_layer_params + 18.0 * n / w.devices) / GIB


def rule_of_thumb_tokens_per_gpu(w: Workload, mfu: float = 0.40) -> np.ndarray:
    """tokens/s/GPU at a fixed 40 % MFU of the dense 16-bit peak, 6N (full) or 4N (PEFT) per token."""
    peak = (w.gpu.tensor_tflops if w.gpu is not None else 1.0) * 1e12
    flops = (6 if w.method == "full" else 4) * w.structure.matmul_params_per_token
    return np.full(w.size, mfu * peak / flops)
