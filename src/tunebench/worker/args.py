"""Command line of the training worker, parsed once into a ``WorkerConfig``.

Flag names follow the SFTTrainer spec "Commandline" (the fms-hf-tuning flags) verbatim, plus tunebench's own
``--tunebench_*``, ``--weights``, ``--stop_after_seconds``, ``--auto_stop_*``, ``--result_path``,
``--metrics_interval_seconds``, ``--host_memory_limit_gib`` and ``--seed``. Flags the worker does
not know are accepted and recorded in the result (``unknown_args``), never fatal. The training
defaults the spec hardcodes come from tunebench.spec.experiments.COMMON_HARDCODED.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tunebench.spec.experiments import COMMON_HARDCODED
from tunebench.spec.properties import (
    ADAPTER_DTYPES,
    ATTN_IMPLEMENTATIONS,
    LOSS_IMPLEMENTATIONS,
    PADDING_FREE_METHODS,
    TORCH_DTYPES,
)
from tunebench.training.adapters import PeftSettings

AUTO_STOP_METHODS = ("None", "WARMUP_60S_STABLE_120S_OR_10_STEPS")  # the SFTTrainer spec "auto_stop_method"
PEFT_METHODS = ("none", "lora", "pt", "qlora")
WEIGHTS = ("auto", "pretrained", "random")
HARD = COMMON_HARDCODED  # the SFTTrainer spec's hardcoded training values (ado-sfttrainer.md §6.2)
EXTRA_GROUP = "flags tunebench never sets"


class ArgsError(ValueError):
    """A command line the worker cannot parse (recorded as status 'error')."""


def to_bool(text: str) -> bool:
    """'True/False/true/false/1/0/yes/no' -> bool (the SFTTrainer spec passes booleans as True/False)."""
    value = str(text).strip().lower()
    if value in ("true", "1", "yes", "y", "on"):
        return True
    if value in ("false", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False), got {text!r}")


def unescape(text: str) -> str:
    """'\\n### Response:' as typed on a command line -> a real newline (fms-hf-tuning unescapes too)."""
    return codecs.decode(text, "unicode_escape") if "\\" in text else text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # never sys.exit: the worker must still write its result file
        raise ArgsError(message)


@dataclass(frozen=True)
class WorkerConfig(PeftSettings):
    """The worker's command line, one field per flag (see build_parser for the meaning and defaults);
    the PEFT flags (peft_method, target_modules, r, lora_alpha, ...) are PeftSettings' fields."""

    # the SFTTrainer spec "Commandline" (fms-hf-tuning flags)
    model_name_or_path: str | None
    torch_dtype: str
    use_flash_attn: bool
    training_data_path: str
    response_template: str
    dataset_text_field: str
    log_level: str
    num_train_epochs: float
    max_steps: int
    per_device_train_batch_size: int
    max_seq_length: int
    eval_strategy: str
    output_dir: str | None
    gradient_accumulation_steps: int
    save_strategy: str
    learning_rate: float
    weight_decay: float
    warmup_ratio: float
    lr_scheduler_type: str
    logging_steps: int
    include_tokens_per_second: bool
    packing: bool
    optim: str
    bf16: bool
    fp16: bool
    fast_moe: list[str] | None
    fast_kernels: list[str] | None
    fused_lora: list[str] | None
    auto_gptq: list[str] | None
    dataset_image_field: str | None
    remove_unused_columns: bool
    dataset_kwargs_skip_prepare_dataset: bool
    use_cpu: bool
    tokenizer_name_or_path: str | None
    # tunebench's stack settings (docs/experiments.md "Stack settings")
    attn_implementation: str | None  # None: flash_attention_2 with use_flash_attn, else transformers' default
    loss_implementation: str | None  # None: chunked with fast_kernels' fast_loss, else upcast
    adapter_dtype: str | None  # None: peft's float32
    torch_compile: bool
    padding_free: list[str] | None  # fms-hf-tuning's --padding_free huggingface: flattened micro-batches
    # tunebench's own
    tunebench_model: str | None
    tunebench_tiny: bool
    tunebench_number_gpus: int  # < 0: the world size on CUDA, else 0
    weights: str  # auto | pretrained | random
    stop_after_seconds: float  # s; <= 0: off
    auto_stop_method: str | None
    auto_stop_warmup_seconds: float
    auto_stop_stable_seconds: float
    auto_stop_stable_steps: int
    result_path: str | None
    metrics_interval_seconds: float
    host_memory_limit_gib: float  # GiB over this node's training processes; <= 0: no limit
    seed: int


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tunebench.worker", description=__doc__, allow_abbrev=False)
    a = p.add_argument
    # --- the SFTTrainer spec "Commandline" (fms-hf-tuning flags); defaults are the spec's where it states one.
    a("--model_name_or_path", default=None, help="local path or HF id (local cache only) of the weights")
    a("--torch_dtype", default="bfloat16", choices=TORCH_DTYPES)
    a("--use_flash_attn", type=to_bool, default=False, help="flash-attention 2 (needs an NVIDIA GPU + flash-attn)")
    a("--training_data_path", required=True, help="JSONL file of {dataset_text_field: text} records")
    a("--response_template", default=HARD["response_template"], type=unescape)
    a("--dataset_text_field", default="output")
    # tunebench's experiments pass log_level debug; run by hand, the worker keeps transformers quiet.
    a("--log_level", default="passive")
    a("--num_train_epochs", type=float, default=1.0)
    a("--max_steps", type=int, default=-1)
    a("--per_device_train_batch_size", type=int, default=8)
    a("--max_seq_length", type=int, default=4096)
    a("--eval_strategy", default=HARD["eval_strategy"])
    a("--output_dir", default=None)
    a("--gradient_accumulation_steps", type=int, default=1)
    a("--save_strategy", default=HARD["save_strategy"])
    a("--learning_rate", type=float, default=HARD["learning_rate"])
    a("--weight_decay", type=float, default=HARD["weight_decay"])
    a("--warmup_ratio", type=float, default=HARD["warmup_ratio"])
    a("--lr_scheduler_type", default=HARD["lr_scheduler_type"])
    a("--logging_steps", type=int, default=HARD["logging_steps"])
    a(
        "--include_tokens_per_second",
        type=to_bool,
        default=HARD["include_tokens_per_second"],
        help="accepted; tunebench counts tokens itself",
    )
    a("--gradient_checkpointing", type=to_bool, default=False)
    a("--gradient_checkpointing_kwargs", type=json.loads, default=None, help='JSON, e.g. {"use_reentrant": false}')
    a("--packing", type=to_bool, default=HARD["packing"])
    a("--peft_method", default="none", choices=PEFT_METHODS)
    a("--target_modules", nargs="+", default=None)
    a("--r", type=int, default=4)  # the SFTTrainer spec entity default r=4, lora_alpha=16 (ado-sfttrainer.md §4)
    a("--lora_alpha", type=int, default=16)
    a("--lora_dropout", type=float, default=0.05)  # ado-sfttrainer.md §6.2
    a("--num_virtual_tokens", type=int, default=8)  # fms-hf-tuning PromptTuningConfig defaults (hf-stack.md §7.2.1)
    a("--prompt_tuning_init", default="TEXT", choices=("TEXT", "RANDOM"))
    a("--prompt_tuning_init_text", default="Classify if the tweet is a complaint or not:")
    a("--optim", default="adamw_torch")  # the SFTTrainer spec "optim" default
    a(
        "--bf16", type=to_bool, default=False
    )  # the SFTTrainer spec: default False -> pure bf16 with torch_dtype bfloat16
    a("--fp16", type=to_bool, default=False)
    a("--fast_moe", nargs="+", default=None, help="expert-parallel degree (fms-acceleration-moe)")
    a("--fast_kernels", nargs="+", default=None, help="fms-acceleration-foak: fast_loss rms_layernorm rope")
    a("--fused_lora", nargs="+", default=None, help="fms-acceleration-foak: base layer, fused")
    a("--auto_gptq", nargs="+", default=None, help="GPTQ-LoRA kernel (triton_v2); GPU only")
    a("--dataset_image_field", default=None)
    a("--remove_unused_columns", type=to_bool, default=True)
    a("--dataset_kwargs_skip_prepare_dataset", type=to_bool, default=False)
    _add_stack_flags(p)
    _add_tunebench_flags(p)
    _add_extra_flags(p)
    return p


