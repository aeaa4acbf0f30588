"""Rank result files of the training worker and the spec's measured properties computed from them.

Every rank writes ``<result_path>.rank<RANK>.json`` (see :mod:`tunebench.worker` for the format);
on success rank 0 also writes ``<result_path>`` (the aggregate: every rank's result plus the
properties). These functions are pure and import neither torch nor transformers, so the parent
process can use them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tunebench.worker.metrics import cpu_properties, gpu_properties

SCHEMA = "tunebench.worker.rank-result/1"
AGGREGATE_SCHEMA = "tunebench.worker.result/1"
EXIT_OK, EXIT_ERROR, EXIT_OOM = 0, 1, 3

# The SFTTrainer spec "Runs raising the following errors are considered invalid due to running out of GPU
# memory" and ado-sfttrainer.md §5.3 (lower-cased substring match on RuntimeError messages).
OOM_MESSAGES = ("cuda error: out of memory", "an illegal memory access was encountered")
# Host allocator failures: out of memory on CPU runs, where host RAM is the device memory.
HOST_OOM_MESSAGES = ("defaultcpuallocator: can't allocate memory", "can't allocate memory")

# The two rates the SFTTrainer spec omits when stop_after_seconds > 0 ("Omitted when stop_after_seconds is greater
# than 0" on train_tokens_per_second and train_tokens_per_gpu_per_second only; the reference also drops
# the samples/steps rates, ado-sfttrainer.md §7.2, tunebench follows the spec).
STOP_AFTER_DROPPED_RATES = ("train_tokens_per_second", "train_tokens_per_gpu_per_second")


def rank_file(result_path: str | os.PathLike, rank: int) -> Path:
    return Path(f"{result_path}.rank{rank}.json")


def read_rank_results(result_path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every ``<result_path>.rank*.json`` that exists, sorted by rank."""
    path = Path(result_path)
    found = []
    for f in path.parent.glob(path.name + ".rank*.json"):
        try:
            found.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(found, key=lambda r: r.get("rank", 0))


