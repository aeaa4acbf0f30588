"""GPU catalog: vendor-datasheet peak numbers per GPU model.

Facts come from ``data/gpus.json``; each entry is keyed by the Kubernetes node-label value of
``nvidia.com/gpu.product`` (e.g. ``NVIDIA-A100-SXM4-80GB``, ``Tesla-T4``), or for AMD Instinct parts of
the ROCm node labeller's ``amd.com/gpu.product-name`` (``AMD_Instinct_MI300X_OAM``), and keeps its
``source`` and ``confidence``. ``get_gpu`` also accepts friendly aliases (``A100-80GB``, ``H100``, ``L40S``) and
the nvidia-smi product name (``NVIDIA A100-SXM4-80GB``), ignoring case and ' ' / '-' / '_'.
Units are in the field names: TFLOP/s are dense (no 2:4 sparsity) peaks, bandwidths are GB/s.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from tunebench.errors import InputError, one_of, suggest

DATA = Path(__file__).parent / "data"
CATALOG_ENV = "TUNEBENCH_GPU_CATALOG"  # a user catalog file (catalog/user_gpus.py)

# oldest first (AMD CDNA3, 2023, between Hopper and Blackwell); Custom: user-defined
ARCHITECTURES = ("Volta", "Turing", "Ampere", "Ada", "Hopper", "CDNA3", "Blackwell", "Custom")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. Compute in dense TFLOP/s, memory in MiB/GiB, bandwidth in GB/s, power in W."""

    name: str  # nvidia.com/gpu.product (AMD: amd.com/gpu.product-name) label value
    aliases: tuple[str, ...]
    architecture: str
    compute_capability: str  # CUDA "major.minor"; AMD: the gfx target (gfx942)
    memory_mib: int  # as nvidia-smi (AMD: rocm-smi) reports it
    memory_gib: float
    memory_gb_nominal: float  # marketing "GB"
    bf16_tflops: float | None  # None: no bf16 (Volta, Turing)
    fp16_tflops: float
    tf32_tflops: float | None  # None: no tf32 (Volta, Turing)
    fp32_tflops: float  # CUDA cores, non-tensor
    memory_bandwidth_gbps: float
    tdp_watts: float
    form_factor: str  # "SXM", "PCIe", "OAM" (AMD Instinct module) or "Superchip" (GB200)
    interconnect: str
    intra_node_bandwidth_gbps: float  # per-GPU bidirectional GPU-to-GPU
    pcie_gen: int
    confidence: str = "datasheet"  # or "unverified"
    notes: str = ""
    source: tuple[str, ...] = ()

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def tensor_tflops(self) -> float:
        """Dense 16-bit tensor peak used for mixed-precision training: bf16 where supported, else fp16."""
        return self.bf16_tflops if self.bf16_tflops is not None else self.fp16_tflops


def _key(value: str) -> str:
    """Normalised lookup key: lower case, no ' ', '-', '_', no leading 'nvidia'/'tesla', no GFD '-SHARED'."""
    text = str(value).strip().lower()
    text = re.sub(r"[\s_\-]+", "-", text)
    text = re.sub(r"-shared$", "", text)  # GFD time-slicing suffix (renameByDefault)
    text = re.sub(r"^(nvidia|tesla)-", "", text)
    return text.replace("-", "")


@functools.cache
def load_gpus() -> dict[str, GPUSpec]:
    """All catalog GPUs by label, in file order."""
    raw = json.loads((DATA / "gpus.json").read_text(encoding="utf-8"))
    gpus: dict[str, GPUSpec] = {}
    for entry in raw["gpus"]:
        entry = dict(entry)
        entry["aliases"] = tuple(entry.get("aliases", ()))
        entry["source"] = tuple(entry.get("source", ()))
        spec = GPUSpec(**entry)
        gpus[spec.name] = spec
    return gpus


@functools.cache
def _index() -> dict[str, str]:
    """Normalised label/alias -> label."""
    index: dict[str, str] = {}
    for spec in load_gpus().values():
        for text in (spec.name, *spec.aliases):
            index.setdefault(_key(text), spec.name)
    return index


