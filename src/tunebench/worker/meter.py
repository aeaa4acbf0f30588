"""Step timing and token counting of a measured run (a TrainerCallback and a thin Trainer subclass).

Per optimisation step the meter records the wall duration (float seconds, from the end of the
previous step, or train begin, to the end of this one, so data loading is included), and the
samples, non-padding tokens (attention-mask sum), padded tokens (input_ids.numel()), data set tokens
(the SFTTrainer spec's note 3: Σ min(len(tokens(entry)), model_max_length, max_seq_length) over the
entries, which the collator passes as ``dataset_tokens``; without it, the attention-mask sum) and trained
tokens (labels != -100: the completion tokens the loss is computed on) of every micro-batch the step
actually consumed: counted in ``training_step``, once per micro-batch, so the
numbers are right for any gradient_accumulation_steps and with gradient checkpointing on or off
(reference bug IBM/ado#65, ado-sfttrainer.md §16 #3).

Across ranks: at every step end the elapsed time since train begin is agreed with an
all_reduce(MAX) (the longest-running rank's clock) and the step's duration is the growth of that
clock, so every rank holds the same duration list, Σ durations is the run's wall time, and every
rank takes the same stop decision at the same step (stop_after_seconds, auto-stop:
tunebench.worker.stopping). Token counts are summed over ranks once, at the end (``global_counts``).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from tunebench.training.data import IGNORE_INDEX
from tunebench.worker.progress import step_line
from tunebench.worker.stopping import AutoStopWindows, StopRule

MAX_RECORDED_INDICES = 1 << 16  # consumed entry indices kept for the result (per rank)


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class StepMeter:
    """Per-step durations and counts of this rank; decides when training stops."""

    def __init__(
        self,
        device: torch.device,
        stop_after_seconds: float = -1.0,
        auto_stop: AutoStopWindows | None = None,
        progress: bool = False,
    ):
        self.device = device
        self.rule = StopRule(stop_after_seconds, auto_stop)
        self.progress = progress
        self.durations: list[float] = []  # agreed across ranks (max)
        self.local_durations: list[float] = []
        self.step_end_times: list[float] = []  # time.monotonic() at each step end (this process)
        self.samples: list[int] = []
        self.non_pad_tokens: list[int] = []
        self.padded_tokens: list[int] = []
        self.dataset_tokens: list[int] = []  # the spec's note 3 count of the consumed entries
        self.trained_tokens: list[int] = []  # label tokens the loss used (labels != -100)
        self.consumed_indices: list[int] = []
        self.consumed_total = 0
        self.stopped_by: str | None = None
        self.total_steps: int | None = None  # the Trainer's max_steps (from the epochs when max_steps <= 0)
        self.last_loss: float | None = None  # the last training loss the Trainer logged
        self.log: list[dict[str, float]] = []  # per logged step: step, loss, learning_rate (the Trainer's logs)
        self.begin_monotonic: float | None = None
        self.begin_wall: float | None = None
        self.end_wall: float | None = None
        self._t_last = 0.0
        self._agreed_elapsed = 0.0
        self._reset_pending()

    def _reset_pending(self) -> None:
        self._non_pad: torch.Tensor | int = 0  # stays on the device until the step ends (no sync per micro-batch)
        self._padded = 0
        self._dataset: torch.Tensor | int = 0
        self._samples: torch.Tensor | int = 0
        self._trained: torch.Tensor | int = 0

    # -- called by the trainer / callback
    def begin(self) -> None:
        self.begin_monotonic = self._t_last = time.monotonic()
        self.begin_wall = time.time()

    def count_batch(self, inputs: dict[str, Any]) -> None:
        """Count one micro-batch; removes its 'entry_index' and 'dataset_tokens' lists (not model inputs)."""
        indices = inputs.pop("entry_index", None)
        dataset = inputs.pop("dataset_tokens", None)
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        non_pad = mask.sum() if mask is not None else ids.numel()
        self._non_pad = self._non_pad + non_pad
        self._dataset = self._dataset + (sum(dataset) if dataset is not None else non_pad)
        self._padded += ids.numel()
        # a padding-free micro-batch is one row of several samples (training.data.FlatteningCollator; fms-hf-tuning's
        # padding_free collators), each starting at position 0
        positions = inputs.get("position_ids")
        if indices is not None:
            self._samples = self._samples + len(indices)
        elif positions is not None and ids.shape[0] == 1:
            self._samples = self._samples + (positions == 0).sum()
        else:
            self._samples = self._samples + ids.shape[0]
        labels = inputs.get("labels")
        if labels is not None:  # completion-only labels: -100 marks prompt, padding and cut-off records
            self._trained = self._trained + (labels != IGNORE_INDEX).sum()
        if indices is not None:
            self.consumed_total += len(indices)
            room = MAX_RECORDED_INDICES - len(self.consumed_indices)
            if room > 0:
                self.consumed_indices.extend(int(i) for i in indices[:room])

    def end_step(self) -> bool:
        """Close the step; True when training must stop after it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the step's kernels are part of its time
        now = time.monotonic()
        local = now - self._t_last
        self._t_last = now
        elapsed = now - self.begin_monotonic
        if _dist_ready() and torch.distributed.get_world_size() > 1:
            # Agree on the elapsed time since train begin (the longest rank's); the step's duration
            # is the growth of that agreed clock, so Σ durations = the run's wall time.
            t = torch.tensor([elapsed], dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            elapsed = float(t.item())
        agreed = max(elapsed - self._agreed_elapsed, 0.0)
        self._agreed_elapsed += agreed
        self.local_durations.append(local)
        self.durations.append(agreed)
        self.step_end_times.append(now)
        self.non_pad_tokens.append(int(self._non_pad))
        self.padded_tokens.append(int(self._padded))
        self.dataset_tokens.append(int(self._dataset))
        self.trained_tokens.append(int(self._trained))
        self.samples.append(int(self._samples))
        self._reset_pending()
        if self.progress:
            print(step_line(self._progress_record()), flush=True)
        if self.rule.update(agreed):
            self.stopped_by = self.rule.stopped_by
            return True
        return False

    def end(self) -> None:
        self.end_wall = time.time()

    def _progress_record(self) -> dict[str, Any]:
        """This step's progress line (tunebench.worker.progress.StepProgress's fields)."""
        world = torch.distributed.get_world_size() if _dist_ready() else 1
        return {
            "step": len(self.durations),
            "max_steps": self.total_steps,
            "duration_s": round(self.durations[-1], 6),
            "elapsed_s": round(self._agreed_elapsed, 6),
            "non_pad_tokens_local": self.non_pad_tokens[-1],
            "non_pad_tokens_total": sum(self.non_pad_tokens),  # this rank's, since train begin
            "world_size": world,
            "loss": self.last_loss,
            "stop_after_s": self.rule.stop_after_seconds,
        }

    # -- after training
    def global_counts(self) -> dict[str, list[int]]:
        """Per-step samples / non-pad / padded / data set / trained tokens summed over ranks (one all_reduce)."""
        local = {
            "samples": self.samples,
            "non_pad_tokens": self.non_pad_tokens,
            "padded_tokens": self.padded_tokens,
            "dataset_tokens": self.dataset_tokens,
            "trained_tokens": self.trained_tokens,
        }
        if not (_dist_ready() and torch.distributed.get_world_size() > 1):
            return {k: list(v) for k, v in local.items()}
        t = torch.tensor(list(local.values()), dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return dict(zip(local, t.cpu().tolist()))

    def warmup_end_monotonic(self, warmup_steps: int) -> float | None:
        """This process's monotonic time at the end of the warm-up (None without warm-up)."""
        return self.step_end_times[warmup_steps - 1] if warmup_steps > 0 else None


class MeasureCallback(TrainerCallback):
    """Starts/stops the meter (and the metrics sampler) with training; asks Trainer to stop when due."""

    def __init__(self, meter: StepMeter, sampler: Any | None = None):
        self.meter = meter
        self.sampler = sampler

    def on_train_begin(self, args, state, control, **kwargs):
        if self.sampler is not None:
            self.sampler.start()
        self.meter.total_steps = state.max_steps if state.max_steps and state.max_steps > 0 else None
        self.meter.begin()

    def on_step_end(self, args, state, control, **kwargs):
        if self.meter.end_step():
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and isinstance(logs.get("loss"), (int, float)):  # logging_steps 1 (the spec): every step
            self.meter.last_loss = float(logs["loss"])
            entry = {"step": int(state.global_step), "loss": float(logs["loss"])}
            if isinstance(logs.get("learning_rate"), (int, float)):
                entry["learning_rate"] = float(logs["learning_rate"])
            self.meter.log.append(entry)

    def on_train_end(self, args, state, control, **kwargs):
        self.meter.end()
        if self.sampler is not None:
            self.sampler.stop()


class ForwardCountingCallback(MeasureCallback):
    """MeasureCallback that also counts each micro-batch, from the inputs of the model's forward.

    For trainers tunebench does not build (fms-hf-tuning's SFTTrainer is made inside its own
    ``train()``; only callbacks reach it): a forward pre-hook on the model sees every training
    micro-batch once (gradient checkpointing re-runs inner layers, not the model's forward).
    """

    def __init__(self, meter: StepMeter, sampler: Any | None = None):
        super().__init__(meter, sampler)
        self._hook: Any = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)
        super().on_train_begin(args, state, control, **kwargs)

    def _count(self, module, args, kwargs):
        if module.training and kwargs.get("input_ids") is not None:
            self.meter.count_batch(dict(kwargs))

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
        super().on_train_end(args, state, control, **kwargs)


class MeasuredTrainer(Trainer):
    """transformers.Trainer whose training_step lets the meter count each micro-batch first."""

    def __init__(self, *args, meter: StepMeter, **kwargs):
        super().__init__(*args, **kwargs)
        self.meter = meter

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.meter.count_batch(inputs)
        return super().training_step(model, inputs, num_items_in_batch)
