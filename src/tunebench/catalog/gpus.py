"""GPU catalog: vendor-datasheet peak numbers per GPU model.

Facts come from ``data/gpus.json``; each entry is keyed by the Kubernetes node-label value of
``nvidia.com/gpu.product`` (e.g. ``NVIDIA-A100-SXM4-80GB``, ``Tesla-T4``), or for AMD Instinct parts of
the ROCm node labeller's ``amd.com/gpu.product-name`` (``AMD_Instinct_MI300X_OAM``), and keeps its
``source`` and ``confidence``. ``get_gpu`` also accepts friendly aliases (``A100-80GB``, ``H100``, ``L40S``) and
the nvidia-smi product name (``NVIDIA A100-SXM4-80GB``), ignoring case and ' ' / '-' / '_'.
Units are in the field names: TFLOP/s are dense (no 2:4 sparsity) peaks, bandwidths are GB/s.

A MIG slice (a partition of an A100, H100, H200, B200, ...) is named as GPU Feature Discovery labels it,
``<GPU>-MIG-<g>g.<memory>gb`` (``NVIDIA-A100-SXM4-80GB-MIG-3g.40gb``), and sized by its own share (mig_slice).
"""

from __future__ import annotations

import functools
import json
import re
import statistics
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
    price_usd_per_gpu_hour: float | None = (
        None  # on-demand list price of one GPU for an hour (PRICES); None: none found
    )
    price_source: str = ""  # who lists that price, for which offer, and when
    # What CUDA gives a process, MiB: cudaMemGetInfo's total (torch.cuda.get_device_properties().total_memory,
    # the "total capacity" of torch's out-of-memory message), nvidia-smi's total less what the driver keeps.
    # None where no public log gives it: cuda_memory_bytes takes off driver_reserve() instead.
    cuda_memory_mib: float | None = None

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def cuda_memory_bytes(self) -> float:
        """Bytes a process can ever hold on the GPU (its CUDA context included): the sourced CUDA total,
        else nvidia-smi's total less the median share the driver keeps on the GPUs that have one."""
        if self.cuda_memory_mib is not None:
            return self.cuda_memory_mib * 1024 * 1024
        return self.memory_bytes * (1.0 - driver_reserve())

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
        price, price_source = PRICES.get(entry["name"], (None, ""))
        spec = GPUSpec(**entry, price_usd_per_gpu_hour=price, price_source=price_source)
        gpus[spec.name] = spec
    return gpus


# On-demand list price of one GPU for one hour, USD: (price, source). Published cloud prices change; these are
# what the named page listed on the named date. --price-per-gpu-hour (and the predict actuator's
# price_per_gpu_hour) overrides them. A price per instance is divided by its GPUs, and includes that
# instance's CPUs, memory and disk. None of the sources found lists the GPUs that are left out (V100 PCIe,
# A100 PCIe 40GB, H100 NVL, H200 NVL, A800, H800, H20, RTX PRO 6000, GB200, MI300X, MI325X): they have no
# price, and cost needs --price-per-gpu-hour. A MIG slice has none either (mig_slice).
_RUNPOD = "RunPod Serverless flex-worker list price (docs.runpod.io/serverless/pricing, stored copy read 2026-11-25)"
_LAMBDA = "Lambda on-demand list price (lambda.ai/pricing as quoted by techbytes.app, verified 2026-05-07)"
_AWS = "AWS EC2 On-Demand list price, us-east-1, Linux (aws.amazon.com/ec2/pricing/on-demand; unchanged since 2024, not re-read here)"
PRICES: dict[str, tuple[float, str]] = {
    "Tesla-V100-SXM2-16GB": (3.06, f"p3.2xlarge (1 GPU) $3.06/h: {_AWS}"),
    "Tesla-V100-SXM2-32GB": (3.9015, f"p3dn.24xlarge (8 GPUs) $31.212/h: {_AWS}"),
    "Tesla-T4": (0.526, f"g4dn.xlarge (1 GPU) $0.526/h: {_AWS}"),
    "NVIDIA-A10G": (1.006, f"g5.xlarge (1 GPU) $1.006/h: {_AWS}; also quoted for June 2026 by an EC2 pricing guide"),
    "NVIDIA-A10": (0.86, f"1x A10 (24 GB PCIe) $0.86/h: {_LAMBDA}"),
    "NVIDIA-GeForce-RTX-3090": (0.684, f"'L4, A5000, 3090' $0.00019/s: {_RUNPOD}"),
    "NVIDIA-RTX-A6000": (1.224, f"'A6000, A40' $0.00034/s: {_RUNPOD}"),
    "NVIDIA-A100-SXM4-40GB": (1.48, f"1x A100 (40 GB SXM4) $1.48/h: {_LAMBDA}"),
    # RunPod's 'A100 80 GB' tier does not say PCIe or SXM: both get it
    "NVIDIA-A100-80GB-PCIe": (2.736, f"'A100 80 GB' $0.00076/s: {_RUNPOD}"),
    "NVIDIA-A100-SXM4-80GB": (2.736, f"'A100 80 GB' $0.00076/s: {_RUNPOD}"),
    "NVIDIA-L4": (0.684, f"'L4, A5000, 3090' $0.00019/s: {_RUNPOD}"),
    "NVIDIA-GeForce-RTX-4090": (1.116, f"'4090 PRO' $0.00031/s: {_RUNPOD}"),
    "NVIDIA-L40": (1.908, f"'L40, L40S, 6000 Ada PRO' $0.00053/s: {_RUNPOD}"),
    "NVIDIA-L40S": (1.908, f"'L40, L40S, 6000 Ada PRO' $0.00053/s: {_RUNPOD}"),
    "NVIDIA-RTX-6000-Ada-Generation": (1.908, f"'L40, L40S, 6000 Ada PRO' $0.00053/s: {_RUNPOD}"),
    "NVIDIA-H100-PCIe": (2.86, f"1x H100 (80 GB PCIe) $2.86/h: {_LAMBDA}"),
    "NVIDIA-H100-80GB-HBM3": (3.78, f"1x H100 (80 GB SXM5) $3.78/h: {_LAMBDA}"),
    "NVIDIA-H200": (5.58, f"'H200 PRO 141 GB' $0.00155/s: {_RUNPOD}"),
    "NVIDIA-B200": (8.64, f"'B200 180 GB' $0.00240/s: {_RUNPOD}"),
}


