#!/usr/bin/env bash
# The GPU checks of docs/benchmarks/gpu.md in one device call, from the repository root on the device machine:
#
#   make gpu-wheels                     # here, once: .whl/ (git-ignored, about 51 MB)
#   device run: command "bash benchmarks/gpu_check.sh", carry [".whl"], timeout_s 560
#
# It installs the carried wheels into /tmp/site (the image's torch, transformers, peft stay), then writes four
# files under $OUT (what the call brings back): env.txt (GPU, driver, versions), pytest_gpu.log (`pytest -m gpu`),
# runs.jsonl (one `tunebench run`/`plan --json` Result per line) and runs.err (their stderr). Each step has its
# own time limit, so that the whole stays within one call and a hung step cannot take the rest with it.
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "the carried wheels did not install (make gpu-wheels, carry .whl)"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TUNEBENCH_HOME=/tmp/tunebench-home
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
{
    date -u
    nvidia-smi
    python3 - <<'PY'
import importlib
for name in ("torch", "transformers", "peft", "accelerate", "datasets", "bitsandbytes", "pydantic", "sqlalchemy", "pyarrow"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except Exception as exc:  # noqa: BLE001 - a missing package is what this file is for
        print(f"{name} MISSING: {exc}")
import torch
print("cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# the gpu test suite: every test marked gpu (tests/gpu/test_on_gpu.py), durations of the slowest
timeout 300 python3 -m pytest -m gpu -ra -p no:cacheprovider --durations=15 tests/gpu >"$OUT/pytest_gpu.log" 2>&1
echo "pytest -m gpu: exit $?"
tail -25 "$OUT/pytest_gpu.log"

# the runs of docs/benchmarks/gpu.md: each Result as one JSON line, random weights, generated data
tb() { timeout 120 python3 -m tunebench "$@" --json 2>>"$OUT/runs.err" | tr -d '\n' >>"$OUT/runs.jsonl"; echo >>"$OUT/runs.jsonl"; }
# flash_attn=0: the image has no flash-attn (its own gpu test says so); sdpa runs
E="model_name=smollm2-135m model_max_length=2048 number_gpus=1 gpu_model=H200 batch_size=8 flash_attn=0"
P="-p max_steps=10 -p dataset_id=news-tokens-16384plus-entries-4096"
for exp in full lora qlora pt; do
    echo "== run finetune_${exp}_benchmark-v1.0.0" >>"$OUT/runs.err"
    tb run "finetune_${exp}_benchmark-v1.0.0" $E $P --weights random
done
echo "== run out of memory on purpose" >>"$OUT/runs.err"
tb run finetune_full_benchmark-v1.0.0 model_name=llama3.1-8b model_max_length=8192 number_gpus=1 batch_size=64 \
    gpu_model=H200 flash_attn=0 -p max_steps=2 --weights random
for exp in full lora qlora pt; do
    tb plan "finetune_${exp}_benchmark-v1.0.0" $E $P
done
echo "runs: $(grep -c . "$OUT/runs.jsonl") lines in runs.jsonl"
