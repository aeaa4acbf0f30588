"""One measured fine-tuning run in four steps, each returning what the next one needs.

``set_up`` (checks that need nothing loaded, precision, seed) -> ``load`` (data, tokenizer, model,
PEFT) -> ``start_meters`` + ``fit`` (transformers Trainer with tunebench's step meter and metrics
sampler) -> ``finish`` (global counts, warm-up exclusion, system metrics). tunebench.worker.run
calls them in order and writes the result files.

Why transformers.Trainer and not trl's SFTTrainer: trl 1.x's SFTTrainer computes the loss through
a fused LM head over the completion positions only and gathers entropy/accuracy metrics across
ranks at every micro-batch; the reference (fms-hf-tuning on trl 0.19) materialises the full logits
through transformers' loss. Plain Trainer with our completion-only collator keeps the reference's
compute and memory profile, which is what tunebench measures.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tunebench.catalog import ModelSpec
from tunebench.spec.properties import loss_path
from tunebench.training import adapters, data, vision
from tunebench.training import loss as loss_mod
from tunebench.training import model as model_mod
from tunebench.training import tokenizer as tok_mod
from tunebench.worker.args import WorkerConfig
from tunebench.worker.meter import MeasureCallback, MeasuredTrainer, StepMeter
from tunebench.worker.metrics import MetricsSampler, cuda_gpu_ids, gpu_names, torch_peak_memory_gib
from tunebench.worker.stopping import AutoStopWindows, excluded_warmup_steps


@dataclass(frozen=True)
class Setup:
    """What set_up decided."""

    config: WorkerConfig
    on_gpu: bool
    output_dir: str
    precision_note: str | None  # a CPU run in 16 bits without native instructions for them (it runs as asked)


@dataclass
class Loaded:
    """What load built, and the facts the result records about it."""

    model: torch.nn.Module
    tokenizer: Any
    dataset: Any
    data: dict[str, Any]  # the record's "data" field
    metadata: dict[str, Any]  # weights, model, tokenizer, PEFT, parameter counts, load_seconds


@dataclass
class Meters:
    """The step meter of this rank and (local rank 0) the system-metrics sampler."""

    meter: StepMeter
    auto_stop: AutoStopWindows | None
    sampler: MetricsSampler | None
    gpus: list[dict[str, Any]] | None = None  # the record's metadata["gpus"] (None: not recorded)


def set_up(config: WorkerConfig, on_gpu: bool) -> Setup:
    """Fail early on what cannot run here (the precision included: a run never trains another precision
    than the entity's); the output directory; the seed."""
    from transformers import set_seed

    reason = _unsupported(config)
    if reason:
        raise NotImplementedError(reason)
    model_mod.check_hardware(
        on_gpu=on_gpu,
        use_flash_attn=config.use_flash_attn,
        peft_method=config.peft_method,
        auto_gptq=config.auto_gptq,
        weights=config.weights,
        attn=config.attn_implementation,
    )
    if loss_implementation(config) == "fused_linear" and not (on_gpu and loss_mod.liger_available()):
        raise model_mod.HardwareError("loss_implementation fused_linear needs liger-kernel and a GPU")
    model_mod.check_cpu_precision(config.fp16, on_gpu)
    precision = model_mod.cpu_precision_note(config.torch_dtype, config.bf16, on_gpu)
    output_dir = config.output_dir or tempfile.mkdtemp(prefix="tunebench-run-")
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    set_seed(config.seed)
    return Setup(config, on_gpu, output_dir, precision)


def _unsupported(config: WorkerConfig) -> str | None:
    if config.packing:
        return "packing=True is not supported (the SFTTrainer spec experiments run with packing False)"
    if config.padding_free and (config.dataset_image_field or config.peft_method == "pt"):
        # spec.validity's padding_free rules, for a worker started by hand
        return "--padding_free flattens text samples of LoRA or full fine-tuning only (not images, not prompt tuning)"
    return None


def load(setup: Setup, rank: int) -> Loaded:
    """Data, weights, tokenizer, model and PEFT adapters of the run."""
    config, started = setup.config, time.monotonic()
    if config.dataset_image_field:
        return _load_vision(setup, rank, started)
    texts = data.read_jsonl(config.training_data_path, config.dataset_text_field)
    pretrained = pretrained_weights(config)
    spec = None if pretrained else model_mod.architecture_spec(config.tunebench_model, config.model_name_or_path)
    resolved = text_tokenizer(config, texts, pretrained, spec, Path(setup.output_dir), rank)
    tokenizer = resolved.tokenizer
    max_len = tok_mod.max_length(tokenizer, config.max_seq_length)
    dataset, data_info = data.build_dataset(tokenizer, texts, config.response_template, max_len)
    model, meta = build_model(config, setup.on_gpu, tokenizer, pretrained, spec)
    model, meta["peft"] = adapters.apply_peft(config, model, resolved.path)
    meta.update(stack_settings(config, model, setup.on_gpu))
    meta["tokenizer"] = resolved.describe()
    meta["parameters"] = model_mod.parameter_counts(model)
    meta["not_applied"] = not_applied(config)
    meta["load_seconds"] = time.monotonic() - started
    record_data = {"path": str(config.training_data_path), "text_field": config.dataset_text_field, **data_info}
    return Loaded(model, tokenizer, dataset, record_data, meta)


def _load_vision(setup: Setup, rank: int, started: float) -> Loaded:
    """Vision runs (tunebench.training.vision): image-text records, processor, LlavaNext model (a local
    checkpoint, else random weights of the catalog architecture), PEFT on its language model."""
    config = setup.config
    rows = vision.read_parquet(config.training_data_path, config.dataset_text_field, config.dataset_image_field)
    pretrained = pretrained_weights(config)
    dtype, device = model_mod.DTYPES[config.torch_dtype], model_mod.target_device(setup.on_gpu)
    attn = model_mod.attn_implementation(config.use_flash_attn, config.attn_implementation)
    if pretrained:
        processor, model = vision.load_pretrained(pretrained, dtype=dtype, device=device, attn_implementation=attn)
        tokenizer, tok_facts, tok_path = processor.tokenizer, {"kind": "model", "path": pretrained}, pretrained
        source, arch = pretrained, None
    else:
        spec = model_mod.architecture_spec(config.tunebench_model, config.model_name_or_path)
        if spec.model_type != "llava_next" or "vision_config" not in spec.extra:
            raise ValueError(f"a vision data set (dataset_image_field) needs a vision model; {spec.name} is not one")
        resolved = tok_mod.resolve_tokenizer(
            config.tokenizer_name_or_path,
            config.model_name_or_path,
            [" ".join(vision.render(c)) for c, _ in rows],
            512 if config.tunebench_tiny else spec.extra["text_config"].get("vocab_size", spec.vocab_size),
            Path(setup.output_dir) / f"tunebench-tokenizer-rank{rank}",
            architecture=None if config.tunebench_tiny else (spec.config_path or spec.name),
            context_length=model_mod.context_length(spec, config.tunebench_tiny),
        )
        tokenizer, tok_facts, tok_path = resolved.tokenizer, resolved.describe(), resolved.path
        processor = vision.build_processor(spec, tokenizer)  # adds <image> to the tokenizer
        model = vision.build_model(
            spec,
            tiny=config.tunebench_tiny,
            tokenizer_vocab=len(tokenizer),
            special_ids={
                "bos_token_id": tokenizer.bos_token_id,
                "eos_token_id": tokenizer.eos_token_id,
                "pad_token_id": tokenizer.pad_token_id,
            },
            image_token_id=tokenizer.convert_tokens_to_ids(vision.IMAGE_TOKEN),
            dtype=dtype,
            device=device,
            attn_implementation=attn,
        )
        source, arch = spec.config_path or spec.name, spec.name
    dataset, data_info = vision.build_dataset(processor, rows, tok_mod.max_length(tokenizer, config.max_seq_length))
    meta: dict[str, Any] = dict(
        weights="pretrained" if pretrained else "random",
        weights_requested=config.weights,
        weights_source=source,
        architecture=arch,
        quantization=None,
        model_class=type(model).__name__,
        model_type=model.config.model_type,
        dtype=str(model.dtype).replace("torch.", ""),
        attn_implementation=getattr(model.config, "_attn_implementation", None),
    )
    settings = config
    if settings.peft_method in (
        "lora",
        "qlora",
    ):  # the SFTTrainer spec's per-model targets name the language model's layers
        targets = settings.target_modules or ["q_proj", "v_proj"]
        if targets != ["all-linear"]:
            settings = dataclasses.replace(settings, target_modules=[vision.language_model_targets(targets)])
    model, meta["peft"] = adapters.apply_peft(settings, model, tok_path)
    meta.update(stack_settings(config, model, setup.on_gpu))
    meta["tokenizer"] = tok_facts
    meta["parameters"] = model_mod.parameter_counts(model)
    meta["not_applied"] = not_applied(config)
    meta["load_seconds"] = time.monotonic() - started
    record_data = {
        "path": str(config.training_data_path),
        "text_field": config.dataset_text_field,
        "image_field": config.dataset_image_field,
        **data_info,
    }
    return Loaded(model, tokenizer, dataset, record_data, meta)


def text_tokenizer(
    config: WorkerConfig, texts: list[str], pretrained: str | None, spec: ModelSpec | None, output_dir: Path, rank: int
) -> Any:
    """The tokenizer of a text run (tunebench.training.tokenizer.resolve_tokenizer): the checkpoint's, the
    architecture's, or (tiny models) one trained on the data set's texts."""
    return tok_mod.resolve_tokenizer(
        config.tokenizer_name_or_path,
        pretrained or config.model_name_or_path,
        texts,
        512 if config.tunebench_tiny else (spec.vocab_size if spec else None),
        output_dir / f"tunebench-tokenizer-rank{rank}",
        architecture=None if (config.tunebench_tiny or spec is None) else (spec.config_path or spec.name),
        context_length=model_mod.context_length(spec, config.tunebench_tiny),
    )


def pretrained_weights(config: WorkerConfig) -> str | None:
    """The local checkpoint to load, or None for random weights (FileNotFoundError if one is required)."""
    if config.weights == "random":
        pretrained = None
    else:
        pretrained = model_mod.resolve_pretrained(config.model_name_or_path)
        if pretrained is None and config.weights == "pretrained":
            raise FileNotFoundError(
                f"weights=pretrained but {config.model_name_or_path!r} is neither a local model directory nor in the "
                "local Hugging Face cache (tunebench never downloads during a measurement)"
            )
    if config.auto_gptq and pretrained is None:
        raise model_mod.HardwareError("GPTQ-LoRA needs a local GPTQ-quantized checkpoint; none resolved")
    return pretrained


def build_model(
    config: WorkerConfig, on_gpu: bool, tokenizer: Any, pretrained: str | None, spec: ModelSpec | None
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model (before PEFT) and the facts about it."""
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    loaded = model_mod.load_model(
        torch_dtype=config.torch_dtype,
        use_flash_attn=config.use_flash_attn,
        quantization=model_mod.quantization_of(config.peft_method, config.auto_gptq),
        on_gpu=on_gpu,
        tokenizer_vocab=len(tokenizer),
        special_ids=special,
        pretrained_path=pretrained,
        architecture=spec,
        tiny=config.tunebench_tiny,
        attn=config.attn_implementation,
    )
    model = loaded.model
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:  # tokenizer with added tokens
        model.resize_token_embeddings(len(tokenizer))
    meta = dict(
        weights=loaded.weights,
        weights_requested=config.weights,
        weights_source=loaded.source,
        architecture=loaded.architecture,
        quantization=loaded.quantization,
        model_class=type(model).__name__,
        model_type=model.config.model_type,
        dtype=str(model.dtype).replace("torch.", ""),
        attn_implementation=getattr(model.config, "_attn_implementation", None),
    )
    return model, meta


def loss_implementation(config: WorkerConfig) -> str:
    """The loss path of the run (spec.properties.loss_path of its flags)."""
    return loss_path(config.loss_implementation, config.fast_kernels)


def stack_settings(config: WorkerConfig, model: torch.nn.Module, on_gpu: bool) -> dict[str, Any]:
    """Apply the loss path and the adapter dtype to the (PEFT-wrapped) model; the facts the record keeps:
    metadata["loss"] (the implementation that runs) and metadata["adapter_dtype"] (the trainable weights' dtypes)."""
    facts: dict[str, Any] = {"loss": loss_mod.apply(model, loss_implementation(config), on_gpu)}
    if config.adapter_dtype and config.peft_method != "none":
        dtype = model_mod.DTYPES[config.adapter_dtype]
        for param in model.parameters():
            if param.requires_grad:  # the adapter's weights (peft freezes the base model's)
                param.data = param.data.to(dtype)
    if config.peft_method != "none":
        facts["adapter_dtype"] = trainable_dtypes(model)
    return facts


def trainable_dtypes(model: torch.nn.Module) -> list[str]:
    """The dtypes of the model's trainable parameters (the adapter's, with PEFT)."""
    return sorted({_dtype_name(p.dtype) for p in model.parameters() if p.requires_grad})


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def fms_acceleration(config: WorkerConfig) -> str | None:
    """Why the native worker refuses this command line: fms-acceleration's kernels, which only fms-hf-tuning runs
    (--fast_kernels with a flag on, --fused_lora, --fast_moe > 0). The measuring actuators judge such entities
    before a run (tunebench.engines.support); a worker started by hand refuses them too, so that no result
    carries a kernel setting that did not run. None: nothing to refuse."""
    flags = []
    if config.fast_kernels and any(str(v).lower() in ("true", "1") for v in config.fast_kernels):
        flags.append("--fast_kernels " + " ".join(config.fast_kernels))
    if config.fused_lora:
        flags.append("--fused_lora " + " ".join(config.fused_lora))
    if fast_moe_degree(config.fast_moe) > 0:
        flags.append("--fast_moe " + " ".join(config.fast_moe))
    if not flags:
        return None
    return (
        f"{', '.join(flags)}: fms-acceleration kernels, which the native worker does not run: measure with "
        "--engine fms-hf-tuning"
    )


def not_applied(config: WorkerConfig) -> dict[str, str]:
    """Flags accepted for compatibility with the SFTTrainer spec's command line that have no effect here."""
    out = {}
    if config.include_tokens_per_second:
        out["include_tokens_per_second"] = "removed in transformers 5; tunebench counts tokens itself"
    if config.adapter_dtype and config.peft_method == "none":
        out["adapter_dtype"] = "full fine-tuning: no adapter weights"
    if config.eval_strategy != "no":
        out["eval_strategy"] = "no evaluation set: never evaluates"
    if config.save_strategy != "no":
        out["save_strategy"] = "a measurement never saves checkpoints"
    if not config.remove_unused_columns or config.dataset_kwargs_skip_prepare_dataset:
        out["dataset preparation flags"] = "tunebench tokenizes the data itself"
    return out


def fast_moe_degree(fast_moe: list[str] | None) -> int:
    """The expert-parallel degree of --fast_moe (True counts as 1)."""
    try:
        return int(fast_moe[0]) if fast_moe else 0
    except ValueError:
        return 1 if str(fast_moe[0]).lower() == "true" else 0


# WorkerConfig fields that TrainingArguments takes under the same name: the entity's values and the run's
# settings. bf16 False + torch_dtype bfloat16 = pure bf16 (hf-stack.md §4.6).
SAME_NAME_ARGS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs", "max_steps", "learning_rate",
    "weight_decay", "lr_scheduler_type", "logging_steps", "log_level", "optim", "bf16", "fp16", "seed",
)  # fmt: skip


def build_training_args(config: WorkerConfig, output_dir: str, on_gpu: bool) -> Any:
    """transformers TrainingArguments: the SFTTrainer spec hardcoded values (ado-sfttrainer.md §6.2) + entity values."""
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    kw: dict[str, Any] = {name: getattr(config, name) for name in SAME_NAME_ARGS}
    kw.update(
        output_dir=output_dir,
        use_cpu=not on_gpu,
        logging_strategy="steps",
        save_strategy="no",  # a measurement never saves (the SFTTrainer spec "does not save checkpoint")
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,  # the collator builds exactly the model inputs
        include_num_input_tokens_seen="no",  # counted by tunebench's meter (no per-step gather)
        skip_memory_metrics=True,
    )
    # transformers 5.x renamed warmup_ratio (a float warmup_steps < 1 is a ratio) and
    # gradient_checkpointing (-> activation_checkpointing); use whichever this version has.
    kw["warmup_ratio" if "warmup_ratio" in fields else "warmup_steps"] = config.warmup_ratio
    gc = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    kw[gc] = config.gradient_checkpointing
    kw[f"{gc}_kwargs"] = config.gradient_checkpointing_kwargs
    kw["torch_compile"] = config.torch_compile  # the entity's torch_compile (Trainer compiles the model)
    # max_steps <= 0 respects num_train_epochs (the SFTTrainer spec); transformers 5 takes only -1 so
    # (Trainer: epoch_based = max_steps < 0; max_steps 0 would stop after the first step)
    kw["max_steps"] = config.max_steps if config.max_steps > 0 else -1
    return TrainingArguments(**kw)


def start_meters(config: WorkerConfig, device: torch.device, on_gpu: bool, env: dict[str, int]) -> Meters:
    """This rank's step meter; on local rank 0 the system-metrics sampler of this node's GPUs."""
    auto_stop = None
    if config.auto_stop_method:
        auto_stop = AutoStopWindows(
            config.auto_stop_warmup_seconds, config.auto_stop_stable_seconds, config.auto_stop_stable_steps
        )
    meter = StepMeter(device, config.stop_after_seconds, auto_stop, progress=env["rank"] == 0)
    if env["local_rank"] == 0:
        n_gpus_here = min(env["local_world_size"], torch.cuda.device_count()) if on_gpu else 0
        gpu_ids = cuda_gpu_ids(n_gpus_here) if n_gpus_here else []
        # several ranks on this node are siblings under their launcher: their CPU time is the run's own too
        ranks_root = os.getppid() if env["local_world_size"] > 1 else None
        sampler = MetricsSampler(config.metrics_interval_seconds, gpu_ids, ranks_root=ranks_root)
        gpus = [{"id": g, "name": gpu_names(sampler.nvml, [g]).get(g)} for g in gpu_ids]
        return Meters(meter, auto_stop, sampler, gpus)
    gpus = [{"id": cuda_gpu_ids(env["local_rank"] + 1)[-1]}] if on_gpu else None
    return Meters(meter, auto_stop, None, gpus)


def fit(loaded: Loaded, meters: Meters, training_args: Any, padding_free: bool = False) -> dict[str, Any]:
    """Train until max_steps/epochs or a stop rule; returns facts for the record's metadata."""
    trainer = MeasuredTrainer(
        model=loaded.model,
        args=training_args,
        train_dataset=loaded.dataset,
        data_collator=_collator(loaded, padding_free),
        processing_class=loaded.tokenizer,
        callbacks=[MeasureCallback(meters.meter, meters.sampler)],
        meter=meters.meter,
    )
    seen: dict[str, str] = {}

    def record_dtype(_module, _args, out) -> None:  # returns None: the output stays as it is
        if isinstance(out, torch.Tensor):
            seen.setdefault("dtype", _dtype_name(out.dtype))

    head = loaded.model.get_output_embeddings()
    hook = None if head is None else head.register_forward_hook(record_dtype)
    try:
        trainer.train()
    finally:
        if hook is not None:
            hook.remove()
    return {
        # the dtype of the LM head's output in the first training forward: the precision the matrix products
        # ran in (bfloat16 under bf16 autocast or with bf16 weights); None when the loss never runs the head
        "compute_dtype": seen.get("dtype"),
        "distributed_type": str(trainer.accelerator.distributed_type).rsplit(".", 1)[-1],
        "wrapped_model_class": type(trainer.model_wrapped).__name__,
        "gradient_checkpointing_on": getattr(trainer.model, "is_gradient_checkpointing", None),
        "torch_compile": compiled(trainer.model_wrapped),
        "train_losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],  # Trainer's logged losses
        "trainable_dtypes": trainable_dtypes(trainer.model),  # as trained (adapter_dtype)
        "nonfinite_trainable": nonfinite_trainable(trainer.model),  # diverged: actuators.outcome notes it
    }


def nonfinite_trainable(model: torch.nn.Module) -> dict[str, Any] | None:
    """Trainable tensors (this rank's shards) holding NaN or inf after training, None when every one is finite: a
    run that diverged. The Trainer hides it from its logged losses (logging_nan_inf_filter, on by default, logs the
    running mean instead of a NaN loss)."""
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    with torch.no_grad():
        bad = [name for name, p in trainable if p.numel() and not bool(torch.isfinite(p).all())]
    return {"tensors": len(bad), "of": len(trainable), "first": bad[:3]} if bad else None


def compiled(model: Any) -> bool:
    """Whether torch.compile's wrapper (OptimizedModule) is the model or what a DDP/FSDP wrapper holds."""
    return any(type(m).__name__ == "OptimizedModule" for m in (model, getattr(model, "module", None)))


def _collator(loaded: Loaded, padding_free: bool) -> Any:
    if isinstance(loaded.dataset, vision.VisionDataset):
        return vision.VisionCollator(loaded.tokenizer.pad_token_id, loaded.model.dtype)
    if padding_free:
        return data.FlatteningCollator()
    return data.CompletionCollator(loaded.tokenizer.pad_token_id)


def finish(meters: Meters) -> dict[str, Any]:
    """The record's fields of a successful run: steps, consumed entries, runtime, system, torch memory."""
    meter, auto_stop = meters.meter, meters.auto_stop
    warmup = excluded_warmup_steps(meter.durations, auto_stop)
    out: dict[str, Any] = {
        "steps": {
            "total": len(meter.durations),
            "warmup": warmup,
            "durations_s": meter.durations,
            "local_durations_s": meter.local_durations,
            "end_monotonic": meter.step_end_times,  # this process's clock, the sampler's (the time series)
            "log": meter.log,  # the Trainer's per-step loss and learning rate
            "local": {
                "samples": meter.samples,
                "non_pad_tokens": meter.non_pad_tokens,
                "padded_tokens": meter.padded_tokens,
                "dataset_tokens": meter.dataset_tokens,
                "trained_tokens": meter.trained_tokens,
            },
            "global": meter.global_counts(),
            "stopped_by": meter.stopped_by,
            "auto_stop_satisfied": (meter.stopped_by == "auto_stop") if auto_stop else None,
        },
        "consumed": {"entries": meter.consumed_total, "indices": meter.consumed_indices},
        "train_runtime": sum(meter.durations[warmup:]),
    }
    if meters.sampler is not None:
        out["system"] = meters.sampler.summary(drop_before=meter.warmup_end_monotonic(warmup))
    out["torch_memory"] = torch_peak_memory_gib()
    return out
