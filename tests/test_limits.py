"""limits: this machine's memory, within a container's cgroup limit (cgroup files written in a temporary root)."""

from __future__ import annotations

import psutil

from tunebench.limits import NO_LIMIT, available_memory, cgroup_memory, total_memory


def test_cgroup_v2_limit_lowers_total_and_available(tmp_path):
    (tmp_path / "memory.max").write_text(f"{4 * 2**30}\n")
    (tmp_path / "memory.current").write_text(f"{1 * 2**30}\n")
    assert cgroup_memory(tmp_path) == (4 * 2**30, 2**30)
    assert total_memory(tmp_path) == min(psutil.virtual_memory().total, 4 * 2**30)
    assert available_memory(tmp_path) <= 3 * 2**30


def test_cgroup_v2_max_means_no_limit(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory(tmp_path) is None
    assert total_memory(tmp_path) == psutil.virtual_memory().total


def test_cgroup_v1_limit_and_its_no_limit_value(tmp_path):
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text(f"{NO_LIMIT + 4096}\n")
    (v1 / "memory.usage_in_bytes").write_text("1000\n")
    assert cgroup_memory(tmp_path) is None
    (v1 / "memory.limit_in_bytes").write_text(f"{2 * 2**30}\n")
    assert cgroup_memory(tmp_path) == (2 * 2**30, 1000)
    assert total_memory(tmp_path) == min(psutil.virtual_memory().total, 2 * 2**30)


def test_no_cgroup_files_is_the_machine(tmp_path):
    assert cgroup_memory(tmp_path) is None
    assert total_memory(tmp_path) == psutil.virtual_memory().total
    assert 0 < available_memory(tmp_path) <= psutil.virtual_memory().total
