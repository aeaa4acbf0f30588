"""The measuring actuator's options (a space file's ``actuator:`` block, or the CLI's flags)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from tunebench.errors import InputError


@dataclass
class MeasureOptions:
    """Actuator options of ``measure``.

    weights: auto | pretrained | random (random builds the architecture, no download).
    timeout_seconds: wall-clock limit of one run, process start to exit; None = no limit.
    visible_devices: CUDA_VISIBLE_DEVICES for the run (the executor's GPU assignment).
    output_dir: where the run writes (the executor's fresh directory per attempt).
    cpu_processes: DDP processes (gloo) for a CPU entity (number_gpus = 0); 1 = one process.
    host_memory_limit_gib: exceeding it is out of memory (is_valid = 0); None: CPU runs get 80% of the
        memory available at launch (tunebench.actuators.memwatch), GPU runs none; 0: no limit.
    nccl_env: NCCL_* variables every node of a GPU run sets (RoCE fabric: NCCL_IB_HCA, NCCL_IB_GID_INDEX,
        NCCL_SOCKET_IFNAME, NCCL_IB_TC, ...; unset ones keep NCCL's defaults, see actuators/network.py).
    """

    weights: str = "auto"
    data_dir: str | None = None
    model_map: dict[str, Any] | None = None
    timeout_seconds: float | None = 3600.0
    visible_devices: str | None = None
    output_dir: str | None = None
    cpu_processes: int = 1
    host_memory_limit_gib: float | None = None
    metrics_interval_seconds: float | None = None
    auto_stop_windows_seconds: tuple[float, float, int] | None = None  # warm-up s, stable s, stable steps
    extra_worker_args: tuple[str, ...] = ()
    nccl_env: dict[str, Any] | None = None

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> MeasureOptions:
        """InputError (actuator.<name>) for an option the actuator does not know."""
        options = dict(options or {})
        names = [f.name for f in fields(cls)]
        unknown = set(options) - set(names)
        if unknown:
            raise InputError(f"actuator.{sorted(unknown)[0]}", "unknown actuator option", allowed=", ".join(names))
        if options.get("nccl_env") is not None:
            from tunebench.actuators.network import check_nccl_env

            options["nccl_env"] = check_nccl_env(options["nccl_env"])
        return cls(**options)