def _add_stack_flags(p: argparse.ArgumentParser) -> None:
    """tunebench's stack settings (docs/experiments.md "Stack settings"); absent = the spec's behaviour."""
    a = p.add_argument
    a(
        "--attn_implementation",
        default=None,
        choices=ATTN_IMPLEMENTATIONS,
        help="transformers attn_implementation (default: flash_attention_2 with --use_flash_attn, else the model's)",
    )
    a(
        "--loss_implementation",
        default=None,
        choices=LOSS_IMPLEMENTATIONS,
        help="upcast (transformers), chunked (tunebench), fused_linear (liger-kernel, GPU), model_dtype (no fp32 "
        "copy); default: chunked with fast_kernels' fast_loss, else upcast",
    )
    a(
        "--adapter_dtype",
        default=None,
        choices=ADAPTER_DTYPES,
        help="dtype of the trainable adapter weights (default float32)",
    )
    a("--torch_compile", type=to_bool, default=False, help="TrainingArguments torch_compile")
    a(
        "--padding_free",
        nargs="+",
        default=None,
        choices=PADDING_FREE_METHODS,
        help="flatten each micro-batch into one row without padding (fms-hf-tuning's flag: huggingface)",
    )


def _add_tunebench_flags(p: argparse.ArgumentParser) -> None:
    """tunebench's own flags."""
    a = p.add_argument
    a("--tunebench_model", default=None, help="catalog name or config.json: the architecture for random weights")
    a(
        "--tunebench_number_gpus",
        type=int,
        default=-1,
        help="the entity's number_gpus, divisor of the per-GPU rates (default: the world size on CUDA, else 0)",
    )
    a("--weights", default="auto", choices=WEIGHTS)
    a("--stop_after_seconds", type=float, default=-1.0)  # the SFTTrainer spec default -1 (off)
    a("--auto_stop_method", default="None", choices=AUTO_STOP_METHODS)
    a("--auto_stop_warmup_seconds", type=float, default=60.0)  # the SFTTrainer spec "auto_stop_method": 60 s warm-up
    a("--auto_stop_stable_seconds", type=float, default=120.0)  # ... the longer of 120 s
    a("--auto_stop_stable_steps", type=int, default=10)  # ... or 10 optimisation steps
    a("--result_path", default=None, help="rank r writes RESULT_PATH.rank<r>.json; rank 0 also RESULT_PATH")
    a("--metrics_interval_seconds", type=float, default=1.0)
    a("--host_memory_limit_gib", type=float, default=-1.0, help="RSS limit of this node's training processes")


