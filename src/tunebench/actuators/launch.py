"""Launch plans: exactly what a measurement of an entity executes (the SFTTrainer spec "Commandline").

For a valid entity this builds, per node, the accelerate config (the spec's FSDP or DDP block), the
command line with every flag of the spec, and the environment. number_gpus <= 1 runs the worker as a
single process (the SFTTrainer spec NOTE: accelerate with one GPU is unsupported, so it runs the trainer
directly); several GPUs run ``accelerate launch`` with one process per GPU; several nodes get one plan
each with its machine_rank and the rendezvous address.

Program names in ``command`` are ``python`` and ``accelerate``; the executor substitutes the
interpreter it runs under. Paths not known yet (output directory, rendezvous host) are placeholders
the executor fills: see ``LaunchPlan.PLACEHOLDERS``.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunebench.actuators.network import nccl_environment
from tunebench.catalog import get_model, model_paths
from tunebench.datasets import parse_dataset_id
from tunebench.engines import FMS, NATIVE
from tunebench.engines.support import unsupported
from tunebench.errors import InputError, has_control_characters
from tunebench.paths import data_dir
from tunebench.spec.experiments import Entity, Experiment, effective_values
from tunebench.spec.properties import PROPERTIES, flash_attn_on
from tunebench.spec.validity import check_values

WORKER_MODULE = "tunebench.worker"
# The module each engine's processes run (tunebench.engines): the native worker, or fms-hf-tuning's
# sft_trainer driven by tunebench.engines.fms_worker inside that version's environment.
WORKER_MODULES = {NATIVE: WORKER_MODULE, FMS: "tunebench.engines.fms_worker"}
DEFAULT_PORT = 29500  # torch.distributed's customary rendezvous port
OUTPUT_DIR = "{output_dir}"
RESULT_PATH = "{output_dir}/result"
MAIN_PROCESS_IP = "{main_process_ip}"
WEIGHTS_MODES = ("auto", "pretrained", "random")


@dataclass
class NodePlan:
    """What one node runs."""

    machine_rank: int
    command: list[str]
    env: dict[str, str]
    accelerate_config: dict[str, Any] | None = None

    @property
    def command_line(self) -> str:
        """The command as a bash line; arguments with a newline use $'...' quoting."""
        return " ".join(_shell_quote(a) for a in self.command)

    def accelerate_config_yaml(self) -> str | None:
        if self.accelerate_config is None:
            return None
        return yaml.safe_dump(self.accelerate_config, sort_keys=False, default_flow_style=False)


@dataclass
class LaunchPlan:
    """The dry run of a measurement: one NodePlan per node."""

    experiment_id: str
    entity_id: str
    mode: str  # "single" (one process: CPU, one GPU, or DP) | "FSDP" | "DDP"
    number_gpus: int
    number_nodes: int
    processes_per_node: int
    per_device_train_batch_size: int
    worker_args: list[str]
    nodes: list[NodePlan] = field(default_factory=list)

    PLACEHOLDERS = (OUTPUT_DIR, MAIN_PROCESS_IP)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for node, plan in zip(out["nodes"], self.nodes, strict=True):
            node["command_line"] = plan.command_line
            node["accelerate_config_yaml"] = plan.accelerate_config_yaml()
        return out


def _shell_quote(arg: str) -> str:
    if "\n" in arg:
        return "$'" + arg.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    return shlex.quote(arg)


def _value(text: str, field: str) -> str:
    """text as the value of a worker flag: InputError if it could read as a flag or break the line.

    Properties are checked when parsed (tunebench.spec.properties); this guards what comes from elsewhere
    (model_map paths, data directories) and stays in force whatever a parser lets through.
    """
    if text.startswith("-") or has_control_characters(text):
        raise InputError(
            field,
            f"{text!r} cannot be passed to the worker: it starts with '-' or holds control characters",
            allowed="a name or path not starting with '-'",
        )
    return text


def _flag(value: Any) -> str:
    """A value as the spec's command line writes it (booleans True/False)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # spec: --num_train_epochs 1, not 1.0
    return str(value)


