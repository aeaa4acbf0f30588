"""Where an NVIDIA GPU exists (``pytest -m gpu``): real training of each method (full, LoRA, prompt
tuning, QLoRA, GPTQ-LoRA, flash-attention), NVML against the driver's own nvidia-smi, a CUDA out of
memory classified as invalid, torch's peak memory against the bytes the run must hold.

Skipped, and listed by ``-ra``, where NVML finds no GPU (tests/conftest.py). On a GPU machine every
test here runs: a missing package (bitsandbytes, flash-attn, gptqmodel) or a CPU-only torch fails
with its reason instead of skipping. docs/benchmarks/gpu.md says how to run it and records results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from worker.test_training import assert_rates_follow_from_tokens, run
from worker_data import write_data

pytestmark = pytest.mark.gpu

GIB = 2**30


def nvidia_smi(*fields: str) -> list[list[str]]:
    """One row per GPU of ``nvidia-smi --query-gpu=<fields>`` (the driver's tool, not NVML's Python binding)."""
    assert shutil.which("nvidia-smi"), "nvidia-smi is not on PATH"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [[x.strip() for x in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def test_torch_sees_the_gpu_nvml_reports():
    import torch

    assert torch.cuda.is_available(), f"an NVIDIA GPU is here but torch {torch.__version__} has no CUDA"
    assert torch.cuda.device_count() == len(nvidia_smi("index"))


def gpu_run(tmp_path: Path, *extra: str, **flags):
    """The worker in this process on the GPU, bf16 weights (the spec's default dtype)."""
    return run(tmp_path, *extra, **{"torch_dtype": "bfloat16", **flags})


def assert_trained_on_the_gpu(r: dict, agg: dict, tmp_path: Path, *, steps: int = 3, samples: int = 6) -> dict:
    assert r["metadata"]["device"] == "cuda"
    props = agg["properties"]
    assert_rates_follow_from_tokens(tmp_path, r, props, steps=steps, samples=samples)
    assert props["gpu_memory_utilization_peak"] > 0 and props["gpu_compute_utilization_max"] > 0
    assert props["gpu_power_watts_max"] > 0
    peak = r["torch_memory"]
    assert props["gpu_memory_allocated_peak_gib"] == peak["max_allocated_gib"] > 0
    assert props["gpu_memory_reserved_peak_gib"] == peak["max_reserved_gib"] >= peak["max_allocated_gib"]
    return props


@pytest.mark.parametrize("method", ["none", "lora", "pt", "qlora"])
def test_each_method_trains_on_the_gpu(tmp_path, method):
    rc, r, agg = gpu_run(tmp_path, peft_method=method)
    assert rc == 0 and r["status"] == "ok", r.get("reason")
    assert_trained_on_the_gpu(r, agg, tmp_path)
    params = r["metadata"]["parameters"]
    if method == "qlora":  # bitsandbytes NF4 with double quantisation under the LoRA adapters
        assert r["metadata"]["quantization"] == "bnb-nf4-double"
        assert 0 < params["trainable"] < params["total"]
    elif method == "none":
        assert params["trainable"] == params["total"]


def test_flash_attention_trains_on_the_gpu(tmp_path):
    rc, r, agg = gpu_run(tmp_path, use_flash_attn="True", peft_method="lora")
    assert rc == 0 and r["status"] == "ok", r.get("reason")
    assert_trained_on_the_gpu(r, agg, tmp_path)
    assert r["metadata"]["attn_implementation"] == "flash_attention_2"


def _gptq_checkpoint(tmp_path: Path) -> Path:
    """A tiny llama quantized to 4-bit GPTQ on this GPU (transformers' GPTQConfig over gptqmodel)."""
    import torch
    from transformers import AutoModelForCausalLM, GPTQConfig, LlamaConfig

    from tunebench.training.tokenizer import train_bpe_tokenizer

    texts = [json.loads(line)["output"] for line in write_data(tmp_path / "data.jsonl").read_text().splitlines()]
    tok = train_bpe_tokenizer(texts, 300)
    cfg = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tok),
    )
    plain = tmp_path / "plain"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float16).save_pretrained(plain)
    tok.save_pretrained(plain)
    quantized = tmp_path / "gptq"
    gptq = GPTQConfig(bits=4, group_size=64, dataset=texts, tokenizer=tok)
    AutoModelForCausalLM.from_pretrained(plain, quantization_config=gptq, device_map="cuda:0").save_pretrained(
        quantized
    )
    tok.save_pretrained(quantized)
    return quantized


def test_gptq_lora_trains_on_the_gpu(tmp_path):
    """The native worker's GPTQ path (transformers' GPTQ backend); fms-acceleration's --fast_kernels and
    --fused_lora are refused by it (only the fms-hf-tuning engine runs them)."""
    checkpoint = _gptq_checkpoint(tmp_path)
    rc, r, agg = gpu_run(
        tmp_path,
        "--auto_gptq",
        "triton_v2",
        peft_method="lora",
        fp16="true",
        torch_dtype="float16",
        model_name_or_path=str(checkpoint),
        weights="pretrained",
        tunebench_tiny="False",
    )
    assert rc == 0 and r["status"] == "ok", r.get("reason")
    assert r["metadata"]["quantization"] == "gptq" and r["metadata"]["weights"] == "pretrained"
    assert_trained_on_the_gpu(r, agg, tmp_path)


