"""Real tiny training runs of the worker, in this process (tunebench.worker.run.main).

Tiny random models of catalog architectures (--tunebench_tiny: hidden 64, 2 layers), an in-process
byte-level BPE tokenizer, a few steps each: seconds per run on a 2-core CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from worker_data import write_data

from tunebench.spec.measured import BENCHMARK_MEASURED
from tunebench.worker.run import main

pytestmark = pytest.mark.slow  # every test here trains a model

# One catalog model per architecture family the issue names (shrunk with --tunebench_tiny).
ARCHS = {
    "llama": "llama3-8b",
    "granite": "granite-3.1-2b",
    "mixtral": "mixtral-8x7b-instruct-v0.1",
    "gpt_bigcode": "granite-20b-v2",
    "bloom": "hf-tiny-model-private/tiny-random-BloomForCausalLM",
}
SPEC_PROPERTIES = BENCHMARK_MEASURED[:-1]  # spec 004 "Measured properties" (is_valid is the caller's)


def run(tmp_path: Path, *extra: str, model: str = "llama3-8b", steps: int = 3, **flags) -> tuple[int, dict, dict]:
    """Run the worker in-process; returns (exit code, rank-0 result, aggregate or {})."""
    data = tmp_path / "data.jsonl"
    if not data.exists():
        write_data(data)
    defaults = {
        "tunebench_model": model,
        "tunebench_tiny": "True",
        "weights": "random",
        "training_data_path": str(data),
        "max_steps": str(steps),
        "per_device_train_batch_size": "2",
        "max_seq_length": "48",
        "torch_dtype": "float32",
        "gradient_checkpointing": "True",
        "use_flash_attn": "False",
        "output_dir": str(tmp_path / "out"),
        "result_path": str(tmp_path / "result.json"),
        "metrics_interval_seconds": "0.2",
    }
    defaults.update({k: str(v) for k, v in flags.items()})
    argv = [x for k, v in defaults.items() for x in (f"--{k}", v)] + list(extra)
    rc = main(argv)
    rank0 = json.loads((tmp_path / "result.json.rank0.json").read_text())
    agg_path = tmp_path / "result.json"
    agg = json.loads(agg_path.read_text()) if agg_path.exists() else {}
    return rc, rank0, agg


def assert_sane(props: dict) -> None:
    assert set(SPEC_PROPERTIES) <= set(props)
    for name in ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second"):
        assert props[name] > 0, name
    assert props["dataset_tokens_per_second"] > 0
    assert props["dataset_tokens_per_second"] <= props["train_tokens_per_second"]  # padding only adds
    assert props["train_tokens_per_gpu_per_second"] == props["train_tokens_per_second"]  # number_gpus 0 -> / 1
    assert all(props[k] == 0.0 for k in props if k.startswith("gpu_"))  # no GPU used
    assert props["cpu_compute_utilization"] > 0
    assert 0 < props["cpu_memory_utilization"] <= 100


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("method", ["none", "lora", "pt"])
def test_every_property_for_each_architecture_and_method(tmp_path, arch, method):
    rc, r, agg = run(tmp_path, model=ARCHS[arch], peft_method=method)
    assert rc == 0, r.get("reason")
    assert r["status"] == "ok" and agg["status"] == "ok"
    assert_sane(agg["properties"])
    meta = r["metadata"]
    assert meta["model_type"] == arch and meta["weights"] == "random" and meta["tokenizer"]["kind"] == "in-process-bpe"
    params = meta["parameters"]
    if method == "none":
        assert params["trainable"] == params["total"]
    elif method == "pt":  # TEXT init, 8 virtual tokens x hidden 64 (hf-stack.md §4.5)
        assert params["trainable"] == 8 * 64
        assert meta["peft"]["prompt_tuning_init"] == "TEXT"
    else:
        assert 0 < params["trainable"] < params["total"]
        expected = {"gpt_bigcode": ["c_attn"], "bloom": ["query_key_value"]}.get(arch, ["q_proj", "v_proj"])
        assert meta["peft"]["target_modules"] == expected
    assert r["steps"]["total"] == 3 and r["train_runtime"] > 0
    assert_rates_follow_from_tokens(tmp_path, r, agg["properties"], steps=3, samples=3 * 2)


def assert_rates_follow_from_tokens(tmp_path: Path, r: dict, props: dict, *, steps: int, samples: int) -> None:
    """Each rate is its count over train_runtime; token counts brute-forced from the consumed entries."""
    assert r["consumed"]["entries"] == samples
    dataset, non_pad, padded = _brute_force(tmp_path, r, int(r["args"]["max_seq_length"]))
    assert sum(r["steps"]["global"]["dataset_tokens"]) == dataset
    assert sum(r["steps"]["global"]["non_pad_tokens"]) == non_pad
    assert sum(r["steps"]["global"]["padded_tokens"]) == padded
    runtime = props["train_runtime"]
    assert props["dataset_tokens_per_second"] == pytest.approx(dataset / runtime, rel=1e-9)
    assert props["train_tokens_per_second"] == pytest.approx(padded / runtime, rel=1e-9)
    assert props["train_samples_per_second"] == pytest.approx(samples / runtime, rel=1e-9)
    assert props["train_steps_per_second"] == pytest.approx(steps / runtime, rel=1e-9)


def _brute_force(tmp_path: Path, r: dict, max_len: int) -> tuple[int, int, int]:
    """Over the consumed entries: (Σ min(len(tokens(entry)), model_max_length, max_len) (the spec's note 3),
    Σ trained lengths (the attention mask), Σ per micro-batch batch x longest)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(r["metadata"]["tokenizer"]["path"])
    texts = [json.loads(line)["output"] for line in (tmp_path / "data.jsonl").read_text().splitlines()]
    counts = [min(len(tok(t)["input_ids"]), tok.model_max_length, max_len) for t in texts]
    # trained = BOS + text + EOS: the reference trains on output + eos_token (hf-stack.md §7.2.4)
    lengths = [min(len(tok(t)["input_ids"]) + 1, tok.model_max_length, max_len) for t in texts]
    consumed = r["consumed"]["indices"]
    bs = r["args"]["per_device_train_batch_size"]
    micro_batches = [consumed[j : j + bs] for j in range(0, len(consumed), bs)]
    padded = sum(len(c) * max(lengths[i] for i in c) for c in micro_batches)
    return sum(counts[i] for i in consumed), sum(lengths[i] for i in consumed), padded


@pytest.mark.parametrize("gas", [1, 4])
@pytest.mark.parametrize("gc", ["True", "False"])
def test_tokens_counted_from_consumed_micro_batches(tmp_path, gas, gc):
    """Reference bug IBM/ado#65: throughput with GAS > 1 and gradient checkpointing off."""
    rc, r, agg = run(tmp_path, steps=3, gradient_accumulation_steps=gas, gradient_checkpointing=gc)
    assert rc == 0, r.get("reason")
    steps = r["steps"]
    assert r["consumed"]["entries"] == 3 * 2 * gas == sum(steps["global"]["samples"])
    _, non_pad, padded = _brute_force(tmp_path, r, 48)
    assert sum(steps["global"]["non_pad_tokens"]) == non_pad
    assert sum(steps["global"]["padded_tokens"]) == padded
    assert_rates_follow_from_tokens(tmp_path, r, agg["properties"], steps=3, samples=3 * 2 * gas)


@pytest.mark.parametrize("arch", ["bloom", "llama"])
def test_dataset_tokens_are_the_specs_count_of_each_consumed_entry(tmp_path, arch):
    """The spec's note 3: each consumed entry counts min(len(tokens(entry["output"])), tokenizer.model_max_length,
    max_seq_length), re-tokenised here with the run's tokenizer: the EOS appended for training is not data."""
    from transformers import AutoTokenizer

    max_len = 40  # the consumed records are about 17 to 62 tokens: some are cut, some are not
    rc, r, agg = run(tmp_path, model=ARCHS[arch], steps=2, gradient_accumulation_steps=4, max_seq_length=max_len)
    assert rc == 0, r.get("reason")
    tok = AutoTokenizer.from_pretrained(r["metadata"]["tokenizer"]["path"])
    texts = [json.loads(line)["output"] for line in (tmp_path / "data.jsonl").read_text().splitlines()]
    consumed = r["consumed"]["indices"]
    assert len(consumed) == r["consumed"]["entries"] == 2 * 4 * 2
    ids = [tok(texts[i])["input_ids"] for i in consumed]
    expected = sum(min(len(x), tok.model_max_length, max_len) for x in ids)
    props = agg["properties"]
    counted = props["dataset_tokens_per_second"] * props["train_runtime"]
    assert counted == pytest.approx(expected, rel=1e-12), (counted, expected)
    assert props["dataset_tokens_per_second_per_gpu"] == props["dataset_tokens_per_second"]  # number_gpus 0
    assert sum(r["steps"]["global"]["dataset_tokens"]) == expected
    # what the model was fed has one more token (the EOS) for every entry shorter than max_len
    uncut = sum(len(x) < max_len for x in ids)
    assert 0 < uncut < len(ids) and sum(r["steps"]["global"]["non_pad_tokens"]) == expected + uncut


def test_truncation_counts_max_seq_length(tmp_path):
    """Every record is longer than max_seq_length 8: each consumed entry contributes exactly 8 tokens."""
    rc, r, agg = run(tmp_path, steps=2, max_seq_length=8)
    assert rc == 0, r.get("reason")
    assert sum(r["steps"]["global"]["non_pad_tokens"]) == 8 * 2 * 2
    assert sum(r["steps"]["global"]["padded_tokens"]) == 8 * 2 * 2


def test_trained_tokens_are_the_labels_the_loss_used(tmp_path):
    """trained_tokens = Σ labels != -100 over the consumed entries; 0 when truncation cuts the marker."""
    from transformers import AutoTokenizer

    from tunebench.training.data import IGNORE_INDEX, tokenize_record

    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    rc, r, agg = run(tmp_path / "a", steps=2)
    assert rc == 0, r.get("reason")
    tok = AutoTokenizer.from_pretrained(r["metadata"]["tokenizer"]["path"])
    texts = [json.loads(line)["output"] for line in (tmp_path / "a" / "data.jsonl").read_text().splitlines()]
    labels = [tokenize_record(tok, t, "\n### Response:", 48).labels for t in texts]
    expected = sum(sum(x != IGNORE_INDEX for x in labels[i]) for i in r["consumed"]["indices"])
    assert expected > 0 and sum(r["steps"]["global"]["trained_tokens"]) == expected == agg["trained_tokens"]
    rc, r, agg = run(tmp_path / "b", steps=1, max_seq_length=8)  # 8 tokens end before every marker
    assert rc == 0 and agg["trained_tokens"] == 0
    assert r["data"]["records_without_label_tokens"] == r["data"]["records"]


def test_stop_after_seconds_stops_and_drops_hf_rates(tmp_path):
    rc, r, agg = run(tmp_path, steps=100000, stop_after_seconds=1.0, per_device_train_batch_size=1)
    assert rc == 0, r.get("reason")
    d = r["steps"]["durations_s"]
    assert r["steps"]["stopped_by"] == "stop_after_seconds"
    assert sum(d) >= 1.0 > sum(d[:-1])  # stopped at the end of the first step past the limit
    props = agg["properties"]
    for name in ("train_tokens_per_second", "train_tokens_per_gpu_per_second"):
        assert name not in props  # spec 004: omitted when stop_after_seconds > 0
    assert props["train_runtime"] == pytest.approx(sum(d))
    dataset, non_pad, _ = _brute_force(tmp_path, r, 48)  # one entry per step (batch 1), truncated at 48 tokens
    assert r["consumed"]["entries"] == len(d) and sum(r["steps"]["global"]["non_pad_tokens"]) == non_pad
    assert props["dataset_tokens_per_second"] == pytest.approx(dataset / sum(d), rel=1e-9)
    for name in ("train_samples_per_second", "train_steps_per_second"):
        assert props[name] > 0  # the spec omits only the two token rates


def test_auto_stop_excludes_warmup(tmp_path):
    rc, r, agg = run(
        tmp_path,
        steps=100000,
        per_device_train_batch_size=1,
        auto_stop_method="WARMUP_60S_STABLE_120S_OR_10_STEPS",
        auto_stop_warmup_seconds=0.6,
        auto_stop_stable_seconds=0.4,
        auto_stop_stable_steps=3,
        metrics_interval_seconds=0.05,
    )
    assert rc == 0, r.get("reason")
    steps = r["steps"]
    d, k = steps["durations_s"], steps["warmup"]
    assert steps["stopped_by"] == "auto_stop" and steps["auto_stop_satisfied"] is True
    assert sum(d[:k]) >= 0.6 > sum(d[: k - 1])  # warm-up: the first steps reaching 0.6 s
    assert len(d) - k >= 3 and sum(d[k:]) >= 0.4  # stable window: >= 3 steps AND >= 0.4 s
    assert sum(d[k:-1]) < 0.4 or len(d) - k - 1 < 3  # ...and it stopped at the first step satisfying both
    props = agg["properties"]
    assert props["train_runtime"] == pytest.approx(sum(d[k:]))
    assert props["dataset_tokens_per_second"] == pytest.approx(sum(steps["global"]["dataset_tokens"][k:]) / sum(d[k:]))
    assert props["train_steps_per_second"] == pytest.approx((len(d) - k) / sum(d[k:]))  # kept: real steps
    assert r["system"]["n_dropped_warmup"] > 0  # samples inside the warm-up dropped


@pytest.mark.parametrize(
    "flags, reason",
    [
        ({"peft_method": "qlora"}, "needs an NVIDIA GPU"),
        ({"use_flash_attn": "True"}, "flash-attention needs an NVIDIA GPU and the flash-attn package"),
        ({"fp16": "True"}, "fp16 autocast needs a GPU"),  # accelerate would silently train float32
    ],
)
def test_gpu_only_options_fail_clearly_on_cpu(tmp_path, flags, reason):
    rc, r, agg = run(tmp_path, **flags)
    assert rc == 1 and r["status"] == "error" and not agg
    assert reason in r["reason"] and r["phase"] == "setup"
    assert r["exception"]["traceback_tail"]


@pytest.mark.parametrize("flags", [{"torch_dtype": "bfloat16"}, {"bf16": "True"}], ids=["pure-bf16", "bf16-autocast"])
def test_bf16_trains_in_bf16_on_a_cpu_without_native_bf16(tmp_path, monkeypatch, flags):
    """A measurement is of the entity it names: bf16 asked on a CPU without AVX512-BF16 or AMX (the CI
    machine's kind, simulated here) trains in bf16, slowly, rather than float32 under the bf16 id."""
    import torch

    (tmp_path / "fp32").mkdir()
    rc, r, _ = run(tmp_path / "fp32", steps=2)  # the same run in float32, the same seed
    assert rc == 0, r.get("reason")
    fp32_losses = r["metadata"]["train_losses"]
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    rc, r, agg = run(tmp_path, steps=2, **flags)
    assert rc == 0 and agg["status"] == "ok", r.get("reason")
    meta = r["metadata"]
    pure = flags.get("torch_dtype") == "bfloat16"
    # the weights (pure bf16) or only the computation (autocast, float32 master weights) are bf16
    assert meta["dtype"] == ("bfloat16" if pure else "float32")
    assert meta["trainable_dtypes"] == (["bfloat16"] if pure else ["float32"])
    assert meta["compute_dtype"] == "bfloat16"  # the LM head's output in training
    assert meta["train_losses"] != fp32_losses  # bf16 rounding changed the numbers: another computation ran
    assert "as asked" in meta["precision_note"]  # and the record says so, and why it is slow


def test_gptq_flags_fail_clearly_on_cpu(tmp_path):
    rc, r, _ = run(tmp_path, "--auto_gptq", "triton_v2", peft_method="lora", fp16="true", torch_dtype="float16")
    assert rc == 1 and r["status"] == "error"
    assert "GPTQ" in r["reason"] and "GPU" in r["reason"]


def test_pretrained_weights_and_tokenizer_from_a_local_directory(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tunebench.training.tokenizer import train_bpe_tokenizer

    texts = [json.loads(line)["output"] for line in write_data(tmp_path / "data.jsonl").read_text().splitlines()]
    tok = train_bpe_tokenizer(texts, 300)
    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tok),
    )
    local = tmp_path / "local-model"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(local)
    tok.save_pretrained(local)
    rc, r, agg = run(
        tmp_path,
        model_name_or_path=str(local),
        weights="auto",
        tunebench_tiny="False",
        tunebench_model="llama3-8b",
        steps=2,
    )
    assert rc == 0, r.get("reason")
    meta = r["metadata"]
    assert meta["weights"] == "pretrained" and meta["weights_requested"] == "auto"
    assert meta["tokenizer"]["kind"] == "model" and meta["parameters"]["total"] < 100_000


