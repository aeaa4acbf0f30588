"""fms-hf-tuning releases tunebench can run, what each environment installs, and which plugins each supports.

Sources: the SFTTrainer spec ("fms_hf_tuning_version" and its notes: "torch 2.4.1 for <= 2.8.2,
2.6.0 above, Python 3.11"; "--fast_moe is only supported for fms-hf-tuning v2.4.0+"), and the
releases' own metadata on the package index (fms-hf-tuning 3.1.0 and later require torch > 2.7,
so their pinned torch is their own lower bound's next release, 2.8.0).
"""

from __future__ import annotations

from dataclasses import dataclass

from tunebench.errors import InputError
from tunebench.spec.properties import FMS_HF_TUNING_VERSIONS, PROPERTIES
from tunebench.spec.validity import GPU_KERNEL_FLAGS, flag_on

VERSIONS = FMS_HF_TUNING_VERSIONS  # the spec's list and the releases since
# When each release was built (the newest file date inside its wheel on the package index). An
# environment resolves its dependencies as of a week later (uv --exclude-newer): the stack the release
# was used with. Without it, a 2024 release meets 2026 packages (pyarrow 26 needs NumPy 2; the release
# pins NumPy < 2). 3.0.0.1 is in the spec's list but was never published to the index.
RELEASED = {
    "3.2.2": "2026-10-01", "3.2.1": "2026-10-01", "3.2.0": "2026-09-25", "3.1.0": "2025-11-11",
    "3.0.0": "2025-07-22", "2.8.2": "2025-04-30", "2.7.1": "2025-03-20", "2.6.0": "2025-02-18",
    "2.5.0": "2025-01-27", "2.4.0": "2025-01-16", "2.3.1": "2024-12-23", "2.2.1": "2024-12-06",
    "2.1.2": "2024-11-19", "2.1.0": "2024-10-18", "2.0.1": "2024-10-01",
}  # fmt: skip
RESOLVE_DAYS_AFTER_RELEASE = 7
NEWEST = VERSIONS[0]  # the newest fms-hf-tuning release on the package index (3.2.2, 2026-10)

# fms-acceleration plugins (fms-hf-tuning's `fms-accel` extra) behind the spec's flags.
FOAK = "fms-acceleration-foak"  # fused ops and kernels: fast_kernels, fused_lora (Triton: GPU only)
MOE = "fms-acceleration-moe"  # ScatterMoE expert parallelism: fast_moe (Triton: GPU only)
PEFT_PLUGIN = "fms-acceleration-peft"  # GPTQ-LoRA's auto_gptq accelerated PEFT (CUDA only)
AADP = "fms-acceleration-aadp"  # attention and distributed packing: padding_free (needs flash-attn: GPU only)


@dataclass(frozen=True)
class Plugin:
    """An fms-acceleration plugin: the package and the first fms-hf-tuning release that drives it."""

    package: str
    min_version: str
    source: str
    needs_gpu: str = "runs {package}'s Triton/CUDA kernels"  # why it needs a GPU, for the reason


PLUGINS = {
    "fast_moe": Plugin(MOE, "2.4.0", "the SFTTrainer spec: fast_moe is only supported for fms-hf-tuning v2.4.0+"),
    "fast_kernels": Plugin(FOAK, "2.0.1", "fms-hf-tuning 2.0.1 ships FusedOpsAndKernelsConfig"),
    "fused_lora": Plugin(FOAK, "2.0.1", "fms-hf-tuning 2.0.1 ships FusedOpsAndKernelsConfig"),
    "auto_gptq": Plugin(PEFT_PLUGIN, "2.0.1", "fms-hf-tuning 2.0.1 ships QuantizedLoraConfig"),
    # fms-hf-tuning --padding_free huggingface (AttentionAndDistributedPackingConfig, required_packages ["aadp"]);
    # its sft_trainer raises without use_flash_attn, and the plugin's require_packages is ["flash_attn"]
    "padding_free": Plugin(
        AADP,
        "2.0.1",
        "fms-hf-tuning 2.0.1 ships AttentionAndDistributedPackingConfig",
        needs_gpu="runs with flash-attention only (fms-hf-tuning refuses --padding_free without use_flash_attn)",
    ),
}


