"""The measuring actuator: train for real, return spec 004's measured properties as a Result.

``measure(experiment, entity, options)`` checks validity, makes sure the data set exists, builds the
launch plan (tunebench.launch), runs it as a subprocess in its own process group with a timeout,
reads the rank result files the worker writes (tunebench.worker) and classifies the outcome:

- valid: every rank succeeded -> is_valid = 1 and every property;
- invalid: a validity rule is broken (nothing runs), or any rank ran out of memory (GPU, or the host
  memory limit on the CPU) -> is_valid = 0 with the reason;
- failed: anything else (an exception, a crash, a signal, a timeout, missing rank files) -> no
  properties; the error and the log tail are kept; failed measurements can be retried.

The stability experiment runs its job ``repetitions`` times and reports the fractions (spec 004).
Multi-node plans need one process per machine: the Ray executor runs those (tunebench.executors).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tunebench.datasets import ensure_dataset
from tunebench.spec.experiments import Entity, Experiment, effective_values
from tunebench.launch import MAIN_PROCESS_IP, OUTPUT_DIR, NodePlan, build_launch_plan
from tunebench.paths import home
from tunebench.spec.results import Result
from tunebench.spec.validity import check_values
from tunebench.worker import outcome, properties_from_results, read_rank_results

LOG_TAIL_LINES = 40


@dataclass
class MeasureOptions:
    """Actuator options (a space file's `actuator:` block, or CLI flags).

    weights: auto | pretrained | random (random builds the architecture, no download).
    timeout_seconds: wall-clock limit of one run, process start to exit; None = no limit.
    visible_devices: CUDA_VISIBLE_DEVICES for the run (the executor's GPU assignment).
    cpu_processes: DDP processes (gloo) for a CPU entity (number_gpus = 0); 1 = one process.
    host_memory_limit_gib: CPU runs: exceeding it is out of memory (is_valid = 0).
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

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> MeasureOptions:
        from tunebench.errors import InputError

        options = dict(options or {})
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            allowed = ", ".join(cls.__dataclass_fields__)
            raise InputError(f"actuator.{sorted(unknown)[0]}", "unknown actuator option", allowed=allowed)
        return cls(**options)


def measure(
    experiment: Experiment,
    entity: Entity,
    options: Mapping[str, Any] | MeasureOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> Result:
    """Measure one entity; never raises for a run that goes wrong (that is a failed Result)."""
    opts = options if isinstance(options, MeasureOptions) else MeasureOptions.from_mapping(options)
    values = effective_values(experiment, entity)
    validity = check_values(values, single_node_only=experiment.single_node_only)
    if not validity.is_valid:
        return Result.invalid(experiment.id, entity.id, validity.reasons)
    if values.get("number_nodes", 1) > 1:
        return Result.failed(
            experiment.id, entity.id, "number_nodes > 1 needs one process per machine: use the ray executor"
        )
    if "repetitions" in experiment.hardcoded:
        return _measure_stability(experiment, entity, values, opts, int(experiment.hardcoded["repetitions"]), progress)
    return _measure_once(experiment, entity, values, opts, progress)


def _measure_once(
    experiment: Experiment,
    entity: Entity,
    values: dict[str, Any],
    opts: MeasureOptions,
    progress: Callable[[str], None] | None,
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
        plan = build_launch_plan(
            experiment,
            entity,
            data_directory=opts.data_dir,
            model_map=opts.model_map,
            weights=opts.weights,
            main_process_ip="127.0.0.1",
            main_process_port=_free_port(),
            cpu_processes=opts.cpu_processes,
        )
    except Exception as exc:  # a data set or plan that cannot be made is a failed measurement
        return Result.failed(experiment.id, entity.id, f"{type(exc).__name__}: {exc}", metadata=meta)

    (node,) = plan.nodes
    command, env = node_command(node, out_dir, opts)
    meta["command"] = command
    log_path = out_dir / "worker.log"
    if progress:
        progress("training")
    returncode, timed_out = run_logged(command, env, log_path, opts.timeout_seconds)
    meta["wall_seconds"] = round(time.time() - started, 3)
    log_tail = tail(log_path)

    result_path = out_dir / "result"
    ranks = read_rank_results(result_path)
    world = plan.processes_per_node * plan.number_nodes
    if timed_out:
        return Result.failed(
            experiment.id, entity.id, f"timeout: the run exceeded {opts.timeout_seconds:g} s and was killed",
            log_tail=log_tail, metadata=meta,
        )  # fmt: skip
    status, reason = outcome(ranks, world_size=world)
    if ranks:
        meta.update(_run_metadata(ranks))
    if status == "invalid":
        return Result.invalid(experiment.id, entity.id, [reason or "out of memory"], metadata=meta, log_tail=log_tail)
    if status == "valid" and returncode != 0:
        status, reason = "failed", f"worker exited with code {returncode} after writing its results"
    if status == "failed":
        if returncode < 0:
            reason = f"worker killed by signal {signal.Signals(-returncode).name}" + (f" ({reason})" if ranks else "")
        elif not ranks:
            reason = f"worker exited with code {returncode} and wrote no result"
        return Result.failed(experiment.id, entity.id, reason or "unknown failure", log_tail=log_tail, metadata=meta)
    try:
        props = properties_from_results(
            ranks, values["number_gpus"], values.get("stop_after_seconds", -1.0), values.get("auto_stop_method")
        )
    except ValueError as exc:
        return Result.failed(experiment.id, entity.id, str(exc), log_tail=log_tail, metadata=meta)
    return Result.valid(experiment.id, entity.id, props, metadata=meta)


def _measure_stability(
    experiment: Experiment,
    entity: Entity,
    values: dict[str, Any],
    opts: MeasureOptions,
    repetitions: int,
    progress: Callable[[str], None] | None,
) -> Result:
    """spec 004 finetune_full_stability: run the job `repetitions` times, report outcome fractions.

    The reference registers this loop but never dispatches it (ado-sfttrainer.md §16 #2).
    """
    base = Path(opts.output_dir) if opts.output_dir else _new_output_dir(experiment, entity)
    runs: list[Result] = []
    for i in range(repetitions):
        if progress:
            progress(f"repetition {i + 1}/{repetitions}")
        run_opts = MeasureOptions(**{**vars(opts), "output_dir": str(base / f"run{i}")})
        runs.append(_measure_once(experiment, entity, values, run_opts, None))
    oom = sum(r.status == "invalid" for r in runs)
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


def node_command(
    node: NodePlan,
    out_dir: Path,
    opts: MeasureOptions | None = None,
    main_process_ip: str | None = None,
    python_executable: str = sys.executable,
) -> tuple[list[str], dict[str, str]]:
    """A node's command and environment with placeholders filled, programs resolved to this interpreter
    and the accelerate config written to its --config_file path."""
    opts = opts or MeasureOptions()
    fill = {OUTPUT_DIR: str(out_dir)}
    if main_process_ip:
        fill[MAIN_PROCESS_IP] = main_process_ip
    command = [_fill(a, fill) for a in node.command]
    if node.accelerate_config is not None:
        cfg = {k: _fill(v, fill) if isinstance(v, str) else v for k, v in node.accelerate_config.items()}
        path = command[command.index("--config_file") + 1] if "--config_file" in command else None
        Path(path or out_dir / "accelerate_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    if command[0] == "python":
        command = [python_executable, *command[1:]]
    elif command[:2] == ["accelerate", "launch"]:
        command = [python_executable, "-m", "accelerate.commands.launch", *command[2:]]
    if opts.host_memory_limit_gib:
        command += ["--host_memory_limit_gib", f"{opts.host_memory_limit_gib:g}"]
    if opts.metrics_interval_seconds:
        command += ["--metrics_interval_seconds", f"{opts.metrics_interval_seconds:g}"]
    if opts.auto_stop_windows_seconds:
        warm, stable, steps = opts.auto_stop_windows_seconds
        command += ["--auto_stop_warmup_seconds", f"{warm:g}", "--auto_stop_stable_seconds", f"{stable:g}"]
        command += ["--auto_stop_stable_steps", str(int(steps))]
    command += list(opts.extra_worker_args)
    env = {**os.environ, **{k: _fill(v, fill) for k, v in node.env.items()}}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if opts.visible_devices is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the executor numbers GPUs as NVML does (PCI bus order)
        env["CUDA_VISIBLE_DEVICES"] = opts.visible_devices
    return command, env


def run_logged(command: list[str], env: dict[str, str], log_path: Path, timeout: float | None) -> tuple[int, bool]:
    """Run in a new process group, output to log_path; on timeout kill the whole group.

    Returns (returncode, timed_out); a negative returncode is the signal that ended the process.
    """
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_terminate_with_parent,
        )  # fmt: skip
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return proc.returncode, True
        except BaseException:  # KeyboardInterrupt: leave no orphan training processes behind
            _kill_group(proc)
            raise


def _terminate_with_parent() -> None:
    """In the child: SIGTERM when the measuring process dies (even by kill -9), so no training runs on
    orphaned (the worker writes a failed result on SIGTERM; accelerate's launcher stops its ranks).
    Linux prctl(PR_SET_PDEATHSIG); elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _kill_group(proc: subprocess.Popen, grace_seconds: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_seconds)
            return
        except subprocess.TimeoutExpired:
            continue


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _run_metadata(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    r0 = min(ranks, key=lambda r: r.get("rank", 0))
    meta = dict(r0.get("metadata") or {})
    steps = r0.get("steps") or {}
    meta.update(
        {
            "world_size": r0.get("world_size"),
            "steps": steps.get("total"),
            "warmup_steps": steps.get("warmup"),
            "stopped_by": steps.get("stopped_by"),
            "torch_memory": [r.get("torch_memory") for r in ranks],
        }
    )
    return meta


def _fill(text: str, mapping: dict[str, str]) -> str:
    for key, value in mapping.items():
        text = text.replace(key, value)
    return text


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _new_output_dir(experiment: Experiment, entity: Entity) -> Path:
    root = home() / "runs"
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"{stamp}-{experiment.method}-", dir=root))