def _add_extra_flags(p: argparse.ArgumentParser) -> None:
    """The flags tunebench's launch never sets (it sets every other one from the entity or the actuator's
    options): the only ones a space file's ``actuator.extra_worker_args`` may add (extra_flags)."""
    a = p.add_argument_group(EXTRA_GROUP, "a space file's actuator.extra_worker_args may add these").add_argument
    a("--use_cpu", type=to_bool, default=False, help="train on the CPU even when CUDA is available")
    a("--tokenizer_name_or_path", default=None, help="local tokenizer (default: the model's, else an in-process BPE)")
    a("--tunebench_tiny", type=to_bool, default=False, help="shrink the architecture to a tiny test model")
    a("--seed", type=int, default=42)  # transformers TrainingArguments default seed


def extra_flags() -> dict[str, argparse.Action]:
    """The flags of the parser's EXTRA_GROUP by name (``--seed``): what actuator.extra_worker_args may add."""
    group = next(g for g in build_parser()._action_groups if g.title == EXTRA_GROUP)
    return {action.option_strings[0]: action for action in group._group_actions}


def parse_args(argv: Sequence[str] | None) -> tuple[WorkerConfig, list[str]]:
    """Parse the worker's flags; returns (the config, unknown flags verbatim)."""
    args, unknown = build_parser().parse_known_args(argv)
    if args.auto_stop_method == "None":
        args.auto_stop_method = None
    if args.gradient_checkpointing_kwargs is None:
        args.gradient_checkpointing_kwargs = {"use_reentrant": False}  # the SFTTrainer spec default use_reentrant False
    return WorkerConfig(**vars(args)), list(unknown)


def result_path_from_argv(argv: Sequence[str]) -> str | None:
    """--result_path out of a command line the parser rejected (so the failure can still be written)."""
    argv = list(argv)
    for i, item in enumerate(argv):
        if item == "--result_path" and i + 1 < len(argv):
            return argv[i + 1]
        if item.startswith("--result_path="):
            return item.split("=", 1)[1]
    return None


def args_record(config: WorkerConfig) -> dict[str, Any]:
    """The parsed flags as JSON-safe values (for the result file)."""
    return dataclasses.asdict(config)
