"""This machine's GPUs (NVML, within $CUDA_VISIBLE_DEVICES) and whether a measurement's GPUs are among them: the
measuring actuator refuses a run whose GPUs are not here (it would train elsewhere than its entity says, on the
CPU or another GPU, and be recorded as the entity's measurement), and the local executor hands out these GPUs."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: str  # as CUDA_VISIBLE_DEVICES spells it
    name: str  # NVML product name, e.g. "NVIDIA A100-SXM4-80GB"


def detect_gpus() -> list[Gpu]:
    """This machine's GPUs via NVML (PCI bus order), limited to $CUDA_VISIBLE_DEVICES (indices, or GPU-/MIG- UUIDs
    as CUDA takes them, in its order); [] without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
                found.append((name.decode() if isinstance(name, bytes) else str(name), str(uuid)))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU, no pynvml: a CPU machine
        return []
    gpus = [Gpu(str(i), name) for i, (name, _) in enumerate(found)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    by_uuid = {uuid: gpu for gpu, (_, uuid) in zip(gpus, found, strict=True)}
    out = []
    for entry in (v.strip() for v in visible.split(",") if v.strip()):
        if entry.isdigit():
            out += [g for g in gpus if g.index == entry]
        elif entry.startswith("GPU-"):
            out += [g for uuid, g in by_uuid.items() if uuid.startswith(entry)]  # CUDA takes a unique prefix
        elif entry.startswith("MIG-"):  # a MIG instance NVML's device list does not name: one GPU of unknown model
            out.append(Gpu(entry, entry))
    return out


def cannot_run_here(number_gpus: int, gpu_model: str | None, gpus: list[Gpu]) -> str | None:
    """Why a one-node measurement of number_gpus GPUs of gpu_model cannot run on a machine with these GPUs (None:
    it can): too few, or the first number_gpus of them (those a run takes, actuators.process.owned_devices) not
    all of that model. A run that went ahead would train elsewhere than its entity says (on the CPU, or another
    GPU) and be recorded as the entity's measurement."""
    if number_gpus > len(gpus):
        have = f"{len(gpus)} GPU(s)" if gpus else "no GPU"
        return f"needs {number_gpus} GPU(s); this machine has {have}"
    if number_gpus > 0 and gpu_model:
        taken = gpus[:number_gpus]
        other = sorted({g.name for g in taken if not same_gpu_model(gpu_model, g.name)})
        if other:
            return (
                f"needs gpu_model {gpu_model}; the {number_gpus} GPU(s) a run takes here are {', '.join(other)}"
                " (CUDA_VISIBLE_DEVICES chooses others)"
            )
    return None


def same_gpu_model(label: str, nvml_name: str) -> bool:
    """Whether an NVML product name is the catalog GPU label (unknown names are given the benefit of the doubt)."""
    from tunebench.catalog import get_gpu

    try:
        return get_gpu(label).name == get_gpu(nvml_name).name
    except Exception:
        return True
