"""The planner's memory model against hand-computed cases, monotonicity, and architecture counts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tunebench.catalog import get_model, list_models
from tunebench.errors import InputError
from tunebench.experiments import effective_values, get_experiment, make_entity
from tunebench.plan.arch import arch_of
from tunebench.plan.coefficients import Coefficients
from tunebench.plan.memory import GPTQ_BYTES, NF4_DQ_BYTES, memory_breakdown, predict_memory
from tunebench.plan.workload import build_workload

GIB = 2**30
UNIT = Coefficients(activation_scale=1.0, loss_bytes_per_vocab=6.0, fused_loss_bytes_per_vocab=0.0,
                    fsdp_peft_checkpoint_copies=0.0)  # fmt: skip
EXP = {
    "full": "finetune_full_benchmark-v1.0.0",
    "lora": "finetune_lora_benchmark-v1.0.0",
    "qlora": "finetune_qlora_benchmark-v1.0.0",
    "gptq-lora": "finetune_gptq-lora_benchmark-v1.0.0",
    "pt": "finetune_pt_benchmark-v1.0.0",
}


def workload(method: str = "full", **props):
    exp = get_experiment(EXP[method])
    raw = {"model_name": "smollm2-135m", "model_max_length": 512, "number_gpus": 1, "batch_size": 1,
           "gpu_model": "A100-80GB", "gradient_accumulation_steps": 1, **props}  # fmt: skip
    values = effective_values(exp, make_entity(exp, raw))
    return build_workload(exp.method, [values])


def states(b: dict) -> float:
    return float(b["weights"][0] + b["gradients"][0] + b["optimizer_states"][0] + b["optimizer_step_transient"][0])


def test_every_catalog_model_counts_its_parameters_exactly():
    checked = 0
    for spec in list_models():
        if spec.total_params is None:
            continue
        assert arch_of(spec).total_params == spec.total_params, spec.name
        checked += 1
    assert checked >= 30


def test_moe_active_parameters_match_the_catalog():
    for name in ("mixtral-8x7b-instruct-v0.1", "granite-3.1-3b-a800m-instruct", "granite-4.0-h-small"):
        spec = get_model(name)
        assert arch_of(spec).active_params == pytest.approx(spec.active_params, rel=1e-9)


def test_model_without_dimensions_is_an_input_error():
    with pytest.raises(InputError) as err:
        arch_of(get_model("granite-8b-japanese"))
    assert err.value.field == "model_name"


def test_full_pure_bf16_single_gpu_peaks_at_10_bytes_per_parameter():
    # pure bf16 AdamW: 2 (w) + 2 (g) + 4 (m, v) + 2 (foreach step temporaries) = 10 B/param (estimation.md §3.1)
    w = workload("full")
    n = w.arch.total_params
    b = memory_breakdown(w, UNIT)
    assert b["weights"][0] == 2 * n and b["gradients"][0] == 2 * n
    assert b["optimizer_states"][0] == 4 * n and b["optimizer_step_transient"][0] == 2 * n
    assert b["peak_optimizer_step"][0] == 10 * n


def test_fp32_weights_need_16_bytes_per_parameter_plus_transient():
    b = memory_breakdown(workload("full", torch_dtype="float32"), UNIT)
    n = get_model("smollm2-135m").total_params
    assert states(b) == (4 + 4 + 8 + 4) * n


def test_8bit_adam_keeps_two_bytes_of_state():
    b = memory_breakdown(workload("full", optim="adamw_bnb_8bit"), UNIT)
    n = get_model("smollm2-135m").total_params
    assert b["optimizer_states"][0] == pytest.approx(2.008 * n)
    assert b["optimizer_step_transient"][0] == 0


def test_fused_adam_has_no_step_transient_and_lomo_no_gradients():
    assert memory_breakdown(workload("full", optim="adamw_torch_fused"), UNIT)["optimizer_step_transient"][0] == 0
    assert memory_breakdown(workload("full", optim="lomo"), UNIT)["gradients"][0] == 0


def test_fsdp_full_shard_divides_states_and_gathers_two_blocks_and_the_root():
    w = workload("full", number_gpus=4, batch_size=4)
    a, n = w.arch, w.arch.total_params
    b = memory_breakdown(w, UNIT)
    assert states(b) == pytest.approx(10 * n / 4)
    root = a.embedding_params + a.lm_head_params + a.hidden
    assert b["gathered_weights"][0] == pytest.approx((root + 2 * a.largest_layer_params) * 2 * 3 / 4)


def test_shard_grad_op_keeps_every_parameter_gathered():
    w = workload("full", number_gpus=4, batch_size=4, fsdp_sharding_strategy="SHARD_GRAD_OP")
    b = memory_breakdown(w, UNIT)
    n = w.arch.total_params
    assert b["gathered_weights"][0] == pytest.approx(n * 2 * 3 / 4)
    assert states(b) == pytest.approx(10 * n / 4)


def test_hybrid_shard_shards_within_a_node_and_no_shard_not_at_all():
    n = get_model("smollm2-135m").total_params
    hybrid = memory_breakdown(workload("full", number_gpus=8, number_nodes=2, batch_size=8,
                                       fsdp_sharding_strategy="HYBRID_SHARD"), UNIT)  # fmt: skip
    assert states(hybrid) == pytest.approx(10 * n / 4)  # 4 GPUs per node
    zero2 = memory_breakdown(workload("full", number_gpus=8, number_nodes=2, batch_size=8,
                                      fsdp_sharding_strategy="HYBRID_SHARD_ZERO2"), UNIT)  # fmt: skip
    assert zero2["gathered_weights"][0] == pytest.approx(n * 2 * 3 / 4)
    none = memory_breakdown(workload("full", number_gpus=8, batch_size=8, fsdp_sharding_strategy="NO_SHARD"), UNIT)
    assert states(none) == pytest.approx(10 * n) and none["gathered_weights"][0] == 0


def test_ddp_replicates_states_and_keeps_a_gradient_bucket_copy():
    b = memory_breakdown(workload("full", number_gpus=2, batch_size=2, distributed_backend="DDP"), UNIT)
    n = get_model("smollm2-135m").total_params
    assert states(b) == pytest.approx(10 * n)
    assert b["ddp_buckets"][0] == pytest.approx(2 * n)


def test_fsdp_with_mixed_precision_upcasts_parameters_to_fp32():
    # accelerate's FSDP upcast; fms-acceleration bf16=True runs: 16 B/param + 4 transient over D
    b = memory_breakdown(workload("full", number_gpus=2, batch_size=2, bf16=True), UNIT)
    n = get_model("smollm2-135m").total_params
    assert states(b) == pytest.approx(20 * n / 2)
    single = memory_breakdown(workload("full", bf16=True), UNIT)
    assert states(single) == pytest.approx(10 * n)  # one process: no FSDP, weights stay bf16


def test_fsdp_gradient_accumulation_holds_unsharded_gradients():
    b = memory_breakdown(workload("full", number_gpus=4, batch_size=4, gradient_accumulation_steps=4), UNIT)
    n = get_model("smollm2-135m").total_params
    assert b["gradients"][0] == pytest.approx(2 * n)  # FSDP.no_sync
    assert b["optimizer_states"][0] == pytest.approx(4 * n / 4)


def test_lora_adapter_parameters_by_hand():
    # smollm2-135m: h 576, 9 heads x 64, 3 KV heads x 64, 30 layers; q_proj (576 -> 576), v_proj (576 -> 192)
    w = workload("lora", r=8)
    assert w.lora_params_per_rank == 30 * ((576 + 576) + (576 + 192))
    n_t = 8 * w.lora_params_per_rank
    b = memory_breakdown(w, UNIT)
    n = w.arch.total_params
    assert b["weights"][0] == pytest.approx(2 * n + 4 * n_t)  # frozen bf16 base + fp32 adapters
    assert b["optimizer_states"][0] == pytest.approx(8 * n_t)
    assert b["gradients"][0] == pytest.approx(4 * n_t)


def test_qlora_and_gptq_bases_by_hand():
    a = arch_of(get_model("smollm2-135m"))
    assert NF4_DQ_BYTES == pytest.approx((4 + 8 / 64 + 32 / (64 * 256)) / 8)
    q = memory_breakdown(workload("qlora", r=4), UNIT)
    n_t = 4 * 30 * ((576 + 576) + (576 + 192))
    base = a.quantized_params * NF4_DQ_BYTES + (a.total_params - a.quantized_params) * 2
    assert q["weights"][0] == pytest.approx(base + 4 * n_t)
    assert q["quantization_transient"][0] == a.largest_linear_params * 2
    exp = get_experiment(EXP["gptq-lora"])
    values = effective_values(exp, make_entity(exp, {"model_name": "llama3.1-405b", "model_max_length": 512,
                                                      "number_gpus": 1, "batch_size": 1, "gpu_model": "H100"}))  # fmt: skip
    g = memory_breakdown(build_workload("gptq-lora", [values]), UNIT)
    big = arch_of(get_model("llama3.1-405b"))
    assert g["weights"][0] >= big.quantized_params * GPTQ_BYTES


def test_prompt_tuning_trains_virtual_tokens_but_keeps_full_activations():
    pt = memory_breakdown(workload("pt"), UNIT)
    lora = memory_breakdown(workload("lora"), UNIT)
    assert pt["optimizer_states"][0] == pytest.approx(8 * 576 * 8)  # 8 virtual tokens x h, fp32 Adam
    assert pt["activation_checkpoints"][0] > lora["activation_checkpoints"][0]  # 8 more tokens per sample


def test_checkpointed_activations_by_hand():
    w = workload("full", batch_size=2, model_max_length=512)
    a = w.arch
    b = memory_breakdown(w, UNIT)
    tokens = 2 * 512
    assert b["activation_checkpoints"][0] == tokens * a.hidden * a.layers * 2
    assert b["layer_activations"][0] == tokens * a.layer_width * 2
    assert b["loss"][0] == tokens * a.vocab * 6.0
    off = memory_breakdown(workload("full", batch_size=2, model_max_length=512, gradient_checkpointing=False), UNIT)
    assert off["activation_checkpoints"][0] == 0 and off["layer_activations"][0] == tokens * a.stack_width * 2


@pytest.mark.parametrize("model", ["llama3.1-8b", "mixtral-8x7b-instruct-v0.1", "granite-4.0-h-tiny", "granite-34b-code-base"])
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_more_gpus_with_fsdp_never_raise_per_gpu_model_states(model, method):
    props = {"model_name": model, "model_max_length": 1024, "gradient_accumulation_steps": 1}
    if method != "full":
        props["target_modules"] = "q_proj,v_proj" if "34b" not in model else "c_attn"
    for ga in (1, 4):
        previous = np.inf
        for d in (1, 2, 4, 8, 16, 32):
            b = memory_breakdown(workload(method, number_gpus=d, batch_size=32, **{**props, "gradient_accumulation_steps": ga}), UNIT)
            now = states(b)
            assert now <= previous + 1e-6, (model, method, ga, d)
            previous = now


@pytest.mark.parametrize("model", ["llama3.1-8b", "granite-4.0-h-micro", "granite-vision-3.2-2b", "smollm2-135m"])
@pytest.mark.parametrize("checkpointing", [True, False])
def test_longer_sequences_never_lower_activation_memory(model, checkpointing):
    previous = -1.0
    for length in (128, 512, 1024, 4096, 16384, 32768, 65536):
        w = workload("lora", model_name=model, model_max_length=length, gradient_checkpointing=checkpointing,
                     target_modules="q_proj,v_proj")  # fmt: skip
        b = memory_breakdown(w, UNIT)
        acts = float(b["activation_checkpoints"][0] + b["layer_activations"][0] + b["loss"][0] + b["vision_tower"][0])
        assert acts >= previous
        previous = acts


def test_oom_and_nvidia_smi_overheads():
    c = Coefficients()
    big = predict_memory(workload("full", model_name="llama3-70b"), c)
    assert not big.fits[0] and big.utilization_pct[0] > 100  # what it would need, not what it can have
    small = predict_memory(workload("full"), c)
    assert small.fits[0]
    assert small.nvidia_smi_gib[0] > small.reserved_gib[0] > small.allocated_gib[0]
    assert small.breakdown_gib["cuda_context"][0] == pytest.approx(c.cuda_context_gib)


def test_config_json_models_plan_like_their_catalog_twin(tmp_path):
    spec = get_model("llama3.2-1b")
    cfg = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
           "max_position_embeddings": 131072, "tie_word_embeddings": True}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    from_config = get_model(str(path))
    assert arch_of(from_config).total_params == spec.total_params
    a = memory_breakdown(workload("full", model_name=str(path)), UNIT)
    b = memory_breakdown(workload("full", model_name="llama3.2-1b"), UNIT)
    for key in ("weights", "optimizer_states", "activation_checkpoints", "loss"):
        assert a[key][0] == b[key][0]


def test_config_json_moe_model(tmp_path):
    cfg = {"model_type": "mixtral", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "num_local_experts": 4,
           "num_experts_per_tok": 2, "tie_word_embeddings": False}  # fmt: skip
    path = tmp_path / "moe" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    a = arch_of(get_model(str(path.parent)))
    per_layer_attn = 512 * 512 * 2 + 512 * 128 * 2
    experts = 4 * 3 * 512 * 1024
    assert a.total_params == 4 * (per_layer_attn + experts + 512 * 4 + 2 * 512) + 2 * 1000 * 512 + 512
    assert a.matmul_params_per_token == pytest.approx(4 * (per_layer_attn + experts / 2 + 512 * 4) + 1000 * 512)
