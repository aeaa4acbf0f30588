"""GPUs outside the catalog: given by their numbers on the command line or in a user catalog file.

A user catalog is JSON or YAML: a list of GPUs, or ``{"gpus": [...]}``, each with ``name`` (the
node label, e.g. ``NVIDIA-RTX-PRO-6000``), ``memory_gib`` (or ``memory_mib`` as nvidia-smi reports
it), ``bf16_tflops`` (dense peak), ``interconnect_gbps`` (GPU-to-GPU within a node, bidirectional),
and optionally ``memory_bandwidth_gbps``, ``fp16_tflops``, ``fp32_tflops``, ``aliases`` and
``cuda_memory_gib`` (what ``torch.cuda.get_device_properties(0).total_memory / 2**30`` prints, the "total
capacity" of torch's out-of-memory message; without it the catalog's median driver reserve applies). Point
``TUNEBENCH_GPU_CATALOG`` (or ``--gpu-catalog``) at it.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tunebench.catalog.gpus import FLOP_PER_BYTE, LABEL, GPUSpec
from tunebench.catalog.gpus import _key as gpu_key
from tunebench.errors import InputError, parse_json

REQUIRED = "name, memory_gib (or memory_mib), bf16_tflops, interconnect_gbps"


NUMBERS = ("memory_gib", "memory_mib", "bf16_tflops", "interconnect_gbps", "memory_bandwidth_gbps", "fp16_tflops",
           "fp32_tflops", "cuda_memory_gib")  # fmt: skip


class GPUNumbers(BaseModel):
    """The numbers the planner needs of a GPU (units in the names; all finite and > 0)."""

    # allow_inf_nan: NaN and inf are "not a finite number", not a failed bound ("should be <= 100000")
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str
    # upper bounds ~100x beyond today's largest (B200/GB200: 180-186 GiB, 2.25-2.5 PFLOPS dense bf16,
    # 8 TB/s HBM, 900 GB/s NVLink 5 per direction): a typo or 1e300 is refused before any arithmetic
    memory_gib: float | None = Field(default=None, gt=0, le=100_000)
    memory_mib: float | None = Field(default=None, gt=0, le=100_000 * 1024)
    bf16_tflops: float = Field(gt=0, le=1_000_000)
    interconnect_gbps: float = Field(gt=0, le=100_000)
    memory_bandwidth_gbps: float | None = Field(default=None, gt=0, le=1_000_000)
    fp16_tflops: float | None = Field(default=None, gt=0, le=1_000_000)
    fp32_tflops: float | None = Field(default=None, gt=0, le=1_000_000)
    aliases: tuple[str, ...] = ()
    cuda_memory_gib: float | None = Field(default=None, gt=0, le=100_000)

    @field_validator("name")
    @classmethod
    def _label(cls, v: str) -> str:
        if not LABEL.match(v):
            raise ValueError("a node label: letters, digits, '.', '_' and '-', at most 100 characters")
        return v

    @field_validator(*NUMBERS, mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        """A number written as text ("48") in a catalog file is a typo of the format, not a number."""
        if isinstance(v, (str, bool)):
            raise ValueError(f"{v!r} is not a number")
        return v

    @field_validator(*NUMBERS)
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @model_validator(mode="after")
    def _memory(self) -> GPUNumbers:
        if self.memory_gib is None and self.memory_mib is None:
            raise ValueError("memory_gib (or memory_mib) is required")
        if self.cuda_memory_gib is not None and self.cuda_memory_gib * 1024 > self.total_mib:
            raise ValueError("cuda_memory_gib cannot exceed the GPU's memory (memory_gib / memory_mib)")
        return self

    @classmethod
    def checked(cls, field: str, **values: Any) -> GPUNumbers:
        """Validated numbers; InputError naming the field and what is missing or wrong."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise InputError(field, _first_error(exc), allowed=REQUIRED) from None

    @property
    def total_mib(self) -> float:
        """nvidia-smi's total, MiB (memory_mib, else memory_gib)."""
        return self.memory_mib if self.memory_mib is not None else self.memory_gib * 1024

    def spec(self) -> GPUSpec:
        """The GPUSpec the planner uses (missing memory bandwidth: FLOP_PER_BYTE of the bf16 peak)."""
        mib = self.total_mib
        bandwidth = self.memory_bandwidth_gbps or self.bf16_tflops * 1000 / FLOP_PER_BYTE
        note = (
            ""
            if self.memory_bandwidth_gbps
            else f"memory bandwidth assumed {bandwidth:,.0f} GB/s ({FLOP_PER_BYTE:g} FLOP/byte)"
        )
        return GPUSpec(
            name=self.name,
            aliases=tuple(self.aliases),
            architecture="Custom",
            compute_capability="",
            memory_mib=int(mib),
            memory_gib=round(mib / 1024, 2),
            memory_gb_nominal=round(mib / 1024),
            bf16_tflops=self.bf16_tflops,
            fp16_tflops=self.fp16_tflops or self.bf16_tflops,
            tf32_tflops=None,
            fp32_tflops=self.fp32_tflops or self.bf16_tflops / 16,
            memory_bandwidth_gbps=bandwidth,
            tdp_watts=0.0,
            form_factor="",
            interconnect="user-defined",
            intra_node_bandwidth_gbps=self.interconnect_gbps,
            pcie_gen=0,
            confidence="user",
            notes=note,
            source=("user-defined",),
            cuda_memory_mib=self.cuda_memory_gib * 1024 if self.cuda_memory_gib is not None else None,
        )


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "value"
    if err.get("type") == "missing":
        return f"{where} is missing"
    return f"{where}: {err.get('msg', 'invalid').removeprefix('Value error, ')}"


@functools.lru_cache(maxsize=8)
def read_catalog(path: str, field: str = "--gpu-catalog") -> tuple[GPUSpec, ...]:
    """The GPUs of a user catalog file (see module docstring); InputError naming where the file was given
    (field: --gpu-catalog, or TUNEBENCH_GPU_CATALOG), the file and the entry."""
    from tunebench import yamlfile  # imports yaml: only when a catalog is read

    file = Path(path).expanduser()
    try:
        text = file.read_text()
        data = parse_json(text) if file.suffix == ".json" else yamlfile.load_yaml(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(field, f"cannot read {str(file)!r}: {exc}", allowed="a JSON or YAML file") from None
    entries = data.get("gpus") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise InputError(field, f"{str(file)!r} holds no list of GPUs", allowed='a list, or {"gpus": [...]}')
    out = []
    seen: dict[str, int] = {}  # a name or alias, as get_gpu matches it, -> the entry that has it
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InputError(field, f"{file.name}: gpus[{i}] is not a mapping", allowed=REQUIRED)
        spec = GPUNumbers.checked(f"{field} {file.name} gpus[{i}]", **entry).spec()
        for text in (spec.name, *spec.aliases):
            if gpu_key(text) in seen:
                raise InputError(
                    f"{field} {file.name} gpus[{i}]",
                    f"{text!r} also names gpus[{seen[gpu_key(text)]}]: which one a plan uses would be a guess",
                    allowed="each name and alias once",
                )
            seen[gpu_key(text)] = i
        out.append(spec)
    return tuple(out)
