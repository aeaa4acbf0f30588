"""A measurement's processes -> its Result: one set of rules for single-node and multi-node runs.

- timed out (any node) -> failed, "timeout: ...";
- any rank out of memory -> invalid with the reason (ado-sfttrainer.md §5.4);
- killed by SIGKILL with evidence that memory ran out (the cgroup's OOM-kill counter, peak RSS at the
  limit, MemAvailable exhausted: tunebench.actuators.memwatch) -> invalid, out of memory (not retried);
- a run that trained on no label token (every label -100: the response template missing or cut off
  by model_max_length) -> invalid, "no label tokens trained: ..." (its rates measure no training);
- any rank failed, a rank missing, no rank result, a non-zero exit after valid results, a signal ->
  failed with the reason and the log tail;
- else valid, with the properties (and metadata ``trained_tokens``) rank 0 computed from every rank's records
  (``tunebench.worker.results.properties_from_results``, run once, in the worker).

A run whose trainable weights hold NaN or inf at its end gets a note: it diverged (its rates are still the
run's). A CPU run (number_gpus 0) during which other processes kept more than BUSY_OTHER_CPU_PERCENT of a core busy
on the CPUs it trains on gets a note (metadata ``notes``): its timings are not the host's own.

Every outcome whose ranks wrote records carries the time series they sampled (``Result.series``,
tunebench.worker.series): an out-of-memory run's memory curve included.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from tunebench.actuators.memwatch import MemoryEvidence, oom_kill_reason
from tunebench.spec.experiments import Entity, Experiment
from tunebench.spec.results import Result
from tunebench.worker.results import no_trained_tokens_reason, outcome
from tunebench.worker.series import run_series

# Other processes' average CPU use (100 = one core) above which a CPU run's timings are not the host's: torch's
# OpenMP regions wait at each barrier for their slowest thread, so one core shared with another process slows
# every region. Measured here: SmolLM2-135M LoRA on 2 cores, 5.3 s a step idle, 105.7 s with another process
# holding one core (docs/engines.md, "A busy host").
BUSY_OTHER_CPU_PERCENT = 25.0


@dataclass
class RunOutcome:
    """What the processes of one measurement left behind, over all its nodes."""

    returncode: int  # 0, or the first non-zero exit code of a node; negative: the signal that ended it
    timed_out: bool
    ranks: list[dict[str, Any]]  # every rank's result record
    aggregate: dict[str, Any] | None  # rank 0's result file (properties), written on success
    world_size: int  # processes expected to write a rank record
    log_tail: str
    metadata: dict[str, Any] = field(default_factory=dict)
    memory: MemoryEvidence | None = None  # the parent's view of host memory (single-node runs)


def result_of_run(experiment: Experiment, entity: Entity, run: RunOutcome, timeout_seconds: float | None) -> Result:
    """The Result of a finished (or killed) run; see the module docstring for the rules."""
    meta, tail = dict(run.metadata), run.log_tail
    if run.timed_out:
        return Result.failed(
            experiment.id,
            entity.id,
            f"timeout: the run exceeded {timeout_seconds or 0:g} s and was killed",
            log_tail=tail,
            metadata=meta,
        )
    status, reason = outcome(run.ranks, world_size=run.world_size)
    series = {"series": run_series(run.ranks)}
    if run.ranks:
        engine = meta.get("engine") or {}  # the actuator's view (environment, notes) + the worker's (what ran)
        meta.update(_run_metadata(run.ranks))
        meta["engine"] = {**engine, **(meta.get("engine") or {})}
        if not entity.values.get("number_gpus") and (note := busy_host_note(meta.get("host_cpu") or {})):
            meta["notes"] = [*meta.get("notes", []), note]
        if note := diverged_note(meta):
            meta["notes"] = [*meta.get("notes", []), note]
    if status == "invalid":
        return Result.invalid(
            experiment.id, entity.id, [reason or "out of memory"], metadata=meta, log_tail=tail, **series
        )
    if status == "valid" and run.returncode != 0:
        status, reason = "failed", f"worker exited with code {run.returncode} after writing its results"
    if status == "valid" and run.aggregate is None:
        status, reason = "failed", "rank 0 wrote no aggregate result (properties)"
    if run.memory is not None:
        meta["host_memory"] = run.memory.to_dict()
    if status == "failed" and (oom := oom_kill_reason(run.returncode, tail, run.memory)):
        return Result.invalid(experiment.id, entity.id, [oom], metadata=meta, log_tail=tail, **series)
    if status == "failed":
        if run.returncode < 0:
            name = signal.Signals(-run.returncode).name
            reason = f"worker killed by signal {name}" + (f" ({reason})" if run.ranks else "")
        elif not run.ranks:
            reason = f"worker exited with code {run.returncode} and wrote no result"
        return Result.failed(
            experiment.id, entity.id, reason or "unknown failure", log_tail=tail, metadata=meta, **series
        )
    tokens = run.aggregate.get("trained_tokens")
    meta["trained_tokens"] = tokens
    if tokens == 0:
        r0 = min(run.ranks, key=lambda r: r.get("rank", 0))
        template = (r0.get("args") or {}).get("response_template") or "\n### Response:"
        reason = no_trained_tokens_reason(r0.get("data"), template)
        return Result.invalid(experiment.id, entity.id, [reason], metadata=meta, log_tail=tail, **series)
    return Result.valid(experiment.id, entity.id, dict(run.aggregate["properties"]), metadata=meta, **series)


def _run_metadata(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's metadata (versions, weights, ...) and step counts, every rank's torch memory peaks."""
    r0 = min(ranks, key=lambda r: r.get("rank", 0))
    meta = dict(r0.get("metadata") or {})
    steps = r0.get("steps") or {}
    system = r0.get("system") or {}
    meta.update(
        {
            "world_size": r0.get("world_size"),
            "steps": steps.get("total"),
            "warmup_steps": steps.get("warmup"),
            "stopped_by": steps.get("stopped_by"),
            "torch_memory": [r.get("torch_memory") for r in ranks],
            # rank 0's node: its CPUs and what other processes used of them (worker.metrics)
            "host_cpu": {
                "cpus": system.get("cpu_count"),
                "cpu_quota": system.get("cpu_quota"),
                "other_cpu_percent": system.get("other_cpu_percent"),
            },
        }
    )
    return meta


