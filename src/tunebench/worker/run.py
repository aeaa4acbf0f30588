"""The training worker: one measured fine-tuning run in this process (one rank of it under torchrun).

Top to bottom: parse flags -> checks (fail early, clear reason) -> tokenizer, data, model, PEFT ->
transformers Trainer with our step meter and metrics sampler -> per-rank result file (+ rank 0's
aggregate). Any exception becomes a result with status ``oom`` or ``error`` (results.classify_exception).

Why transformers.Trainer and not trl's SFTTrainer: trl 1.x's SFTTrainer computes the loss through
a fused LM head over the completion positions only and gathers entropy/accuracy metrics across
ranks at every micro-batch; the reference (fms-hf-tuning on trl 0.19) materialises the full logits
through transformers' loss. Plain Trainer with our completion-only collator keeps the reference's
compute and memory profile, which is what tunebench measures.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tunebench.worker.args import ArgsError, args_record, parse_args, result_path_from_argv
from tunebench.worker.hostmem import GIB, HostMemoryWatchdog
from tunebench.worker.results import (
    AGGREGATE_SCHEMA,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OOM,
    SCHEMA,
    classify_exception,
    properties_from_results,
    rank_file,
    write_json,
)
from tunebench.worker.stopping import AutoStopWindows, excluded_warmup_steps

TRACEBACK_LINES = 40  # lines of traceback kept in a failed result


class WorkerTerminated(BaseException):
    """SIGTERM/SIGINT received (the launcher stops the other ranks when one fails, or a timeout)."""


def _dist_env() -> dict[str, int]:
    """Rank layout from torchrun/accelerate's environment (single process: rank 0 of 1)."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    return {
        "rank": int(env.get("RANK", "0")),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "world_size": world,
        "local_world_size": int(env.get("LOCAL_WORLD_SIZE", str(world))),
        "node_rank": int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
    }


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "peft", "trl", "accelerate", "tokenizers", "bitsandbytes", "flash-attn"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _not_applied(args: argparse.Namespace, is_moe: bool) -> dict[str, str]:
    """Flags accepted for compatibility with spec 004's command line that have no effect here."""
    out = {}
    if args.include_tokens_per_second:
        out["include_tokens_per_second"] = "removed in transformers 5; tunebench counts tokens itself"
    if args.fast_moe and not is_moe:
        out["fast_moe"] = "not a mixture-of-experts model"
    if args.fast_kernels:
        out["fast_kernels"] = "fms-acceleration-foak kernels are not used by tunebench's worker"
    if args.fused_lora:
        out["fused_lora"] = "fms-acceleration-foak kernels are not used by tunebench's worker"
    if args.eval_strategy != "no":
        out["eval_strategy"] = "no evaluation set: never evaluates"
    if args.save_strategy != "no":
        out["save_strategy"] = "a measurement never saves checkpoints"
    if not args.remove_unused_columns or args.dataset_kwargs_skip_prepare_dataset:
        out["dataset preparation flags"] = "tunebench tokenizes the data itself"
    return out


def _unsupported(args: argparse.Namespace) -> str | None:
    if args.packing:
        return "packing=True is not supported (spec 004 experiments run with packing False)"
    if args.dataset_image_field:
        return "vision fine-tuning (dataset_image_field) is not supported by tunebench's worker yet"
    return None


def _fast_moe_degree(args: argparse.Namespace) -> int:
    try:
        return int(args.fast_moe[0]) if args.fast_moe else 0
    except ValueError:
        return 1 if str(args.fast_moe[0]).lower() == "true" else 0


def build_training_args(args: argparse.Namespace, output_dir: str, on_gpu: bool) -> Any:
    """transformers TrainingArguments: spec 004 hardcoded values (ado-sfttrainer.md §6.2) + entity values."""
    import dataclasses

    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    kw: dict[str, Any] = dict(
        output_dir=output_dir,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        num_train_epochs=args.num_train_epochs,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        lr_scheduler_type=args.lr_scheduler_type,
        logging_strategy="steps",
        logging_steps=args.logging_steps,
        save_strategy="no",  # a measurement never saves (spec 004 "does not save checkpoint")
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_level=args.log_level,
        optim=args.optim,
        bf16=args.bf16,  # False + torch_dtype bfloat16 = pure bf16 (hf-stack.md §4.6)
        fp16=args.fp16,
        seed=args.seed,
        use_cpu=not on_gpu,
        dataloader_num_workers=0,
        remove_unused_columns=False,  # the collator builds exactly the model inputs
        include_num_input_tokens_seen="no",  # counted by tunebench's meter (no per-step gather)
        skip_memory_metrics=True,
    )
    # transformers 5.x renamed warmup_ratio (a float warmup_steps < 1 is a ratio) and
    # gradient_checkpointing (-> activation_checkpointing); use whichever this version has.
    if "warmup_ratio" in fields:
        kw["warmup_ratio"] = args.warmup_ratio
    else:
        kw["warmup_steps"] = args.warmup_ratio
    gc = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    kw[gc] = args.gradient_checkpointing
    kw[f"{gc}_kwargs"] = args.gradient_checkpointing_kwargs
    return TrainingArguments(**kw)


