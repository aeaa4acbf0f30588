"""End to end: the issue's minimal space file, measured for real by tunebench.measure on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunebench.executors.local import LocalExecutor
from tunebench.explore import Settings, explore, load_space
from tunebench.store import Store

MINIMAL = Path(__file__).parent.parent / "examples" / "minimal-cpu-lora.yaml"


@pytest.mark.slow
def test_minimal_space_measured_for_real(tmp_path):
    space = load_space(MINIMAL)
    with Store(tmp_path / "store.db") as store:
        summary = explore(space, store, LocalExecutor(1), Settings(max_parallel=1, max_retries=1))
        rows = store.rows(operation_id=summary.operation_id)
        assert summary.valid == 4, [r["error"] for r in rows]
        for row in rows:
            props = row["properties"]
            assert props["is_valid"] == 1 and props["dataset_tokens_per_second"] > 0 and props["train_runtime"] > 0
        again = explore(space, store, LocalExecutor(1), Settings(max_parallel=1))
        assert (again.measured, again.memoised) == (0, 4)