def diverged_note(meta: dict[str, Any]) -> str | None:
    """A note when rank 0's trainable weights hold NaN or inf after training (worker.train.nonfinite_trainable)."""
    bad = meta.get("nonfinite_trainable")
    if not bad:
        return None
    why = ""
    if "float16" in (meta.get("trainable_dtypes") or []):
        # torch AdamW adds eps to sqrt(v) in the parameter's dtype: 1e-8 is below float16's smallest subnormal
        # (6e-8), and lora_A's first gradient is 0 (lora_B starts at 0: peft's LoRA init), so its update is 0/0
        why = (
            "; float16 trainable weights with AdamW: its eps 1e-8 is 0 in float16, so a zero gradient (LoRA's "
            "lora_A at the first step) updates by 0/0 (use adapter_dtype bfloat16 or float32)"
        )
    return (
        f"training diverged: {bad['tensors']} of {bad['of']} trainable tensors hold NaN or inf after the run "
        f"({', '.join(bad['first'])}){why}; the Trainer logs the running mean in place of a NaN loss "
        "(logging_nan_inf_filter). Its rates are still the run's"
    )


def busy_host_note(host_cpu: dict[str, Any]) -> str | None:
    """A note when other processes kept more than BUSY_OTHER_CPU_PERCENT of a core busy during the run; none
    under a cgroup CPU quota, whose allowed CPUs are shared with other cgroups by design (worker.metrics)."""
    other, cpus = host_cpu.get("other_cpu_percent"), host_cpu.get("cpus")
    if other is None or other <= BUSY_OTHER_CPU_PERCENT or host_cpu.get("cpu_quota"):
        return None
    of = f" of the {cpus} it trains on" if cpus else ""
    return (
        f"other processes kept {other / 100:.1f} CPU cores{of} busy during the run: its CPU timings are not "
        "this host's own (torch's threads wait for the slowest core); measure on an idle host"
    )
