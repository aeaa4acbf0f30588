"""The measuring actuator: train for real, return the SFTTrainer spec's measured properties as a Result.

``measure(experiment, entity, options)`` computes the entity's effective values and checks
validity (once), makes sure the data set exists, builds the launch plan from those values
(tunebench.actuators.launch), runs it as a subprocess in its own process group with a timeout
(tunebench.actuators.process) and turns what the worker wrote into a Result
(tunebench.actuators.outcome):

- valid: every rank succeeded -> is_valid = 1 and every property;
- invalid: a validity rule is broken, or the engine cannot run a setting as asked
  (tunebench.engines.support; nothing runs in either case), any rank ran out of memory (GPU, or the host
  memory limit on the CPU), or the run trained on no label token -> is_valid = 0 with the reason;
- failed: anything else (an exception, a crash, a signal, a timeout, missing rank files) -> no
  properties; the error and the log tail are kept; failed measurements can be retried.

The stability experiment runs its job ``repetitions`` times and reports the fractions (SFTTrainer spec).
Multi-node plans need one process per machine: the Ray executor schedules those and calls the
``MultiNode`` steps of ``MEASURE`` / ``MEASURE_FMS``: ``plan_nodes`` (on the coordinator), ``run_node``
(on each node) and ``collect_nodes`` (on the coordinator), the same outcome rules as a single-node run.
"""

from __future__ import annotations

import dataclasses
import functools
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tunebench.actuators.launch import (
    WORKER_MODULES,
    LaunchPlan,
    NodePlan,
    build_launch_plan,
    cpu_processes_reason,
    plan_of_values,
)
from tunebench.actuators.machine import cannot_run_here, detect_gpus
from tunebench.actuators.memwatch import DEFAULT_LIMIT_FRACTION, MemoryWatch, default_host_memory_limit_bytes
from tunebench.actuators.options import MeasureOptions
from tunebench.actuators.outcome import RunOutcome, result_of_run
from tunebench.actuators.process import NodeResult, node_command, run_logged, run_node_plan, tail
from tunebench.actuators.registry import Actuator, MultiNode
from tunebench.datasets import ensure_dataset
from tunebench.engines import FMS, NATIVE
from tunebench.engines.runtime import runtime
from tunebench.engines.support import unsupported
from tunebench.paths import home
from tunebench.spec.experiments import Entity, Experiment, effective_values
from tunebench.spec.results import Result
from tunebench.spec.validity import check_values
from tunebench.units import GIB
from tunebench.worker.progress import StepProgress
from tunebench.worker.results import NO_TRAINED_TOKENS, read_aggregate, read_rank_results


def measure(
    experiment: Experiment,
    entity: Entity,
    options: Mapping[str, Any] | MeasureOptions | None = None,
    progress: Callable[[str], None] | None = None,
    engine: str = NATIVE,
    on_step: Callable[[StepProgress], None] | None = None,
) -> Result:
    """Measure one entity with an engine (tunebench.engines); never raises for a run that goes wrong
    (that is a failed Result). The Result's actuator is the engine's actuator name.

    progress: told each phase (data set, training, ...); on_step: each training step of the worker (step x/N,
    tokens/s, loss, ETA: tunebench.worker.progress)."""
    opts = options if isinstance(options, MeasureOptions) else MeasureOptions.from_mapping(options)
    values = effective_values(experiment, entity)
    here = values.get("number_nodes", 1) <= 1  # a run that starts here (several nodes run elsewhere: Ray)
    # In order: what is true of the entity anywhere (the spec's rules, what the engine cannot run), then what this
    # machine lacks (its GPUs: failed, nothing about the entity), then the packages missing here (invalid here).
    reasons = judge(experiment, entity, engine, here=False)
    if not reasons and (why := cpu_processes_reason(values, opts.cpu_processes)):  # per point of an exploration
        reasons = [f"{why} (the actuator's cpu_processes)"]
    if reasons:
        result = Result.invalid(experiment.id, entity.id, reasons)
    elif not here:
        result = Result.failed(
            experiment.id, entity.id, "number_nodes > 1 needs one process per machine: use the ray executor"
        )
    elif opts.visible_devices is None and (missing := gpus_missing(values)) is not None:  # an executor checked its own
        result = Result.failed(experiment.id, entity.id, missing)
    elif reasons := judge(experiment, entity, engine, here=True):
        result = Result.invalid(experiment.id, entity.id, reasons)
    elif "repetitions" in experiment.hardcoded:
        repetitions = int(experiment.hardcoded["repetitions"])
        result = _measure_stability(experiment, entity, values, opts, repetitions, progress, engine, on_step)
    else:
        result = _measure_once(experiment, entity, values, opts, progress, engine, on_step)
    return dataclasses.replace(result, actuator=ACTUATOR_OF_ENGINE[engine])