def resolve_model_path(experiment: Experiment, model_name: str, model_map: dict[str, Any] | None = None) -> str:
    """Where the weights come from: model_map, then the reference's model paths, then the HF id.

    model_map values are a path/HF id (the plain weights) or {Vanilla: ..., GPTQ-Quantized: ...}, as the
    reference's actuator configuration (ado-sfttrainer.md §11).
    """
    kind = "GPTQ-Quantized" if experiment.method == "gptq-lora" else "Vanilla"
    spec = get_model(model_name)
    for source in (model_map or {}, model_paths()):
        entry = source.get(spec.name)
        if isinstance(entry, str) and kind == "Vanilla":
            return entry
        if isinstance(entry, dict) and entry.get(kind):
            return str(entry[kind])
    if spec.config_path:
        return str(Path(spec.config_path).parent)
    return spec.hf_id or spec.name


def with_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """values plus the default of every optional property they lack: properties an experiment does not
    expose (the stability experiment has no r, no fast_kernels, no enable_roce, ...) take the default."""
    return {**{n: p.default for n, p in PROPERTIES.items() if not p.required}, **values}


def worker_args(
    experiment: Experiment,
    values: dict[str, Any],
    *,
    training_data_path: str,
    model_path: str,
    weights: str = "auto",
) -> list[str]:
    """The worker's arguments, in the order of the SFTTrainer spec's command line, then tunebench's own.

    Properties an experiment does not expose (the stability experiment has no r, no fast_kernels, ...)
    take the property's default.
    """
    values = with_defaults(values)
    gpus = values["number_gpus"]
    per_device = values["batch_size"] // max(1, gpus)
    # flash_attn None: on with GPUs (the reference's own CPU runs switched it off); an attn_implementation
    # decides (flash_attention_2 is fms-hf-tuning's --use_flash_attn True, the flag it knows)
    attn = values.get("attn_implementation")
    flash = flash_attn_on(values) if attn is None else attn == "flash_attention_2"
    dataset = parse_dataset_id(values["dataset_id"])
    text_field = _value(values.get("dataset_text_field") or "output", "dataset_text_field")
    # the SFTTrainer spec: num_train_epochs is "Ignored if max_steps is greater than 0", so 0 respects the epochs
    # as -1 does; transformers 5 reads max_steps 0 as a budget of no step (Trainer: epoch_based = max_steps < 0)
    max_steps = values.get("max_steps", -1) if values.get("max_steps", -1) > 0 else -1
    args = [
        "--model_name_or_path",
        _value(model_path, "model_name_or_path"),
        "--torch_dtype",
        values["torch_dtype"],
        "--use_flash_attn",
        _flag(flash),
        "--training_data_path",
        _value(training_data_path, "data_dir"),
        "--response_template",
        values["response_template"],
        "--dataset_text_field",
        text_field,
        "--log_level",
        values["log_level"],
        "--num_train_epochs",
        _flag(values.get("num_train_epochs", 1.0)),
        "--max_steps",
        str(max_steps),
        "--per_device_train_batch_size",
        str(per_device),
        "--max_seq_length",
        str(values["model_max_length"]),
        "--eval_strategy",
        values["eval_strategy"],
        "--output_dir",
        OUTPUT_DIR,
        "--gradient_accumulation_steps",
        str(values["gradient_accumulation_steps"]),
        "--save_strategy",
        values["save_strategy"],
        "--learning_rate",
        str(values["learning_rate"]),
        "--weight_decay",
        str(values["weight_decay"]),
        "--warmup_ratio",
        str(values["warmup_ratio"]),
        "--lr_scheduler_type",
        values["lr_scheduler_type"],
        "--logging_steps",
        str(values["logging_steps"]),
        "--include_tokens_per_second",
        _flag(values["include_tokens_per_second"]),
        "--gradient_checkpointing",
        _flag(values["gradient_checkpointing"]),
        "--packing",
        _flag(values["packing"]),
        "--peft_method",
        values["peft_method"],
    ]
    args += _method_args(experiment, values)
    args += _optional_args(values, dataset.is_vision)
    args += _stack_args(values)
    # tunebench's own: the architecture for random weights, early stops, where results go.
    args += ["--tunebench_model", _value(values["model_name"], "model_name"), "--weights", weights]
    args += ["--stop_after_seconds", _flag(values.get("stop_after_seconds", -1.0))]
    args += ["--auto_stop_method", str(values.get("auto_stop_method"))]
    args += ["--result_path", RESULT_PATH]
    return args


