#!/usr/bin/env bash
# The GPU checks of docs/benchmarks/gpu.md in one device call, from the repository root on the device machine:
#
#   make gpu-wheels                     # here, once: .whl/ (git-ignored, about 51 MB)
#   device run: command "bash benchmarks/gpu_check.sh", carry [".whl"], timeout_s 420
#
# It installs the carried wheels into /tmp/site (the image's torch, transformers, peft stay), then writes four
# files under $OUT (what the call brings back): env.txt (GPU, driver, versions), runs.jsonl (one `tunebench run`
# or `plan --json` Result per line), runs.err (their stderr) and pytest_gpu.log (`pytest -m gpu`). The runs come
# first, the test suite last, all within BUDGET seconds (each step limited to what is left), so that the whole
# ends inside the call's timeout and leaves device time to run it again. Exit 0 only where every step did.
set -u
OUT=${OUT:-/tmp/gpu-check}
BUDGET=${BUDGET:-360}
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
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

failed=0
# one Result as one JSON line; a run that fails or runs out of time leaves an empty line and counts as failed
tb() {
    local limit
    limit=$(left)
    [ "$limit" -gt 10 ] || { echo "== skipped (no time left): $*" >>"$OUT/runs.err"; echo >>"$OUT/runs.jsonl"; failed=1; return; }
    echo "== $* (at most ${limit} s)" >>"$OUT/runs.err"
    timeout "$limit" python3 -m tunebench "$@" --json 2>>"$OUT/runs.err" | tr -d '\n' >>"$OUT/runs.jsonl"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    echo >>"$OUT/runs.jsonl"
}
# the runs of docs/benchmarks/gpu.md: random weights, generated data; flash_attn=0: the image has no flash-attn
E="model_name=smollm2-135m model_max_length=2048 number_gpus=1 gpu_model=H200 batch_size=8 flash_attn=0"
P="-p max_steps=10 -p dataset_id=news-tokens-16384plus-entries-4096"
for exp in full lora qlora pt; do
    tb run "finetune_${exp}_benchmark-v1.0.0" $E $P --weights random --no-store
done
# padding_free on a GPU: one flattened row per micro-batch under sdpa's block-diagonal mask (no flash-attn here)
tb run finetune_lora_benchmark-v1.0.0 $E $P padding_free=1 --weights random --no-store
# out of memory on purpose: is_valid 0 with the CUDA reason (a Result of status invalid exits 0)
tb run finetune_full_benchmark-v1.0.0 model_name=llama3.1-8b model_max_length=8192 number_gpus=1 batch_size=64 \
    gpu_model=H200 flash_attn=0 -p max_steps=2 --weights random --no-store
for exp in full lora qlora pt; do
    tb plan "finetune_${exp}_benchmark-v1.0.0" $E $P
done
echo "runs: $(grep -c . "$OUT/runs.jsonl") of 10 lines in runs.jsonl"

# the gpu test suite (tests/gpu/test_on_gpu.py) with the time left
limit=$(left)
if [ "$limit" -gt 20 ]; then
    timeout "$limit" python3 -m pytest -m gpu -ra -p no:cacheprovider --durations=15 tests/gpu >"$OUT/pytest_gpu.log" 2>&1
    code=$?
else
    echo "not run: no time left of BUDGET=$BUDGET s" >"$OUT/pytest_gpu.log"
    code=1
fi
echo "pytest -m gpu: exit $code"
tail -25 "$OUT/pytest_gpu.log"
[ "$code" -eq 0 ] || failed=1
exit "$failed"