def parse_version(text: str) -> tuple[int, ...]:
    """'3.0.0.1' -> (3, 0, 0, 1); InputError for anything that is not dotted numbers."""
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        raise InputError("fms_hf_tuning_version", f"{text!r} is not a version", allowed=", ".join(VERSIONS)) from None


def check_version(text: str) -> str:
    """The version if tunebench can run it, else InputError with the allowed ones."""
    if text not in VERSIONS:
        raise InputError("fms_hf_tuning_version", f"unknown version {text!r}", allowed=", ".join(VERSIONS))
    return text


def pinned_torch(version: str) -> str:
    """The torch release the spec pins for an fms-hf-tuning version (used with ``torch="pinned"``)."""
    v = parse_version(version)
    if v <= (2, 8, 2):
        return "2.4.1"
    return "2.6.0" if v < (3, 1, 0) else "2.8.0"


def plugins_used(values: dict) -> list[str]:
    """The spec flags of these effective values that switch on an fms-acceleration plugin."""
    used = []
    if int(values.get("fast_moe") or 0) > 0:
        used.append("fast_moe")
    for flag in ("fast_kernels", "fused_lora", "auto_gptq"):
        if flag_on(flag, values.get(flag)):
            used.append(flag)
    if values.get("padding_free"):
        used.append("padding_free")
    return used


def engine_reasons(values: dict) -> list[str]:
    """Why fms-hf-tuning cannot run these effective values: a version never published, a plugin the
    version does not drive, or a plugin's GPU kernels without a GPU (empty: it can)."""
    version = values.get("fms_hf_tuning_version") or PROPERTIES["fms_hf_tuning_version"].default
    reasons = []
    if version not in RELEASED:
        reasons.append(
            f"fms-hf-tuning {version} was never published to the package index: no environment "
            f"can be built for it (published: {', '.join(RELEASED)})"
        )
    for flag in plugins_used(values):
        plugin = PLUGINS[flag]
        if parse_version(version) < parse_version(plugin.min_version):
            reasons.append(
                f"{flag} needs {plugin.package}, which fms-hf-tuning {version} does not drive "
                f"(first in {plugin.min_version}; {plugin.source})"
            )
        elif int(values.get("number_gpus") or 0) == 0 and flag not in GPU_KERNEL_FLAGS:  # spec.validity says those
            reasons.append(
                f"{flag} {plugin.needs_gpu.format(package=plugin.package)}: it needs a GPU (number_gpus is 0)"
            )
    return reasons


def exclude_newer(version: str) -> str:
    """uv's --exclude-newer for a version's environment (EngineError-free: InputError if never published)."""
    import datetime

    if version not in RELEASED:
        raise InputError(
            "fms_hf_tuning_version", f"{version} was never published to the package index", allowed=", ".join(RELEASED)
        )
    day = datetime.date.fromisoformat(RELEASED[version]) + datetime.timedelta(days=RESOLVE_DAYS_AFTER_RELEASE)
    return f"{day.isoformat()}T00:00:00Z"


def requirements(version: str, plugins: bool) -> list[str]:
    """What uv installs into the environment of a version (torch comes separately: see envs.TORCH_MODES)."""
    base = f"fms-hf-tuning[fms-accel]=={version}" if plugins else f"fms-hf-tuning=={version}"
    extra = [FOAK, MOE, PEFT_PLUGIN, AADP] if plugins else []
    # psutil and nvidia-ml-py: tunebench's metrics sampler, which runs inside the engine's process.
    return [base, *extra, "psutil", "nvidia-ml-py", "pyyaml"]