def test_nvml_agrees_with_nvidia_smi_while_the_gpu_works():
    import torch

    from tunebench.executors.local import Gpu, detect_gpus
    from tunebench.worker.metrics import MetricsSampler

    rows = nvidia_smi("index", "name", "memory.total", "power.limit")
    expected = [Gpu(i, name) for i, name, *_ in rows]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        expected = [g for g in expected if g.index in {v.strip() for v in visible.split(",")}]
    assert detect_gpus() == expected
    stop = threading.Event()

    def work():  # keep GPU 0 busy with bf16 matrix products
        a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
        while not stop.is_set():
            a @ a
            torch.cuda.synchronize()

    sampler = MetricsSampler(interval_s=0.1, gpu_ids=["0"]).start()
    worker = threading.Thread(target=work)
    worker.start()
    time.sleep(3.0)
    stop.set()
    worker.join()
    sampler.stop()
    series = [g for s in sampler.samples for g in s.gpus]
    assert series, "the sampler recorded no GPU sample through NVML"
    assert max(g.compute_utilization for g in series) > 50  # a busy GPU, as NVML reports it
    limit_w = float(rows[0][3])
    assert 0 < max(g.power_watts for g in series) <= 1.1 * limit_w  # nvidia-smi's power limit
    used_mib = max(g.memory_utilization for g in series) / 100 * float(rows[0][2])  # % of nvidia-smi's total
    assert 128 < used_mib  # the 128 MiB operand alone (8,192^2 x 2 B), plus the CUDA context


def tiny_config(tmp_path: Path, **dims) -> str:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        **dims,
    }
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return str(path)


def measure_on_gpu(tmp_path: Path, config: str, parameters: dict, entity: dict):
    from tunebench.actuators.measure import measure
    from tunebench.spec.experiments import get_experiment, make_entity

    exp = get_experiment(
        "finetune_full_benchmark-v1.0.0",
        {"dataset_id": "news-chars-2048-entries-4096", "gradient_accumulation_steps": 1, **parameters},
    )
    from tunebench.catalog import get_gpu

    gpu_model = get_gpu(nvidia_smi("name")[0][0]).name  # this machine's GPU as the catalog names it
    # flash_attn False: sdpa, which every CUDA torch has (flash-attention has its own test above)
    values = {"model_name": config, "number_gpus": 1, "gpu_model": gpu_model, "flash_attn": False, **entity}
    ent = make_entity(exp, values)
    options = {"weights": "random", "output_dir": str(tmp_path / "run"), "timeout_seconds": 900, "visible_devices": "0"}
    return measure(exp, ent, options)


def test_cuda_out_of_memory_is_invalid(tmp_path):
    """Logits alone: 256 samples of about 1,000 tokens (4,223 characters, a 2,048-entry BPE) x 1,048,576
    vocabulary entries x 2 B = 0.5 TB, beyond any GPU (the embedding itself is 67 M parameters)."""
    config = tiny_config(tmp_path, vocab_size=1_048_576)
    result = measure_on_gpu(tmp_path, config, {"max_steps": 2}, {"model_max_length": 2048, "batch_size": 256})
    assert result.status == "invalid", (result.status, result.error, result.log_tail)
    assert result.properties == {"is_valid": 0}
    assert result.reasons[0].startswith("GPU out of memory"), result.reasons


def test_torch_peak_memory_holds_weights_gradients_and_adam_states(tmp_path):
    """Full fine-tuning in float32 with AdamW keeps 4 B of weights, 4 B of gradients and 8 B of optimizer
    state per parameter after the first step: the allocated peak is at least 16 B x parameters, and
    the activations of 4 x 256 tokens of a 1,024-wide, 8-layer model add well under 2 GiB."""
    dims = {
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 32000,
    }
    per_layer = 4 * 1024 * 1024 + 3 * 1024 * 2816 + 2 * 1024  # q k v o, gate up down, two RMSNorms
    params = 8 * per_layer + 2 * 32000 * 1024 + 1024  # + embeddings, untied head, final norm
    config = tiny_config(tmp_path, **dims)
    result = measure_on_gpu(
        tmp_path,
        config,
        {"max_steps": 3, "torch_dtype": "float32", "gradient_checkpointing": False},
        {"model_max_length": 256, "batch_size": 4},
    )
    assert result.status == "valid", (result.error, result.log_tail)
    p = result.properties
    floor = 16 * params / GIB
    assert floor <= p["gpu_memory_allocated_peak_gib"] < floor + 2.0
    assert p["gpu_memory_allocated_peak_gib"] <= p["gpu_memory_reserved_peak_gib"]
    total_gib = float(nvidia_smi("memory.total")[0][0]) / 1024
    # nvidia-smi's view (peak utilization x the card) adds the CUDA context to torch's reserved bytes
    assert p["gpu_memory_utilization_peak"] / 100 * total_gib >= p["gpu_memory_reserved_peak_gib"]
