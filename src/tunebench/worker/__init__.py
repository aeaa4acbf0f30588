"""The measuring worker: one real fine-tuning run, its timing, tokens and system metrics.

Launch (tunebench.actuators.launch builds the command): ``python -m tunebench.worker ARGS`` for one process,
or ``accelerate launch --config_file CFG --num_processes N -m tunebench.worker ARGS`` (torchrun and
``accelerate launch --multi_gpu`` both work, also DDP over gloo on the CPU). ARGS are the SFTTrainer spec's
command-line flags plus tunebench's own (``python -m tunebench.worker --help``).

Exit code: 0 ok, 3 out of memory, 1 any other failure (bad flags included).

Standard output of rank 0, for progress displays (one JSON object after the tag, one line each):
``TUNEBENCH_STEP {"step", "max_steps", "duration_s", "elapsed_s", "non_pad_tokens_local",
"non_pad_tokens_total", "world_size", "loss", "stop_after_s"}`` after every optimisation step
(tunebench.worker.progress reads it: step x/N, tokens/s, loss, ETA), and ``TUNEBENCH_RESULT {"status", "reason", "properties"?}`` at the end.

Rank result file ``<result_path>.rank<RANK>.json`` (schema ``tunebench.worker.rank-result/1``),
written by every rank, also on failure::

    status          "ok" | "oom" | "error"
    reason          one line: why it failed (None when ok); "host memory limit exceeded: ..." for the
                    host-memory limit, "GPU out of memory: ..." for CUDA OOM
    exception       {type, message, traceback_tail} on failure
    phase           where it ended: parse | setup | load | train | finish
    rank, local_rank, world_size, local_world_size, node_rank
    argv, args, unknown_args   the command line, parsed flags, flags the worker ignored
    metadata        host, pid, versions{python, torch, transformers, peft, trl, accelerate, ...},
                    device (cpu|cuda), gpus[{id, name}], weights (pretrained|random),
                    weights_requested, weights_source, architecture, quantization, model_class,
                    model_type, dtype, attn_implementation, tokenizer{kind, path, class, vocab_size,
                    model_max_length}, peft{method, target_modules, ...}, parameters{total,
                    trainable}, not_applied{flag: why}, load_seconds, distributed_type,
                    wrapped_model_class, compute_dtype (the LM head's output dtype in training: the
                    precision that ran), precision_note (16 bits on a CPU without native instructions
                    for them), train_begin / train_end (epoch seconds)
    data            path, text_field, records, records_without_response_template, max_length,
                    tokens_min / tokens_max / tokens_mean (per record, after truncation)
    steps           total, warmup (steps excluded by auto-stop), durations_s (per optimisation step,
                    agreed across ranks), local_durations_s, local{samples, non_pad_tokens,
                    padded_tokens, dataset_tokens (the spec's note 3 count), trained_tokens} (this
                    rank, per step), global{...} (summed over ranks, per step),
                    stopped_by (stop_after_seconds | auto_stop | None), auto_stop_satisfied
    consumed        entries (micro-batch samples this rank consumed), indices (their dataset
                    indices, first 65536)
    train_runtime   Σ post-warm-up step durations (s)
    system          local rank 0 only: tunebench.worker.metrics.summarize() of the sampler (cpu/memory
                    time-averages, per-GPU time-averages and maxima, raw samples), warm-up dropped
    torch_memory    {max_allocated_gib, max_reserved_gib} of this rank's GPU, None on CPU
    host_memory     {limit_gib, per_process_limit_gib, peak_rss_gib} with --host_memory_limit_gib

On success rank 0 also writes ``<result_path>`` (schema ``tunebench.worker.result/1``):
``{status, number_gpus, properties, ranks: [every rank's record]}``, where properties is
:func:`properties_from_results` (the SFTTrainer spec's measured properties but is_valid), computed here once
over every rank's records. The parent reads them with :func:`read_aggregate` and classifies the run
from the rank files (:func:`read_rank_results`, :func:`outcome`: any rank oom -> invalid; any
error/missing -> failed). ``--tunebench_number_gpus`` (the entity's number_gpus, passed by the
measuring actuator) is the divisor of the per-GPU rates.

This package's ``__init__`` imports neither torch nor transformers.
"""

from tunebench.worker.results import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OOM,
    classify_exception,
    outcome,
    properties_from_results,
    rank_file,
    read_aggregate,
    read_rank_results,
)
from tunebench.worker.stopping import AutoStopWindows, auto_stop_reached, should_stop, warmup_steps

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_OOM",
    "AutoStopWindows",
    "auto_stop_reached",
    "classify_exception",
    "outcome",
    "properties_from_results",
    "rank_file",
    "read_aggregate",
    "read_rank_results",
    "should_stop",
    "warmup_steps",
]
