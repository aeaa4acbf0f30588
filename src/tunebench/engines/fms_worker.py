"""The fms-hf-tuning engine's worker: one measured run through fms-hf-tuning's own ``tuning.sft_trainer``.

Runs inside a version's environment (tunebench.engines.envs), started by the measuring actuator as
``<engine python> -m tunebench.engines.fms_worker <the worker's flags>``, or under ``accelerate
launch`` with one process per GPU, exactly where the SFTTrainer spec's command line runs
``-m tuning.sft_trainer``. It takes the native worker's command line and writes the same result
files (tunebench.worker.run does both), and trains like this:

1. set_up: what cannot run here fails first (fp16 autocast on a CPU), the seed; the entity's precision runs;
2. the weights: a local checkpoint, or the catalog architecture with random weights and its tokenizer,
   written once per node to ``<output_dir>/tunebench-model`` (fms-hf-tuning loads from a path);
3. the spec's flags fms-hf-tuning knows (its own parser decides which), with the model path, output
   directory and precision of step 1-2, as ``sys.argv`` of ``tuning.sft_trainer.main()``: the
   release's own parsing, data preparation, PEFT and plugins run, unchanged;
4. its ``train`` is called with ``additional_callbacks=[ForwardCountingCallback]`` (the only change):
   tunebench's step meter and metrics sampler, so every measured property keeps its definition.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunebench.engines import MANIFEST, RECORDED
from tunebench.spec.properties import fast_loss_on
from tunebench.worker import run
from tunebench.worker.args import WorkerConfig

MODEL_DIR = "tunebench-model"
FACTS = "tunebench-facts.json"  # written last into MODEL_DIR: the checkpoint is complete
WAIT_SECONDS = 3600.0  # other ranks wait this long for local rank 0's checkpoint


class EngineFailure(RuntimeError):
    """fms-hf-tuning's main() exited without raising (it logs and calls sys.exit on errors)."""


def engine_facts() -> dict[str, Any]:
    """The engine that runs: name, the exact versions importable here, and the environment's manifest."""
    versions = {}
    for name in RECORDED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    manifest_path = Path(sys.prefix) / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    return {
        "name": "fms-hf-tuning",
        "version": versions.get("fms-hf-tuning"),
        "packages": versions,
        "torch_mode": manifest.get("torch_mode", "unknown"),
        "environment": sys.prefix,
    }


def train_fms(config: WorkerConfig, record: dict[str, Any], env: dict[str, int], state: run.RunState) -> None:
    """tunebench.worker.run's train step for this engine (same record fields as the native one)."""
    import torch

    from tunebench.training.model import cuda_available
    from tunebench.worker import train as steps
    from tunebench.worker.meter import ForwardCountingCallback

    meta = record["metadata"]
    record["phase"] = "setup"
    on_gpu = cuda_available(config.use_cpu)
    meta["device"] = "cuda" if on_gpu else "cpu"
    meta["engine"] = engine_facts()
    if config.dataset_image_field:
        raise NotImplementedError("the fms-hf-tuning engine measures text data sets; vision runs use the native one")
    setup = steps.set_up(config, on_gpu)
    if setup.precision_note is not None:
        meta["precision_note"] = setup.precision_note
    record["phase"] = "load"
    started = time.monotonic()
    model_path, facts = weights_path(setup, env, record["argv"])
    meta.update(facts, load_seconds=time.monotonic() - started)
    record["phase"] = "train"
    device = torch.device("cuda", env["local_rank"]) if on_gpu else torch.device("cpu")
    state.meters = steps.start_meters(setup.config, device, on_gpu, env)
    if state.meters.gpus is not None:
        meta["gpus"] = state.meters.gpus
    argv, meta["engine"]["flags_not_passed"] = sft_trainer_argv(record["argv"], setup, model_path, on_gpu)
    meta["engine"]["argv"] = argv
    meta["padding_free"] = "--padding_free" in argv  # its aadp plugin flattens the batches (as the native worker)
    trainer = run_sft_trainer(argv, ForwardCountingCallback(state.meters.meter, state.meters.sampler), setup.output_dir)
    meta.update(trained_model_facts(trainer))
    meta["loss"] = loss_facts(setup.config)
    record["data"] = {
        "path": str(config.training_data_path),
        "text_field": config.dataset_text_field,
        "max_length": config.max_seq_length,
        "prepared_by": "fms-hf-tuning",
    }
    record["phase"] = "finish"
    record.update(steps.finish(state.meters))


def loss_facts(config: WorkerConfig) -> dict[str, str]:
    """The loss fms-hf-tuning runs, under the planner's name (plan.workload loss_implementation): foak's fast
    cross-entropy with fast_kernels' fast_loss, else transformers' upcast (the engine judges every other
    loss_implementation, tunebench.engines.support)."""
    if fast_loss_on(config.fast_kernels):
        return {"implementation": "fast_loss", "function": "fms-acceleration-foak fast cross-entropy"}
    return {"implementation": "upcast", "function": "transformers ForCausalLMLoss"}