def _method_args(experiment: Experiment, values: dict[str, Any]) -> list[str]:
    """The flags of the fine-tuning method: LoRA, prompt tuning, GPTQ-LoRA's plugins, fast kernels."""
    args: list[str] = []
    if experiment.uses_lora:
        args += ["--target_modules", *(_value(m, "target_modules") for m in values["target_modules"])]
        args += ["--r", str(values["r"]), "--lora_alpha", str(values["lora_alpha"])]
        args += ["--lora_dropout", str(values["lora_dropout"])]
    if experiment.method == "pt":
        # fms-hf-tuning's PromptTuningConfig defaults (ado-sfttrainer.md §3). The spec's PT command line
        # says --peft_method none, a copy-paste slip the reference code does not make (it uses pt).
        args += ["--num_virtual_tokens", str(values["num_virtual_tokens"])]
        args += ["--prompt_tuning_init", values["prompt_tuning_init"]]
        args += ["--prompt_tuning_init_text", values["prompt_tuning_init_text"]]
    if experiment.method == "gptq-lora":
        # the SFTTrainer spec GPTQ-LoRA command line: fms-acceleration plugins.
        args += ["--fp16", "true", "--fast_kernels", *[_flag(v).lower() for v in values["fast_kernels"]]]
        args += ["--fused_lora", *[_flag(v).lower() if isinstance(v, bool) else v for v in values["fused_lora"]]]
        args += ["--auto_gptq", *values["auto_gptq"]]
    elif values.get("fast_kernels"):
        args += ["--fast_kernels", *[_flag(v) for v in values["fast_kernels"]]]
    return args


def _optional_args(values: dict[str, Any], is_vision: bool) -> list[str]:
    """The optimiser, precision, checkpointing and data-preparation flags."""
    args = ["--optim", values["optim"], "--bf16", _flag(values["bf16"])]
    reentrant = json.dumps({"use_reentrant": values["gradient_checkpointing_use_reentrant"]})
    args += ["--gradient_checkpointing_kwargs", reentrant]
    # the SFTTrainer spec: "--fast_moe is only supported for fms-hf-tuning v2.4.0+"
    version = tuple(int(p) for p in values["fms_hf_tuning_version"].split("."))
    if version >= (2, 4, 0):
        args += ["--fast_moe", str(values.get("fast_moe", 0))]
    if is_vision or values.get("dataset_image_field"):
        args += ["--dataset_image_field", _value(values.get("dataset_image_field") or "images", "dataset_image_field")]
    if not values["remove_unused_columns"]:
        args += ["--remove_unused_columns", "False"]
    if values["dataset_kwargs_skip_prepare_dataset"]:
        args += ["--dataset_kwargs_skip_prepare_dataset", "True"]
    return args


def _stack_args(values: dict[str, Any]) -> list[str]:
    """tunebench's stack settings (docs/experiments.md "Stack settings"), each only when set: a default
    entity's command line is the SFTTrainer spec's. Settings no engine runs are judged before this
    (tunebench.engines.support); fms-hf-tuning's parser takes --torch_compile (a TrainingArguments field) and
    --padding_free (its fms-acceleration-aadp plugin) and drops the others, which it runs only as their defaults."""
    args: list[str] = []
    for name in ("attn_implementation", "loss_implementation", "adapter_dtype"):
        if values.get(name) is not None:
            args += [f"--{name}", str(values[name])]
    if values.get("torch_compile"):
        args += ["--torch_compile", "True"]
    if values.get("padding_free"):  # fms-hf-tuning's own flag and value (AttentionAndDistributedPackingConfig)
        args += ["--padding_free", "huggingface"]
    return args


