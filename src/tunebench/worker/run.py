"""The training worker's entry point: one measured run in this process (one rank of it under torchrun).

``main`` parses the command line once (tunebench.worker.args.WorkerConfig), runs the steps of
tunebench.worker.train (set_up -> load -> fit -> finish) under the host-memory watchdog and a
SIGTERM handler, and writes this rank's result file (+ rank 0's aggregate with the properties).
Any exception becomes a result with status ``oom`` or ``error`` (results.classify_exception).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunebench.worker.args import ArgsError, WorkerConfig, args_record, parse_args, result_path_from_argv
from tunebench.worker.hostmem import GIB, HostMemoryWatchdog
from tunebench.worker.results import (
    AGGREGATE_SCHEMA,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OOM,
    SCHEMA,
    classify_exception,
    properties_from_results,
    rank_file,
    trained_tokens,
    write_json,
)

if TYPE_CHECKING:
    from tunebench.worker.train import Meters

TRACEBACK_LINES = 40  # lines of traceback kept in a failed result


class WorkerTerminated(BaseException):
    """SIGTERM/SIGINT received (the launcher stops the other ranks when one fails, or a timeout)."""


def _dist_env() -> dict[str, int]:
    """Rank layout from torchrun/accelerate's environment (single process: rank 0 of 1)."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    return {
        "rank": int(env.get("RANK", "0")),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "world_size": world,
        "local_world_size": int(env.get("LOCAL_WORLD_SIZE", str(world))),
        "node_rank": int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
    }


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "peft", "trl", "accelerate", "tokenizers", "bitsandbytes", "flash-attn"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _failure_fields(exc: BaseException, status: str, reason: str) -> dict[str, Any]:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    lines = "".join(tb).rstrip().splitlines()
    return {
        "status": status,
        "reason": reason,
        "exception": {
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc)[:4000],
            "traceback_tail": "\n".join(lines[-TRACEBACK_LINES:]),
        },
    }


@dataclass
class RunState:
    """How far the run got: what a failure's bookkeeping still needs (the meters, once they exist)."""

    meters: Meters | None = None


def train(config: WorkerConfig, record: dict[str, Any], env: dict[str, int], state: RunState) -> None:
    """The steps of one measured run, each one's result put in ``record`` (status is set by the caller)."""
    from tunebench.training.model import cuda_available
    from tunebench.worker import train as steps

    meta = record["metadata"]
    record["phase"] = "setup"
    on_gpu = cuda_available(config.use_cpu)
    meta["device"] = "cuda" if on_gpu else "cpu"
    meta["engine"] = {"name": "native"}  # tunebench's worker (tunebench.engines)
    refused = steps.fms_acceleration(config)
    if refused:
        raise NotImplementedError(refused)
    setup = steps.set_up(config, on_gpu)
    if setup.precision_note is not None:
        meta["precision_note"] = setup.precision_note
    record["phase"] = "load"
    loaded = steps.load(setup, env["rank"])
    record["data"] = loaded.data
    meta.update(loaded.metadata)
    record["phase"] = "train"
    training_args = steps.build_training_args(setup.config, setup.output_dir, on_gpu)
    state.meters = steps.start_meters(setup.config, training_args.device, on_gpu, env)
    if state.meters.gpus is not None:
        meta["gpus"] = state.meters.gpus
    meta["padding_free"] = bool(config.padding_free)  # micro-batches flattened into one row (training.data)
    meta.update(steps.fit(loaded, state.meters, training_args, padding_free=bool(config.padding_free)))
    record["phase"] = "finish"
    record.update(steps.finish(state.meters))
    meta["train_begin"] = state.meters.meter.begin_wall
    meta["train_end"] = state.meters.meter.end_wall


