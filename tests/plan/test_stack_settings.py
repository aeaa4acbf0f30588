"""The stack settings (docs/experiments.md "Stack settings") on the measuring side: each one really runs, or
the entity is judged before anything runs (tunebench.engines.support), never ignored.

Real tiny training runs (the worker in this process, or the measuring actuator's subprocess) on the CPU;
judged entities are checked to start no process and make no run folder.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from actuators.test_measure import PARAMS, TINY_LLAMA, entity_of, opts
from worker.test_training import run

import tunebench.actuators.measure as measure_module
from tunebench.actuators.launch import build_launch_plan
from tunebench.actuators.measure import measure
from tunebench.engines import FMS, NATIVE
from tunebench.engines.support import RULES, unsupported
from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.properties import PADDING_FREE_MODEL_TYPES
from tunebench.training.loss import chunked_causal_lm_loss, model_dtype_causal_lm_loss

LORA = "finetune_lora_benchmark-v1.0.0"
FULL = "finetune_full_benchmark-v1.0.0"
A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


# ------------------------------------------------------------------------------------------ chunked loss


@pytest.mark.parametrize("num_items", [None, 57])
def test_chunked_loss_equals_transformers_upcast_loss_and_gradient(num_items):
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(0)
    vocab = 300
    labels = torch.randint(0, vocab, (3, 40))
    labels[:, :12] = -100  # the prompt: masked
    labels[1, 30:] = -100  # padding
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(3, 40, vocab).to(dtype).requires_grad_()
        n = torch.tensor(num_items) if num_items else None
        upcast = ForCausalLMLoss(logits, labels, vocab, num_items_in_batch=n)
        (grad_upcast,) = torch.autograd.grad(upcast, logits)
        chunked = chunked_causal_lm_loss(logits, labels, vocab, num_items_in_batch=n, chunk_tokens=16)  # 8 chunks
        (grad_chunked,) = torch.autograd.grad(chunked, logits)
        assert chunked.dtype == torch.float32 and grad_chunked.dtype == dtype
        assert chunked.item() == pytest.approx(upcast.item(), rel=1e-6)
        torch.testing.assert_close(grad_chunked, grad_upcast)
    every_label_masked = torch.full((3, 40), -100)
    assert math.isnan(chunked_causal_lm_loss(logits, every_label_masked, vocab).item())  # as F.cross_entropy
    assert math.isnan(ForCausalLMLoss(logits, every_label_masked, vocab).item())


def test_chunked_loss_keeps_no_fp32_logits_for_backward():
    """What autograd saves: the 16-bit logits (views) only, never a chunk's fp32 upcast (recomputed)."""
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t

    logits = torch.randn(2, 64, 100).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 100, (2, 64))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = chunked_causal_lm_loss(logits, labels, 100, chunk_tokens=32)
    loss.backward()
    assert saved and not [s for s in saved if s[0] == torch.float32 and s[1] > 100]  # at most scalars in fp32


