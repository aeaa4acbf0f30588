"""Bad input to every command: one line ``error: <field>: ...``, exit code 2, no traceback, nothing
created or changed on disk.

``CASES`` is the table (command line, field the message must name). Every case runs in-process
through ``tunebench.commands.main.main`` in a fresh working directory that holds the files the cases refer to
(a good store, a corrupt one, binary YAML and CSV, a directory, ...), with TUNEBENCH_HOME inside it;
the directory is snapshotted (names, sizes, modification times, contents) before and after. A
representative subset (``SUBPROCESS``) runs again as real processes of the console script, to show
that no traceback reaches a real terminal.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from layout import DATA, SRC
from tiny_models import TINY_DECODER

from tunebench.commands.main import main
from tunebench.errors import InputError
from tunebench.secrets import mask_secrets
from tunebench.store import Store
from tunebench.store.csvio import import_csv

ADO_CSV = DATA / "ado_docs_example_smollm2_cpu_measurements.csv"

LORA = "finetune_lora_benchmark-v1.0.0"
FULL = "finetune_full_benchmark-v1.0.0"
ENTITY = ["model_name=smollm2-135m", "model_max_length=256", "number_gpus=0", "batch_size=2"]
GPU_ENTITY = ["model_name=llama3.1-8b", "model_max_length=2048", "number_gpus=2", "batch_size=8", "gpu_model=H100"]


def c(field: str, *argv: str) -> tuple[str, list[str]]:
    return field, list(argv)


CASES: list[tuple[str, list[str]]] = [
    # --- usage errors: unknown option or command, missing or malformed values (item 1)
    c("--bogus", "plan", "--bogus"),
    c("--bogus", "--bogus"),
    c("--limit", "show", "--limit", "0"),
    c("--store", "report", "--store", "missing.db"),
    c("SPACE", "report", "nosuch.yaml"),
    c("--output", "report", "--store", "good.db", "-o", "/nonexistent/d/r.html"),
    c("--bogus", "report", "--bogus"),
    c("--to", "track", "export", "--to", "wandb", "--store", "good.db"),
    c("--store", "track", "export", "--to", "mlflow", "--store", "missing.db"),
    c("--uri", "track", "export", "--to", "mlflow", "--uri", "http://127.0.0.1:1", "--store", "good.db"),
    c("--uri", "track", "export", "--to", "aim", "--uri", "aim://127.0.0.1:1", "--store", "good.db"),
    c("--track", "run", LORA, *ENTITY, "--track", "mlfow"),
    c("--track", "run", LORA, *ENTITY, "--track", "mlflow:http://127.0.0.1:1"),
    c("--track", "run", LORA, *ENTITY, "--no-store", "--track", "aim"),
    c("--no-store", "run", LORA, *ENTITY, "--store", "new.db", "--no-store", "--timeout", "30"),  # as calibrate
    # MLflow tracking URIs it keeps no runs in: refused before anything trains (MLflow's client raised its own)
    c("--track: mlflow tracking URI 'ftp://x'", "run", LORA, *ENTITY, "--track", "mlflow:ftp://x"),
    c("--track: mlflow tracking URI 'notaurl'", "run", LORA, *ENTITY, "--track", "mlflow:notaurl"),
    c("--track: mlflow tracking URI 'ftp://x'", "explore", "space.yaml", "--track", "mlflow:ftp://x"),
    c("track: mlflow tracking URI 'ftp://x'", "explore", "track_ftp.yaml"),
    c(
        "--uri: mlflow tracking URI 'ftp://x'",
        "track",
        "export",
        "--to",
        "mlflow",
        "--uri",
        "ftp://x",
        "--store",
        "good.db",
    ),
    c(
        "--uri: mlflow tracking URI 'notaurl'",
        "track",
        "export",
        "--to",
        "mlflow",
        "--uri",
        "notaurl",
        "--store",
        "good.db",
    ),
    c("--uri", "track", "export", "--to", "mlflow", "--uri", "sqlite:///some.jsonl", "--store", "good.db"),
    c("--uri", "track", "export", "--to", "mlflow", "--uri", "sqlite:///adir", "--store", "good.db"),
    # a local tracker in a folder that does not exist: MLflow and Aim would make every missing folder
    c("--uri", "track", "export", "--to", "mlflow", "--uri", "sqlite:///nodir/m.db", "--store", "good.db"),
    c("--uri", "track", "export", "--to", "aim", "--uri", "nodir/sub/repo", "--store", "good.db"),
    c("--track", "run", LORA, *GPU_ENTITY, "--track", "mlflow:sqlite:///nodir/m.db"),
    c(
        "--uri: mlflow tracking URI 'http://[::1' is no URI",
        "track",
        "export",
        "--to",
        "mlflow",
        "--uri",
        "http://[::1",
    ),
    c("arguments", "track", "export", "foo"),  # not "--to: is required"
    c("--to", "track", "export", "--store", "good.db"),
    c("--limit", "show", "--limit", "abc"),
    c("--limit", "show", "--limit"),
    c("--max-parallel", "explore", "space.yaml", "--max-parallel", "0"),
    c("--ray-address", "explore", "space.yaml", "--ray-address", "ray://head:10001"),  # the executor is local
    c("--max-retries", "explore", "space.yaml", "--max-retries", "-1"),
    c("--lease-seconds", "explore", "space.yaml", "--lease-seconds", "0"),
    c("command", "nosuchcommand"),
    c("command", "datasets", "nope"),
    c("command", "plann"),
    c("EXPERIMENT", "validate"),
    c("EXPERIMENT", "describe"),
    c("EXPERIMENT", "run"),
    c("EXPERIMENT", "launch-plan"),
    c("EXPERIMENT", "recommend"),
    c("FILE", "import"),
    c("SPACE", "explore"),
    c("DATASET_ID", "datasets", "generate"),
    c("--model", "datasets", "stats", "news-chars-512-entries-4096"),
    c("--port", "launch-plan", LORA, *ENTITY, "--port", "abc"),
    c("--timeout", "run", LORA, *ENTITY, "--timeout", "soon"),
    c("--cpu-processes", "run", LORA, *ENTITY, "--cpu-processes", "1.5"),
    c("--adapters", "deploy-spec", "--params-b", "7", "--adapters", "x"),
    c("--quantization", "deploy-spec", "--quantization"),
    c("--price-per-gpu-hour", "plan", LORA, *ENTITY, "--price-per-gpu-hour", "cheap"),
    c("-p", "plan", "-p"),
    c("--format", "show", "--format"),
    c("--gpus-per-node", "recommend", LORA, *ENTITY, "--gpus-per-node", "eight"),
    c("arguments", "show", "extra"),
    c("arguments", "models", "extra"),
    c("arguments", "version", "1"),
    c("--json", "gpus", "--json=yes"),
    c("--bogus", "datasets", "list", "--bogus"),
    c("--max-len", "datasets", "stats", "news-chars-512-entries-4096", "--model", "smollm2-135m", "--max-len", "x"),
    c("--bogus", "experiments", "--bogus"),
    c("--lomo", "calibrate", "--lomo=maybe"),
    c("--bogus", "export", "--bogus"),
    c("arguments", "demo", "now"),
    # --- numbers, durations, ports where they are parsed (items 5, 6)
    c("--timeout", "run", LORA, *ENTITY, "--timeout", "-5"),
    c("--timeout", "run", LORA, *ENTITY, "--timeout", "nan"),
    c("--timeout", "run", LORA, *ENTITY, "--timeout", "inf"),
    c("--timeout", "run", LORA, *ENTITY, "--timeout", "0"),
    c("--cpu-processes", "run", LORA, *ENTITY, "--cpu-processes", "0"),
    c("--cpu-processes", "run", LORA, *ENTITY, "--cpu-processes", "-2"),
    # batch_size 2 over 3 CPU processes: refused before a data set, run folder or store is made
    c("--cpu-processes", "run", LORA, *ENTITY, "--cpu-processes", "3"),
    c("--host-memory-limit-gib", "run", LORA, *ENTITY, "--host-memory-limit-gib", "0"),
    c("--host-memory-limit-gib", "run", LORA, *ENTITY, "--host-memory-limit-gib", "nan"),
    c("--weights", "run", LORA, *ENTITY, "--weights", "fancy"),
    c("--engine", "run", LORA, *ENTITY, "--engine", "fms"),
    c("--engine", "launch-plan", LORA, *ENTITY, "--engine", "trl"),
    c("entity", "launch-plan", LORA, *ENTITY, "--engine", "fms-hf-tuning", "fast_kernels=True,True,True"),
    c("fms_hf_tuning_version", "engines", "install", "9.9"),
    c("fms_hf_tuning_version", "engines", "install", "3.0.0.1"),
    c("fms_hf_tuning_version", "engines", "remove", "2.1.2x"),
    c("--torch", "engines", "install", "3.2.2", "--torch", "cuda"),
    c("--bogus", "engines", "list", "--bogus"),
    c("--port", "launch-plan", LORA, *ENTITY, "--port", "99999999"),
    c("--port", "launch-plan", LORA, *ENTITY, "--port", "0"),
    c("--port", "launch-plan", LORA, *ENTITY, "--port", "-1"),
    c("--main-process-ip", "launch-plan", LORA, *ENTITY, "--main-process-ip", "--evil"),
    c("--main-process-ip", "launch-plan", LORA, *ENTITY, "--main-process-ip", "not a host!"),
    c("--data-dir", "launch-plan", LORA, *ENTITY, "--data-dir", "-x"),
    c("--weights", "launch-plan", LORA, *ENTITY, "--weights", "none"),
    c("--price-per-gpu-hour", "plan", LORA, *ENTITY, "--price-per-gpu-hour", "nan"),
    c("--price-per-gpu-hour", "plan", LORA, *ENTITY, "--price-per-gpu-hour", "-1"),
    c("--price-per-gpu-hour", "plan", LORA, *ENTITY, "--price-per-gpu-hour", "inf"),
    c("--network-gbps", "plan", LORA, *ENTITY, "--network-gbps", "0"),
    c("--network-gbps", "plan", LORA, *ENTITY, "--network-gbps", "nan"),
    c("--network-gbps", "plan", LORA, *ENTITY, "--network-gbps", "-3"),
    c("--host-memory-gib", "plan", LORA, *ENTITY, "--host-memory-gib", "0"),
    c("--host-memory-gib", "plan", LORA, *ENTITY, "--host-memory-gib", "nan"),
    c("tensor_parallel_degree", "plan", LORA, *ENTITY, "tensor_parallel_degree=0"),
    c("deepspeed_zero_stage", "plan", LORA, *ENTITY, "deepspeed_zero_stage=4"),
    c("offload_optimizer_device", "plan", LORA, *ENTITY, "offload_optimizer_device=disk"),
    c("attn_implementation", "validate", LORA, *ENTITY, "attn_implementation=flash"),
    c("--price-per-gpu-hour", "recommend", LORA, *ENTITY, "--price-per-gpu-hour", "nan"),
    c("--network-gbps", "recommend", LORA, *ENTITY, "--network-gbps", "inf"),
    c("--max-gpus", "recommend", LORA, *ENTITY, "--max-gpus", "0"),
    c("--max-gpus", "recommend", LORA, *ENTITY, "--max-gpus", "1000000000000000", "--gpus-per-node", "1"),
    c("--gpus-per-node", "recommend", LORA, *ENTITY, "--gpus-per-node", "0"),
    c("--max-oom-risk", "recommend", LORA, *GPU_ENTITY, "--max-oom-risk", "1.5"),
    c("number_gpus", "recommend", LORA, *ENTITY),  # a CPU run has no GPU count to recommend
    c(
        "--gpu-memory-gib",
        "plan",
        LORA,
        *GPU_ENTITY[:4],
        "gpu_model=Acme-X1",
        "--gpu-memory-gib",
        "-40",
        "--gpu-bf16-tflops",
        "100",
        "--gpu-interconnect-gbps",
        "50",
    ),  # was named --gpu-*: memory_gib
    c("--gpu-name", "plan", LORA, *GPU_ENTITY, "--gpu-name", "Acme-X1"),  # a label without its numbers
    c("batch_size", "plan", LORA, *GPU_ENTITY[:3], "gpu_model=H100", "--grid", "batch_size=1..99999999999999999999999"),
    c("number_gpus", "recommend", LORA, *GPU_ENTITY[:2], "number_gpus=two", *GPU_ENTITY[3:]),
    c("--max-oom-risk", "plan", LORA, *GPU_ENTITY, "--max-oom-risk", "nan"),
    c("seq_len", "plan", LORA, *GPU_ENTITY[:-2], "--grid", "seq_len=512..1024"),
    c("--method", "max-batch", "llama3.1-8b", "--gpu-model", "H100", "--method", "sft"),
    c("--gpu-model", "max-length", "llama3.1-8b"),
    c("--max-oom-risk", "max-length", "llama3.1-8b", "--gpu-model", "H100", "--max-oom-risk", "-1"),
    c("--dir", "demo", "--dir", "good.csv"),
    c("--currency", "plan", LORA, *GPU_ENTITY, "--price-per-gpu-hour", "2", "--currency", "dollars"),
    c("--adapter-size-gb", "deploy-spec", "--params-b", "7", "--adapter-size-gb", "nan"),
    c("--adapter-size-gb", "deploy-spec", "--params-b", "7", "--adapter-size-gb", "-1"),
    c("--params-b", "deploy-spec", "--params-b", "inf"),
    c("--params-b", "deploy-spec", "--params-b", "0"),
    c("--params-b", "deploy-spec", "--params-b", "nan"),
    c("--adapters", "deploy-spec", "--params-b", "7", "--adapters", "-1"),
    c("--gpu-memory-gb", "deploy-spec", "--params-b", "7", "--gpu-memory-gb", "0"),
    c("--quantization", "deploy-spec", "--params-b", "7", "--quantization", "3bit"),
    c("--token-env", "deploy-spec", "--params-b", "7", "--token-env", "A B"),
    c("--description", "deploy-spec", "--params-b", "7", "--description", "line\x1b[2J"),
    c("--lease-seconds", "explore", "space.yaml", "--lease-seconds", "nan"),
    c("--lease-seconds", "explore", "space.yaml", "--lease-seconds", "inf"),
    c("--executor", "explore", "space.yaml", "--executor", "kube"),
    c("--ray-address", "explore", "space.yaml", "--ray-address", "-x"),
    c("--max-len", "datasets", "stats", "news-chars-512-entries-4096", "--model", "smollm2-135m", "--max-len", "0"),
    # --- files: missing, a directory, binary, corrupt, of the wrong shape (item 5)
    c("--store", "show", "--store", "g.db"),
    c("--store", "show", "--store", "half.db"),
    c("--store", "show", "--store", "typo.db"),
    c("--store", "show", "--store", "adir"),
    c("--store", "show", "--store", "nodir/s.db"),
    c("--store", "show"),  # no store yet in TUNEBENCH_HOME: reading must not create one
    c("--store", "export", "--store", "g.db"),
    c("--store", "operations", "--store", "typo.db"),
    c("--store", "operations"),  # no store yet: listing must not create one
    c("--store", "export", "--store", "typo.db"),
    c("--store", "explore", "space.yaml", "--store", "g.db"),
    c("--store", "explore", "space.yaml", "--store", "adir"),
    c("--store", "explore", "space.yaml", "--store", "nodir/s.db"),
    c("--store", "import", "good.csv", "--store", "g.db"),
    c("--store", "import", "good.csv", "--store", "half.db"),
    c("--store", "calibrate", "--store", "typo.db"),
    c("--store", "calibrate", "--store", "g.db"),
    c("--store", "show", "--store", "notaurl://x:y"),
    c("--store", "show", "--store", "foreign.db"),  # another program's SQLite file: read, never given a store
    c("--store", "show", "--store", "empty.db"),
    c("--store", "export", "--store", "foreign.db"),
    c("--store", "report", "--store", "foreign.db"),
    c("--store", "calibrate", "--store", "foreign.db"),
    c("--store", "plan", LORA, *ENTITY, "--compare", "--store", "foreign.db"),
    c("--store", "plan", LORA, *ENTITY, "--compare", "--store", "missing.db"),
    c("--operation", "show", "--store", "good.db", "--operation", "op-nope"),
    c("--actuator", "show", "--store", "good.db", "--actuator", "nosuch"),  # not an empty table: a typo
    c("--actuator", "export", "--store", "good.db", "--actuator", "zzz"),
    c("--where", "show", "--store", "good.db", "--where", "batch_size>nan"),
    c("--where", "show", "--store", "good.db", "--where", "batch_size<=abc"),
    c("--format", "show", "--format", "xml", "--store", "good.db"),
    c("--format", "export", "--format", "xml", "--store", "good.db"),
    c("--output", "show", "--store", "good.db", "--format", "parquet"),
    c("--output", "show", "--store", "good.db", "-o", "adir"),
    c("--output", "show", "--store", "good.db", "-o", "nodir/out.csv"),
    c("--output", "show", "--store", "good.db", "-o", "adir/newdir/"),  # a directory: Path drops the '/'
    c("--where", "show", "--store", "good.db", "--where", "status=bogus"),  # would match nothing, silently
    c("--output", "export", "--store", "good.db", "-o", "adir"),
    c("--output", "export", "--store", "good.db", "-o", "nodir/out.csv"),
    c("--output", "export", "--store", "good.db", "-o", "adir/newdir/"),  # parsed as a Path, it lost its '/'
    c("--output", "export", "--format", "ado", "--store", "good.db"),
    c("--output", "export", "--format", "ado", "--store", "good.db", "-o", "good.csv"),
    c("SPACE", "space", "from-ado", "missing.yaml"),
    c("SPACE", "space", "from-ado", "bin.yaml"),
    c("experiments[0].experimentIdentifier", "space", "from-ado", "space.yaml"),
    c("--operation", "space", "from-ado", "space.yaml", "--operation", "missing.yaml"),
    c("--space", "show", "--store", "good.db", "--space", "bin.yaml"),
    c("--space", "show", "--store", "good.db", "--space", "missing.yaml"),
    c("--space", "export", "--store", "good.db", "--space", "adir"),
    c("SPACE", "explore", "bin.yaml"),
    c("SPACE", "explore", "adir"),
    c("SPACE", "explore", "missing.yaml"),
    c("FILE", "import", "bin.csv", "--store", "good.db"),
    c("FILE", "import", "adir", "--store", "good.db"),
    c("FILE", "import", "missing.csv", "--store", "good.db"),
    c("--output-dir", "run", LORA, *ENTITY, "--output-dir", "good.csv"),
    c("--output-dir", "run", LORA, *ENTITY, "--output-dir", "nodir/run"),
    c("--data-dir", "run", LORA, *ENTITY, "--data-dir", "good.csv"),
    c("--output", "calibrate", "--from", "good.csv", "--output", "adir"),
    c("--output", "calibrate", "--from", "good.csv", "--output", "nodir/cal.json"),
    c("--from", "calibrate", "--from", "bin.csv"),
    c("--from", "calibrate", "--from", "adir"),
    c("--ship-traces", "calibrate", "--ship-traces"),
    c("--ship-traces", "calibrate", "--from", "good.csv", "--ship-traces", "--no-store"),
    c("--from", "calibrate", "--from", "missing.csv"),
    c("--from", "calibrate", "--from", "runtime_inf.csv"),
    c("--from", "calibrate", "--from", "huge_field.csv"),
    c("--calibration", "plan", LORA, *ENTITY, "--calibration", "notjson.json"),
    c("--calibration", "plan", LORA, *ENTITY, "--calibration", "wrongshape.json"),
    c("--calibration", "plan", LORA, *ENTITY, "--calibration", "array.json"),
    c("--calibration", "plan", LORA, *ENTITY, "--calibration", "nancoef.json"),
    c("--calibration", "plan", LORA, *ENTITY, "--calibration", "zerocoef.json"),  # a divisor: numpy's warnings
    c("--calibration", "plan", LORA, *ENTITY, "--calibration", "bin.yaml"),
    c("--calibration", "plan", LORA, *ENTITY, "--calibration", "missing.json"),
    c("--calibration", "recommend", LORA, *ENTITY, "--calibration", "adir"),
    c("--batch", "plan", "--batch", "bin.csv"),
    c("--batch", "plan", "--batch", "adir"),
    c("--batch", "plan", "--batch", "missing.jsonl"),
    c("--dir", "datasets", "generate", "news-chars-64-entries-2", "--dir", "good.csv"),
    c("--dir", "datasets", "generate", "news-chars-64-entries-2", "--dir", "nodir/data"),
    c("--dir", "datasets", "list", "--dir", "good.csv"),
    # --- entity values: flags, control characters, what the store cannot hold (items 3, 4, 6)
    c("target_modules", "validate", LORA, *ENTITY, "target_modules=q_proj --host_memory_limit_gib 0.01"),
    c("target_modules", "run", LORA, *ENTITY, "target_modules=q_proj --host_memory_limit_gib 0.01"),
    c("target_modules", "launch-plan", LORA, *ENTITY, "target_modules=q_proj,--weights,pretrained"),
    c("target_modules", "plan", LORA, *ENTITY, 'target_modules=["--result_path"]'),
    # --- contents of files and values: a config.json's dimensions, broken or deeply nested JSON
    *[
        c(
            "model_name",
            cmd,
            LORA,
            "model_name=./" + name,
            "model_max_length=256",
            "number_gpus=1",
            "batch_size=1",
            "gpu_model=A100",
        )
        for cmd in ("plan", "validate", "launch-plan")
        for name in (
            "heads0.json",
            "hidden_huge.json",
            "hidden_text.json",
            "no_hidden.json",
            "layers_neg.json",
            "layers_huge.json",
            "deep_config.json",
        )
    ],
    c("target_modules", "validate", LORA, *ENTITY, 'target_modules=["q_proj"'),
    c("target_modules", "plan", LORA, *ENTITY, "target_modules=" + "[" * 50_000),
    c("space", "explore", "dupkey.yaml"),
    c("--gpu-catalog", "plan", LORA, *GPU_ENTITY[:-1], "gpu_model=BIGGPU", "--gpu-catalog", "gpus_huge.yaml"),
    c("--gpu-catalog", "plan", LORA, *GPU_ENTITY[:-1], "gpu_model=X", "--gpu-catalog", "gpus_dupkey.yaml"),
    # --- counts that would enumerate or launch without end: capped where they enter
    c(
        "number_gpus",
        "launch-plan",
        LORA,
        "model_name=smollm2-135m",
        "model_max_length=64",
        "number_gpus=100000",
        "batch_size=100000",
        "gpu_model=A100",
        "number_nodes=100000",
    ),
    c("number_nodes", "validate", LORA, *GPU_ENTITY, "number_nodes=100000"),
    c("--max-gpus", "recommend", LORA, *GPU_ENTITY, "--max-gpus", "1000000"),
    c("--gpus-per-node", "recommend", LORA, *GPU_ENTITY, "--gpus-per-node", "1000000"),
    c("--cpu-processes", "run", LORA, *ENTITY, "--cpu-processes", "100000"),
    c("--params-b", "deploy-spec", "--params-b", "1e30"),
    c("--gpu-memory-gb", "deploy-spec", "--params-b", "7", "--gpu-memory-gb", "1e300"),
    c("entity_space.model_max_length", "explore", "range_huge.yaml"),
    c("entity_space", "explore", "ten_million.yaml"),
    c("--space", "show", "--space", "ten_million.yaml", "--store", "good.db"),
    c("SPACE", "report", "ten_million.yaml", "--store", "good.db", "-o", "r.html"),
    c(
        "--nccl-env",
        "launch-plan",
        LORA,
        *GPU_ENTITY,
        "number_nodes=2",
        "--nccl-env",
        "NCCL_IB_HCA=mlx5\nrm -rf /",
    ),
    c("dataset_text_field", "validate", LORA, *ENTITY, "dataset_text_field=--max_steps"),
    c("dataset_text_field", "run", FULL, *ENTITY, "dataset_text_field=output --max_steps 1"),
    c("dataset_image_field", "launch-plan", LORA, *ENTITY, "dataset_image_field=-x"),
    c(
        "accelerate_config_fsdp_transformer_layer_cls_to_wrap",
        "validate",
        FULL,
        *GPU_ENTITY,
        "accelerate_config_fsdp_transformer_layer_cls_to_wrap=--fsdp_offload_params",
    ),
    c(
        "model_name",
        "validate",
        LORA,
        "model_name=smollm2-135m\x1b[2J",
        "model_max_length=256",
        "number_gpus=0",
        "batch_size=2",
    ),
    c("gpu_model", "validate", LORA, *GPU_ENTITY[:4], "gpu_model=H100\n"),
    c("dataset_id", "validate", LORA, *ENTITY, "dataset_id=news-chars-512-entries-4096\r"),
    c("optim", "validate", LORA, *ENTITY, "optim=adamw_torch\t"),
    c("dataset_text_field", "validate", LORA, *ENTITY, "dataset_text_field=out\x00put"),
    c("experiment", "validate", LORA + "\x07", *ENTITY),
    c(
        "model_max_length",
        "validate",
        LORA,
        "model_name=smollm2-135m",
        "model_max_length=99999999999999999999999999999999",
        "number_gpus=0",
        "batch_size=2",
    ),
    c(
        "model_max_length",
        "plan",
        LORA,
        "model_name=smollm2-135m",
        "model_max_length=9223372036854775808",
        "number_gpus=0",
        "batch_size=2",
    ),
    c(
        "batch_size",
        "validate",
        LORA,
        "model_name=smollm2-135m",
        "model_max_length=256",
        "number_gpus=0",
        "batch_size=-99999999999999999999999",
    ),
    c("num_train_epochs", "validate", LORA, *ENTITY, "num_train_epochs=1e309"),
    c("num_train_epochs", "validate", LORA, *ENTITY, "num_train_epochs=inf"),
    c("stop_after_seconds", "run", LORA, *ENTITY, "stop_after_seconds=nan"),
    c("r", "describe", LORA, "-p", "r=99999999999999999999999"),
    c("dataset_id", "validate", LORA, *ENTITY, "dataset_id=news-chars-512-entries-4096x"),
    c("entity_space.target_modules", "explore", "inject.yaml"),
    c("entity_space.model_max_length", "explore", "huge.yaml"),
    c("entity_space.dataset_text_field", "explore", "control.yaml"),
    c("entity_space.num_train_epochs", "explore", "inf.yaml"),
    c("entity_space.model_max_length.max", "explore", "range_inf.yaml"),
    c("execution.lease_seconds", "explore", "lease_inf.yaml"),
    c("actuator.timeout_seconds", "explore", "timeout_nan.yaml"),
    c("execution.max_parallel", "explore", "parallel_0.yaml"),
    c("actuator.extra_worker_args", "explore", "extra_result_path.yaml"),
    c("actuator.extra_worker_args", "explore", "extra_output_dir.yaml"),
    c("actuator.extra_worker_args", "explore", "extra_max_steps.yaml"),
    c("actuator.extra_worker_args", "explore", "extra_unknown.yaml"),
    c("actuator.extra_worker_args", "explore", "extra_bad_value.yaml"),
    c("actuator.extra_worker_args", "explore", "extra_not_a_list.yaml"),
    # --- data sets larger than this machine can hold: refused before anything is written (item 3)
    c("dataset_id", "datasets", "generate", "news-chars-512-entries-999999999999", "--dir", "data"),
    c("dataset_id", "datasets", "generate", "news-tokens-99999999999plus-entries-1", "--dir", "data"),
    c("dataset_id", "datasets", "generate", "vision-999999x999999-16plus-entries-1", "--dir", "data"),
    c("dataset_id", "datasets", "stats", "news-chars-512-entries-999999999999", "--model", "smollm2-135m"),
    # --- imported measurements: finite, non-negative, in range (item 6)
    c("runtime_inf.csv line 2: train_runtime", "import", "runtime_inf.csv", "--store", "good.db"),
    c("runtime_neg.csv line 2: train_runtime", "import", "runtime_neg.csv", "--store", "good.db"),
    c("runtime_text.csv line 2: train_runtime", "import", "runtime_text.csv", "--store", "good.db"),
    c("is_valid_2.csv line 2: is_valid", "import", "is_valid_2.csv", "--store", "good.db"),
    c("throughput_nan.csv line 3: dataset_tokens_per_second", "import", "throughput_nan.csv"),
    c("FILE", "import", "huge_field.csv", "--store", "good.db"),
    c("neg_batch.csv line 2: is_valid", "import", "neg_batch.csv", "--store", "good.db"),
    c("FILE", "import", "dup_header.csv", "--store", "good.db"),
    c("FILE", "import", "ragged.csv", "--store", "good.db"),
    c("FILE", "import", "short_row.csv", "--store", "good.db"),
    c("FILE", "import", "unterminated.csv", "--store", "good.db"),
    c("FILE", "import", "no_columns.csv", "--store", "good.db"),
    # files that cannot be a store's import: nothing beside the input (no -wal, -shm), no store made
    c("FILE: notdb.db is not a SQLite database", "import", "notdb.db", "--store", "new.db"),
    c("FILE: trunc.db is a damaged SQLite database", "import", "trunc.db", "--store", "new.db"),
    c("FILE: good.db is an SQLite file without an ado sample store", "import", "good.db", "--store", "new.db"),
    c("FILE: header_only.csv has no rows", "import", "header_only.csv", "--store", "new.db"),
    c("FILE: four_columns.csv lacks an is_valid or a train_runtime column", "import", "four_columns.csv"),
    c("FILE: four_header.csv lacks an is_valid", "import", "four_header.csv", "--store", "new.db"),
    c("FILE: no_properties.csv lacks the columns model_name, number_gpus", "import", "no_properties.csv"),
    c("--from: partial.csv line 3: model_max_length", "calibrate", "--from", "partial.csv", "--no-save"),
    # --- actuators: registered names only, unless whoever runs it opts in (item 8)
    c("actuator.name", "explore", "osystem.yaml"),
    c("actuator.cpu_processes", "explore", "opt_processes.yaml"),
    c("name", "explore", "control_name.yaml"),
    # bytes of another encoding (lone surrogates): a space's name and an operation id never reach the database
    c("name", "explore", "surrogate_name.yaml"),
    c("--operation", "show", "--store", "good.db", "--operation", "op-\udcff"),
    c("--operation", "export", "--store", "good.db", "--operation", "op-\udcff"),
    c("actuator.model_map", "explore", "opt_model_map.yaml"),
    c("actuator.weights", "explore", "opt_weights.yaml"),
    c("actuator.name", "explore", "space.yaml", "--actuator", "os:system"),
    c("actuator.name", "explore", "space.yaml", "--actuator", "fake_actuators:sleepy"),
    c("actuator.name", "explore", "space.yaml", "--actuator", "measur"),
    c("space", "explore", "bomb.yaml"),
    c("space", "explore", "deep.yaml"),
    c("space", "explore", "notyaml.yaml"),
    # --- credentials: where the bearer token may go (item 2)
    c("--post", "deploy-spec", "--params-b", "7", "--post", "http://example.com/v2/hardware_specifications"),
    c("--post", "deploy-spec", "--params-b", "7", "--post", "ftp://example.com/x"),
    c("--post", "deploy-spec", "--params-b", "7", "--post", "https://user:pw@example.com/x"),
    c("--post", "deploy-spec", "--params-b", "7", "--post", "not a url"),
    # --- an option given twice: click kept the last value without a word
    c("--price-per-gpu-hour", "plan", LORA, *GPU_ENTITY, "--price-per-gpu-hour", "1", "--price-per-gpu-hour", "2"),
    c("--gpu-model", "max-batch", "llama3.1-8b", "--gpu-model", "L40S", "--gpu-model", "H100"),
    c("--store", "import", "good.csv", "--store", "a.db", "--store", "b.db"),
    c("--to", "track", "export", "--to", "mlflow", "--to", "aim", "--store", "good.db"),
    c("--max-gpus", "recommend", LORA, *GPU_ENTITY, "--max-gpus", "2", "--max-gpus", "4"),
    c("--model", "deploy-spec", "--model", "llama3.1-8b", "--model", "mistral-7b"),
    c("--output", "report", "--store", "good.db", "-o", "a.html", "--output=b.html"),
    c("--json", "plan", LORA, *ENTITY, "--json", "--json"),
    c("--verbose", "-v", "--verbose", "models"),
    c("--dir", "demo", "--dir", "d1", "--dir", "d2"),
    # --- the demo starts afresh only in a folder of its own
    c("--dir", "demo", "--dir", ""),
    c("--dir", "demo", "--dir", "mine"),  # someone's store and report: the demo would have deleted the store
    c("--dir", "demo", "--dir", "."),
    c("model_name", "max-batch", "llama3.1-8b", "--gpu-model", "L40S", "model_name=mistral-7b"),
]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with its kind, size, modification time and content hash."""
    out: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        out[str(path.relative_to(root))] = (
            path.is_dir(),
            st.st_size if path.is_file() else None,
            st.st_mtime_ns,
            digest,
        )
    return out


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> Path:
    """The files the cases name, made once (copied into each case's working directory)."""
    root = tmp_path_factory.mktemp("bad-input-files")
    (root / "space.yaml").write_text(
        "experiments: [{id: finetune_lora_benchmark-v1.0.0}]\n"
        "entity_space: {model_name: smollm2-135m, model_max_length: 64, number_gpus: 0, batch_size: 1}\n"
        "actuator: {name: noop}\n"
    )
    (root / "good.csv").write_bytes(ADO_CSV.read_bytes())
    with Store(root / "good.db") as store:
        import_csv(store, ADO_CSV)
    rng = random.Random(0)
    (root / "g.db").write_bytes(rng.randbytes(100_000))  # `head -c 100000 /dev/urandom > g.db`
    (root / "half.db").write_bytes((root / "good.db").read_bytes()[:100] + rng.randbytes(4000))
    (root / "bin.yaml").write_bytes(b"\x89PNG\r\n\x1a\n" + rng.randbytes(3000))
    (root / "bin.csv").write_bytes(rng.randbytes(3000))
    (root / "adir").mkdir()
    (root / "mine").mkdir()
    shutil.copy(root / "good.db", root / "mine" / "runs.db")
    (root / "mine" / "report.html").write_text("<html>someone's report</html>")
    with sqlite3.connect(root / "foreign.db") as conn:  # another program's database
        conn.execute("CREATE TABLE users (name TEXT)")
    conn.close()
    (root / "empty.db").touch()
    (root / "notjson.json").write_text("coefficients: yes\n")
    (root / "wrongshape.json").write_text('{"coefficients": {"no_such_coefficient": 1.0}}')
    (root / "array.json").write_text("[1, 2, 3]")
    (root / "nancoef.json").write_text('{"coefficients": {"hfu_max": NaN}}')
    (root / "zerocoef.json").write_text('{"coefficients": {"link_efficiency": 0}}')
    header, *rows = list(csv.reader(io.StringIO(ADO_CSV.read_text())))
    for name, column, value, line in (
        ("runtime_inf", "train_runtime", "-1e309", 0),
        ("runtime_neg", "train_runtime", "-5", 0),
        ("runtime_text", "train_runtime", "fast", 0),
        ("is_valid_2", "is_valid", "2", 0),
        ("throughput_nan", "dataset_tokens_per_second", "inf", 1),
    ):
        bad = [list(r) for r in rows]
        bad[line][header.index(column)] = value
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([header, *bad])
        (root / f"{name}.csv").write_text(out.getvalue())
    (root / "huge_field.csv").write_text(",".join(header) + '\n"' + "x" * 200_000 + '"\n')
    (root / "no_columns.csv").write_text("a,b\n1,2\n")
    neg = [list(r) for r in rows]
    neg[0][header.index("batch_size")] = "-1"
    neg[0][header.index("identifier")] = neg[0][header.index("identifier")].replace("batch_size.1", "batch_size.-1")
    for name, table in (
        ("neg_batch", [header, *neg]),
        ("dup_header", [[*header, "batch_size"], *[[*r, "4"] for r in rows]]),
        ("ragged", [header, [*rows[0], "x"], *rows[1:]]),
        ("short_row", [header, rows[0][:5], *rows[1:]]),
    ):
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(table)
        (root / f"{name}.csv").write_text(out.getvalue())
    (root / "unterminated.csv").write_text(",".join(header) + '\n"0,abc\n')
    (root / "notdb.db").write_bytes(b"SQLite format 3\x00" + rng.randbytes(8000))  # the header, then noise
    good = (root / "good.db").read_bytes()
    assert good[18] == 2  # a WAL-mode file: SQLite reading it in place leaves -wal and -shm beside it
    (root / "trunc.db").write_bytes(good[:3000])
    (root / "header_only.csv").write_text(",".join(header) + "\n")
    four = [header.index(n) for n in ("identifier", "experiment_id", "model_name", "batch_size")]
    (root / "four_header.csv").write_text(",".join(header[i] for i in four) + "\n")
    (root / "four_columns.csv").write_text("\n".join(",".join(r[i] for i in four) for r in [header, *rows]) + "\n")
    kept = [i for i, n in enumerate(header) if n not in ("identifier", "model_name", "number_gpus")]
    (root / "no_properties.csv").write_text("\n".join(",".join(r[i] for i in kept) for r in [header, *rows]) + "\n")
    partial = [list(r) for r in rows[:2]]
    partial[1][header.index("model_max_length")] = "abc"
    (root / "partial.csv").write_text("\n".join(",".join(r) for r in [header, *partial]) + "\n")
    (root / "some.jsonl").write_text('{"a": 1}\n')
    space = yaml.safe_load((root / "space.yaml").read_text())
    for name, key, value in (
        ("inject", "target_modules", [["q_proj", "--host_memory_limit_gib", "0.01"]]),
        ("huge", "model_max_length", [64, 10**40]),
        ("control", "dataset_text_field", "output\x1b]0;owned\x07"),
        ("inf", "num_train_epochs", [1.0, float("inf")]),
    ):
        (root / f"{name}.yaml").write_text(
            yaml.safe_dump({**space, "entity_space": {**space["entity_space"], key: value}})
        )
    for name, extra in (
        ("range_inf", {"entity_space": {**space["entity_space"], "model_max_length": {"min": 1, "max": float("inf")}}}),
        ("lease_inf", {"execution": {"lease_seconds": float("inf")}}),
        ("timeout_nan", {"actuator": {"name": "noop", "timeout_seconds": float("nan")}}),
        ("parallel_0", {"execution": {"max_parallel": 0}}),
    ):
        (root / f"{name}.yaml").write_text(yaml.safe_dump({**space, **extra}))
    # a space file's extra worker flags: never one tunebench sets (the worker keeps the last of a repeated flag)
    measure = {
        **space,
        "experiments": [{"id": LORA, "parameters": {"max_steps": 1, "dataset_id": "news-chars-64-entries-2"}}],
        "actuator": {"name": "measure", "weights": "random", "timeout_seconds": 300},
    }
    (root / "victim.txt").write_text("a file the space file must not reach\n")
    for name, extra in (
        ("extra_result_path", ["--result_path", "victim.txt"]),
        ("extra_output_dir", ["--output_dir=/tmp/tunebench-outside-its-home"]),
        ("extra_max_steps", ["--max_steps", 1000000]),
        ("extra_unknown", ["--bogus", "1"]),
        ("extra_bad_value", ["--seed", "seven"]),
        ("extra_not_a_list", "--seed 7"),
    ):
        (root / f"{name}.yaml").write_text(
            yaml.safe_dump({**measure, "actuator": {**measure["actuator"], "extra_worker_args": extra}})
        )
    (root / "track_ftp.yaml").write_text(yaml.safe_dump({**space, "track": ["mlflow:ftp://x"]}))
    (root / "osystem.yaml").write_text(yaml.safe_dump({**space, "actuator": {"name": "os:system"}}))
    (root / "control_name.yaml").write_text(yaml.safe_dump({**space, "name": "bad\x1b[31mname"}))
    (root / "surrogate_name.yaml").write_text(yaml.safe_dump({**space, "name": "bad\udcffname"}))
    for name, option in (
        ("opt_processes", {"cpu_processes": "abc"}),
        ("opt_model_map", {"model_map": {"smollm2-135m": 42}}),
        ("opt_weights", {"weights": "rnd"}),
    ):
        (root / f"{name}.yaml").write_text(yaml.safe_dump({**space, "actuator": {"name": "measure", **option}}))
    (root / "bomb.yaml").write_text(
        "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nexperiments: [*c, *c, *c, *c]\n"
    )
    (root / "deep.yaml").write_text("[" * 5000 + "]" * 5000)
    for name, changed in (
        ("heads0", {"num_attention_heads": 0}),
        ("hidden_huge", {"hidden_size": 10**15}),
        ("hidden_text", {"hidden_size": "abc"}),
        ("no_hidden", {"hidden_size": None}),
        ("layers_neg", {"num_hidden_layers": -1}),
        ("layers_huge", {"num_hidden_layers": 10**9}),
    ):
        (root / f"{name}.json").write_text(
            json.dumps({k: v for k, v in {**TINY_DECODER, **changed}.items() if v is not None})
        )
    (root / "dupkey.yaml").write_text(
        (root / "space.yaml").read_text().replace("batch_size: 1}", "batch_size: 1, batch_size: 2}")
    )
    (root / "gpus_huge.yaml").write_text(
        "gpus:\n  - {name: BIGGPU, memory_gib: 1e300, bf16_tflops: 1, interconnect_gbps: 1}\n"
    )
    (root / "gpus_dupkey.yaml").write_text(
        "gpus:\n  - {name: X, name: Y, memory_gib: 8, bf16_tflops: 1, interconnect_gbps: 1}\n"
    )
    (root / "ten_million.yaml").write_text(
        yaml.safe_dump(
            {
                **space,
                "entity_space": {
                    **space["entity_space"],
                    "model_max_length": {"min": 1, "max": 10_000},
                    "batch_size": {"min": 1, "max": 1000},
                },
            }
        )
    )
    (root / "range_huge.yaml").write_text(
        yaml.safe_dump(
            {**space, "entity_space": {**space["entity_space"], "model_max_length": {"min": 1, "max": 1e308}}}
        )
    )
    (root / "deep_config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (root / "notyaml.yaml").write_text("experiments: [\n  - id: x\n")
    return root


@pytest.fixture
def workdir(tmp_path, monkeypatch, files):
    """A working directory with the files the cases name; TUNEBENCH_HOME (not created) inside it."""
    shutil.copytree(files, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEBENCH_STORE", raising=False)
    monkeypatch.delenv("TUNEBENCH_DATA_DIR", raising=False)
    return tmp_path


def check(code: int, out: str, err: str, field: str) -> None:
    lines = err.splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {field}"), lines[0]
    assert "Traceback" not in err and out == "", (out, err)


@pytest.mark.parametrize(("field", "argv"), CASES, ids=[" ".join(a)[:80] for _, a in CASES])
def test_bad_input_in_process(workdir, capsys, field, argv):
    before = snapshot(workdir)
    code = main(argv)
    out, err = capsys.readouterr()
    check(code, out, err, field)
    assert snapshot(workdir) == before, "bad input created or changed files"


def test_the_table_covers_every_command():
    from tunebench.commands.main import app

    commands = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    commands |= {
        f"{g.name} {c.name or c.callback.__name__.replace('_', '-')}"
        for g in app.registered_groups
        for c in g.typer_instance.registered_commands
    }
    commands -= {"version", "_root"}  # take no input (bad arguments to them are covered as usage errors)
    groups = {g.name for g in app.registered_groups}
    named = {" ".join(a[:2]) if a[0] in groups else a[0] for _, a in CASES}
    assert commands <= named, commands - named


# A representative subset as real processes of the console script: no traceback reaches a terminal.
# The issue's own cases first (items 1-8), then one of each kind of file and value error.
SUBPROCESS = [
    ["plan", "--bogus"],
    ["show", "--limit", "0"],
    ["explore", "space.yaml", "--max-parallel", "0"],
    ["nosuchcommand"],
    ["deploy-spec", "--params-b", "7", "--post", "http://example.com/v2/hardware_specifications"],
    ["datasets", "generate", "news-chars-512-entries-999999999999", "--dir", "data"],
    ["validate", LORA, *ENTITY, "target_modules=q_proj --host_memory_limit_gib 0.01"],
    ["show", "--store", "g.db"],
    ["explore", "bin.yaml"],
    ["import", "bin.csv", "--store", "good.db"],
    ["calibrate", "--from", "bin.csv"],
    ["plan", "--batch", "bin.csv"],
    ["import", "adir", "--store", "good.db"],
    ["export", "--store", "good.db", "-o", "adir"],
    ["show", "--store", "good.db", "-o", "nodir/out.csv"],
    ["run", LORA, *ENTITY, "--output-dir", "good.csv"],
    ["calibrate", "--from", "good.csv", "--output", "adir"],
    ["deploy-spec", "--params-b", "7", "--adapter-size-gb", "nan"],
    ["plan", LORA, *ENTITY, "--calibration", "notjson.json"],
    ["run", LORA, *ENTITY, "--timeout", "-5"],
    ["run", LORA, *ENTITY, "--cpu-processes", "0"],
    ["engines", "install", "9.9"],
    ["launch-plan", LORA, *ENTITY, "--port", "99999999"],
    ["plan", LORA, *ENTITY, "--price-per-gpu-hour", "nan"],
    ["plan", LORA, *ENTITY, "--network-gbps", "0"],
    ["plan", LORA, *ENTITY, "--calibration", "wrongshape.json"],
    ["validate", LORA, "model_name=smollm2-135m\x1b[2J", "model_max_length=256", "number_gpus=0", "batch_size=2"],
    ["import", "runtime_inf.csv", "--store", "good.db"],
    ["show", "--store", "typo.db"],
    ["explore", "osystem.yaml"],
    ["explore", "extra_result_path.yaml"],
    ["show", "--store", "foreign.db"],
    ["import", "trunc.db", "--store", "new.db"],
]
BY_ARGV = {tuple(argv): field for field, argv in CASES}


def console_script() -> list[str]:
    script = Path(sys.executable).with_name("tunebench")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tunebench"]


@pytest.mark.parametrize("argv", SUBPROCESS, ids=[" ".join(a)[:80] for a in SUBPROCESS])
def test_bad_input_in_a_real_process(workdir, argv):
    field = BY_ARGV[tuple(argv)]  # every one is a case of the table
    src = str(SRC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    before = snapshot(workdir)
    proc = subprocess.run([*console_script(), *argv], capture_output=True, text=True, timeout=120, env=env)
    check(proc.returncode, proc.stdout, proc.stderr, field)
    assert snapshot(workdir) == before


# Settings from the environment: an error names the variable, never an option that was not given.
ENV_CASES = [
    ("TUNEBENCH_HOME", "good.csv/home", ["plan", LORA, *ENTITY]),
    ("TUNEBENCH_HOME", "good.csv", ["show"]),
    ("TUNEBENCH_HOME", "good.csv", ["calibrate", "--from", "good.csv", "--no-lomo"]),
    ("TUNEBENCH_DATA_DIR", "good.csv", ["datasets", "generate", "news-chars-64-entries-2"]),
    ("TUNEBENCH_DATA_DIR", "good.csv/data", ["datasets", "list"]),
    ("TUNEBENCH_GPU_CATALOG", "bin.yaml", ["gpus"]),
    ("TUNEBENCH_GPU_CATALOG", "missing.yaml", ["gpus", "--json"]),
    ("TUNEBENCH_GPU_CATALOG", "array.json", ["plan", LORA, *GPU_ENTITY]),
    ("TUNEBENCH_ENGINES_DIR", "good.csv", ["engines", "list"]),
]


@pytest.mark.parametrize(("name", "value", "argv"), ENV_CASES, ids=[f"{n}={v} {a[0]}" for n, v, a in ENV_CASES])
def test_bad_environment_settings_are_named(workdir, capsys, monkeypatch, name, value, argv):
    monkeypatch.setenv(name, str(workdir / value))
    before = snapshot(workdir)
    code = main(argv)
    out, err = capsys.readouterr()
    check(code, out, err, name)
    assert snapshot(workdir) == before


def test_python_dash_m_tunebench_exits_with_the_commands_code(workdir):
    src = str(SRC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "tunebench", "show", "--limit", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    check(proc.returncode, proc.stdout, proc.stderr, "--limit")


@pytest.mark.parametrize("argv", [["--version"], ["version"]])
def test_version(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("0.1.0") and (out.startswith("tunebench ") or argv == ["version"])


@pytest.mark.parametrize(
    "argv", [["-h"], ["--help"], [], ["datasets"], ["plan", "-h"], ["datasets", "stats", "--help"]]
)
def test_help_exits_0(capsys, argv):
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "Usage: tunebench" in out and err == ""


def test_store_passwords_are_masked_in_messages(workdir, capsys):
    """Item 7: a store URL's password never reaches a message: not main's, not the "no operation" error."""
    from tunebench.commands.store import _select

    url = "postgresql://user:s3cret-pw@127.0.0.1:notaport/db"
    assert main(["show", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "postgresql://user:***@127.0.0.1" in err and "s3cret-pw" not in err, err
    with Store(workdir / "good.db") as store:
        store.url = "postgresql+psycopg://user:s3cret-pw@db.example/tunebench"  # where the rows would come from
        with pytest.raises(InputError) as caught:
            _select(store, None, "op-nope", None)
    assert "postgresql+psycopg://user:***@db.example/tunebench" in str(caught.value)
    assert "s3cret-pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://me:pw@h:5432/db", "postgresql://me:***@h:5432/db"),
        ("mysql+pymysql://root:p%40ss@h/db?charset=utf8", "mysql+pymysql://root:***@h/db?charset=utf8"),
        ("see postgresql://u:a:b@h/db and sqlite:////x.db", "see postgresql://u:***@h/db and sqlite:////x.db"),
        (
            "postgresql://h/db?user=u&password=pw&sslmode=require",
            "postgresql://h/db?user=u&password=***&sslmode=require",
        ),
        ("Authorization: Bearer abc.def.ghi", "Authorization: Bearer ***"),
        ("postgresql://nobody@h/db", "postgresql://nobody@h/db"),
    ],
)
def test_mask_secrets(text, masked):
    assert mask_secrets(text) == masked


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["max-batch", "llama3.1-8b", "--gpu-model", "L40S", "--gpu-model=H100"],
            "error: --gpu-model: given twice (allowed: once)",
        ),
        (["import", "good.csv", "--store", "a.db", "--store=b.db"], "error: --store: given twice (allowed: once)"),
        (
            ["report", "--store", "good.db", "-o", "a.html", "--output", "b.html", "-o", "c.html"],
            "error: --output: given 3 times (allowed: once)",
        ),
        (["plan", LORA, *ENTITY, "--json", "--json"], "error: --json: given twice (allowed: once)"),
        (
            ["recommend", LORA, *GPU_ENTITY, "--max-gpus", "2", "--max-gpus", "4"],
            "error: --max-gpus: given twice (allowed: once)",
        ),
    ],
)
def test_an_option_given_twice_is_refused_naming_it(workdir, capsys, argv, line):
    """Click keeps an option's last value: max-batch planned for the H100, import wrote b.db. Each spelling
    counts (--opt v, --opt=v, a short alias); nothing is written."""
    before = snapshot(workdir)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", line + "\n")
    assert snapshot(workdir) == before


def test_options_declared_repeatable_take_every_value(workdir, capsys):
    """-p and --nccl-env are lists: each value counts, none is an option given twice; --help still shows help."""
    argv = ["launch-plan", LORA, *GPU_ENTITY, "-p", "max_steps=3", "-p", "gradient_accumulation_steps=5"]
    assert main([*argv, "--nccl-env", "NCCL_DEBUG=INFO", "--nccl-env", "NCCL_IB_HCA=mlx5", "--json"]) == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert plan["experiment_id"] == f"{LORA}-gradient_accumulation_steps.5-max_steps.3", err
    assert {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5"}.items() <= plan["nodes"][0]["env"].items()
    assert main(["plan", "--json", "--json", "--help"]) == 0
    out, err = capsys.readouterr()
    assert "Usage: tunebench plan" in out and err == ""


def test_a_bearer_token_is_masked_not_the_word_token(workdir, capsys, monkeypatch):
    """The message of a missing token said 'the bearer ***': the mask took the word for a credential."""
    monkeypatch.delenv("TOKEN", raising=False)
    assert main(["deploy-spec", "--model", "llama3.1-8b", "--post", "http://127.0.0.1:1/v2"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --token-env: environment variable TOKEN is not set (it must hold the bearer token)\n"), err
    assert mask_secrets("(Authorization: Bearer s3cr3t-42), sent") == "(Authorization: Bearer ***), sent"
    assert mask_secrets("bearer token-s3cr3t") == "bearer ***"  # a credential that starts with the word


def test_max_batch_names_the_model_argument_not_an_option(workdir, capsys):
    """There is no --model-name: the model is max-batch's MODEL argument."""
    assert main(["max-batch", "llama3.1-8b", "--gpu-model", "L40S", "model_name=mistral-7b"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: model_name: given twice: as the MODEL argument and as KEY=VALUE (allowed: the MODEL argument alone)\n"
    )


@pytest.mark.parametrize(
    ("field", "argv"),
    [
        ("FILE", ["import", "big.txt", "--store", "new.db"]),
        ("SPACE", ["explore", "big.txt"]),
        (
            "model_name",
            [
                "plan",
                LORA,
                "model_name=./big.txt",
                "model_max_length=64",
                "number_gpus=1",
                "batch_size=1",
                "gpu_model=A100",
            ],
        ),
    ],
)
def test_text_inputs_larger_than_the_cap_are_refused_before_reading(tmp_path, monkeypatch, capsys, field, argv):
    # 65 MiB of size in a sparse file (no blocks written): refused from its size, nothing created
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path / "home"))
    with open(tmp_path / "big.txt", "wb") as f:
        f.truncate(65 * 2**20)
    code = main(argv)
    out, err = capsys.readouterr()
    check(code, out, err, field)
    assert "at most 64 MiB" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.txt"]


# --- a write that fails (a full disk) leaves the user's file as it was, and no temporary file behind

FULL_DISK_DRIVER = r"""
import json, os, subprocess, sys
directory, name, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", directory], check=True)
with open(os.path.join(directory, name), "w") as f:
    f.write("precious")
try:
    with open(os.path.join(directory, "filler"), "wb") as f:
        while True:
            f.write(bytes(4096))
            f.flush()
except OSError:
    pass
proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
left = {n: open(os.path.join(directory, n), "rb").read()[:100].decode("latin-1") for n in os.listdir(directory)}
print(json.dumps({"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "left": left}))
"""


def unshare_works() -> bool:
    """Whether this user may make a mount namespace of its own (util-linux unshare, user namespaces)."""
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _limits(fsize: int | None):
    """preexec_fn: bounded memory and CPU time; fsize caps the size of any file written (SIGXFSZ ignored:
    the write fails with EFBIG, as a full disk fails with ENOSPC)."""
    import resource
    import signal

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (600, 600))
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return apply


def on_a_full_disk(workdir: Path, name: str, argv: list[str]) -> tuple[int, str, dict[str, str]]:
    """Run the console script with argv, its outputs under FULL (a full 256 KiB tmpfs in a namespace of
    its own, holding the file name with 'precious' in it; without namespaces, a directory where no
    file may grow past 1 kB): (exit code, stderr, what the directory holds afterwards)."""
    full = workdir / "full"
    full.mkdir()
    argv = [*console_script(), *(a.replace("FULL", str(full)) for a in argv)]
    src = str(SRC)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if unshare_works() and not os.environ.get("TUNEBENCH_TEST_NO_UNSHARE"):
        driver = ["unshare", "-rm", sys.executable, "-c", FULL_DISK_DRIVER, str(full), name, json.dumps(argv)]
        proc = subprocess.run(driver, capture_output=True, text=True, timeout=400, env=env, preexec_fn=_limits(None))
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        return out["rc"], out["stderr"], out["left"]
    (full / name).write_text("precious")
    with sqlite3.connect(workdir / "good.db") as conn:  # read without a -shm file (which would exceed the cap)
        conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    # the cap holds for every file the process writes: the planner's cache is filled by a first run
    warm = [a.replace(str(full / name), str(workdir / "warm-up")) for a in argv]
    subprocess.run(warm, capture_output=True, timeout=400, env=env, preexec_fn=_limits(None), check=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=env, preexec_fn=_limits(1000))
    return proc.returncode, proc.stderr, {p.name: p.read_bytes()[:100].decode("latin-1") for p in full.iterdir()}


FULL_DISK_CASES = [
    ["show", "--store", "good.db", "-f", "parquet", "-o", "FULL/out"],
    ["show", "--store", "good.db", "-f", "csv", "-o", "FULL/out"],
    ["show", "--store", "good.db", "-f", "table", "-o", "FULL/out"],
    ["export", "--store", "good.db", "-o", "FULL/out"],
    ["report", "--store", "good.db", "-o", "FULL/out"],
    ["calibrate", "--from", "good.csv", "--replace", "--no-lomo", "-o", "FULL/out"],
]


@pytest.mark.parametrize("argv", FULL_DISK_CASES, ids=[" ".join(a[:3]) for a in FULL_DISK_CASES])
def test_a_failed_write_leaves_the_users_file_as_it_was(workdir, argv):
    code, err, left = on_a_full_disk(workdir, "out", argv)
    assert code == 2, err
    (line,) = err.strip().splitlines()[-1:]
    assert re.match(r"error: --output: (no space left on device|file too large) writing '.*/full/out'$", line), err
    assert "Traceback" not in err
    assert left.get("out") == "precious", left  # the user's file as it was
    assert set(left) <= {"out", "filler"}, left  # and no temporary file behind


def test_calibrate_checks_its_output_before_fitting(workdir):
    """calibrate fits for minutes: a result it could not write is refused before the fit starts."""
    code, err, left = on_a_full_disk(
        workdir, "cal.json", ["calibrate", "--from", "good.csv", "--replace", "--no-lomo", "-o", "FULL/cal.json"]
    )
    assert code == 2 and "fitting" not in err, err
    assert err.strip().startswith("error: --output: ") and len(err.strip().splitlines()) == 1, err
    assert left.get("cal.json") == "precious" and set(left) <= {"cal.json", "filler"}, left


@pytest.mark.parametrize(
    ("argv", "suggested"),
    [
        (["plan", LORA, *GPU_ENTITY, "lora_r=8"], "Did you mean 'r'"),  # the alias first, not 'lora_alpha'
        (["plan", LORA, *GPU_ENTITY, "max_seq_length=8"], "Did you mean 'model_max_length'"),
        (["recommend", LORA, *GPU_ENTITY, "--price", "2"], "Did you mean '--price-per-gpu-hour'"),
        (["plan", LORA, *GPU_ENTITY, "--price", "2"], "Did you mean '--price-per-gpu-hour'"),  # not '--space'
        (["plan", LORA, *GPU_ENTITY[1:], "model_name=granite-3.1-8b"], "Did you mean 'granite-3.1-8b-instruct'"),
    ],
)
def test_suggestions_prefer_aliases_and_names_that_start_with_the_text(argv, suggested, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert suggested in err and len(err.strip().splitlines()) == 1