def weights_path(setup: Any, env: dict[str, int], worker_argv: list[str]) -> tuple[str, dict[str, Any]]:
    """The path fms-hf-tuning loads: the local checkpoint, or random weights of the catalog architecture
    with their tokenizer, saved once per node (local rank 0 writes; the others wait for it)."""
    from tunebench.worker import train as steps

    config = setup.config
    pretrained = steps.pretrained_weights(config)
    if pretrained:
        return pretrained, {"weights": "pretrained", "weights_requested": config.weights, "weights_source": pretrained}
    target = Path(setup.output_dir) / MODEL_DIR
    if env["local_rank"] == 0 and not (target / FACTS).exists():
        # Built by the project's interpreter (its transformers, which tunebench's model code is written
        # for) into the checkpoint format every release reads; this engine then loads it like any other.
        host = os.environ.get("TUNEBENCH_HOST_PYTHON", sys.executable)
        argv = [*worker_argv, "--output_dir", setup.output_dir, "--torch_dtype", config.torch_dtype]  # as run
        proc = subprocess.run([host, "-m", "tunebench.engines.checkpoint", *argv], check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"writing the random-weight checkpoint failed (exit {proc.returncode}; see the log)")
    return str(target), _wait_for(target)


def _wait_for(target: Path) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_SECONDS
    while not (target / FACTS).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"local rank 0 wrote no checkpoint to {target} in {WAIT_SECONDS:.0f} s")
        time.sleep(0.5)
    return json.loads((target / FACTS).read_text())


def sft_trainer_argv(worker_argv: list[str], setup: Any, model_path: str, on_gpu: bool) -> tuple[list[str], list[str]]:
    """The flags for fms-hf-tuning's parser: the spec's flags it knows, with this run's model path, output
    directory, precision and seed; and the flags it does not know (tunebench's own), which are not passed."""
    from tuning import sft_trainer

    known = set(sft_trainer.get_parser()._option_string_actions)  # the release's own parser decides
    config = setup.config
    replace = {
        "--model_name_or_path": [model_path],
        "--output_dir": [setup.output_dir],
        "--torch_dtype": [config.torch_dtype],
        "--bf16": [str(config.bf16)],
        "--seed": [str(config.seed)],
    }
    if not on_gpu:
        replace["--use_cpu"] = ["True"]
    argv, dropped, i = [], [], 0
    while i < len(worker_argv):
        flag, j = worker_argv[i], i + 1
        while j < len(worker_argv) and not worker_argv[j].startswith("--"):
            j += 1
        values = worker_argv[i + 1 : j]
        if flag in replace:
            values = replace.pop(flag)
        if flag in known and not (flag == "--fast_moe" and values == ["0"]):
            argv += [flag, *values]
        else:  # tunebench's own flags; --fast_moe 0 (off), which fms-hf-tuning reads as "load ScatterMoE"
            dropped.append(flag)
        i = j
    for flag, values in replace.items():
        if flag in known:
            argv += [flag, *values]
    return argv, dropped


def run_sft_trainer(argv: list[str], callback: Any, output_dir: str) -> Any:
    """``tuning.sft_trainer.main()`` on argv, its ``train`` given our callback; returns the trainer.

    main() logs and calls sys.exit on any failure: the exception train() raised is re-raised instead,
    so the worker classifies it (out of memory, error) like the native one's.
    """
    from tuning import sft_trainer

    original, outcome = sft_trainer.train, {}

    def train_with_callback(*args, **kwargs):
        kwargs["additional_callbacks"] = [*(kwargs.get("additional_callbacks") or []), callback]
        try:
            outcome["result"] = original(*args, **kwargs)
        except BaseException as exc:
            outcome["exception"] = exc
            raise
        return outcome["result"]

    os.environ["TERMINATION_LOG_FILE"] = str(Path(output_dir) / "termination-log")  # not /dev/termination-log
    saved_argv, sft_trainer.train = sys.argv, train_with_callback
    sys.argv = ["tuning.sft_trainer", *argv]
    try:
        sft_trainer.main()
    except SystemExit as exit_:
        if "exception" in outcome:
            raise outcome["exception"] from None
        if exit_.code not in (0, None):
            raise EngineFailure(f"fms-hf-tuning exited with {exit_.code}: {_termination_log(output_dir)}") from None
    finally:
        sft_trainer.train, sys.argv = original, saved_argv
    if "result" not in outcome:
        raise EngineFailure(f"fms-hf-tuning's main() did not train: {_termination_log(output_dir)}")
    result = outcome["result"]
    return result[0] if isinstance(result, tuple) else result


def _termination_log(output_dir: str) -> str:
    path = Path(output_dir) / "termination-log"
    return path.read_text().strip()[-2000:] if path.exists() else "no termination log"


def trained_model_facts(trainer: Any) -> dict[str, Any]:
    """What the record's metadata says about the model fms-hf-tuning trained."""
    from tunebench.training import model as model_mod

    model = trainer.model
    peft_config = getattr(model, "peft_config", None)
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return {
        "model_class": type(model).__name__,
        "model_type": getattr(getattr(model, "config", None), "model_type", None),
        "dtype": str(getattr(model, "dtype", "")).replace("torch.", ""),
        "parameters": model_mod.parameter_counts(model),
        "peft": {k: str(v.peft_type) for k, v in peft_config.items()} if peft_config else None,
        "distributed_type": str(trainer.accelerator.distributed_type).rsplit(".", 1)[-1],
        "wrapped_model_class": type(trainer.model_wrapped).__name__,
        "gradient_checkpointing_on": getattr(model, "is_gradient_checkpointing", None),
        "attn_implementation": getattr(getattr(base, "config", None), "_attn_implementation", None),
        "torch_compile": any(
            type(m).__name__ == "OptimizedModule"
            for m in (trainer.model_wrapped, getattr(trainer.model_wrapped, "module", None))
        ),
    }


def main(argv: list[str] | None = None) -> int:
    return run.main(argv, train_fn=train_fms)


if __name__ == "__main__":
    sys.exit(main())
