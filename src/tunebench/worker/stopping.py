"""When to stop a measured run: ``stop_after_seconds`` and ``WARMUP_60S_STABLE_120S_OR_10_STEPS``.

Pure functions over the list of optimisation-step wall durations (float seconds), so the rules are
unit-tested apart from training. The worker agrees the durations across ranks first (all_reduce MAX
of each step's duration), so every rank takes the same decision at the same step.

Reading of the SFTTrainer spec ("auto_stop_method"): *"the job stops after spending at least 60 seconds in the
warmup phase plus the longer of 120 seconds or the duration of 10 optimization steps"*:

- warm-up = the first k steps, k the smallest count whose durations sum to >= warmup_s (the step
  that crosses 60 s is still warm-up: "at least 60 seconds in the warmup phase");
- stable window = the steps after the warm-up; the run stops at the end of the first step where the
  window spans >= stable_s seconds AND holds >= stable_steps steps ("the longer of 120 s or the
  duration of 10 steps" is satisfied only when both are). This is also what the reference code
  requires (ado-sfttrainer.md §8.2); the "OR" of the method's name is not an OR of stop conditions.
- warm-up steps are excluded from train_runtime, step/sample/token counts and system metrics.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

AUTO_STOP = "WARMUP_60S_STABLE_120S_OR_10_STEPS"


@dataclass(frozen=True)
class AutoStopWindows:
    """Windows of the auto-stop rule; the defaults are the spec's (60 s, 120 s, 10 steps)."""

    warmup_s: float = 60.0
    stable_s: float = 120.0
    stable_steps: int = 10


def _elapsed(durations: Sequence[float]) -> list[float]:
    """Time since train begin at the end of each step (left-to-right sums, as StopRule adds them)."""
    return list(itertools.accumulate(durations))


def warmup_steps(durations: Sequence[float], warmup_s: float) -> int | None:
    """Number of warm-up steps: the smallest k with sum(durations[:k]) >= warmup_s; None if not reached yet."""
    if warmup_s <= 0:
        return 0
    for k, total in enumerate(_elapsed(durations), start=1):
        if total >= warmup_s:
            return k
    return None


def auto_stop_reached(durations: Sequence[float], windows: AutoStopWindows) -> bool:
    """True once warm-up is over and the stable window spans >= stable_s seconds and >= stable_steps steps."""
    k = warmup_steps(durations, windows.warmup_s)
    if k is None:
        return False
    elapsed = _elapsed(durations)
    stable_steps = len(durations) - k
    stable_s = (elapsed[-1] if elapsed else 0.0) - (elapsed[k - 1] if k else 0.0)
    return stable_steps >= windows.stable_steps and stable_s >= windows.stable_s


def stop_after_reached(durations: Sequence[float], stop_after_seconds: float) -> bool:
    """stop_after_seconds (SFTTrainer spec): checked at the end of each step against the time since train start."""
    return stop_after_seconds > 0 and bool(durations) and _elapsed(durations)[-1] >= stop_after_seconds


def should_stop(
    durations: Sequence[float], stop_after_seconds: float = -1.0, auto_stop: AutoStopWindows | None = None
) -> bool:
    """Whether the run stops at the end of the last step in ``durations``."""
    if stop_after_reached(durations, stop_after_seconds):
        return True
    return auto_stop is not None and auto_stop_reached(durations, auto_stop)


def excluded_warmup_steps(durations: Sequence[float], auto_stop: AutoStopWindows | None) -> int:
    """Steps to exclude from the measurement after the run ended.

    0 without auto-stop. With auto-stop, the warm-up steps, provided at least one step followed them;
    a run that ended (max_steps, end of data) before the warm-up was over keeps every step, and the
    result records that the auto-stop criterion was not satisfied.
    """
    if auto_stop is None:
        return 0
    k = warmup_steps(durations, auto_stop.warmup_s)
    if k is None or k >= len(durations):
        return 0
    return k


class StopRule:
    """Incremental form of :func:`should_stop` for use at every step end (O(1) per step).

    ``update(duration)`` appends one step and returns whether to stop after it, with the same result
    as ``should_stop(all_durations_so_far, ...)`` (tested against it).
    """

    def __init__(self, stop_after_seconds: float = -1.0, auto_stop: AutoStopWindows | None = None):
        self.stop_after_seconds = stop_after_seconds
        self.auto_stop = auto_stop
        self.steps = 0
        self.elapsed = 0.0
        self.warmup_steps: int | None = 0 if auto_stop is not None and auto_stop.warmup_s <= 0 else None
        self.warmup_elapsed = 0.0
        self.stopped_by: str | None = None

    def update(self, duration: float) -> bool:
        self.steps += 1
        self.elapsed += duration
        if self.stop_after_seconds > 0 and self.elapsed >= self.stop_after_seconds:
            self.stopped_by = "stop_after_seconds"
            return True
        if self.auto_stop is None:
            return False
        if self.warmup_steps is None:
            if self.elapsed >= self.auto_stop.warmup_s:
                self.warmup_steps, self.warmup_elapsed = self.steps, self.elapsed
            return False
        stable_steps = self.steps - self.warmup_steps
        stable_s = self.elapsed - self.warmup_elapsed
        if stable_steps >= self.auto_stop.stable_steps and stable_s >= self.auto_stop.stable_s:
            self.stopped_by = "auto_stop"
            return True
        return False
