"""The metrics sampler and the spec's reductions (tunebench.worker.metrics)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from tunebench.worker.metrics import (
    GpuSample,
    MetricsSampler,
    Sample,
    cpu_properties,
    gpu_properties,
    load_nvml,
    summarize,
)


class FakeNvml:
    """The pynvml calls the sampler makes, for two GPUs with fixed readings."""

    READINGS = {  # id -> (util %, used GiB, total GiB, power mW, enforced limit mW)
        "GPU-aaaa": (90, 40, 80, 350_000, 700_000),
        "1": (30, 10, 80, 100_000, 400_000),
    }

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.READINGS:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    def nvmlDeviceGetHandleByIndex(self, index):
        return str(index)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.READINGS[h][0])

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.READINGS[h][1], total=self.READINGS[h][2])

    def nvmlDeviceGetPowerUsage(self, h):
        return self.READINGS[h][3]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        if h == "1":
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # e.g. no power sensor: value None, no crash
        return self.READINGS[h][4]


def test_sampler_reads_every_gpu_and_samples_at_start_interval_and_stop():
    sampler = MetricsSampler(interval_s=0.05, gpu_ids=["GPU-aaaa", "1", "GPU-missing"], nvml=FakeNvml())
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    samples = sampler.samples
    assert len(samples) >= 4  # start + a few intervals + stop
    assert samples[0].cpu_percent is None and samples[-1].cpu_percent is not None
    assert all(len(s.gpus) == 2 for s in samples)  # the unknown GPU is skipped
    summary = sampler.summary()
    by_id = {g["id"]: g for g in summary["gpus"]}
    a, b = by_id["GPU-aaaa"], by_id["1"]
    assert a["compute_utilization_avg"] == 90 and a["memory_utilization_avg"] == 50.0
    assert a["power_watts_avg"] == 350.0 and a["power_percent_avg"] == 50.0
    assert b["power_watts_avg"] == 100.0 and b["power_percent_avg"] is None
    props = gpu_properties(summary["gpus"])
    assert (
        props["gpu_compute_utilization_min"],
        props["gpu_compute_utilization_avg"],
        props["gpu_compute_utilization_max"],
    ) == (30, 60, 90)
    assert props["gpu_memory_utilization_peak"] == 50.0
    assert props["gpu_power_percent_min"] == props["gpu_power_percent_max"] == 50.0  # only GPU-aaaa reports it


def test_short_runs_still_get_samples():
    sampler = MetricsSampler(interval_s=10.0).start()
    sampler.stop()
    summary = sampler.summary()
    assert summary["n_samples"] == 2 and summary["cpu_compute_utilization"] is not None
    assert summary["gpus"] == [] and 0 < summary["cpu_memory_utilization"] <= 100


def test_no_nvml_means_no_gpu_series(monkeypatch):
    # A machine without the NVIDIA driver, on any machine: pynvml's init fails as it does without
    # libnvidia-ml.so; load_nvml() gives None and the sampler records no GPU (nothing raises).
    class NVMLError(Exception):
        pass

    def no_library():
        raise NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=no_library))
    assert load_nvml() is None
    sampler = MetricsSampler(interval_s=0.05, gpu_ids=["0"]).start()
    sampler.stop()
    assert all(s.gpus == [] for s in sampler.samples)
    assert gpu_properties(sampler.summary()["gpus"]) == {k: 0.0 for k in gpu_properties([])}


def test_process_cpu_percent_counts_busy_threads():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin)
    cpu0, wall0 = time.process_time(), time.monotonic()
    sampler = MetricsSampler(interval_s=0.1).start()
    t.start()
    time.sleep(0.6)
    stop.set()
    t.join()
    sampler.stop()
    expected = 100 * (time.process_time() - cpu0) / (time.monotonic() - wall0)  # this process, 100 = one core
    cpu = sampler.summary()["cpu_compute_utilization"]
    assert expected > 20 and cpu == pytest.approx(expected, rel=0.3)


def _sample(t, cpu, mem, gpus=()):
    return Sample(t=t, wall=t, cpu_percent=cpu, node_memory_percent=mem, process_rss_gib=1.0, gpus=list(gpus))


def test_summary_time_averages_and_drops_warmup():
    g = lambda u, m: GpuSample("GPU-x", u, m, 100.0, 25.0)  # noqa: E731
    samples = [
        _sample(0.0, None, 10.0, [g(0, 5)]),
        _sample(1.0, 400.0, 20.0, [g(10, 90)]),  # warm-up peak: dropped below
        _sample(2.0, 100.0, 30.0, [g(80, 40)]),
        _sample(3.0, 200.0, 40.0, [g(100, 60)]),
    ]
    full = summarize(samples)
    assert full["cpu_compute_utilization"] == pytest.approx(700 / 3)  # the start sample has no CPU value
    assert full["gpus"][0]["memory_utilization_max"] == 90
    post = summarize(samples, drop_before=2.0)
    assert post["n_samples"] == 2 and post["n_dropped_warmup"] == 2
    assert post["cpu_compute_utilization"] == 150.0 and post["cpu_memory_utilization"] == 35.0
    assert post["gpus"][0]["compute_utilization_avg"] == 90 and post["gpus"][0]["memory_utilization_max"] == 60
    # a warm-up that swallowed every sample still leaves the stop sample
    assert summarize(samples, drop_before=99.0)["n_samples"] == 1


def test_cpu_properties_average_nodes_and_default_zero():
    assert cpu_properties(
        [
            {"cpu_compute_utilization": 100.0, "cpu_memory_utilization": 10.0},
            {"cpu_compute_utilization": 300.0, "cpu_memory_utilization": 30.0},
        ]
    ) == {"cpu_compute_utilization": 200.0, "cpu_memory_utilization": 20.0}
    assert cpu_properties([]) == {"cpu_compute_utilization": 0.0, "cpu_memory_utilization": 0.0}


def test_cpu_time_average_weights_uneven_intervals():
    # 1 s at 100 %, then a 10 ms stop interval that caught one 10 ms /proc tick (1000 %): the run used
    # 1.01 CPU seconds in 1.01 s, i.e. 100 %, not the 550 % a plain mean of the two samples would say.
    samples = [
        Sample(0.0, 0.0, None, 10.0, 1.0),
        Sample(1.0, 1.0, 100.0, 10.0, 1.0, cpu_seconds=1.0, interval_s=1.0),
        Sample(1.01, 1.01, 1000.0, 10.0, 1.0, cpu_seconds=0.01, interval_s=0.01),
    ]
    assert summarize(samples)["cpu_compute_utilization"] == pytest.approx(100.0)


def sampled_while_spinning(*ranks_roots: int | None) -> list[dict]:
    """Summaries of samplers of a sleeping process (one per ranks_root) while a thread of this one spins 0.8 s."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin)
    try:
        samplers = [MetricsSampler(interval_s=0.1, pid=sleeper.pid, ranks_root=r).start() for r in ranks_roots]
        t.start()
        time.sleep(0.8)
        stop.set()
        t.join()
        for sampler in samplers:
            sampler.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
    return [sampler.summary() for sampler in samplers]