def test_missing_pretrained_weights_fail_without_download(tmp_path):
    rc, r, _ = run(tmp_path, model_name_or_path=str(tmp_path / "nowhere"), weights="pretrained")
    assert rc == 1 and r["status"] == "error"
    assert "local" in r["reason"] and r["phase"] == "load"


def test_unknown_flags_are_recorded_not_fatal(tmp_path):
    rc, r, _ = run(tmp_path, "--fms_only_flag", "7", "--fast_moe", "0", steps=1)
    assert rc == 0, r.get("reason")
    assert r["unknown_args"] == ["--fms_only_flag", "7"]
    assert "fast_moe" not in r["metadata"]["not_applied"]  # 0 is off; > 0 is refused (fms-acceleration)


def test_bad_command_line_still_writes_a_result(tmp_path):
    rc = main(["--training_data_path", "x.jsonl", "--max_steps", "many", "--result_path", str(tmp_path / "r.json")])
    r = json.loads((tmp_path / "r.json.rank0.json").read_text())
    assert rc == 1 and r["status"] == "error" and "max_steps" in r["reason"]


def test_random_weights_rebuild_every_catalog_architecture():
    """The config built for random weights has exactly the catalog's parameter count (meta device: no memory),
    and its tiny version trains (forward + backward)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tunebench.catalog import list_models
    from tunebench.training.model import build_config

    checked, tiny_types = 0, set()
    for spec in list_models():
        if spec.is_vision or spec.hidden_size is None or not spec.total_params:
            continue  # vision models: tests/worker/test_vision.py; granite-8b-japanese has no shape
        with torch.device("meta"):
            full = AutoModelForCausalLM.from_config(build_config(spec, False, 512, {}))
        assert sum(p.numel() for p in full.parameters()) == spec.total_params, spec.name
        checked += 1
        if spec.model_type in tiny_types:
            continue
        tiny_types.add(spec.model_type)  # one tiny model per type trains (keeps the test short)
        tiny = AutoModelForCausalLM.from_config(build_config(spec, True, 300, {"pad_token_id": 3}))
        assert tiny.config.model_type == spec.model_type
        x = torch.randint(0, 300, (1, 8))
        tiny(input_ids=x, labels=x).loss.backward()
    assert checked >= 30 and len(tiny_types) >= 7


def test_random_weights_use_the_offline_tokenizer_of_their_family(tmp_path, monkeypatch):
    """Non-tiny random weights tokenize like tunebench.datasets counts: the family's offline tokenizer."""
    from tunebench.datasets import offline
    from tunebench.training.tokenizer import offline_tokenizer

    assert offline.available("mistral-v1"), "mistral-common (the offline Mistral tokenizer) is part of the install"
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path))
    tok, name = offline_tokenizer("mistral-7b-v0.1", 32000)
    assert name.startswith("mistral-v1") and len(tok) == 32000
    assert (tok.bos_token, tok.eos_token) == ("<s>", "</s>") and tok("hi")["input_ids"][0] == tok.bos_token_id
    assert offline_tokenizer("mistral-7b-v0.1", 1000) is None  # more ids than the embedding has rows
