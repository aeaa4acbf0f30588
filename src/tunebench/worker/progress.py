"""The worker's per-step progress line, and what a watcher makes of it: step x/N, tokens/s, loss, ETA.

Rank 0 prints ``TUNEBENCH_STEP {json}`` on its standard output (the run's log) after every optimisation
step (``step_line``); the measuring process follows the log (tunebench.actuators.process) and turns each
line into a ``StepProgress`` (``parse_step_line``) that the command line shows. Imports neither torch nor
transformers (the parent reads these lines).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from tunebench.logs import duration

STEP_TAG = "TUNEBENCH_STEP "


def step_line(record: dict[str, Any]) -> str:
    """The line rank 0 prints after a step (record: the fields of StepProgress, JSON-serialisable)."""
    return STEP_TAG + json.dumps(record)


@dataclass(frozen=True)
class StepProgress:
    """Where a training run is after a step.

    step: optimisation steps done; total_steps: the Trainer's max_steps (max_steps, or the steps of the
    epochs when max_steps <= 0; None if unknown); elapsed_s: training seconds so far (agreed across ranks);
    tokens: non-padding tokens rank 0 consumed so far, times world_size (the ranks' batches are the same
    size); loss: the last logged training loss; stop_after_s: the run's time limit (stop_after_seconds,
    <= 0: none).
    """

    step: int
    elapsed_s: float
    total_steps: int | None = None
    tokens: int = 0
    loss: float | None = None
    stop_after_s: float = -1.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Training seconds left: the steps left at the mean step time so far, capped by stop_after_s."""
        left = []
        if self.total_steps and self.step > 0:
            left.append(max(0, self.total_steps - self.step) * self.elapsed_s / self.step)
        if self.stop_after_s > 0:
            left.append(max(0.0, self.stop_after_s - self.elapsed_s))
        return min(left) if left else None

    def describe(self, since_s: float = 0.0) -> str:
        """'step 3/10, 1,234 tokens/s, loss 2.31, ETA 12 s' (since_s: seconds since the step ended, taken
        off the ETA)."""
        total = f"/{self.total_steps}" if self.total_steps else ""
        loss = f", loss {self.loss:.4g}" if self.loss is not None and math.isfinite(self.loss) else ""
        eta = self.eta_s
        eta_text = "?" if eta is None else duration(max(0.0, eta - since_s))
        return f"step {self.step}{total}, {self.tokens_per_second:,.0f} tokens/s{loss}, ETA {eta_text}"


def parse_step_line(line: str) -> StepProgress | None:
    """The StepProgress of a worker's output line; None for any other line (or a damaged one)."""
    if not line.startswith(STEP_TAG):
        return None
    try:
        d = json.loads(line[len(STEP_TAG) :])
        world = int(d.get("world_size", 1))
        return StepProgress(
            step=int(d["step"]),
            elapsed_s=float(d["elapsed_s"]),
            total_steps=d.get("max_steps") or None,
            tokens=int(d.get("non_pad_tokens_total", 0)) * world,
            loss=d.get("loss"),
            stop_after_s=float(d.get("stop_after_s", -1.0)),
        )
    except (ValueError, KeyError, TypeError):
        return None