# A sourced CUDA total within this share of nvidia-smi's says the driver kept nothing back (older drivers,
# ROCm): it carries no information on the reserve of a driver that does.
NO_RESERVE_SHARE = 0.001


@functools.cache
def driver_reserve() -> float:
    """Median share of nvidia-smi's total that CUDA does not give a process, over the distinct sourced
    (nvidia-smi, CUDA) totals of the catalog that show a reserve: the assumption for every other GPU
    (user-defined ones, MIG slices). Entries sharing one log (SXM and PCIe parts) count once."""
    pairs = {(g.memory_mib, g.cuda_memory_mib) for g in load_gpus().values() if g.cuda_memory_mib}
    shares = sorted(s for s in (1.0 - cuda / smi for smi, cuda in pairs) if s >= NO_RESERVE_SHARE)
    return float(statistics.median(shares)) if shares else 0.0


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
    mig = mig_slice(value)
    if mig is not None:
        return mig
    choices = [text for spec in gpus.values() for text in (spec.name, *spec.aliases)]
    raise InputError(
        "gpu_model",
        f"unknown GPU {value!r}; give its numbers (--gpu-memory-gib, --gpu-bf16-tflops, --gpu-interconnect-gbps) "
        "or a GPU catalog file (--gpu-catalog, TUNEBENCH_GPU_CATALOG)." + suggest(str(value), choices),
        allowed=one_of(spec.name for spec in list_gpus()),
    )


# --- MIG slices -----------------------------------------------------------------------------------------
# NVIDIA GPU Feature Discovery's nvidia.com/gpu.product of a MIG device, "<product>-MIG-<profile>", the profile
# "<g>g.<memory>gb" (a compute instance spanning its GPU instance), or "<c>c.<g>g.<memory>gb" for a smaller
# compute instance (NVIDIA MIG user guide, "MIG Device Names"); "+me" adds media engines.
MIG_NAME = re.compile(
    r"^(?P<gpu>.+?)[-_ ]MIG[-_ ](?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<gb>\d+)gb(?:\+me)?$", re.IGNORECASE
)
# Compute slices of a whole GPU by CUDA compute capability: 7 on GA100 (A100; A30 has 4, not in the catalog),
# GH100 (H100, H200, H20, H800) and GB100 (B200, GB200); 4 on the RTX PRO 6000 Blackwell (GB202). NVIDIA MIG user
# guide, "Supported GPUs" (Max Number of Instances) and "Supported MIG Profiles" (Fraction of SMs g/7, g/4).
MIG_COMPUTE_SLICES = {"8.0": 7, "9.0": 7, "10.0": 7, "12.0": 4}
MIG_MEMORY_SLICES = 8  # memory (and L2, memory controllers) in eighths: "Fraction of Memory" 1/8 ... 8/8
PCIE_X16_GBPS = {3: 32, 4: 64, 5: 128, 6: 256}  # bidirectional x16 (the catalog's PCIe entries)
MIG_GUIDE = (
    "NVIDIA Multi-Instance GPU user guide (docs.nvidia.com/datacenter/tesla/mig-user-guide): Supported MIG Profiles"
)


def is_mig(value: str | None) -> bool:
    """Whether a gpu_model label names a MIG slice (a partitioned GPU)."""
    return bool(value) and MIG_NAME.match(str(value).strip()) is not None