def test_other_processes_cpu_is_counted_apart_from_the_sampled_process_tree():
    # sample a sleeping process while this one spins: the spinning is another process's CPU use
    (summary,) = sampled_while_spinning(None)
    assert summary["cpu_compute_utilization"] < 10  # the sleeper
    assert summary["other_cpu_percent"] > 40  # this process's spinning thread, on one of the allowed CPUs
    assert summary["cpu_count"] >= 1


def test_the_ranks_of_a_node_are_the_runs_own_cpu_not_other_processes():
    # rank 0 (a sleeper) with a sibling rank that spins (this process, the ranks' launcher-to-be): sampled with
    # ranks_root, the spinning is the run's own; without it, another process's. Both samplers see the same
    # background load over the same interval, so their difference is the spinning alone.
    alone, ranks = sampled_while_spinning(None, os.getpid())
    assert alone["other_cpu_percent"] - ranks["other_cpu_percent"] > 40
    assert ranks["cpu_compute_utilization"] < 10  # rank 0's own figure is unchanged


def test_busy_cpu_time_is_keyed_by_cpu_number():
    from tunebench.worker.metrics import _busy_by_cpu, allowed_cpus, node_busy_seconds

    busy = _busy_by_cpu()
    assert set(allowed_cpus() or busy) <= set(busy) and all(v >= 0 for v in busy.values())
    assert node_busy_seconds([]) == 0 and node_busy_seconds() >= max(busy.values())