def _gather(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's record, on every rank (world size 1: just this one)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [record]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, record)
    return out


def _new_record(env: dict[str, int], argv: list[str]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "status": "error",
        "reason": None,
        "exception": None,
        "phase": "parse",
        **{k: env[k] for k in ("rank", "local_rank", "world_size", "local_world_size", "node_rank")},
        "argv": argv,
        "metadata": {"host": socket.gethostname(), "pid": os.getpid(), "versions": _versions()},
    }


def _install_term_handler() -> dict[int, Any]:
    previous = {}
    if threading.current_thread() is not threading.main_thread():
        return previous

    def handler(signum, frame):
        raise WorkerTerminated(f"terminated by signal {signal.Signals(signum).name} (timeout, or another rank failed)")

    for sig in (signal.SIGTERM,):
        previous[sig] = signal.signal(sig, handler)
    return previous


TrainFn = Callable[[WorkerConfig, dict[str, Any], dict[str, int], RunState], None]


def main(argv: list[str] | None = None, train_fn: TrainFn = train) -> int:
    """Run the worker; returns the exit code (0 ok, 1 error, 3 out of memory).

    train_fn runs the steps and fills the record: ``train`` (the native engine) or another engine's
    (tunebench.engines.fms_worker.train_fms); parsing, the watchdog and the result files are shared.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # Never reach the network during a measurement (weights/tokenizers come from disk or the cache).
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no fork warnings from the Rust pool
    # transformers' own Trainer still calls the deprecated is_gradient_checkpointing (5.23): noise only.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*deprecated", category=FutureWarning)
    env = _dist_env()
    record = _new_record(env, argv)
    try:
        config, unknown = parse_args(argv)
    except (ArgsError, ValueError) as exc:
        record.update(_failure_fields(exc, "error", f"bad command line: {exc}"))
        path = result_path_from_argv(argv)
        if path:
            write_json(rank_file(path, env["rank"]), record)
        print(f"tunebench.worker: {record['reason']}", file=sys.stderr)
        return EXIT_ERROR
    record["args"] = args_record(config)
    record["unknown_args"] = unknown
    previous_handlers = _install_term_handler()
    try:
        _run_guarded(config, record, env, train_fn)
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    return _write_results(config, record, env)


def _run_guarded(config: WorkerConfig, record: dict[str, Any], env: dict[str, int], train_fn: TrainFn) -> None:
    """train() under the host-memory watchdog; any failure is classified into the record, never raised."""
    watchdog, state = None, RunState()
    with ExitStack() as stack:
        try:
            if config.host_memory_limit_gib and config.host_memory_limit_gib > 0:
                if threading.current_thread() is not threading.main_thread():
                    raise RuntimeError("--host_memory_limit_gib needs the worker in the main thread (signals)")
                limit = config.host_memory_limit_gib * GIB / max(1, env["local_world_size"])
                watchdog = stack.enter_context(HostMemoryWatchdog(int(limit)))
            train_fn(config, record, env, state)
            record.update(status="ok", reason=None)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a result
            if watchdog is not None:
                watchdog.disarm()
            on_cpu = record["metadata"].get("device", "cpu") == "cpu"
            status, reason = classify_exception(exc, watchdog.exceeded if watchdog else None, on_cpu)
            record.update(_failure_fields(exc, status, reason))
        finally:
            if watchdog is not None:
                watchdog.disarm()  # nothing may raise into the bookkeeping below
            if record["status"] != "ok":
                _record_partial(record, state)
    if watchdog is not None:
        record["host_memory"] = {
            "limit_gib": config.host_memory_limit_gib,
            "per_process_limit_gib": watchdog.limit_bytes / GIB,
            "peak_rss_gib": watchdog.peak_rss_bytes / GIB,
        }
        if watchdog.exceeded and record["status"] == "ok":  # swallowed somewhere: still out of memory
            record.update(status="oom", reason=watchdog.exceeded)


def _record_partial(record: dict[str, Any], state: RunState) -> None:
    """What a failed run measured before it failed: system metrics, step durations, the memory peak."""
    meters = state.meters
    if meters is not None and meters.sampler is not None:
        meters.sampler.stop()
        record["system"] = meters.sampler.summary()
    if meters is not None:
        meter = meters.meter
        record["steps"] = {
            "total": len(meter.durations),
            "durations_s": meter.durations,
            "end_monotonic": meter.step_end_times,
            "log": meter.log,
        }
    if "torch" in sys.modules:
        from tunebench.worker.metrics import torch_peak_memory_gib

        record["torch_memory"] = torch_peak_memory_gib()  # the peak reached before an OOM


def _write_results(config: WorkerConfig, record: dict[str, Any], env: dict[str, int]) -> int:
    """This rank's result file; on rank 0 of a successful run also the aggregate with the properties
    (computed here, once: the measuring actuator reads them from it)."""
    aggregate = None
    if record["status"] == "ok":
        try:
            ranks = _gather(record)
            if env["rank"] == 0:
                number_gpus = config.tunebench_number_gpus
                if number_gpus < 0:
                    number_gpus = env["world_size"] if record["metadata"].get("device") == "cuda" else 0
                props = properties_from_results(ranks, number_gpus, config.stop_after_seconds, config.auto_stop_method)
                aggregate = {
                    "schema": AGGREGATE_SCHEMA,
                    "status": "ok",
                    "number_gpus": number_gpus,
                    "properties": props,
                    "trained_tokens": trained_tokens(ranks),
                    "ranks": ranks,
                }
        except Exception as exc:  # noqa: BLE001
            status, reason = "error", f"aggregating results failed: {type(exc).__name__}: {exc}"
            record.update(_failure_fields(exc, status, reason))
    if config.result_path:
        write_json(rank_file(config.result_path, env["rank"]), record)
        if aggregate is not None:
            write_json(config.result_path, aggregate)
    if env["rank"] == 0:
        summary = {"status": record["status"], "reason": record.get("reason")}
        if aggregate:
            summary["properties"] = aggregate["properties"]
        print("TUNEBENCH_RESULT " + json.dumps(summary), flush=True)
    if record["status"] == "ok":
        _shutdown_dist()  # a failed rank just exits: its peers may be gone or stuck in a collective
    return {"ok": EXIT_OK, "oom": EXIT_OOM}.get(record["status"], EXIT_ERROR)


def _shutdown_dist() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