def mig_slice(value: str) -> GPUSpec | None:
    """The GPUSpec of a MIG slice of a catalog GPU, sized by its own share; None if value names no MIG slice.

    Memory: the profile's share of the GPU's memory in eighths (3g.40gb of an 80 GB A100: 4/8), which also
    sets its share of memory bandwidth (memory slices bring their memory controllers and L2). Compute: g
    compute slices of the GPU's 7 (or 4), the guide's "Fraction of SMs" (a c-slice compute instance: c of them);
    peak TFLOP/s and power scale with it. MIG has no peer-to-peer between slices (watsonx.ai 'Partitioning GPU
    processors': no NVLink or PCIe P2P), so GPU-to-GPU traffic crosses the host's PCIe link. InputError for a
    profile the GPU cannot have (not MIG-capable, more slices or memory than it has).
    """
    match = MIG_NAME.match(str(value).strip())
    if match is None:
        return None
    base = get_gpu(match["gpu"])
    slices = MIG_COMPUTE_SLICES.get(base.compute_capability)
    g, c, gb = int(match["g"]), int(match["c"] or match["g"]), int(match["gb"])
    memory_eighths = round(MIG_MEMORY_SLICES * gb / base.memory_gb_nominal)
    if slices is None or not 1 <= c <= g <= slices or not 1 <= memory_eighths <= MIG_MEMORY_SLICES:
        why = (
            "is not MIG-capable" if slices is None else f"has {slices} compute slices and {base.memory_gb_nominal:g} GB"
        )
        raise InputError(
            "gpu_model",
            f"{value!r}: {base.name} {why}; no MIG profile {match['g']}g.{gb}gb",
            allowed="<GPU>-MIG-<g>g.<GB>gb, e.g. NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
        )
    compute, memory = c / slices, memory_eighths / MIG_MEMORY_SLICES
    profile = f"{c}c.{g}g.{gb}gb" if c != g else f"{g}g.{gb}gb"

    def scaled(x: float | None) -> float | None:
        return None if x is None else round(x * compute, 2)

    return GPUSpec(
        name=f"{base.name}-MIG-{profile}",
        aliases=(),
        architecture=base.architecture,
        compute_capability=base.compute_capability,
        memory_mib=int(base.memory_mib * memory),
        memory_gib=round(base.memory_mib * memory / 1024, 2),
        memory_gb_nominal=gb,
        bf16_tflops=scaled(base.bf16_tflops),
        fp16_tflops=scaled(base.fp16_tflops),
        tf32_tflops=scaled(base.tf32_tflops),
        fp32_tflops=scaled(base.fp32_tflops),
        memory_bandwidth_gbps=round(base.memory_bandwidth_gbps * memory, 1),
        tdp_watts=round(base.tdp_watts * compute, 1),
        form_factor=base.form_factor,
        interconnect=f"MIG slice: no peer-to-peer; PCIe {base.pcie_gen}.0 x16 through the host",
        intra_node_bandwidth_gbps=PCIE_X16_GBPS.get(base.pcie_gen, 64),
        pcie_gen=base.pcie_gen,
        confidence="derived",
        notes=f"MIG slice {profile} of {base.name}: {c}/{slices} of its SMs, "
        f"{memory_eighths}/{MIG_MEMORY_SLICES} of its memory and memory bandwidth",
        source=(*base.source, MIG_GUIDE),
    )


def alias_note(value: str | None) -> str | None:
    """What a short alias chose where other parts it also names hold a different memory ('A100' is the
    80 GB SXM4 of the 40 and 80 GB parts: gpus.json sources_note), else None: the plan then says so."""
    if not value or _key(value) in _user_gpus() or not is_known_gpu(value):
        return None
    chosen = get_gpu(value)
    key = _key(value)
    if key == _key(chosen.name) or is_mig(value):
        return None
    others = sorted(
        {
            spec.name: spec
            for spec in load_gpus().values()
            if spec.memory_mib != chosen.memory_mib and any(_key(t).startswith(key) for t in (spec.name, *spec.aliases))
        }.values(),
        key=lambda spec: spec.memory_mib,
    )
    if not others:
        return None
    named = ", ".join(f"{spec.name} ({spec.memory_gib:.0f} GiB)" for spec in others)
    return f"gpu_model {value} is taken as {chosen.name} ({chosen.memory_gib:.0f} GiB); it also names {named}"


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


def custom_gpu(
    name: str,
    memory_gib: float,
    bf16_tflops: float,
    interconnect_gbps: float,
    memory_bandwidth_gbps: float | None = None,
    fp32_tflops: float | None = None,
    field: str = "gpu_model",
) -> GPUSpec:
    """A GPU described by its numbers: memory (GiB), dense bf16 peak (TFLOP/s), GPU-to-GPU bandwidth
    within a node (GB/s, bidirectional); memory bandwidth (GB/s) optional."""
    from tunebench.catalog.user_gpus import GPUNumbers

    numbers = GPUNumbers.checked(
        field,
        name=name,
        memory_gib=memory_gib,
        bf16_tflops=bf16_tflops,
        interconnect_gbps=interconnect_gbps,
        memory_bandwidth_gbps=memory_bandwidth_gbps,
        fp32_tflops=fp32_tflops,
    )
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
