"""The planner's --gpu-catalog and --gpu-* options: GPUs outside the catalog, for plan and recommend.

``with_gpu_options(command)`` turns ``command(..., gpu: GPUOptions)`` into a Typer command that
takes the six options in the place of ``gpu``, so that every planner command declares them once
and in the same way; ``GPUOptions.register`` makes those GPUs known to this process's planner.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from tunebench.commands.options import option
from tunebench.errors import InputError
from tunebench.inputs import Positive

# each number is > 0 and finite as it is parsed (tunebench.inputs.Positive, naming its flag); the file is read by
# catalog.user_gpus.read_catalog and the numbers checked together by
# catalog.gpus.custom_gpu (field --gpu-*), which also serve the Python API
GPUCatalog = Annotated[
    Path | None,
    option(
        Path,
        "--gpu-catalog",
        help="JSON/YAML file of GPUs outside the catalog (name, memory_gib, "
        "bf16_tflops, interconnect_gbps[, memory_bandwidth_gbps, cuda_memory_gib]).",
    ),
]
GPUMemory = Annotated[
    float | None,
    option(Positive, "--gpu-memory-gib", help="Memory of a GPU outside the catalog, GiB, as nvidia-smi's total."),
]
GPUTflops = Annotated[float | None, option(Positive, "--gpu-bf16-tflops", help="Its dense bf16 peak, TFLOP/s.")]
GPULink = Annotated[
    float | None, option(Positive, "--gpu-interconnect-gbps", help="Its GPU-to-GPU bandwidth within a node, GB/s.")
]
GPUBandwidth = Annotated[
    float | None, option(Positive, "--gpu-memory-bandwidth-gbps", help="Its memory bandwidth, GB/s (optional).")
]
GPUName = Annotated[
    str | None, option(str, "--gpu-name", help="Label the --gpu-* numbers describe (default: gpu_model).")
]

# The command's parameter ("gpu_" + GPUOptions' field) -> its Typer declaration, in --help's order.
GPU_PARAMETERS = {
    "gpu_catalog": GPUCatalog, "gpu_memory": GPUMemory, "gpu_tflops": GPUTflops, "gpu_link": GPULink,
    "gpu_bandwidth": GPUBandwidth, "gpu_name": GPUName,
}  # fmt: skip


@dataclass(frozen=True)
class GPUOptions:
    """--gpu-catalog (a file) and the numbers of one GPU: memory GiB, dense bf16 TFLOP/s, GPU-to-GPU
    and memory bandwidth GB/s, and the name they describe (None: not given)."""

    catalog: Path | None = None
    memory: float | None = None
    tflops: float | None = None
    link: float | None = None
    bandwidth: float | None = None
    name: str | None = None

    def register(self, gpu_model: str | None) -> None:
        """Make the GPUs of the catalog file and of the numbers (named --gpu-name, else gpu_model) known
        to this process's planner; InputError names the option that is missing or wrong."""
        from tunebench.catalog.gpus import catalog_file_gpus, custom_gpu, register_gpu
        from tunebench.catalog.user_gpus import read_catalog

        catalog_file_gpus()  # TUNEBENCH_GPU_CATALOG's file, refused now if it is malformed (before any planning)
        for spec in read_catalog(str(self.catalog)) if self.catalog is not None else ():
            register_gpu(spec)
        given = {
            "--gpu-memory-gib": self.memory,
            "--gpu-bf16-tflops": self.tflops,
            "--gpu-interconnect-gbps": self.link,
        }
        if all(v is None for v in (*given.values(), self.bandwidth)):
            if self.name is not None:  # a label for numbers that are not there: a forgotten option, not a no-op
                raise InputError(
                    "--gpu-name",
                    "names the GPU the --gpu-* numbers describe, and none is given",
                    allowed=", ".join(given),
                )
            return
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise InputError(missing[0], "missing: a GPU given by its numbers needs all of " + ", ".join(given))
        label = self.name or gpu_model
        if not label:
            raise InputError(
                "--gpu-name", "which GPU do the --gpu-* numbers describe? give gpu_model=LABEL or --gpu-name"
            )
        register_gpu(custom_gpu(label, self.memory, self.tflops, self.link, self.bandwidth, field="--gpu-*"))  # type: ignore[arg-type]


def with_gpu_options(command: Callable[..., None]) -> Callable[..., None]:
    """A Typer command taking --gpu-catalog and the --gpu-* options, which calls command with them as gpu.

    Typer reads a command's options from its signature: the returned function's is command's
    without gpu, with GPU_PARAMETERS after its own (keyword-only, default None).
    """
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "gpu"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=declaration)
        for name, declaration in GPU_PARAMETERS.items()
    ]

    @functools.wraps(command)
    def typer_command(**kwargs: Any) -> None:
        gpu = GPUOptions(**{name.removeprefix("gpu_"): kwargs.pop(name) for name in GPU_PARAMETERS})
        command(**kwargs, gpu=gpu)

    parameters = [*own, *added]
    typer_command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    typer_command.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return typer_command
