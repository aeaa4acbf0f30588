"""System metrics of a training run: a sampler thread and the spec's reductions.

The sampler runs in the local-rank-0 training process of each node (ado-sfttrainer.md §7.1) and
takes one sample at start, one every ``interval_s`` seconds (default 1 s; the reference's AIM
tracker used 10 s) and one at stop, so even a sub-second run has two samples. A sample holds:

- per GPU used on this node, through NVML (nvidia-ml-py's ``pynvml``): utilisation % (NVML
  ``utilization.gpu``), memory used/total % and memory used in GiB (NVML, i.e. everything reserved on
  the device including the CUDA context), power in W and power as % of the *enforced* power limit;
- ``cpu_percent``: CPU use of the training process *and its child processes* (dataloader workers,
  compile workers) over the interval since the previous sample, 100 = one core (can exceed 100);
  its time-average is Σ CPU seconds / Σ interval seconds.
  Other ranks' processes are not included (each rank is its own process, as in the reference;
  the SFTTrainer spec note 2 "the sft_trainer.py process"). The start sample has no CPU value (no interval);
- ``other_cpu_percent``: CPU use of every *other* process on the node over the same interval (the node's
  busy CPU time, psutil ``cpu_times``, less the training process tree's), 100 = one core: a CPU run's
  timings are only its own where this stays near 0 (docs/engines.md, "A busy host");
- ``node_memory_percent``: the whole node's RAM in use (psutil ``virtual_memory().percent``, AIM's
  ``__system__memory_percent``); ``process_rss_gib``: the training process tree's resident memory.

Without NVML (no driver, no GPU, package absent) the GPU series are empty and nothing fails.

Reductions (the SFTTrainer spec notes 1-2, ado-sfttrainer.md §7.2): each series is reduced to its time-average
(the mean of its samples, which are evenly spaced but for the final stop sample); GPU properties
are then the min / mean / max **across GPUs** of each GPU's time-average, and
``gpu_memory_utilization_peak`` the max over GPUs of each GPU's largest sample. All GPU properties
are 0.0 when no GPU is used. Samples taken inside an auto-stop warm-up window are dropped from the
reductions; the summary keeps every sample (``samples``) for the run's time series (tunebench.worker.series).

This module imports neither torch nor pynvml at import time.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tunebench.units import GIB
from tunebench.worker.proctree import ProcessTree

GPU_SERIES = (
    "compute_utilization",
    "memory_utilization",
    "power_watts",
    "power_percent",
)  # the SFTTrainer spec gpu_<X>


@dataclass
class GpuSample:
    """One GPU at one instant. None where NVML does not report the value (e.g. MIG, no power sensor)."""

    id: str
    compute_utilization: float | None = None  # %
    memory_utilization: float | None = None  # % of total device memory in use
    power_watts: float | None = None  # W
    power_percent: float | None = None  # % of the enforced power limit
    memory_used_gib: float | None = None  # GiB of device memory in use (NVML memory info "used")


@dataclass
class Sample:
    t: float  # time.monotonic() seconds
    wall: float  # time.time() seconds since the epoch
    cpu_percent: float | None  # process tree CPU % over the previous interval (100 = one core)
    node_memory_percent: float  # %
    process_rss_gib: float  # GiB
    gpus: list[GpuSample] = field(default_factory=list)
    cpu_seconds: float | None = None  # process tree CPU time used in the previous interval (s)
    interval_s: float | None = None  # length of the previous interval (s)
    other_cpu_seconds: float | None = None  # CPU time other processes of the node used in that interval (s)


# ---------------------------------------------------------------------------------------------- NVML


def load_nvml() -> Any | None:
    """The initialised pynvml module, or None when NVML is unavailable (no package, driver or GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return None


def _nvml_handle(nvml: Any, gpu_id: str) -> Any | None:
    """NVML handle of a GPU given as an NVML index ('0') or a UUID, with or without its 'GPU-'/'MIG-' prefix."""
    if gpu_id.isdigit():
        try:
            return nvml.nvmlDeviceGetHandleByIndex(int(gpu_id))
        except Exception:
            return None
    bare = gpu_id.split("-", 1)[1] if gpu_id.startswith(("GPU-", "MIG-")) else gpu_id
    for candidate in dict.fromkeys((gpu_id, f"GPU-{bare}", f"MIG-{bare}")):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(candidate)
        except Exception:
            continue
    return None


def _try(fn: Callable[[], float]) -> float | None:
    try:
        return float(fn())
    except Exception:
        return None


def read_gpu(nvml: Any, handle: Any, gpu_id: str) -> GpuSample:
    """One NVML reading of a GPU; unsupported queries give None."""
    util = _try(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    def mem_percent() -> float:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return 100.0 * info.used / info.total

    watts = _try(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # NVML reports mW
    limit = _try(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)  # mW
    percent = 100.0 * watts / limit if watts is not None and limit else None
    used = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / GIB)  # NVML reports bytes
    return GpuSample(gpu_id, util, _try(mem_percent), watts, percent, used)


def gpu_names(nvml: Any | None, gpu_ids: Sequence[str]) -> dict[str, str]:
    """NVML product name of each GPU id (empty without NVML)."""
    out: dict[str, str] = {}
    if nvml is None:
        return out
    for gid in gpu_ids:
        handle = _nvml_handle(nvml, gid)
        if handle is not None:
            name = _try_str(lambda: nvml.nvmlDeviceGetName(handle))
            if name:
                out[gid] = name
    return out


def _try_str(fn: Callable[[], Any]) -> str | None:
    try:
        value = fn()
        return value.decode() if isinstance(value, bytes) else str(value)
    except Exception:
        return None


def cuda_gpu_ids(count: int) -> list[str]:
    """NVML ids of CUDA devices 0..count-1 of this process (local rank i uses device i).

    UUIDs from torch (robust to CUDA_VISIBLE_DEVICES and to CUDA vs NVML ordering; the sampler adds
    the 'GPU-'/'MIG-' prefix NVML wants), else the entries of CUDA_VISIBLE_DEVICES, else the indices.
    """
    try:
        import torch

        return [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
    except Exception:
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        return visible[:count] if len(visible) >= count else [str(i) for i in range(count)]


def torch_peak_memory_gib() -> dict[str, float] | None:
    """torch.cuda.max_memory_allocated / max_memory_reserved of this process's device, in GiB; None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return {
            "max_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
            "max_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
        }
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------- sampler


class _ProcessTreeCpu:
    """CPU time and resident memory of a process and its live children (dataloader workers, ...)."""

    def __init__(self, pid: int):
        self.tree = ProcessTree(pid)
        self.last_t = time.monotonic()
        self.last: dict[int, float] = self.tree.cpu_seconds()

    def rss_bytes(self) -> int:
        return self.tree.rss_bytes()

    def interval(self) -> tuple[float, float]:
        """(CPU seconds used, wall seconds elapsed) since the previous call."""
        now, times = time.monotonic(), self.tree.cpu_seconds()
        used = sum(t - self.last.get(pid, 0.0) for pid, t in times.items())
        elapsed = now - self.last_t
        self.last, self.last_t = times, now
        return max(used, 0.0), elapsed


def node_busy_seconds(cpus: Iterable[int] | None = None) -> float:
    """CPU seconds the given CPUs (default: every CPU) have been busy since boot: all of their times but idle
    and iowait, less guest time, which Linux also counts in user and nice (psutil's cpu_percent does the
    same: _cpu_busy_time)."""
    chosen = None if cpus is None else set(cpus)
    return sum(busy for cpu, busy in _busy_by_cpu().items() if chosen is None or cpu in chosen)


def _busy_by_cpu() -> dict[int, float]:
    """Busy CPU seconds by CPU number. Read from /proc/stat's cpuN lines on Linux, keyed by N: psutil's
    per-CPU list leaves offline CPUs out, so its positions are not CPU numbers (psutil _pslinux
    per_cpu_times); elsewhere psutil's list, by position."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        tick = float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):
        return {i: _busy(tuple(t), t.idle, getattr(t, "iowait", 0.0)) for i, t in enumerate(psutil.cpu_times(True))}
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            # user nice system idle iowait irq softirq steal guest guest_nice (proc(5)), in clock ticks
            v = [int(x) / tick for x in fields[:10]] + [0.0] * (10 - len(fields[:10]))
            out[int(name[3:])] = _busy(tuple(v), v[3], v[4])
    return out


def _busy(times: tuple[float, ...], idle: float, iowait: float) -> float:
    """Busy seconds of one CPU from all its times (guest and guest_nice last, as psutil and proc(5) list them)."""
    guest = times[8:10] if len(times) >= 10 else ()
    return sum(times) - sum(guest) - idle - iowait


def allowed_cpus() -> set[int] | None:
    """The CPUs this process may run on (Linux sched_getaffinity), None where the platform does not say."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def cpu_quota() -> float | None:
    """CPUs the process's cgroup may use in time (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cfs_period_us), None
    without a quota. Under a quota and no cpuset (a Kubernetes pod's default) the allowed CPUs are the whole
    node's and other pods' load on them is no contention of the run's own cores."""
    for quota_file, period_file in (
        ("/sys/fs/cgroup/cpu.max", None),
        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    ):
        try:
            text = Path(quota_file).read_text().split()
            quota, period = (text[0], text[1]) if period_file is None else (text[0], Path(period_file).read_text())
            if quota not in ("max", "-1"):
                return int(quota) / int(period)
        except (OSError, ValueError, IndexError):
            continue
    return None


class MetricsSampler:
    """Background sampler thread: ``start()``, ``stop()``, then ``samples`` / ``summary()``.

    gpu_ids: NVML ids (UUIDs or indices) of the GPUs this node's ranks use; empty for CPU runs.
    nvml: an initialised pynvml-like module (tests pass a fake); default ``load_nvml()`` when gpu_ids.
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        gpu_ids: Sequence[str] = (),
        pid: int | None = None,
        nvml: Any | None = None,
        ranks_root: int | None = None,
    ):
        self.interval_s = max(float(interval_s), 0.01)
        self.gpu_ids = list(gpu_ids)
        self.nvml = nvml if nvml is not None else (load_nvml() if self.gpu_ids else None)
        self.handles = {gid: _nvml_handle(self.nvml, gid) for gid in self.gpu_ids} if self.nvml else {}
        self.cpu = _ProcessTreeCpu(pid or os.getpid())
        # whose CPU time is the run's own, not other processes': the tree of ranks_root (the launcher of a
        # node's several ranks, siblings of this one), else this process's tree
        self.ours = self.cpu if ranks_root in (None, pid or os.getpid()) else _ProcessTreeCpu(ranks_root)
        self.cpus = allowed_cpus()  # read once: one set of CPUs for every interval
        self.node_busy = node_busy_seconds(self.cpus)
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, with_cpu: bool = True) -> Sample:
        """Take one sample now and append it."""
        gpus = [read_gpu(self.nvml, h, gid) for gid, h in self.handles.items() if h is not None]
        used, elapsed = self.cpu.interval()
        ours = used if self.ours is self.cpu else self.ours.interval()[0]
        busy, self.node_busy = self.node_busy, node_busy_seconds(self.cpus)
        with_cpu = with_cpu and elapsed > 0
        s = Sample(
            t=time.monotonic(),
            wall=time.time(),
            cpu_percent=100.0 * used / elapsed if with_cpu else None,
            node_memory_percent=psutil.virtual_memory().percent,
            process_rss_gib=self.cpu.rss_bytes() / GIB,
            gpus=gpus,
            cpu_seconds=used if with_cpu else None,
            interval_s=elapsed if with_cpu else None,
            other_cpu_seconds=max(self.node_busy - busy - ours, 0.0) if with_cpu else None,
        )
        with self._lock:
            self.samples.append(s)
        return s

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # a failed reading must never take the training process down
                continue

    def start(self) -> MetricsSampler:
        self.sample(with_cpu=False)  # the start sample: no interval to attribute CPU time to
        self._thread = threading.Thread(target=self._loop, name="tunebench-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._thread = None
        try:
            self.sample()  # the stop sample
        except Exception:
            pass

    def summary(self, drop_before: float | None = None) -> dict[str, Any]:
        with self._lock:
            samples = list(self.samples)
        return summarize(samples, drop_before=drop_before, interval_s=self.interval_s)


# ---------------------------------------------------------------------------------------------- reductions


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _max(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _cpu_average(samples: Sequence[Sample]) -> float | None:
    """Time-average CPU %: 100 x Σ CPU seconds / Σ interval seconds (exact for uneven intervals, and not
    fooled by the 10 ms tick of /proc CPU times on a short final interval); plain mean of cpu_percent
    for samples without interval data."""
    timed = [s for s in samples if s.cpu_seconds is not None and s.interval_s]
    if timed:
        return 100.0 * sum(s.cpu_seconds for s in timed) / sum(s.interval_s for s in timed)
    return _mean(s.cpu_percent for s in samples)


def _other_cpu_average(samples: Sequence[Sample]) -> float | None:
    """Time-average CPU % of the node's other processes (100 = one core), as _cpu_average; None if unsampled."""
    timed = [s for s in samples if s.other_cpu_seconds is not None and s.interval_s]
    return 100.0 * sum(s.other_cpu_seconds for s in timed) / sum(s.interval_s for s in timed) if timed else None


def summarize(samples: Sequence[Sample], drop_before: float | None = None, interval_s: float | None = None) -> dict:
    """Per-node summary of samples: time-averages (and maxima) per series, per GPU, and every sample.

    drop_before: monotonic time of the end of the auto-stop warm-up; earlier samples are left out of
    the reductions (the stop sample always remains, so they are never empty) but kept in ``samples``.
    """
    kept = [s for s in samples if drop_before is None or s.t >= drop_before]
    if not kept and samples:
        kept = [samples[-1]]
    gpus: dict[str, list[GpuSample]] = {}
    for s in kept:
        for g in s.gpus:
            gpus.setdefault(g.id, []).append(g)
    per_gpu = []
    for gid, series in gpus.items():
        entry: dict[str, Any] = {"id": gid, "n_samples": len(series)}
        for name in GPU_SERIES:
            entry[f"{name}_avg"] = _mean(getattr(g, name) for g in series)
            entry[f"{name}_max"] = _max(getattr(g, name) for g in series)
        per_gpu.append(entry)
    return {
        "host": socket.gethostname(),
        "interval_s": interval_s,
        "n_samples": len(kept),
        "n_dropped_warmup": len(samples) - len(kept),
        "cpu_compute_utilization": _cpu_average(kept),  # process tree, 100 = one core
        "other_cpu_percent": _other_cpu_average(kept),  # the node's other processes, 100 = one core
        "cpu_count": len(allowed_cpus() or ()) or psutil.cpu_count(),  # logical CPUs this process may use
        "cpu_quota": cpu_quota(),  # CPUs of the cgroup's time quota, None without one
        "cpu_memory_utilization": _mean(s.node_memory_percent for s in kept),  # node RAM %
        "process_rss_gib_max": _max(s.process_rss_gib for s in kept),
        "gpus": per_gpu,
        "warmup_end": drop_before,  # monotonic s; None: no warm-up dropped
        "samples": [asdict(s) for s in samples],  # every sample, warm-up included (the run's time series)
    }


def gpu_properties(per_gpu: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The SFTTrainer spec GPU properties from per-GPU summaries (``summarize()["gpus"]`` of every node).

    gpu_<X>_{min,avg,max}: min / mean / max across GPUs of each GPU's time-average (note 1);
    gpu_memory_utilization_peak: max over GPUs of each GPU's largest memory sample. 0.0 without GPUs.
    """
    props: dict[str, float] = {}
    for name in GPU_SERIES:
        avgs = [g[f"{name}_avg"] for g in per_gpu if g.get(f"{name}_avg") is not None]
        props[f"gpu_{name}_min"] = min(avgs) if avgs else 0.0
        props[f"gpu_{name}_avg"] = statistics.fmean(avgs) if avgs else 0.0
        props[f"gpu_{name}_max"] = max(avgs) if avgs else 0.0
    peaks = [g["memory_utilization_max"] for g in per_gpu if g.get("memory_utilization_max") is not None]
    props["gpu_memory_utilization_peak"] = max(peaks) if peaks else 0.0
    return props


def cpu_properties(node_summaries: Sequence[dict[str, Any]]) -> dict[str, float]:
    """cpu_compute_utilization / cpu_memory_utilization: time-averages, averaged over nodes (note 2)."""
    cpu = [s["cpu_compute_utilization"] for s in node_summaries if s.get("cpu_compute_utilization") is not None]
    mem = [s["cpu_memory_utilization"] for s in node_summaries if s.get("cpu_memory_utilization") is not None]
    return {
        "cpu_compute_utilization": statistics.fmean(cpu) if cpu else 0.0,
        "cpu_memory_utilization": statistics.fmean(mem) if mem else 0.0,
    }