def get_gpu(value: str) -> GPUSpec:
    """The GPU named by a label, an alias or an nvidia-smi name: a GPU the user defined (custom_gpu,
    a user catalog file) first, then the catalog. InputError (field gpu_model) if unknown."""
    user = _user_gpus()
    if _key(value) in user:
        return user[_key(value)]
    gpus = load_gpus()
    if value in gpus:
        return gpus[value]
    label = _index().get(_key(value))
    if label is not None:
        return gpus[label]
    choices = [text for spec in gpus.values() for text in (spec.name, *spec.aliases)]
    raise InputError(
        "gpu_model",
        f"unknown GPU {value!r}; give its numbers (--gpu-memory-gib, --gpu-bf16-tflops, --gpu-interconnect-gbps) "
        "or a GPU catalog file (--gpu-catalog, TUNEBENCH_GPU_CATALOG)." + suggest(str(value), choices),
        allowed=one_of(spec.name for spec in list_gpus()),
    )


def is_known_gpu(value: str) -> bool:
    """Whether a label names a catalog or user-defined GPU."""
    try:
        get_gpu(value)
    except InputError:
        return False
    return True


# --- GPUs outside the catalog ---------------------------------------------------------------------------
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # a Kubernetes label value (nvidia.com/gpu.product)
# Memory bandwidth of a GPU given without it: compute / bandwidth of the catalog's median data-centre GPU
# (A100 80GB SXM: 312 TFLOP/s over 2,039 GB/s = 153 FLOP per byte). An assumption, said in the plan.
FLOP_PER_BYTE = 153.0
_CUSTOM: dict[str, GPUSpec] = {}


def custom_gpu(name: str, memory_gib: float, bf16_tflops: float, interconnect_gbps: float,
               memory_bandwidth_gbps: float | None = None, fp32_tflops: float | None = None,
               field: str = "gpu_model") -> GPUSpec:  # fmt: skip
    """A GPU described by its numbers: memory (GiB), dense bf16 peak (TFLOP/s), GPU-to-GPU bandwidth
    within a node (GB/s, bidirectional); memory bandwidth (GB/s) optional."""
    from tunebench.catalog.user_gpus import GPUNumbers

    numbers = GPUNumbers.checked(field, name=name, memory_gib=memory_gib, bf16_tflops=bf16_tflops,
                                 interconnect_gbps=interconnect_gbps, memory_bandwidth_gbps=memory_bandwidth_gbps,
                                 fp32_tflops=fp32_tflops)  # fmt: skip
    return numbers.spec()


def register_gpu(spec: GPUSpec) -> GPUSpec:
    """Make a user-defined GPU known to get_gpu (this process)."""
    _CUSTOM[_key(spec.name)] = spec
    for alias in spec.aliases:
        _CUSTOM[_key(alias)] = spec
    return spec


def _user_gpus() -> dict[str, GPUSpec]:
    """GPUs registered in this process, then those of the user catalog file (TUNEBENCH_GPU_CATALOG)."""
    return {**{_key(k): v for spec in catalog_file_gpus() for k, v in _names(spec)}, **_CUSTOM}


def catalog_file_gpus() -> tuple[GPUSpec, ...]:
    """The GPUs of the user catalog file TUNEBENCH_GPU_CATALOG names (none when it is unset); InputError
    naming the variable when the file cannot be read or is malformed."""
    import os

    path = os.environ.get(CATALOG_ENV)
    if not path:
        return ()
    from tunebench.catalog.user_gpus import read_catalog

    return read_catalog(path, CATALOG_ENV)


def _names(spec: GPUSpec) -> list[tuple[str, GPUSpec]]:
    return [(text, spec) for text in (spec.name, *spec.aliases)]


def list_gpus() -> list[GPUSpec]:
    """All GPUs (the catalog's and the user catalog file's), oldest architecture first, then by memory, then
    by dense tensor peak."""
    return sorted(
        {**load_gpus(), **{spec.name: spec for spec in catalog_file_gpus()}}.values(),
        key=lambda g: (ARCHITECTURES.index(g.architecture), g.memory_mib, g.tensor_tflops, g.name),
    )