def accelerate_config(
    values: dict[str, Any], *, backend: str, machine_rank: int, port: int, main_process_ip: str | None
) -> dict[str, Any]:
    """The SFTTrainer spec's accelerate_config.yml: the FSDP block or the DDP block, keys in the spec's order."""
    nodes = values["number_nodes"]
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE"}
    if backend == "FSDP":
        wrap = (
            values.get("accelerate_config_fsdp_transformer_layer_cls_to_wrap")
            or get_model(values["model_name"]).wrap_classes
        )
        fsdp: dict[str, Any] = {
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_forward_prefetch": False,
            "fsdp_offload_params": False,
            "fsdp_sharding_strategy": values["fsdp_sharding_strategy"],
            "fsdp_state_dict_type": values["fsdp_state_dict_type"],
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_sync_module_states": True,
        }
        if wrap:
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = wrap
        fsdp["fsdp_use_orig_params"] = values.get("fsdp_use_orig_params", True)
        cfg.update({"distributed_type": "FSDP", "downcast_bf16": "no", "fsdp_config": fsdp})
    else:
        cfg.update({"debug": False, "downcast_bf16": "no", "distributed_type": "MULTI_GPU"})
    cfg.update(
        {
            "machine_rank": machine_rank,
            "main_training_function": "main",
            "mixed_precision": values["accelerate_config_mixed_precision"],
            "num_machines": nodes,
            "rdzv_backend": "static",
            "same_network": True,
            "tpu_env": [],
            "tpu_use_cluster": False,
            "tpu_use_sudo": False,
            "use_cpu": False,
        }
    )
    if nodes > 1:
        cfg["main_process_ip"] = main_process_ip or MAIN_PROCESS_IP
    cfg["main_process_port"] = port
    cfg["num_processes"] = values["number_gpus"]  # accelerate counts processes over all machines
    return cfg


def cpu_processes_reason(values: dict[str, Any], cpu_processes: int | None) -> str | None:
    """Why a CPU entity's (number_gpus 0) batch_size does not split evenly over cpu_processes DDP processes;
    None where it does, or where the entity runs on GPUs."""
    processes, batch = int(cpu_processes or 1), values["batch_size"]
    if values.get("number_gpus") or processes <= 1 or batch % processes == 0:
        return None
    return f"batch_size {batch} is not divisible by {processes} processes"


def check_cpu_processes(values: dict[str, Any], cpu_processes: int, field: str = "cpu_processes") -> None:
    """InputError naming field (cpu_processes_reason); checked by `tunebench run` before anything is written, and
    by the plan. An exploration's measuring actuator judges each point instead (actuators.measure)."""
    if reason := cpu_processes_reason(values, cpu_processes):
        raise InputError(
            field, reason, allowed=f"a number of processes that divides batch_size {values['batch_size']}, or 1"
        )


def build_launch_plan(experiment: Experiment, entity: Entity, **options: Any) -> LaunchPlan:
    """The launch plan of a valid entity; InputError if the entity breaks a validity rule.

    Computes the entity's effective values and checks them, then ``plan_of_values(..., **options)``
    (whose keyword options these are; callers that have checked the values call it directly).
    """
    values = effective_values(experiment, entity)
    validity = check_values(values, single_node_only=experiment.single_node_only)
    engine = options.get("engine") or NATIVE
    reasons = validity.reasons + (unsupported(values, engine, here=False) if validity.is_valid else [])
    if reasons:
        raise InputError("entity", "is not valid, nothing would run: " + "; ".join(reasons))
    return plan_of_values(experiment, entity.id, values, **options)