def gpus_missing(values: Mapping[str, Any]) -> str | None:
    """Why this machine cannot run the GPUs a one-node entity names (actuators.machine.cannot_run_here on NVML's
    GPUs within $CUDA_VISIBLE_DEVICES), None where it can: without this, a number_gpus=1 run on a machine
    without a GPU trains on the CPU and is recorded as the GPU entity's measurement."""
    gpus = int(values.get("number_gpus") or 0)
    if gpus == 0:
        return None
    why = cannot_run_here(gpus, values.get("gpu_model"), detect_gpus())
    if why is None:
        return None
    return f"{why} (NVML, within $CUDA_VISIBLE_DEVICES): measure it where those GPUs are, or set number_gpus=0 for a CPU run"


def judge(experiment: Experiment, entity: Entity, engine: str = NATIVE, *, here: bool = True) -> list[str]:
    """Why the entity is not measured (its Result is invalid, nothing runs): the spec's validity rules, then,
    for a valid entity, what the engine cannot run as asked (tunebench.engines.support; here=False: not the
    rules that ask this machine, for a run that starts on other machines)."""
    values = effective_values(experiment, entity)
    validity = check_values(values, single_node_only=experiment.single_node_only)
    return validity.reasons + (unsupported(values, engine, here=here) if validity.is_valid else [])


def measure_fms(
    experiment: Experiment,
    entity: Entity,
    options: Mapping[str, Any] | MeasureOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> Result:
    """The ``fms-hf-tuning`` actuator: measure through fms-hf-tuning at the entity's fms_hf_tuning_version."""
    return measure(experiment, entity, options, progress, engine=FMS)


ACTUATOR_OF_ENGINE = {NATIVE: "measure", FMS: FMS}  # the store keeps each engine's results apart


def _measure_once(
    experiment: Experiment,
    entity: Entity,
    values: dict[str, Any],
    opts: MeasureOptions,
    progress: Callable[[str], None] | None,
    engine: str = NATIVE,
    on_step: Callable[[StepProgress], None] | None = None,
) -> Result:
    """One run of a valid entity; values are its effective property values."""
    started = time.time()
    out_dir = Path(opts.output_dir) if opts.output_dir else _new_output_dir(experiment, entity)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"output_dir": str(out_dir), "weights_requested": opts.weights}
    try:
        if progress:
            progress(f"data set {values['dataset_id']}")
        ensure_dataset(values["dataset_id"], opts.data_dir)
        plan = plan_of_values(
            experiment,
            entity.id,
            values,
            data_directory=opts.data_dir,
            model_map=opts.model_map,
            weights=opts.weights,
            main_process_ip="127.0.0.1",
            main_process_port=_free_port(),
            cpu_processes=opts.cpu_processes,
            nccl_env=opts.nccl_env,
            engine=engine,
        )
        run_env = runtime(engine, values, out_dir, progress)  # fms-hf-tuning: its environment, built if needed
    except Exception as exc:  # a data set, plan or environment that cannot be made is a failed measurement
        return Result.failed(experiment.id, entity.id, f"{type(exc).__name__}: {exc}", metadata=meta)
    meta["engine"] = run_env.facts

    (node,) = plan.nodes
    opts, limit_source = with_host_memory_limit(opts, values)
    if opts.host_memory_limit_gib:
        meta["host_memory_limit_gib"] = opts.host_memory_limit_gib
        meta["host_memory_limit_source"] = limit_source
    command, env = node_command(node, out_dir, with_gpu_count(opts, values), python_executable=run_env.python)
    env.update(run_env.env)
    meta["command"] = command
    log_path = out_dir / "worker.log"
    if progress:
        progress("training")
    limit = int(opts.host_memory_limit_gib * GIB) if opts.host_memory_limit_gib else None
    watch = MemoryWatch(limit, limit_source)
    returncode, timed_out = run_logged(command, env, log_path, opts.timeout_seconds, watch, on_step)
    meta["wall_seconds"] = round(time.time() - started, 3)
    run = RunOutcome(
        returncode=returncode,
        timed_out=timed_out,
        ranks=read_rank_results(out_dir / "result"),
        aggregate=read_aggregate(out_dir / "result"),
        world_size=plan.processes_per_node * plan.number_nodes,
        log_tail=tail(log_path),
        metadata=meta,
        memory=watch.evidence,
    )
    return result_of_run(experiment, entity, run, opts.timeout_seconds)