@pytest.mark.parametrize("num_items", [None, 57])
def test_model_dtype_loss_is_the_upcast_loss_computed_in_the_logits_dtype(num_items):
    """fp32 logits: exactly transformers' loss and gradient; bf16 logits: within bf16's rounding, its gradient
    in bf16, and no fp32 vocabulary-sized tensor saved for backward (the point of the path)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(0)
    vocab = 300
    labels = torch.randint(0, vocab, (3, 40))
    labels[:, :12] = -100
    labels[1, 30:] = -100
    n = torch.tensor(num_items) if num_items else None
    logits = torch.randn(3, 40, vocab).requires_grad_()
    upcast = ForCausalLMLoss(logits, labels, vocab, num_items_in_batch=n)
    (grad_upcast,) = torch.autograd.grad(upcast, logits)
    same = model_dtype_causal_lm_loss(logits, labels, vocab, num_items_in_batch=n)
    (grad_same,) = torch.autograd.grad(same, logits)
    assert same.item() == pytest.approx(upcast.item(), rel=1e-6)
    torch.testing.assert_close(grad_same, grad_upcast)

    saved = []
    half = logits.detach().to(torch.bfloat16).requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, t.numel())) or t, lambda t: t):
        loss = model_dtype_causal_lm_loss(half, labels, vocab, num_items_in_batch=n)
    (grad_half,) = torch.autograd.grad(loss, half)
    assert loss.dtype == torch.bfloat16 and grad_half.dtype == torch.bfloat16
    assert loss.item() == pytest.approx(upcast.item(), rel=2e-2)
    assert saved and not [s for s in saved if s[0] == torch.float32 and s[1] > 100]
    # under AMP torch autocasts cross_entropy to fp32 (the copy this path avoids): the path turns it off
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.functional.cross_entropy(half.reshape(-1, vocab), labels.reshape(-1)).dtype == torch.float32
        assert model_dtype_causal_lm_loss(half, labels, vocab).dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------ padding_free


def _samples(lengths: list[int], vocab: int) -> list[dict]:
    torch.manual_seed(1)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, vocab, (n,)).tolist()
        labels = [-100] * 3 + ids[3:]  # a prompt of 3 tokens, as the completion-only labels mask it
        out.append({"input_ids": ids, "labels": labels, "entry_index": i, "dataset_tokens": n})
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_flattened_batch_has_the_padded_batchs_loss_and_gradients(attn):
    """FlatteningCollator's one row of samples, whose position ids restart at each sample, attends within each
    sample only: the loss and every gradient are the padded batch's. Concatenated without restarting positions
    (one long sample) they are not: the check can tell the two apart."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tunebench.training.data import CompletionCollator, FlatteningCollator

    config = LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "model_type"}, use_cache=False)
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float()
    features = _samples([7, 19, 12], TINY_LLAMA["vocab_size"])

    def loss_and_grads(batch: dict) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        inputs = {k: v for k, v in batch.items() if k not in ("entry_index", "dataset_tokens")}
        loss = model(**inputs).loss
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters()]

    padded = CompletionCollator(pad_token_id=0)(features)
    flat = FlatteningCollator()(features)
    assert flat["input_ids"].shape == (1, 38) and padded["input_ids"].shape == (3, 19)
    assert flat["entry_index"] == [0, 1, 2] and flat["dataset_tokens"] == [7, 19, 12]
    assert flat["position_ids"][0].tolist() == [*range(7), *range(19), *range(12)]
    loss_padded, grads_padded = loss_and_grads(padded)
    loss_flat, grads_flat = loss_and_grads(flat)
    assert loss_flat == pytest.approx(loss_padded, rel=1e-5)
    for a, b in zip(grads_flat, grads_padded, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    one_sample = {**flat, "position_ids": torch.arange(38)[None]}
    assert loss_and_grads(one_sample)[0] != pytest.approx(loss_padded, rel=1e-3)


# tiny models of each type (hf-stack.md §4.1 shapes); the per-type fields their configs name otherwise
TINY_OF_TYPE = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "head_dim": 16,
                "pad_token_id": 0}  # fmt: skip
