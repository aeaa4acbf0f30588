"""The cross-entropy path of a measured run (the entity's loss_implementation).

- ``upcast``: transformers' own ForCausalLMLoss (the model's 16-bit logits upcast to a full fp32 copy);
- ``chunked``: :func:`chunked_causal_lm_loss`, the model's 16-bit logits and the cross-entropy over
  chunks of CHUNK_TOKENS tokens, each chunk's fp32 upcast recomputed in backward
  (``torch.utils.checkpoint``), so only the 16-bit logits and one chunk's fp32 values are alive
  (torchtune's CEWithChunkedOutputLoss keeps the same budget);
- ``fused_linear``: Liger's fused linear cross-entropy (liger-kernel, Triton: GPU only), which never
  materialises the logits (``apply_fused_linear``);
- ``model_dtype``: :func:`model_dtype_causal_lm_loss`, the cross-entropy of the logits in their own (16-bit)
  dtype, no fp32 copy: what heads that call ``nn.CrossEntropyLoss`` on the model's logits run without AMP
  (Qwen (v1)'s remote code, ``modeling_qwen.py`` ``QWenLMHeadModel.forward``, on the Hugging Face Hub, under
  DeepSpeed, which casts the model instead of autocasting).

Same label rules as ForCausalLMLoss (transformers.loss.loss_utils): labels shifted by one with
-100 padding, -100 ignored, the sum divided by ``num_items_in_batch`` when the Trainer passes it
(gradient accumulation), else the mean over the label tokens.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tunebench.spec.properties import LOSS_CHUNK_TOKENS as CHUNK_TOKENS  # one chunk's fp32 logits: x vocab x 4 B
from tunebench.spec.properties import LOSS_IMPLEMENTATIONS


def _chunk_sum(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Summed cross-entropy of one chunk of 16-bit logits, computed in fp32."""
    return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction="sum")


def chunked_causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    **kwargs: Any,
) -> torch.Tensor:
    """ForCausalLMLoss's value, without the fp32 copy of the logits (a model's ``loss_function``)."""
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    flat = logits.reshape(-1, vocab_size)
    targets = shift_labels.reshape(-1).to(flat.device)
    total = torch.zeros((), dtype=torch.float32, device=flat.device)
    # split (one backward node that concatenates the chunks' gradients), each chunk checkpointed
    for part, part_targets in zip(flat.split(chunk_tokens), targets.split(chunk_tokens), strict=True):
        if flat.requires_grad:
            total = total + checkpoint(_chunk_sum, part, part_targets, ignore_index, use_reentrant=False)
        else:
            total = total + _chunk_sum(part, part_targets, ignore_index)
    return _per_item(total, targets, num_items_in_batch, ignore_index)


def _per_item(
    total: torch.Tensor, targets: torch.Tensor, num_items_in_batch: torch.Tensor | int | None, ignore_index: int
) -> torch.Tensor:
    """ForCausalLMLoss's reduction of a summed loss: over ``num_items_in_batch`` when the Trainer passes it
    (gradient accumulation), else the mean over label tokens (0/0 = nan, as F.cross_entropy)."""
    if num_items_in_batch is None:
        return total / (targets != ignore_index).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def model_dtype_causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """ForCausalLMLoss's value computed on the logits as they are (bf16/fp16 log-softmax; no fp32 copy), the
    way heads written before transformers' loss_function shift them: a contiguous copy of all but the last
    position (``shift_logits = logits[..., :-1, :].contiguous()``), then ``nn.CrossEntropyLoss``.

    Autocast is off around the cross-entropy: under AMP (the Trainer's bf16/fp16 flags) torch autocasts
    ``cross_entropy`` to fp32 (its op list), which would make the fp32 copy this path exists to avoid; such a
    head under AMP runs upcast's budget, not this one."""
    if shift_labels is None:
        logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:]
    flat = logits.reshape(-1, vocab_size)
    targets = shift_labels.reshape(-1).to(flat.device)
    with torch.autocast(device_type="cuda" if flat.is_cuda else "cpu", enabled=False):
        total = F.cross_entropy(flat, targets, ignore_index=ignore_index, reduction="sum")
    return _per_item(total, targets, num_items_in_batch, ignore_index)


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model whose forward computes the loss (under a peft wrapper, its base model)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def liger_available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def apply(model: torch.nn.Module, implementation: str, on_gpu: bool) -> dict[str, Any]:
    """Make the model's forward compute the loss this way; returns the facts the result records."""
    if implementation not in LOSS_IMPLEMENTATIONS:
        raise ValueError(f"unknown loss_implementation {implementation!r} (one of {', '.join(LOSS_IMPLEMENTATIONS)})")
    target = causal_lm(model)
    if implementation == "upcast":
        return {"implementation": "upcast", "function": "transformers ForCausalLMLoss"}
    if implementation == "chunked":
        target.loss_function = chunked_causal_lm_loss  # PreTrainedModel.loss_function's setter
        return {
            "implementation": "chunked",
            "function": "tunebench chunked_causal_lm_loss",
            "chunk_tokens": CHUNK_TOKENS,
        }
    if implementation == "model_dtype":
        target.loss_function = model_dtype_causal_lm_loss
        return {"implementation": "model_dtype", "function": "tunebench model_dtype_causal_lm_loss"}
    return apply_fused_linear(target, on_gpu)


def apply_fused_linear(model: torch.nn.Module, on_gpu: bool) -> dict[str, Any]:
    """Liger's fused linear cross-entropy in the model's forward (liger-kernel's per-instance patch, every
    other Liger kernel off): HardwareError-like RuntimeError without a GPU or liger-kernel."""
    if not (on_gpu and liger_available()):
        raise RuntimeError("loss_implementation fused_linear needs liger-kernel and a GPU")
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance

    model_type = getattr(model.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:  # liger would log and return: the loss would stay upcast
        raise RuntimeError(f"loss_implementation fused_linear: liger-kernel has no patch for model type {model_type}")
    # only the loss changes: every other Liger kernel off (liger passes each flag its patch function takes)
    off = dict(cross_entropy=False, rope=False, rms_norm=False, swiglu=False, geglu=False, layer_norm=False)
    _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=True, **off)
    return {
        "implementation": "fused_linear",
        "function": "liger_kernel LigerFusedLinearCrossEntropyLoss",
        "model_type": model_type,
    }
