"""Running one node's part of a launch plan as a subprocess: command, environment, timeout, log.

``node_command`` fills a NodePlan's placeholders and resolves its programs to this interpreter;
``run_logged`` runs it in its own process group (killed as a whole on timeout or interrupt, and
sent SIGTERM if the measuring process dies); ``run_node_plan`` does both for one node and reads the
rank result files the worker wrote. Plain Python, no Ray: the measuring actuator runs its
single-node plans with these, the Ray executor runs each node of a multi-node plan with them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunebench.actuators.launch import MAIN_PROCESS_IP, OUTPUT_DIR, NodePlan
from tunebench.actuators.memwatch import MemoryEvidence, MemoryWatch
from tunebench.actuators.options import MeasureOptions
from tunebench.spec.results import LOG_TAIL_CHARS
from tunebench.units import GIB
from tunebench.worker.progress import StepProgress, parse_step_line
from tunebench.worker.results import read_aggregate, read_rank_results

LOG_TAIL_LINES = 40  # lines of a single-node run's log kept in its Result


@dataclass
class NodeResult:
    """What one node of a launch plan did."""

    machine_rank: int
    returncode: int | None  # None: timed out and killed; negative: the signal that ended it
    duration_s: float
    log_tail: str
    output_dir: str
    host: str = field(default_factory=socket.gethostname)
    node_ip: str | None = None
    node_id: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)  # the worker's rank result files
    aggregate: dict[str, Any] | None = None  # rank 0's result file, on the node that ran rank 0
    memory: MemoryEvidence | None = None  # this node's process tree memory (tunebench.actuators.memwatch)


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
    command += _option_flags(opts)
    env = {**os.environ, **{k: _fill(v, fill) for k, v in node.env.items()}}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    devices = owned_devices(
        node.env.get("CUDA_VISIBLE_DEVICES"), opts.visible_devices, os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    if opts.visible_devices is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the executors number GPUs as NVML does (PCI bus order)
    return command, env


def owned_devices(planned: str | None, assigned: str | None, inherited: str | None) -> str | None:
    """CUDA_VISIBLE_DEVICES of a node's processes: exactly the GPUs the run owns.

    planned: the launch plan's (its node's first GPUs, "" on the CPU, None when another actuator's plan says
    nothing); assigned: the executor's GPUs (local pool, Ray's get_gpu_ids), which win; inherited: this
    process's CUDA_VISIBLE_DEVICES, the GPUs it may use, whose first ones are taken when no executor assigned
    any. A CPU plan keeps "" whatever is assigned. None: leave the variable as inherited. Indices are NVML's
    (PCI bus order: CUDA_DEVICE_ORDER=PCI_BUS_ID), as the executors number them.
    """
    if planned == "":
        return ""
    if assigned is not None:
        return assigned
    if planned is None or inherited is None:
        return planned
    count = len([d for d in planned.split(",") if d.strip()])
    return ",".join([d.strip() for d in inherited.split(",") if d.strip()][:count])


def _option_flags(opts: MeasureOptions) -> list[str]:
    """The worker flags that come from actuator options rather than from the entity."""
    flags: list[str] = []
    if opts.host_memory_limit_gib:
        flags += ["--host_memory_limit_gib", f"{opts.host_memory_limit_gib:g}"]
    if opts.metrics_interval_seconds:
        flags += ["--metrics_interval_seconds", f"{opts.metrics_interval_seconds:g}"]
    if opts.auto_stop_windows_seconds:
        warm, stable, steps = opts.auto_stop_windows_seconds
        flags += ["--auto_stop_warmup_seconds", f"{warm:g}", "--auto_stop_stable_seconds", f"{stable:g}"]
        flags += ["--auto_stop_stable_steps", str(int(steps))]
    return flags + list(opts.extra_worker_args)


def run_logged(
    command: list[str],
    env: dict[str, str],
    log_path: Path,
    timeout: float | None,
    watch: MemoryWatch | None = None,
    on_step: Callable[[StepProgress], None] | None = None,
) -> tuple[int, bool]:
    """Run in a new process group, output to log_path; on timeout kill the whole group.

    watch: samples the process tree's memory from start to exit (the evidence of a kernel OOM kill).
    on_step: called with each step line the worker writes to the log (tunebench.worker.progress), from a
    thread that follows the log while the process runs.
    Returns (returncode, timed_out); a negative returncode is the signal that ended the process.
    """
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,
        )
        if watch is not None:
            watch.start(proc.pid)
        follower = LogFollower(log_path, on_step) if on_step is not None else None
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return proc.returncode, True
        except BaseException:  # KeyboardInterrupt: leave no orphan training processes behind
            _kill_group(proc)
            raise
        finally:
            if watch is not None:
                watch.stop()
            if follower is not None:
                follower.stop()


class LogFollower:
    """Reads a growing log every interval seconds and calls on_step with each worker step line in it."""

    def __init__(self, path: Path, on_step: Callable[[StepProgress], None], interval: float = 0.5):
        self.path, self.on_step, self.interval = path, on_step, interval
        self._offset, self._partial = 0, b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="tunebench-log-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following, after reading what the log holds now (the last steps)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._read()

    def _follow(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            step = parse_step_line(line.decode("utf-8", "replace").rstrip("\r"))
            if step is not None:
                with contextlib.suppress(Exception):  # a display that fails never stops a measurement
                    self.on_step(step)


def run_node_plan(
    node_plan: NodePlan,
    output_dir: str | Path,
    python_executable: str = sys.executable,
    *,
    main_process_ip: str | None = None,
    timeout_s: float | None = None,
    options: MeasureOptions | None = None,
) -> NodeResult:
    """Run one node's part of a launch plan here, as a subprocess; never raises for the child's failures.

    Fills ``{output_dir}`` and ``{main_process_ip}`` in the command, the environment and the
    accelerate config (written to ``output_dir/accelerate_config.yaml``), runs the command with the
    node's environment over this process's (``options``: the worker flags and GPUs of node_command),
    logs to ``output_dir/node<rank>.log`` and reads the
    result files the worker wrote (``tunebench.worker.results``).
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    command, env = node_command(node_plan, out, options, main_process_ip, python_executable)
    log_path = out / f"node{node_plan.machine_rank}.log"
    started = time.monotonic()
    limit = options.host_memory_limit_gib if options else None
    watch = MemoryWatch(int(limit * GIB) if limit else None)
    code, timed_out = run_logged(command, env, log_path, timeout_s, watch)
    return NodeResult(
        machine_rank=node_plan.machine_rank,
        returncode=None if timed_out else code,
        duration_s=time.monotonic() - started,
        log_tail=log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:],
        output_dir=str(out),
        records=read_rank_results(out / "result"),
        aggregate=read_aggregate(out / "result"),
        memory=watch.evidence,
    )


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
    """The last lines of a log file ('' if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _fill(text: str, mapping: dict[str, str]) -> str:
    for key, value in mapping.items():
        text = text.replace(key, value)
    return text
