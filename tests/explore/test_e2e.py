"""End to end: the issue's minimal space file, measured for real by tunebench.actuators.measure on the CPU."""

from __future__ import annotations

import pytest
from layout import REPO

from tunebench.executors.local import LocalExecutor
from tunebench.explore import Settings, explore, load_space
from tunebench.store import Store

MINIMAL = REPO / "examples" / "minimal-cpu-lora.yaml"


@pytest.mark.slow
def test_minimal_space_measured_for_real(tmp_path):
    space = load_space(MINIMAL)
    with Store(tmp_path / "store.db") as store:
        summary = explore(space, store, LocalExecutor(1), Settings(max_parallel=1, max_retries=1))
        rows = store.rows(operation_id=summary.operation_id)
        assert summary.valid == 4, [r["error"] for r in rows]
        assert sorted((r["entity"]["model_max_length"], r["entity"]["batch_size"]) for r in rows) == [
            (320, 1),
            (320, 2),
            (384, 1),
            (384, 2),
        ]
        for row in rows:
            props, length, batch = row["properties"], row["entity"]["model_max_length"], row["entity"]["batch_size"]
            runtime = props["train_runtime"]
            assert props["is_valid"] == 1 and runtime > 0
            # 2 steps x 1 micro-batch (the example sets gradient_accumulation_steps 1) x batch; every news-chars-1024 entry
            # (410-500 SmolLM2 tokens, `tunebench datasets stats`) is longer than 384 tokens: no padding,
            # each sample is `length` tokens
            samples = 2 * 1 * batch
            assert props["train_steps_per_second"] == pytest.approx(2 / runtime, rel=1e-6)
            assert props["train_samples_per_second"] == pytest.approx(samples / runtime, rel=1e-6)
            assert props["dataset_tokens_per_second"] == pytest.approx(samples * length / runtime, rel=1e-6)
            assert props["train_tokens_per_second"] == pytest.approx(samples * length / runtime, rel=1e-6)
        again = explore(space, store, LocalExecutor(1), Settings(max_parallel=1))
        assert (again.measured, again.memoised) == (0, 4)