def _measure_stability(
    experiment: Experiment,
    entity: Entity,
    values: dict[str, Any],
    opts: MeasureOptions,
    repetitions: int,
    progress: Callable[[str], None] | None,
    engine: str = NATIVE,
    on_step: Callable[[StepProgress], None] | None = None,
) -> Result:
    """The SFTTrainer spec finetune_full_stability: run the job `repetitions` times, report outcome fractions.

    The reference registers this loop but never dispatches it (ado-sfttrainer.md §16 #2).
    """
    base = Path(opts.output_dir) if opts.output_dir else _new_output_dir(experiment, entity)
    runs: list[Result] = []
    for i in range(repetitions):
        if progress:
            progress(f"repetition {i + 1}/{repetitions}")
        run_opts = MeasureOptions(**{**vars(opts), "output_dir": str(base / f"run{i}")})
        runs.append(_measure_once(experiment, entity, values, run_opts, None, engine, on_step))
    oom = sum(r.status == "invalid" and not r.reasons[0].startswith(NO_TRAINED_TOKENS) for r in runs)
    ok = sum(r.status == "valid" for r in runs)
    other = repetitions - oom - ok
    rates = [r.properties["dataset_tokens_per_second"] for r in runs if r.status == "valid"]
    meta: dict[str, Any] = {
        "output_dir": str(base),
        "runs": [{"status": r.status, "reasons": r.reasons, "error": r.error} for r in runs],
    }
    if len(rates) > 1:
        mean = sum(rates) / len(rates)
        sd = (sum((x - mean) ** 2 for x in rates) / (len(rates) - 1)) ** 0.5
        meta["dataset_tokens_per_second_cv"] = sd / mean if mean else None
    props = {"f_gpu_oom": oom / repetitions, "f_other_error": other / repetitions, "f_no_error": ok / repetitions}
    return Result.valid(experiment.id, entity.id, props, metadata=meta)


# ------------------------------------------------------------------------ multi-node (Ray executor)


def plan_nodes(
    experiment: Experiment,
    entity: Entity,
    options: Mapping[str, Any],
    main_process_ip: str,
    main_process_port: int,
    engine: str = NATIVE,
) -> LaunchPlan:
    """The launch plan of a multi-node entity, rendezvous at main_process_ip:main_process_port."""
    return build_launch_plan(
        experiment,
        entity,
        data_directory=options.get("data_dir"),
        model_map=options.get("model_map"),
        weights=options.get("weights", "auto"),
        main_process_ip=main_process_ip,
        main_process_port=main_process_port,
        nccl_env=options.get("nccl_env"),
        engine=engine,
    )


def run_node(
    experiment: Experiment,
    entity: Entity,
    options: Mapping[str, Any],
    node_plan: NodePlan,
    output_dir: str,
    main_process_ip: str,
    engine: str = NATIVE,
) -> NodeResult:
    """One node's part, on that node: its own copy of the data set (generated or verified), the engine's
    environment (fms-hf-tuning: built on this node if it has none), then the run."""
    values = effective_values(experiment, entity)
    ensure_dataset(values["dataset_id"], options.get("data_dir"))
    run_env = runtime(engine, values, Path(output_dir), None)
    node_plan = dataclasses.replace(node_plan, env={**node_plan.env, **run_env.env})
    runs_worker = any(m in node_plan.command for m in WORKER_MODULES.values())  # another actuator's may run anything
    gpus = MeasureOptions(visible_devices=options.get("visible_devices"))  # the GPUs Ray gave this node's task
    return run_node_plan(
        node_plan,
        output_dir,
        run_env.python,
        main_process_ip=main_process_ip,
        timeout_s=options.get("timeout_seconds"),
        options=with_gpu_count(gpus, values) if runs_worker else gpus,
    )


