"""Options of the planner's commands (plan, recommend, deploy-spec, calibrate) as pydantic models.

Checked before anything runs: prices and bandwidths are finite (a NaN price gave a null cost, a
zero bandwidth numpy warnings and 0 tokens/s), files exist and hold text, a calibration file has
the shape ``tunebench calibrate`` writes, the candidates of ``recommend`` fit in memory, and an
output file's directory exists before a fit of minutes runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from tunebench.errors import InputError
from tunebench.inputs import (
    FiniteFloat,
    NonNegative,
    NonNegativeInt,
    Options,
    Positive,
    TextFile,
    input_error,
    parse,
)
from tunebench.limits import check_memory
from tunebench.plan.deploy import check_post_url
from tunebench.plan.lengths import MAX_AVG_TOKENS
from tunebench.plan.recommend import DEFAULT_MAX_OOM_RISK
from tunebench.spec.properties import MAX_GPUS

if TYPE_CHECKING:
    from tunebench.plan.lengths import UserLengths

# Peak memory of `recommend` per GPU count it tries (it predicts several batch sizes for each):
# measured with tracemalloc at about 25 kB (512 and 4,096 counts, smollm2-135m); rounded up.
CANDIDATE_BYTES = 32_768


# Coefficients the planner divides by (an efficiency, a speed, a rate): zero is a division by zero (numpy's
# warnings and an infinite runtime); every other coefficient is a size, a share or a time, never below zero.
POSITIVE_COEFFICIENTS = (
    "hfu_max", "qlora_speed", "gptq_speed", "fast_kernels_speed", "compile_speed", "link_efficiency", "cpu_tflops",
)  # fmt: skip


class CalibrationContent(BaseModel):
    """The JSON a calibration file holds (Calibration.to_dict): finite coefficients of known names, none below
    zero, the divisors (POSITIVE_COEFFICIENTS) above it."""

    model_config = ConfigDict(extra="forbid")
    coefficients: dict[str, FiniteFloat] = Field(min_length=1)
    source: str = "?"
    records: NonNegativeInt = 0
    models: list[str] = []
    metrics: dict[str, Any] = {}

    @field_validator("coefficients")
    @classmethod
    def _known(cls, value: dict[str, float]) -> dict[str, float]:
        from tunebench.plan.coefficients import Coefficients

        known = [f.name for f in fields(Coefficients)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"unknown coefficient {unknown[0]!r} (known: {', '.join(known)})")
        for name, number in value.items():
            if number < 0 or (number == 0 and name in POSITIVE_COEFFICIENTS):
                raise ValueError(f"{name} must be {'>' if name in POSITIVE_COEFFICIENTS else '>='} 0 (got {number})")
        return value


def _calibration_file(path: Path) -> Path:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(path)!r} is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} is not a calibration (a JSON object with coefficients)")
    try:
        CalibrationContent.model_validate(data)
    except ValidationError as exc:
        err = input_error(exc)
        raise ValueError(f"{str(path)!r} is not a calibration: {err}") from None
    return path


CalibrationFile = Annotated[TextFile, AfterValidator(_calibration_file)]


# An ISO 4217 code's shape (three capital letters): the currency cost is printed in; nothing converts.
def _currency(code: str) -> str:
    if not re.fullmatch(r"[A-Z]{3}", code):
        raise ValueError(f"an ISO 4217 code, three capital letters such as USD or EUR (got {code!r})")
    return code


Currency = Annotated[str, AfterValidator(_currency)]
# A probability: the largest out-of-memory probability a verdict or recommendation accepts.
Probability = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


# Mean tokens per sample of the user's data (plan.lengths): at least one token, at most plan.lengths.MAX_AVG_TOKENS.
AvgTokens = Annotated[float, Field(ge=1, le=MAX_AVG_TOKENS, allow_inf_nan=False)]


class PlannerOptions(Options):
    """Options plan and recommend share (and plan's --batch file)."""

    NAMES = {
        "price": "--price-per-gpu-hour",
        "network": "--network-gbps",
        "host_memory": "--host-memory-gib",
        "avg_tokens": "--avg-tokens",
        "lengths": "--lengths",
    }
    price: NonNegative | None = None
    calibration: CalibrationFile | None = None
    network: Positive | None = None
    host_memory: Positive | None = None
    batch: TextFile | None = None
    currency: Currency = "USD"
    max_oom_risk: Probability = DEFAULT_MAX_OOM_RISK
    avg_tokens: AvgTokens | None = None
    lengths: TextFile | None = None


def user_lengths(avg_tokens: float | None, lengths: Path | None) -> UserLengths | None:
    """The user's sample lengths from --avg-tokens or --lengths (checked: not both; the file read and its
    lines checked here, tokenised per model when planned), None for the data set's."""
    if avg_tokens is not None and lengths is not None:
        raise InputError("--avg-tokens", "give --avg-tokens N or --lengths FILE, not both")
    from tunebench.plan.lengths import from_file, from_mean  # numpy: loaded when a plan runs, not with --help

    if avg_tokens is not None:
        return from_mean(avg_tokens)
    return from_file(lengths) if lengths is not None else None


# A number of GPUs a command may ask about (recommend's --gpus-per-node and --max-gpus).
GpuCount = Annotated[int, Field(ge=1, le=MAX_GPUS)]


class RecommendOptions(Options):
    gpus_per_node: GpuCount
    max_gpus: GpuCount


def check_recommend(gpus_per_node: int, max_gpus: int) -> None:
    """The GPU counts recommend tries: valid, and few enough for this machine's memory."""
    parse(RecommendOptions, gpus_per_node=gpus_per_node, max_gpus=max_gpus)
    candidates = max_gpus // gpus_per_node + gpus_per_node.bit_length()
    check_memory("--max-gpus", candidates * CANDIDATE_BYTES, f"trying {candidates:,} GPU counts")


# Where deploy-spec may POST a hardware specification (https, or http to this machine).
PostUrl = Annotated[str, AfterValidator(check_post_url)]


def _measurements_file(path: Path) -> Path:
    """A CSV the csv module reads whose measured-property columns (that layout) are finite and >= 0."""
    from tunebench.errors import InputError
    from tunebench.store.csvio import measurements_of, read_csv_rows

    try:
        columns, rows = read_csv_rows(path, "--from")
        number = 1
        if "experiment_id" in columns:
            for number, row in enumerate(rows, start=2):
                measurements_of(row)
    except InputError as exc:
        raise ValueError(exc.message if exc.field == "--from" else f"{path.name} line {number}: {exc}") from None
    return path


MeasurementsFile = Annotated[TextFile, AfterValidator(_measurements_file)]