def read_aggregate(result_path: str | os.PathLike) -> dict[str, Any] | None:
    """Rank 0's ``<result_path>`` (every rank's record and the properties), or None if it is not there."""
    try:
        data = json.loads(Path(result_path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == AGGREGATE_SCHEMA else None


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- outcomes


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _is_torch_oom(exc: BaseException) -> bool:
    return any(c.__name__ == "OutOfMemoryError" and c.__module__.startswith("torch") for c in type(exc).__mro__)


def classify_exception(exc: BaseException, host_memory_exceeded: str | None = None, on_cpu: bool = False):
    """(status, reason) of a failed run: 'oom' or 'error'.

    oom: torch.cuda.OutOfMemoryError; a RuntimeError whose lower-cased message contains "cuda error:
    out of memory" or "an illegal memory access was encountered" (SFTTrainer spec); the host-memory limit
    (``host_memory_exceeded`` is the watchdog's message); on CPU runs, a MemoryError or a host
    allocator failure. Anything else: error. The exception's cause/context chain is searched too.
    """
    if host_memory_exceeded:
        return "oom", host_memory_exceeded
    for e in _chain(exc):
        if type(e).__name__ == "HostMemoryLimitExceeded":
            return "oom", str(e)
        text = str(e).lower()
        if _is_torch_oom(e):
            return "oom", f"GPU out of memory: {type(e).__name__}: {_first_line(e)}"
        if isinstance(e, RuntimeError) and any(m in text for m in OOM_MESSAGES):
            return "oom", f"GPU out of memory: {type(e).__name__}: {_first_line(e)}"
        if on_cpu and (isinstance(e, MemoryError) or any(m in text for m in HOST_OOM_MESSAGES)):
            return "oom", f"host memory exhausted: {type(e).__name__}: {_first_line(e)}"
    return "error", f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:limit]


def outcome(rank_results: Sequence[dict[str, Any]], world_size: int | None = None) -> tuple[str, str | None]:
    """Outcome of a run from its rank results: ('valid'|'invalid'|'failed', reason).

    Any rank 'oom' -> invalid (ado-sfttrainer.md §5.4: OOM on any rank invalidates the entity);
    else any 'error', or fewer results than ranks, or none -> failed; else valid.
    """
    if not rank_results:
        return "failed", "no rank wrote a result"
    for r in rank_results:
        if r.get("status") == "oom":
            return "invalid", f"rank {r.get('rank')}: {r.get('reason')}"
    for r in rank_results:
        if r.get("status") != "ok":
            return "failed", f"rank {r.get('rank')}: {r.get('reason')}"
    expected = world_size or max(r.get("world_size", 1) for r in rank_results)
    if len({r.get("rank") for r in rank_results}) < expected:
        return "failed", f"only {len(rank_results)} of {expected} ranks wrote a result"
    return "valid", None


# ---------------------------------------------------------------------------------------------- properties


def trained_tokens(rank_results: Sequence[dict[str, Any]]) -> int | None:
    """Label tokens trained on (labels != -100) over every step, warm-up included, summed over ranks;
    None when the records do not count them."""
    if not rank_results or any("trained_tokens" not in (r.get("steps") or {}).get("local", {}) for r in rank_results):
        return None
    return int(sum(global_steps(rank_results)["trained_tokens"]))


NO_TRAINED_TOKENS = "no label tokens trained"  # the start of that invalid reason


def no_trained_tokens_reason(data: dict[str, Any] | None, template: str = "\n### Response:") -> str:
    """Why a run trained on no label token: records without the response template, or cut before it."""
    data = data or {}
    records, without = data.get("records"), data.get("records_without_response_template")
    if records and without == records:
        return f"{NO_TRAINED_TOKENS}: no record of the data set contains the response template {template!r}"
    cut = data.get("records_without_label_tokens")
    counted = f" ({cut} of {records} records have none)" if cut is not None and records else ""
    return (
        f"{NO_TRAINED_TOKENS}: the response marker {template!r} of every record trained on was cut off by "
        f"truncation at max_length {data.get('max_length')} (min of model_max_length and the tokenizer's "
        f"limit){counted}; raise model_max_length"
    )


def global_steps(rank_results: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-step durations and global counts: rank 0's all-reduced values, else the sum of the ranks' own."""
    r0 = min(rank_results, key=lambda r: r.get("rank", 0))
    steps = r0["steps"]
    if steps.get("global"):
        return {"durations_s": steps["durations_s"], **steps["global"]}
    total: dict[str, list[float]] = {}
    for r in rank_results:
        for key, values in r["steps"]["local"].items():
            acc = total.setdefault(key, [0] * len(values))
            for i, v in enumerate(values[: len(acc)]):
                acc[i] += v
    return {"durations_s": steps["durations_s"], **total}


def properties_from_results(
    rank_results: Sequence[dict[str, Any]],
    number_gpus: int,
    stop_after_seconds: float = -1.0,
    auto_stop: str | None = None,
) -> dict[str, float]:
    """The SFTTrainer spec measured properties (all but is_valid, which the caller sets) from successful rank results.

    Over the post-warm-up steps (all steps without auto-stop), with global counts (summed over ranks)
    unless said otherwise:

    - train_runtime = Σ step durations (s);
    - train_samples_per_second, train_steps_per_second (always);
    - train_tokens_per_gpu_per_second = rank 0's padded tokens (padding included) / runtime, and
      train_tokens_per_second = world size x that (the SFTTrainer spec: "for FSDP this is estimated from
      num_gpus * rank_0_train_tokens_per_second", "for FSDP this is reported using just rank 0"; the
      reference does the same for DDP, ado-sfttrainer.md §7.2); with number_gpus <= 1 the two are equal
      (the spec). Both omitted when stop_after_seconds > 0 (SFTTrainer spec). They are kept
      with auto-stop: they come from the steps actually run after the warm-up, not from HF's
      planned step count, so the inflation that made the reference drop them does not arise;
    - dataset_tokens_per_second = Σ min(len(tokens(entry["output"])), tokenizer.model_max_length,
      max_seq_length) over the consumed entries (the spec's note 3; tunebench.training.data) / runtime;
      _per_gpu divides by max(1, number_gpus);
    - gpu_* and cpu_* from the local-rank-0 sampler summaries (tunebench.worker.metrics), 0.0 without GPUs;
    - extra: gpu_memory_allocated_peak_gib / gpu_memory_reserved_peak_gib, the max over ranks of
      torch.cuda.max_memory_allocated / max_memory_reserved (0.0 without CUDA).

    Raises ValueError when a rank did not succeed or no post-warm-up step was run.
    """
    if not rank_results:
        raise ValueError("no rank results")
    bad = [r for r in rank_results if r.get("status") != "ok"]
    if bad:
        raise ValueError(f"rank {bad[0].get('rank')} did not succeed: {bad[0].get('reason')}")
    per_gpu = max(1, int(number_gpus))
    r0 = min(rank_results, key=lambda r: r.get("rank", 0))
    steps = global_steps(rank_results)
    warmup = int(r0["steps"].get("warmup", 0))
    post = slice(warmup, None)
    runtime = float(sum(steps["durations_s"][post]))
    n_steps = len(steps["durations_s"][post])
    if n_steps == 0 or runtime <= 0:
        raise ValueError("no optimisation step after the warm-up: nothing to measure")
    samples = sum(steps["samples"][post])
    dataset = sum(steps["dataset_tokens"][post])
    rank0_padded = sum(r0["steps"]["local"]["padded_tokens"][post])
    world_size = int(r0.get("world_size") or len(rank_results))

    props: dict[str, float] = {"train_runtime": runtime}
    props["train_samples_per_second"] = samples / runtime
    props["train_steps_per_second"] = n_steps / runtime
    if not stop_after_seconds or stop_after_seconds <= 0:
        props["train_tokens_per_second"] = world_size * rank0_padded / runtime
        props["train_tokens_per_gpu_per_second"] = (
            props["train_tokens_per_second"] if number_gpus <= 1 else rank0_padded / runtime
        )
    props["dataset_tokens_per_second"] = dataset / runtime
    props["dataset_tokens_per_second_per_gpu"] = dataset / runtime / per_gpu

    systems = [r["system"] for r in rank_results if r.get("system")]
    gpus = [g for s in systems for g in s.get("gpus", [])] if number_gpus > 0 else []
    props.update(gpu_properties(gpus))
    props.update(cpu_properties(systems))

    peaks = [r.get("torch_memory") or {} for r in rank_results]
    props["gpu_memory_allocated_peak_gib"] = max((p.get("max_allocated_gib", 0.0) for p in peaks), default=0.0)
    props["gpu_memory_reserved_peak_gib"] = max((p.get("max_reserved_gib", 0.0) for p in peaks), default=0.0)
    return props