def _failure_fields(exc: BaseException, status: str, reason: str) -> dict[str, Any]:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    lines = "".join(tb).rstrip().splitlines()
    return {
        "status": status,
        "reason": reason,
        "exception": {
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc)[:4000],
            "traceback_tail": "\n".join(lines[-TRACEBACK_LINES:]),
        },
    }


def train(args: argparse.Namespace, record: dict[str, Any], env: dict[str, int]) -> None:
    """One measured run; fills ``record`` (status is set by the caller)."""
    import torch

    from tunebench.metrics import MetricsSampler, cuda_gpu_ids, gpu_names, torch_peak_memory_gib
    from tunebench.training import adapters, data, model as model_mod, tokenizer as tok_mod
    from tunebench.worker.meter import MeasureCallback, MeasuredTrainer, StepMeter

    meta = record["metadata"]
    # ---- setup: checks that need nothing loaded
    record["phase"] = "setup"
    on_gpu = model_mod.cuda_available(args.use_cpu)
    meta["device"] = "cuda" if on_gpu else "cpu"
    reason = _unsupported(args)
    if reason:
        raise NotImplementedError(reason)
    model_mod.check_hardware(args, on_gpu)
    precision = model_mod.cpu_precision(args.torch_dtype, args.bf16, args.fp16, on_gpu)
    if precision is not None:  # recorded: the measurement says which precision really ran
        meta["precision_note"] = precision
        args.torch_dtype, args.bf16, args.fp16 = "float32", False, False
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="tunebench-run-")
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    from transformers import set_seed

    set_seed(args.seed)

    # ---- load: data, weights, tokenizer, model, PEFT
    record["phase"] = "load"
    t_load = time.monotonic()
    texts = data.read_jsonl(args.training_data_path, args.dataset_text_field)
    if args.weights == "random":
        pretrained = None
    else:
        pretrained = model_mod.resolve_pretrained(args.model_name_or_path)
        if pretrained is None and args.weights == "pretrained":
            raise FileNotFoundError(
                f"weights=pretrained but {args.model_name_or_path!r} is neither a local model directory nor in the "
                "local Hugging Face cache (tunebench never downloads during a measurement)"
            )
    if args.auto_gptq and pretrained is None:
        raise model_mod.HardwareError("GPTQ-LoRA needs a local GPTQ-quantized checkpoint; none resolved")
    spec = None if pretrained else model_mod.architecture_spec(args.tunebench_model, args.model_name_or_path)
    is_moe = model_mod.is_moe(spec, pretrained)
    if _fast_moe_degree(args) > 0 and is_moe:
        raise NotImplementedError(
            "fast_moe > 0 (ScatterMoE expert parallelism) needs fms-acceleration-moe, "
            "which tunebench's worker does not use"
        )
    model_vocab = 512 if args.tunebench_tiny else (spec.vocab_size if spec else None)
    tok_source = pretrained or args.model_name_or_path
    resolved = tok_mod.resolve_tokenizer(
        args.tokenizer_name_or_path,
        tok_source,
        texts,
        model_vocab,
        Path(output_dir) / f"tunebench-tokenizer-rank{env['rank']}",
        architecture=None if (args.tunebench_tiny or spec is None) else (spec.config_path or spec.name),
        context_length=model_mod.context_length(spec, args.tunebench_tiny),
    )
    tokenizer = resolved.tokenizer
    meta["tokenizer"] = resolved.describe()
    max_len = tok_mod.max_length(tokenizer, args.max_seq_length)
    dataset, data_info = data.build_dataset(tokenizer, texts, args.response_template, max_len)
    record["data"] = {"path": str(args.training_data_path), "text_field": args.dataset_text_field, **data_info}
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    loaded = model_mod.load_model(args, on_gpu, len(tokenizer), special, pretrained)
    model = loaded.model
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:  # tokenizer with added tokens
        model.resize_token_embeddings(len(tokenizer))
    meta.update(
        weights=loaded.weights,
        weights_requested=args.weights,
        weights_source=loaded.source,
        architecture=loaded.architecture,
        quantization=loaded.quantization,
        model_class=type(model).__name__,
        model_type=model.config.model_type,
        dtype=str(model.dtype).replace("torch.", ""),
        attn_implementation=getattr(model.config, "_attn_implementation", None),
    )
    model, peft_facts = adapters.apply_peft(args, model, resolved.path)
    meta["peft"] = peft_facts
    meta["parameters"] = model_mod.parameter_counts(model)
    meta["not_applied"] = _not_applied(args, is_moe)
    meta["load_seconds"] = time.monotonic() - t_load

    # ---- train
    record["phase"] = "train"
    training_args = build_training_args(args, output_dir, on_gpu)
    auto_stop = None
    if args.auto_stop_method:
        auto_stop = AutoStopWindows(
            args.auto_stop_warmup_seconds, args.auto_stop_stable_seconds, args.auto_stop_stable_steps
        )
    meter = StepMeter(training_args.device, args.stop_after_seconds, auto_stop, progress=env["rank"] == 0)
    sampler = None
    if env["local_rank"] == 0:
        n_gpus_here = min(env["local_world_size"], torch.cuda.device_count()) if on_gpu else 0
        gpu_ids = cuda_gpu_ids(n_gpus_here) if n_gpus_here else []
        sampler = MetricsSampler(args.metrics_interval_seconds, gpu_ids)
        meta["gpus"] = [{"id": g, "name": gpu_names(sampler.nvml, [g]).get(g)} for g in gpu_ids]
        record["_sampler"] = sampler  # stopped by the caller even on failure
    elif on_gpu:
        meta["gpus"] = [{"id": cuda_gpu_ids(env["local_rank"] + 1)[-1]}]
    trainer = MeasuredTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        data_collator=data.CompletionCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        callbacks=[MeasureCallback(meter, sampler)],
        meter=meter,
    )
    record["_meter"] = meter
    trainer.train()
    meta["distributed_type"] = str(trainer.accelerator.distributed_type).rsplit(".", 1)[-1]
    meta["wrapped_model_class"] = type(trainer.model_wrapped).__name__

    # ---- finish: global counts, warm-up exclusion, system metrics
    record["phase"] = "finish"
    warmup = excluded_warmup_steps(meter.durations, auto_stop)
    record["steps"] = {
        "total": len(meter.durations),
        "warmup": warmup,
        "durations_s": meter.durations,
        "local_durations_s": meter.local_durations,
        "local": {
            "samples": meter.samples,
            "non_pad_tokens": meter.non_pad_tokens,
            "padded_tokens": meter.padded_tokens,
        },
        "global": meter.global_counts(),
        "stopped_by": meter.stopped_by,
        "auto_stop_satisfied": (meter.stopped_by == "auto_stop") if auto_stop else None,
    }
    record["consumed"] = {"entries": meter.consumed_total, "indices": meter.consumed_indices}
    record["train_runtime"] = sum(meter.durations[warmup:])
    meta["train_begin"] = meter.begin_wall
    meta["train_end"] = meter.end_wall
    if sampler is not None:
        record["system"] = sampler.summary(drop_before=meter.warmup_end_monotonic(warmup))
        record.pop("_sampler", None)
    record["torch_memory"] = torch_peak_memory_gib()