TINY_OVERRIDES = {
    "gpt_bigcode": {"vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128},
    "bloom": {"vocab_size": 256, "hidden_size": 64, "n_layer": 2, "n_head": 4},
    "falcon": {"num_key_value_heads": None, "head_dim": None},
    "gpt_neox": {"num_key_value_heads": None, "head_dim": None},
    "phi": {"num_key_value_heads": None, "head_dim": None},
    "starcoder2": {"head_dim": None},
    "stablelm": {"num_key_value_heads": 4, "head_dim": None},
}
LEAKY_MODEL_TYPES = ("bloom", "falcon", "granitemoehybrid")


def _leak(model_type: str) -> float:
    """How far a sample's logits in a flattened row (position ids restarting at it) are from its logits alone,
    relative to their size: ~1e-7 where the model keeps samples apart. The largest over sdpa and eager."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {**TINY_OF_TYPE, **TINY_OVERRIDES.get(model_type, {})}
    if model_type in ("gpt_bigcode", "bloom"):
        fields = {**TINY_OVERRIDES[model_type], "pad_token_id": 0}
    worst, ran = 0.0, []
    for attn in ("sdpa", "eager"):
        config = AutoConfig.for_model(model_type, **{k: v for k, v in fields.items() if v is not None})
        config._attn_implementation = attn
        torch.manual_seed(0)
        try:
            model = AutoModelForCausalLM.from_config(config).float()
        except ValueError as exc:  # a model without sdpa (bloom, gemma2) runs eager only
            assert "does not support an attention implementation" in str(exc)
            continue
        model.eval()  # no dropout (gpt_bigcode's attention dropout is an argument, not a module)
        ids = torch.randint(3, 250, (1, 30))
        positions = torch.tensor([[*range(12), *range(18)]])
        flat = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, 12:]
        alone = model(input_ids=ids[:, 12:], use_cache=False).logits[0]
        worst = max(worst, ((flat - alone).abs().max() / alone.abs().max()).item())
        ran.append(attn)
    assert ran, model_type
    return worst


@pytest.mark.parametrize("model_type", [*PADDING_FREE_MODEL_TYPES, *LEAKY_MODEL_TYPES])
def test_padding_free_is_valid_for_the_model_types_that_keep_samples_apart(model_type):
    """spec.properties.PADDING_FREE_MODEL_TYPES: the model types whose transformers code builds its masks from the
    packed position ids. The others let a flattened row's samples attend to each other, and training them so
    would measure another model: the native engine refuses padding_free for them (engines.support)."""
    leak = _leak(model_type)
    if model_type in PADDING_FREE_MODEL_TYPES:
        assert leak < 1e-5, f"{model_type}: samples of a flattened row attend to each other ({leak:.1e})"
    else:
        assert leak > 1e-3, f"{model_type} keeps a flattened row's samples apart now: add it to the list"


def test_padding_free_is_invalid_where_one_gpu_would_take_the_batch(tmp_path):
    from tunebench.spec.validity import check

    exp = get_experiment(LORA, PARAMS)
    two = {"number_gpus": 2, "batch_size": 4, "gpu_model": A100, "distributed_backend": None}
    (reason,) = check(exp, entity_of(exp, _tiny_config(tmp_path), padding_free=True, **two)).reasons
    assert "DataParallel splits a batch by rows" in reason
    for ok in ({"distributed_backend": "DDP"}, {"distributed_backend": "FSDP"}, {"device_map": "auto"}):
        assert check(exp, entity_of(exp, _tiny_config(tmp_path), padding_free=True, **{**two, **ok})).is_valid, ok


def _tiny_config(tmp_path) -> str:
    """A config.json path like the module's ``tiny`` fixture, for a test that writes its own."""
    path = tmp_path / "tiny-llama.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


def test_a_padding_free_run_trains_as_the_padded_run_on_fewer_tokens(tmp_path):
    """The worker with --padding_free huggingface (fms-hf-tuning's flag): the same samples, steps and losses as the
    padded run (same seed and data), the same sample count per step (one row holds several), and the tokens it
    processes (what train_tokens_per_second counts, the spec's "including padding tokens") are the padded run's
    non-padding tokens."""
    runs = {}
    for name, extra in (("padded", ()), ("free", ("--padding_free", "huggingface"))):
        (tmp_path / name).mkdir()
        rc, r, agg = run(tmp_path / name, *extra, steps=3)
        assert rc == 0, r.get("reason")
        runs[name] = (r["metadata"], r["steps"]["local"], agg["properties"])
    (padded_meta, padded, _), (free_meta, free, free_props) = runs["padded"], runs["free"]
    assert free_meta["padding_free"] is True and padded_meta["padding_free"] is False
    assert free_meta["train_losses"] == pytest.approx(padded_meta["train_losses"], rel=1e-5)
    assert free["samples"] == padded["samples"] == [2, 2, 2]
    assert free["padded_tokens"] == free["non_pad_tokens"] == padded["non_pad_tokens"]
    assert sum(free["padded_tokens"]) < sum(padded["padded_tokens"])  # the padded run processed padding
    assert free["dataset_tokens"] == padded["dataset_tokens"] and free["trained_tokens"] == padded["trained_tokens"]
    processed = free_props["train_tokens_per_second"] * free_props["train_runtime"]
    assert processed == pytest.approx(sum(free["non_pad_tokens"]), rel=1e-6)


def test_the_meter_counts_a_flattened_rows_samples_from_its_positions():
    """fms-hf-tuning's padding-free collators give one row without tunebench's entry indices: the samples are the
    row's position ids restarting at 0; its tokens are all real (no attention mask, nothing padded)."""
    from tunebench.training.data import FlatteningCollator
    from tunebench.worker.meter import StepMeter

    row = FlatteningCollator()(_samples([7, 19, 12], TINY_LLAMA["vocab_size"]))
    meter = StepMeter(torch.device("cpu"))
    meter.begin()
    meter.count_batch({k: v for k, v in row.items() if k not in ("entry_index", "dataset_tokens")})
    meter.count_batch(dict(row))  # the native worker's: its entry indices
    meter.end_step()
    assert meter.samples == [6] and meter.padded_tokens == meter.non_pad_tokens == [76]
    assert meter.consumed_total == 3


def test_the_native_worker_refuses_padding_free_for_prompt_tuning(tmp_path):
    rc, r, _ = run(tmp_path, "--padding_free", "huggingface", peft_method="pt", steps=1)
    assert rc == 1 and r["phase"] == "setup" and "--padding_free" in r["reason"], r.get("reason")


# ------------------------------------------------------------------------------- real runs of the worker


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attention_implementation_is_set_on_the_model(tmp_path, attn):
    rc, r, agg = run(tmp_path, attn_implementation=attn, steps=2)
    assert rc == 0, r.get("reason")
    assert r["metadata"]["attn_implementation"] == attn  # model.config._attn_implementation as built
    assert agg["properties"]["train_runtime"] > 0


@pytest.mark.parametrize(
    "loss, facts",
    [
        ("chunked", {"function": "tunebench chunked_causal_lm_loss", "chunk_tokens": 1024}),
        ("model_dtype", {"function": "tunebench model_dtype_causal_lm_loss"}),
    ],
)
def test_loss_run_trains_like_the_upcast_run(tmp_path, loss, facts):
    """Same seed, data and float32 model: the chunked and model_dtype runs' losses are the upcast run's."""
    runs = {}
    for name in ("upcast", loss):
        (tmp_path / name).mkdir()
        rc, r, _ = run(tmp_path / name, loss_implementation=name, peft_method="lora", steps=3)
        assert rc == 0, r.get("reason")
        runs[name] = r["metadata"]
    assert runs[loss]["loss"] == {"implementation": loss, **facts}
    assert runs["upcast"]["loss"]["implementation"] == "upcast"
    up, other = runs["upcast"]["train_losses"], runs[loss]["train_losses"]
    assert len(up) == len(other) == 3 and all(math.isfinite(x) for x in other)
    assert other == pytest.approx(up, rel=1e-4)


@pytest.mark.parametrize(
    "flags", [("--fast_kernels", "True", "False", "False"), ("--fused_lora", "auto_gptq", "true"), ("--fast_moe", "2")]
)
def test_native_worker_refuses_fms_acceleration_kernels(tmp_path, flags):
    """A worker started by hand with fms-acceleration flags fails at setup, naming the engine that runs them:
    no result of the native worker carries a kernel setting that did not run."""
    rc, r, agg = run(tmp_path, *flags, steps=1)
    assert rc == 1 and r["status"] == "error" and r["phase"] == "setup" and not agg
    assert flags[0] in r["reason"] and "measure with --engine fms-hf-tuning" in r["reason"]


def test_fast_kernels_all_off_runs_on_the_native_engine(tmp_path):
    rc, r, _ = run(tmp_path, "--fast_kernels", "False", "False", "False", steps=1)
    assert rc == 0, r.get("reason")
    assert r["metadata"]["loss"]["implementation"] == "upcast" and "fast_kernels" not in r["metadata"]["not_applied"]


def test_adapter_dtype_gives_trainable_weights_in_that_dtype(tmp_path):
    rc, r, _ = run(tmp_path, adapter_dtype="bfloat16", peft_method="lora", steps=2)
    assert rc == 0, r.get("reason")
    meta = r["metadata"]
    assert meta["trainable_dtypes"] == ["bfloat16"]  # the trainable parameters after training
    assert meta["adapter_dtype"] == ["bfloat16"] and meta["dtype"] == "float32"  # the base model stays float32
    (tmp_path / "default").mkdir()
    rc, r, _ = run(tmp_path / "default", peft_method="lora", steps=1)
    assert r["metadata"]["trainable_dtypes"] == ["float32"]  # peft's default


@pytest.mark.slow
def test_torch_compile_compiles_the_model(tmp_path):
    """TrainingArguments(torch_compile=True) on the CPU (inductor + the C compiler): ~20 s for one step (each new
    batch shape compiles again: 2 steps of varied length took 100 s on a 2-core CPU)."""
    rc, r, _ = run(tmp_path, torch_compile="True", gradient_checkpointing="False", steps=1)
    assert rc == 0, r.get("reason")
    assert r["metadata"]["torch_compile"] is True


def test_worker_refuses_flash_attention_and_fused_linear_on_the_cpu(tmp_path):
    rc, r, _ = run(tmp_path, attn_implementation="flash_attention_3")
    assert rc == 1 and "flash-attention needs an NVIDIA GPU and the flash-attn 3 package" in r["reason"]
    rc, r, _ = run(tmp_path, loss_implementation="fused_linear")
    assert rc == 1 and "fused_linear needs liger-kernel and a GPU" in r["reason"] and r["phase"] == "setup"


# ------------------------------------------------------------------ through the measuring actuator


@pytest.mark.slow
def test_a_run_that_diverges_says_so(tmp_path, tiny):
    """float16 LoRA adapters under AdamW turn NaN at the first step (eps 1e-8 is 0 in float16; lora_A's first
    gradient is 0), and the Trainer logs the running mean in place of the NaN loss: the result says the run
    diverged, and why, instead of passing for a training (its rates are still measured)."""
    exp = get_experiment(LORA, {**PARAMS, "max_steps": 2})
    result = measure(exp, entity_of(exp, tiny, adapter_dtype="float16"), opts(tmp_path))
    assert result.status == "valid", (result.error, result.reasons, result.log_tail)
    bad = result.metadata["nonfinite_trainable"]
    assert bad["tensors"] > 0 and all("lora_" in name for name in bad["first"])
    (note,) = [n for n in result.metadata["notes"] if n.startswith("training diverged")]
    assert "float16 trainable weights with AdamW" in note and "logging_nan_inf_filter" in note
    assert result.properties["dataset_tokens_per_second"] > 0


@pytest.mark.slow
def test_measured_result_records_attention_loss_and_adapter_dtype(tmp_path, tiny):
    exp = get_experiment(LORA, {**PARAMS, "max_steps": 1})
    entity = entity_of(
        exp,
        tiny,
        attn_implementation="eager",
        loss_implementation="chunked",
        adapter_dtype="bfloat16",
        padding_free=True,
    )
    result = measure(exp, entity, opts(tmp_path))
    assert result.status == "valid", (result.error, result.reasons, result.log_tail)
    meta = result.metadata
    assert meta["attn_implementation"] == "eager" and meta["loss"]["implementation"] == "chunked"
    assert meta["trainable_dtypes"] == ["bfloat16"] and meta["padding_free"] is True
    assert meta["nonfinite_trainable"] is None and not any("diverged" in n for n in meta.get("notes", []))
    props = result.properties  # nothing padded: the tokens processed are the data set's (+ the appended EOS)
    assert (
        props["dataset_tokens_per_second"]
        <= props["train_tokens_per_second"]
        < 1.02 * props["dataset_tokens_per_second"]
    )
    command = meta["command"]
    for flag, value in (
        ("--attn_implementation", "eager"),
        ("--loss_implementation", "chunked"),
        ("--adapter_dtype", "bfloat16"),
        ("--padding_free", "huggingface"),
    ):
        assert command[command.index(flag) + 1] == value


@pytest.mark.slow
def test_default_measurement_records_sdpa_and_upcast(tmp_path, tiny):
    exp = get_experiment(FULL, {**PARAMS, "max_steps": 1})
    result = measure(exp, entity_of(exp, tiny), opts(tmp_path))
    assert result.status == "valid", (result.error, result.log_tail)
    assert result.metadata["attn_implementation"] == "sdpa" and result.metadata["loss"]["implementation"] == "upcast"
    stack_flags = {"--attn_implementation", "--loss_implementation", "--adapter_dtype", "--torch_compile"}
    assert not {*stack_flags, "--padding_free"} & set(result.metadata["command"])  # the SFTTrainer spec's
    assert result.metadata["padding_free"] is False


# -------------------------------------------------------------------------------- judged, nothing runs

JUDGED = [
    (NATIVE, FULL, {"distributed_backend": "DeepSpeed"}, "distributed_backend DeepSpeed is planning only"),
    (
        NATIVE,
        FULL,
        {
            "distributed_backend": "DeepSpeed",
            "deepspeed_zero_stage": 3,
            "offload_param_device": "cpu",
            "offload_optimizer_device": "nvme",
        },
        "distributed_backend DeepSpeed is planning only",
    ),
    (NATIVE, FULL, {"deepspeed_zero_stage": 3}, "deepspeed_zero_stage 3 needs distributed_backend DeepSpeed"),
    (NATIVE, FULL, {"device_map": "auto", "distributed_backend": None}, "device_map auto"),
    (NATIVE, FULL, {"fsdp_offload_params": True}, "fsdp_offload_params is planning only"),
    (NATIVE, FULL, {"gradient_checkpointing_mode": "selective"}, "gradient_checkpointing_mode selective"),
    (
        NATIVE,
        FULL,
        {"sequence_parallel_degree": 2, "number_gpus": 2, "batch_size": 1, "gpu_model": "A100"},
        "sequence_parallel_degree 2 are planning only",
    ),
    (
        FMS,
        LORA,
        {"tensor_parallel_degree": 2, "number_gpus": 2, "batch_size": 1, "gpu_model": "A100"},
        "tensor_parallel_degree 2 / sequence_parallel_degree 1 are planning only",
    ),
    (NATIVE, FULL, {"attn_implementation": "flash_attention_2"}, "flash-attention needs an NVIDIA GPU"),
    (NATIVE, FULL, {"flash_attn": True}, "flash_attn 1: flash-attention needs an NVIDIA GPU"),
    (FMS, LORA, {"attn_implementation": "sdpa"}, "attn_implementation sdpa: fms-hf-tuning"),
    (FMS, LORA, {"attn_implementation": "eager"}, "measure with --engine native"),
    (FMS, LORA, {"loss_implementation": "chunked"}, "fast_kernels' fast_loss"),
    (FMS, LORA, {"loss_implementation": "fused_linear"}, "fms-hf-tuning has no fused linear cross-entropy"),
    (FMS, LORA, {"loss_implementation": "model_dtype"}, "loss_implementation model_dtype: fms-hf-tuning"),
    (FMS, LORA, {"adapter_dtype": "bfloat16"}, "adapter_dtype bfloat16: fms-hf-tuning keeps adapter weights"),
    (FMS, LORA, {"gradient_checkpointing_mode": "selective"}, "gradient_checkpointing_mode selective"),
    (NATIVE, LORA, {"liger_kernels": True}, "liger_kernels is planning only"),
    (FMS, FULL, {"liger_kernels": True}, "liger_kernels is planning only"),
    # fms-acceleration's kernels run only under fms-hf-tuning: judged on the native engine, not run without them
    (NATIVE, LORA, {"fast_kernels": "True,False,False"}, "fast_kernels True,False,False: fms-acceleration kernels"),
    (NATIVE, FULL, {"fast_kernels": "False,True,True"}, "measure with --engine fms-hf-tuning"),
    # GPU-only kernels on a CPU run: the spec's rules allow it, but nothing can run (or plan) it
    (FMS, LORA, {"fast_kernels": "True,True,True"}, "with number_gpus 0: these are Triton/CUDA kernels"),
    (NATIVE, LORA, {"loss_implementation": "fused_linear"}, "loss_implementation fused_linear with number_gpus 0"),
    # a CPU entity over several nodes: rule 2 holds (0 % 2 == 0), but no node would run a process
    (NATIVE, FULL, {"number_nodes": 2}, "number_nodes 2 with number_gpus 0"),
    (FMS, LORA, {"number_nodes": 2}, "a CPU run runs on one machine"),
    # GPUs over several nodes without a backend: one process (DataParallel) for all, on one machine
    (
        NATIVE,
        FULL,
        {"number_nodes": 2, "number_gpus": 2, "batch_size": 2, "gpu_model": "A100", "distributed_backend": None},
        "number_nodes 2 with distributed_backend None",
    ),
    # images for a model without a vision tower: the worker's vision path refuses it
    (NATIVE, LORA, {"dataset_id": "vision-384x384-16384plus-entries-4096"}, "has no vision tower"),
    # padding_free: the native worker flattens batches itself; fms-hf-tuning with flash-attention only
    (NATIVE, "finetune_pt_benchmark-v1.0.0", {"padding_free": True}, "prompt tuning would prepend its virtual"),
    (
        NATIVE,
        LORA,
        {"padding_free": True, "model_name": "hf-tiny-model-private/tiny-random-BloomForCausalLM"},
        "padding_free: bloom is not among the model types checked",
    ),
    (FMS, LORA, {"padding_free": True}, "padding_free runs with flash-attention only"),
    (
        FMS,
        LORA,
        {"padding_free": True, "number_gpus": 1, "gpu_model": "A100", "flash_attn": False},
        "padding_free with flash_attn 0: fms-hf-tuning flattens batches with flash-attention only",
    ),
]


@pytest.mark.parametrize("engine, experiment_id, settings, reason", JUDGED)
def test_judged_settings_are_invalid_and_nothing_runs(
    tmp_path, tiny, monkeypatch, engine, experiment_id, settings, reason
):
    def no_process(*args, **kwargs):
        raise AssertionError("a judged entity started a process")

    monkeypatch.setattr(measure_module, "run_logged", no_process)
    monkeypatch.setattr(measure_module, "runtime", no_process)  # no engine environment either
    exp = get_experiment(experiment_id, PARAMS)
    result = measure(exp, entity_of(exp, tiny, **settings), opts(tmp_path), engine=engine)
    assert result.status == "invalid" and result.properties == {"is_valid": 0}, (result.error, result.reasons)
    assert any(reason in r for r in result.reasons), result.reasons
    assert not (tmp_path / "run").exists()


def _no_process(monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError("a judged entity started a process")

    monkeypatch.setattr(measure_module, "run_logged", no_process)
    monkeypatch.setattr(measure_module, "runtime", no_process)


def test_gptq_lora_is_an_fms_acceleration_experiment(tmp_path, tiny, monkeypatch):
    """Its defaults and hardcoded flags (fast_kernels, fused_lora, auto_gptq triton_v2) are fms-acceleration's:
    the native engine judges it before running, naming the engine that runs it; fms-hf-tuning plans it."""
    _no_process(monkeypatch)
    exp = get_experiment("finetune_gptq-lora_benchmark-v1.0.0", PARAMS)
    entity = entity_of(exp, tiny, number_gpus=1, gpu_model=A100, flash_attn=False)  # flash-attn is not installed
    result = measure(exp, entity, opts(tmp_path))
    assert result.status == "invalid", (result.error, result.reasons)
    (reason,) = result.reasons
    assert reason.startswith("fast_kernels True,True,True, fused_lora auto_gptq,True, auto_gptq triton_v2:")
    assert "fms-acceleration-foak" in reason and "fms-acceleration-peft" in reason
    assert reason.endswith("measure with --engine fms-hf-tuning")
    with pytest.raises(InputError, match="--engine fms-hf-tuning"):
        build_launch_plan(exp, entity)
    assert "--fused_lora" in build_launch_plan(exp, entity, engine=FMS).worker_args


def test_fast_moe_on_a_mixture_of_experts_model_is_judged_not_failed(tmp_path, monkeypatch):
    """Was: the worker raised NotImplementedError at run time (failed, then retried)."""
    _no_process(monkeypatch)
    moe = tmp_path / "moe" / "config.json"
    moe.parent.mkdir()
    moe.write_text(
        json.dumps({**TINY_LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2})
    )
    exp = get_experiment(LORA, {**PARAMS, "fms_hf_tuning_version": "2.4.0"})
    result = measure(exp, entity_of(exp, str(moe), fast_moe=2), opts(tmp_path))
    assert result.status == "invalid", (result.error, result.reasons)
    assert result.reasons == [
        "fast_moe 2: fms-acceleration kernels (fms-acceleration-moe) that only the "
        "fms-hf-tuning engine runs: measure with --engine fms-hf-tuning",
        "fast_moe 2 with number_gpus 0: these are Triton/CUDA kernels that run on a GPU only; give number_gpus "
        "and a gpu_model",  # this entity is a CPU one: no engine could run it (spec.validity.gpu_kernels_reason)
    ]


def test_flash_attention_on_a_gpu_entity_needs_the_package_here(tmp_path, tiny, monkeypatch):
    """A GPU entity asking for flash-attention: judged where the run would start when flash-attn is missing;
    a launch plan (built for any machine) leaves the package to the machine that runs it."""
    import importlib.util

    if importlib.util.find_spec("flash_attn"):
        pytest.skip("flash-attn is installed here")
    exp = get_experiment(FULL, PARAMS)
    entity = make_entity(
        exp, {"model_name": tiny, "model_max_length": 192, "number_gpus": 1, "batch_size": 4, "gpu_model": A100}
    )
    import tunebench.actuators.measure as measure_module
    from tunebench.actuators.machine import Gpu

    # where the run would start: its A100 is there (NVML), flash-attn is not
    monkeypatch.setattr(measure_module, "detect_gpus", lambda: [Gpu("0", "NVIDIA A100-SXM4-80GB")])
    result = measure(exp, entity, opts(tmp_path))  # flash_attn None: on with a GPU
    assert result.status == "invalid" and "needs the flash-attn package" in result.reasons[0]
    monkeypatch.setattr(measure_module, "detect_gpus", lambda: [])  # a machine without the GPU: failed, first
    assert "this machine has no GPU" in measure(exp, entity, opts(tmp_path)).error
    assert not (tmp_path / "run").exists()
    plan = build_launch_plan(exp, entity)
    args = plan.worker_args
    assert args[args.index("--use_flash_attn") + 1] == "True" and "--attn_implementation" not in args


def test_launch_plan_passes_stack_flags_and_refuses_judged_entities(tiny):
    exp = get_experiment(FULL, PARAMS)
    entity = make_entity(
        exp,
        {
            "model_name": tiny,
            "model_max_length": 192,
            "number_gpus": 2,
            "batch_size": 4,
            "gpu_model": A100,
            "attn_implementation": "sdpa",
            "torch_compile": True,
            "padding_free": True,
        },
    )
    plan = build_launch_plan(exp, entity)
    assert plan.mode == "FSDP"
    args = plan.worker_args
    assert args[args.index("--use_flash_attn") + 1] == "False"  # attn_implementation decides
    assert args[args.index("--attn_implementation") + 1] == "sdpa"
    assert args[args.index("--torch_compile") + 1] == "True"
    assert args[args.index("--padding_free") + 1] == "huggingface"  # fms-hf-tuning's flag and its one method
    # fms-hf-tuning runs it with flash-attention, in an environment with its fms-acceleration-aadp plugin
    fms = build_launch_plan(exp, make_entity(exp, {**entity.values, "attn_implementation": None}), engine=FMS)
    assert "--padding_free" in fms.worker_args
    judged = make_entity(
        exp,
        {
            "model_name": tiny,
            "model_max_length": 192,
            "number_gpus": 2,
            "batch_size": 4,
            "gpu_model": A100,
            "gradient_checkpointing_mode": "selective",
        },
    )
    with pytest.raises(InputError, match="gradient_checkpointing_mode selective"):
        build_launch_plan(exp, judged)
    offload = make_entity(
        exp,
        {
            "model_name": tiny,
            "model_max_length": 192,
            "number_gpus": 2,
            "batch_size": 4,
            "gpu_model": A100,
            "fsdp_offload_params": True,
        },
    )
    with pytest.raises(InputError, match="fsdp_offload_params is planning only"):
        build_launch_plan(exp, offload)


def test_rules_name_their_setting_and_default_entities_pass():
    base = {"number_gpus": 0, "distributed_backend": "FSDP", "deepspeed_zero_stage": 2, "fast_kernels": None}
    assert unsupported(base, NATIVE) == [] and unsupported(base, FMS) == []
    assert all(rule.setting and rule.engines for rule in RULES)


@pytest.mark.parametrize("actuator, engine", [("measure", NATIVE), ("fms-hf-tuning", FMS)])
def test_ray_judges_a_multi_node_entity_before_placing_nodes(tiny, actuator, engine):
    """The Ray executor's multi-node path asks the actuator's judge_nodes first: invalid, no placement group."""
    from tunebench.executors.ray import RayExecutor
    from tunebench.executors.task import Task

    exp = get_experiment(FULL, PARAMS)
    values = {
        "model_name": tiny,
        "model_max_length": 192,
        "number_gpus": 2,
        "number_nodes": 2,
        "batch_size": 4,
        "gpu_model": A100,
        "gradient_checkpointing_mode": "selective",
    }
    entity = make_entity(exp, values)
    task = Task(
        request_id=1,
        attempt=1,
        actuator=actuator,
        base_id=FULL,
        parameters=PARAMS,
        experiment_id=exp.id,
        entity_id=entity.id,
        entity_values=values,
        number_gpus=2,
        number_nodes=2,
        gpu_model=A100,
    )
    executor = object.__new__(RayExecutor)  # no Ray: the judge comes before any call to it
    executor.ray = None
    result = executor._run_multinode(task)
    assert result.status == "invalid" and result.actuator == actuator
    assert "gradient_checkpointing_mode selective" in result.reasons[0]
    assert measure_module.judge(exp, entity, engine, here=False) == result.reasons


def test_fused_linear_patches_only_the_loss_and_refuses_unpatched_model_types(monkeypatch):
    """liger-kernel stands in (no GPU here): the per-instance patch gets fused_linear_cross_entropy and every other
    kernel off; a model type it has no patch for is refused (liger itself would log and keep the upcast loss)."""
    import importlib.machinery
    import sys
    import types

    from tunebench.training import loss as loss_mod

    calls = []
    modules = {
        name: types.ModuleType(name)
        for name in ("liger_kernel", "liger_kernel.transformers", "liger_kernel.transformers.monkey_patch")
    }
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    patch = modules["liger_kernel.transformers.monkey_patch"]
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": None}
    patch._apply_liger_kernel_to_instance = lambda **kw: calls.append(kw)
    llama = types.SimpleNamespace(config=types.SimpleNamespace(model_type="llama"))
    facts = loss_mod.apply(llama, "fused_linear", on_gpu=True)
    assert facts["implementation"] == "fused_linear" and len(calls) == 1
    flags = {k: v for k, v in calls[0].items() if k != "model"}
    assert flags.pop("fused_linear_cross_entropy") is True and not any(flags.values())
    bloom = types.SimpleNamespace(config=types.SimpleNamespace(model_type="bloom"))
    with pytest.raises(RuntimeError, match="no patch for model type bloom"):
        loss_mod.apply(bloom, "fused_linear", on_gpu=True)
    with pytest.raises(RuntimeError, match="needs liger-kernel and a GPU"):
        loss_mod.apply(llama, "fused_linear", on_gpu=False)