def plan_of_values(
    experiment: Experiment,
    entity_id: str,
    values: dict[str, Any],
    *,
    data_directory: str | Path | None = None,
    model_map: dict[str, Any] | None = None,
    weights: str = "auto",
    config_file: str = "{output_dir}/accelerate_config.yaml",
    main_process_ip: str | None = None,
    main_process_port: int = DEFAULT_PORT,
    cpu_processes: int = 1,
    nccl_env: dict[str, Any] | None = None,
    engine: str = NATIVE,
) -> LaunchPlan:
    """The launch plan of an entity from its effective values, already checked valid. nccl_env: NCCL variables
    every node of a GPU plan sets (actuators.network); engine: the worker module run (WORKER_MODULES).

    cpu_processes > 1 runs a CPU entity (number_gpus = 0) as DDP over gloo with that many processes on
    one machine (hf-stack.md §6: `accelerate launch --multi_gpu` runs MULTI_CPU/gloo without a GPU;
    `--cpu` starts one process only); the effective batch is split over them.
    """
    if weights not in WEIGHTS_MODES:
        raise InputError("weights", f"unknown weights mode {weights!r}", allowed=", ".join(WEIGHTS_MODES))
    values = with_defaults(values)
    dataset = parse_dataset_id(values["dataset_id"])
    data_path = str(data_dir(data_directory) / f"{dataset.id}{dataset.suffix}")
    gpus, nodes = values["number_gpus"], values["number_nodes"]
    cpu_ddp = gpus == 0 and cpu_processes > 1
    if cpu_ddp:
        check_cpu_processes(values, cpu_processes)
        values = {**values, "batch_size": values["batch_size"] // cpu_processes}  # per process
    model_path = resolve_model_path(experiment, values["model_name"], model_map)
    args = worker_args(experiment, values, training_data_path=data_path, model_path=model_path, weights=weights)
    backend = values.get("distributed_backend")
    mode = backend if gpus >= 2 and backend in ("FSDP", "DDP") else "single"
    per_node = gpus // nodes if mode != "single" else 1
    if cpu_ddp:
        mode, per_node = "DDP", cpu_processes
    env = _environment(values, gpus if mode == "single" else gpus // nodes, cpu_ddp, nccl_env)
    plan = LaunchPlan(
        experiment_id=experiment.id,
        entity_id=entity_id,
        mode=mode,
        number_gpus=gpus,
        number_nodes=nodes if mode != "single" else 1,
        processes_per_node=per_node,
        per_device_train_batch_size=values["batch_size"] // max(1, gpus),
        worker_args=args,
    )
    plan.nodes += _nodes(
        values,
        mode,
        args,
        env,
        cpu_processes if cpu_ddp else 0,
        config_file,
        main_process_ip,
        main_process_port,
        WORKER_MODULES[engine],
    )
    return plan


def _environment(
    values: dict[str, Any], gpus_per_node: int, cpu_ddp: bool, nccl_env: dict[str, Any] | None
) -> dict[str, str]:
    """The environment every node of the plan sets. Each node sees exactly the GPUs it owns: none on the CPU,
    else gpus_per_node of them, here the node's first ones (NVML's PCI bus order); the executor that
    assigns others replaces them (tunebench.actuators.process.node_command). A process that sees more GPUs
    than it owns would use them: with one process, transformers' Trainer wraps the model in DataParallel over
    every visible GPU (TrainingArguments.n_gpu), multiplying the batch while the sampler watches one GPU."""
    env: dict[str, str] = {}
    if values["number_gpus"] == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU measurement must not touch a GPU
    else:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers the devices as NVML does
        env["CUDA_VISIBLE_DEVICES"] = first_devices(gpus_per_node)
        env.update(nccl_environment(bool(values["enable_roce"]), values["number_nodes"], nccl_env))
    if cpu_ddp:
        env["OMP_NUM_THREADS"] = "1"  # hf-stack.md §4.6: one thread per rank for CPU DDP
    return env


def first_devices(count: int) -> str:
    """CUDA_VISIBLE_DEVICES of a node's first count GPUs: "0,1,...,count-1" ("" for none)."""
    return ",".join(str(i) for i in range(count))


def _nodes(
    values: dict[str, Any],
    mode: str,
    args: list[str],
    env: dict[str, str],
    cpu_processes: int,
    config_file: str,
    main_process_ip: str | None,
    main_process_port: int,
    module: str,
) -> list[NodePlan]:
    """One NodePlan per node: CPU DDP (cpu_processes > 0), one process, or accelerate per node."""
    if cpu_processes:
        command = ["accelerate", "launch", "--multi_gpu", "--num_processes", str(cpu_processes)]
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += ["--main_process_port", str(main_process_port), "-m", module, *args]
        return [NodePlan(machine_rank=0, command=command, env=dict(env))]
    if mode == "single":
        return [NodePlan(machine_rank=0, command=["python", "-m", module, *args], env=dict(env))]
    nodes = []
    for rank in range(values["number_nodes"]):
        cfg = accelerate_config(
            values, backend=mode, machine_rank=rank, port=main_process_port, main_process_ip=main_process_ip
        )
        command = ["accelerate", "launch", "--config_file", config_file, "--num_processes", str(values["number_gpus"])]
        command += ["-m", module, *args]
        nodes.append(NodePlan(machine_rank=rank, command=command, env=dict(env), accelerate_config=cfg))
    return nodes