def _gather(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's record, on every rank (world size 1: just this one)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [record]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, record)
    return out


def _new_record(env: dict[str, int], argv: list[str]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "status": "error",
        "reason": None,
        "exception": None,
        "phase": "parse",
        **{k: env[k] for k in ("rank", "local_rank", "world_size", "local_world_size", "node_rank")},
        "argv": argv,
        "metadata": {"host": socket.gethostname(), "pid": os.getpid(), "versions": _versions()},
    }


def _install_term_handler() -> dict[int, Any]:
    previous = {}
    if threading.current_thread() is not threading.main_thread():
        return previous

    def handler(signum, frame):
        raise WorkerTerminated(f"terminated by signal {signal.Signals(signum).name} (timeout, or another rank failed)")

    for sig in (signal.SIGTERM,):
        previous[sig] = signal.signal(sig, handler)
    return previous


def main(argv: list[str] | None = None) -> int:
    """Run the worker; returns the exit code (0 ok, 1 error, 3 out of memory)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Never reach the network during a measurement (weights/tokenizers come from disk or the cache).
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no fork warnings from the Rust pool
    # transformers' own Trainer still calls the deprecated is_gradient_checkpointing (5.23): noise only.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*deprecated", category=FutureWarning)
    env = _dist_env()
    record = _new_record(env, argv)
    try:
        args, unknown = parse_args(argv)
    except (ArgsError, ValueError) as exc:
        record.update(_failure_fields(exc, "error", f"bad command line: {exc}"))
        path = result_path_from_argv(argv)
        if path:
            write_json(rank_file(path, env["rank"]), record)
        print(f"tunebench.worker: {record['reason']}", file=sys.stderr)
        return EXIT_ERROR
    record["args"] = args_record(args)
    record["unknown_args"] = unknown

    watchdog = None
    previous_handlers = _install_term_handler()
    try:
        with ExitStack() as stack:
            try:
                if args.host_memory_limit_gib and args.host_memory_limit_gib > 0:
                    if threading.current_thread() is not threading.main_thread():
                        raise RuntimeError("--host_memory_limit_gib needs the worker in the main thread (signals)")
                    limit = args.host_memory_limit_gib * GIB / max(1, env["local_world_size"])
                    watchdog = stack.enter_context(HostMemoryWatchdog(int(limit)))
                train(args, record, env)
                record.update(status="ok", reason=None)
            except BaseException as exc:  # noqa: BLE001 - every failure becomes a result
                if watchdog is not None:
                    watchdog.disarm()
                on_cpu = record["metadata"].get("device", "cpu") == "cpu"
                status, reason = classify_exception(exc, watchdog.exceeded if watchdog else None, on_cpu)
                record.update(_failure_fields(exc, status, reason))
            finally:
                if watchdog is not None:
                    watchdog.disarm()  # nothing may raise into the bookkeeping below
                sampler = record.pop("_sampler", None)
                meter = record.pop("_meter", None)
                if sampler is not None and record["status"] != "ok":
                    sampler.stop()
                    record["system"] = sampler.summary()
                if meter is not None and record["status"] != "ok":
                    record["steps"] = {"total": len(meter.durations), "durations_s": meter.durations}
                if record["status"] != "ok" and "torch" in sys.modules:
                    from tunebench.metrics import torch_peak_memory_gib

                    record["torch_memory"] = torch_peak_memory_gib()  # the peak reached before an OOM
        if watchdog is not None:
            record["host_memory"] = {
                "limit_gib": args.host_memory_limit_gib,
                "per_process_limit_gib": watchdog.limit_bytes / GIB,
                "peak_rss_gib": watchdog.peak_rss_bytes / GIB,
            }
            if watchdog.exceeded and record["status"] == "ok":  # swallowed somewhere: still out of memory
                record.update(status="oom", reason=watchdog.exceeded)
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)

    return _write_results(args, record, env)


def _write_results(args: argparse.Namespace, record: dict[str, Any], env: dict[str, int]) -> int:
    status = record["status"]
    aggregate = None
    if status == "ok":
        try:
            ranks = _gather(record)
            if env["rank"] == 0:
                number_gpus = env["world_size"] if record["metadata"].get("device") == "cuda" else 0
                props = properties_from_results(ranks, number_gpus, args.stop_after_seconds, args.auto_stop_method)
                aggregate = {
                    "schema": AGGREGATE_SCHEMA,
                    "status": "ok",
                    "number_gpus": number_gpus,
                    "properties": props,
                    "ranks": ranks,
                }
        except Exception as exc:  # noqa: BLE001
            status, reason = "error", f"aggregating results failed: {type(exc).__name__}: {exc}"
            record.update(_failure_fields(exc, status, reason))
    if args.result_path:
        write_json(rank_file(args.result_path, env["rank"]), record)
        if aggregate is not None:
            write_json(args.result_path, aggregate)
    if env["rank"] == 0:
        summary = {"status": record["status"], "reason": record.get("reason")}
        if aggregate:
            summary["properties"] = aggregate["properties"]
        import json

        print("TUNEBENCH_RESULT " + json.dumps(summary), flush=True)
    if record["status"] == "ok":
        _shutdown_dist()  # a failed rank just exits: its peers may be gone or stuck in a collective
    return {"ok": EXIT_OK, "oom": EXIT_OOM}.get(record["status"], EXIT_ERROR)


def _shutdown_dist() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
