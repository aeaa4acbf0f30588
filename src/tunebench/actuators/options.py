"""The measuring actuator's options (a space file's ``actuator:`` block, or the CLI's flags)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from tunebench.errors import InputError, has_control_characters
from tunebench.inputs import NonNegative, Seconds, Weights, input_error
from tunebench.limits import MAX_CPU_PROCESSES

# model_map values: a path or Hugging Face id of the plain weights, or the reference's per-kind mapping
ModelSource = str | dict[Literal["Vanilla", "GPTQ-Quantized"], str]


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
    extra_worker_args: worker flags and values added to every run, only those tunebench never sets itself
        (check_extra_worker_args), e.g. [--seed, 7] or [--tunebench_tiny, True].
    """

    weights: Weights = "auto"
    data_dir: str | None = None
    model_map: dict[str, ModelSource] | None = None
    timeout_seconds: Seconds | None = 3600.0
    visible_devices: str | None = None
    output_dir: str | None = None
    cpu_processes: Annotated[int, Field(ge=1, le=MAX_CPU_PROCESSES)] = 1
    host_memory_limit_gib: NonNegative | None = None
    metrics_interval_seconds: Seconds | None = None
    auto_stop_windows_seconds: tuple[NonNegative, NonNegative, Annotated[int, Field(ge=1)]] | None = (
        None  # warm-up s, stable s, stable steps
    )
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
        if "extra_worker_args" in options:
            options["extra_worker_args"] = check_extra_worker_args(options["extra_worker_args"])
        try:  # every field's type and bounds, as a space file is read (nothing runs before)
            return TypeAdapter(cls).validate_python(options)
        except ValidationError as exc:
            raise input_error(exc, prefix="actuator") from None


FIELD = "actuator.extra_worker_args"


def check_extra_worker_args(value: Any) -> tuple[str, ...]:
    """A list of worker flags and their values, as the worker will read it (InputError naming the field).

    Only the flags of the worker parser's group of flags tunebench never sets (worker/args.py
    extra_flags): a flag tunebench sets itself (--result_path, --output_dir, --max_steps, ...) would
    replace the entity's or tunebench's value, since the worker keeps the last of a repeated flag.
    Each value is parsed with its flag's type and choices; none may read as a flag.
    """
    from tunebench.worker.args import extra_flags

    flags = extra_flags()
    allowed = ", ".join(sorted(flags))
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InputError(FIELD, "must be a list of worker flags and their values, e.g. [--seed, 7]", allowed=allowed)
    items = [_scalar(v) for v in value]
    out: list[str] = []
    i = 0
    while i < len(items):
        name, eq, inline = items[i].partition("=")
        action = flags.get(name)
        if action is None:
            why = "is set by tunebench itself" if _is_worker_flag(name) else "is not a flag tunebench passes on"
            raise InputError(FIELD, f"{name!r} {why}", allowed=allowed)
        if eq:
            given, i = [inline], i + 1
        else:
            given, i = items[i + 1 : i + 2], i + 2
        if len(given) != 1:
            raise InputError(FIELD, f"{name} needs one value", allowed=allowed)
        out += [name, _checked_value(name, action, given[0])]
    return tuple(out)


def _scalar(item: Any) -> str:
    """One list item as the text the worker would receive (YAML gives numbers and booleans as such)."""
    if isinstance(item, (bool, int, float, str)):
        text = str(item)
    else:
        raise InputError(FIELD, f"{item!r} is not a flag or a value", allowed="text, numbers and booleans")
    if has_control_characters(text):
        raise InputError(FIELD, f"{text!r} contains control characters", allowed="printable text")
    return text


def _checked_value(name: str, action: Any, text: str) -> str:
    """text as a value of the worker's flag name: its type and choices, and never a flag."""
    import argparse

    try:
        value = action.type(text) if action.type else text
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        kind = {int: "an integer", float: "a number"}.get(action.type, "True, False")
        raise InputError(FIELD, f"{name}: bad value {text!r}", allowed=kind) from None
    if text.startswith("-") and not isinstance(value, (int, float)):
        raise InputError(
            FIELD,
            f"{name}: the value {text!r} starts with '-' and would read as a flag",
            allowed="a value not starting with '-'",
        )
    if action.choices and value not in action.choices:
        raise InputError(FIELD, f"{name}: unknown value {text!r}", allowed=", ".join(map(str, action.choices)))
    return text


def _is_worker_flag(name: str) -> bool:
    from tunebench.worker.args import build_parser

    return name in build_parser()._option_string_actions