def with_host_memory_limit(opts: MeasureOptions, values: dict[str, Any]) -> tuple[MeasureOptions, str | None]:
    """opts with the host memory limit the run gets, and where it comes from.

    Given (> 0): as given; 0: none. Not given, on the CPU (number_gpus = 0): the default of
    tunebench.actuators.memwatch (80% of the smaller of the cgroup's room and MemAvailable at
    launch), so that the worker's own limit is reached before the kernel's OOM killer acts.
    """
    if opts.host_memory_limit_gib is not None:
        return opts, "host_memory_limit_gib" if opts.host_memory_limit_gib > 0 else None
    default = default_host_memory_limit_bytes() if values.get("number_gpus", 0) == 0 else None
    if not default:
        return opts, None
    source = f"default: {DEFAULT_LIMIT_FRACTION:.0%} of the memory available at launch"
    return dataclasses.replace(opts, host_memory_limit_gib=round(default / GIB, 3)), source


def with_gpu_count(opts: MeasureOptions, values: dict[str, Any]) -> MeasureOptions:
    """opts plus the worker flag that makes the per-GPU rates divide by the entity's number_gpus (the
    worker computes the properties; it cannot tell simulated GPUs, or CPU DDP processes, from real ones)."""
    flag = ("--tunebench_number_gpus", str(values["number_gpus"]))
    return dataclasses.replace(opts, extra_worker_args=(*opts.extra_worker_args, *flag))


def collect_nodes(
    experiment: Experiment, entity: Entity, options: Mapping[str, Any], plan: LaunchPlan, nodes: list[NodeResult]
) -> Result:
    """The Result of a multi-node run from every node's exit and rank records (the single-node rules)."""
    failed = [n.returncode for n in nodes if n.returncode]
    tails = "\n".join(f"--- node {n.machine_rank} ({n.host}, exit {n.returncode})\n{n.log_tail[-1500:]}" for n in nodes)
    meta = {
        "nodes": [
            {
                "rank": n.machine_rank,
                "host": n.host,
                "node_ip": n.node_ip,
                "node_id": n.node_id,
                "returncode": n.returncode,
            }
            for n in nodes
        ]
    }
    run = RunOutcome(
        returncode=failed[0] if failed else 0,
        timed_out=any(n.returncode is None for n in nodes),
        ranks=sorted((r for n in nodes for r in n.records), key=lambda r: r.get("rank", 0)),
        aggregate=next((n.aggregate for n in nodes if n.aggregate), None),
        world_size=plan.processes_per_node * plan.number_nodes,
        log_tail=tails,
        metadata=meta,
        memory=next((n.memory for n in nodes if n.returncode and n.memory), None),  # a killed node's view
    )
    return result_of_run(experiment, entity, run, options.get("timeout_seconds"))


def _collect_fms(*args: Any, **kwargs: Any) -> Result:
    return dataclasses.replace(collect_nodes(*args, **kwargs), actuator=FMS)


# The two measuring actuators: tunebench's own worker (the native engine) and fms-hf-tuning's.
MEASURE = Actuator(
    "measure", measure, check_options=MeasureOptions.from_mapping,
    multinode=MultiNode(plan=plan_nodes, run=run_node, collect=collect_nodes, judge=functools.partial(judge, here=False)),
)  # fmt: skip
MEASURE_FMS = Actuator(
    FMS, measure_fms, check_options=MeasureOptions.from_mapping,
    multinode=MultiNode(plan=functools.partial(plan_nodes, engine=FMS), run=functools.partial(run_node, engine=FMS),
                        collect=_collect_fms, judge=functools.partial(judge, engine=FMS, here=False)),
)  # fmt: skip


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _new_output_dir(experiment: Experiment, entity: Entity) -> Path:
    root = home() / "runs"
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"{stamp}-{experiment.method}-", dir=root))
