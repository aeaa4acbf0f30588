"""The planner's memory model against hand-computed model states, traced activations, monotonicity."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tunebench.catalog import get_gpu, get_model
from tunebench.plan.coefficients import Coefficients
from tunebench.plan.memory import (
    GPTQ_BYTES,
    NF4_DQ_BYTES,
    activation_moments,
    fused_linear_forward_bytes,
    memory_breakdown,
    oom_probability,
    predict_memory,
    residual_bytes,
)
from tunebench.plan.structure import structure_of
from tunebench.plan.workload import build_workload
from tunebench.spec.experiments import effective_values, get_experiment, make_entity

GIB = 2**30
UNIT = Coefficients(
    fused_loss_bytes_per_vocab=0.0, fsdp_peft_checkpoint_copies=0.0, fast_kernels_activation_fraction=1.0
)
EXP = {
    "full": "finetune_full_benchmark-v1.0.0",
    "lora": "finetune_lora_benchmark-v1.0.0",
    "qlora": "finetune_qlora_benchmark-v1.0.0",
    "gptq-lora": "finetune_gptq-lora_benchmark-v1.0.0",
    "pt": "finetune_pt_benchmark-v1.0.0",
}


def workload(method: str = "full", **props):
    """A Workload of one entity; keys starting with '_' are the planner's private settings (records)."""
    exp = get_experiment(EXP[method])
    private = {k: v for k, v in props.items() if k.startswith("_")}
    raw = {
        "model_name": "smollm2-135m",
        "model_max_length": 512,
        "number_gpus": 1,
        "batch_size": 1,
        "gpu_model": "A100-80GB",
        "gradient_accumulation_steps": 1,
        **{k: v for k, v in props.items() if k not in private},
    }
    values = {**effective_values(exp, make_entity(exp, raw)), **private}
    return build_workload(exp.method, [values])


def states(b: dict) -> float:
    return float(b["weights"][0] + b["gradients"][0] + b["optimizer_states"][0] + b["optimizer_step_transient"][0])


def test_full_pure_bf16_single_gpu_peaks_at_10_bytes_per_parameter():
    # pure bf16 AdamW: 2 (w) + 2 (g) + 4 (m, v) + 2 (foreach step temporaries) = 10 B/param (estimation.md §3.1)
    w = workload("full")
    n = w.structure.total_params
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
    m, n = w.structure, w.structure.total_params
    b = memory_breakdown(w, UNIT)
    assert states(b) == pytest.approx(10 * n / 4)
    # smollm2-135m: tied 49152 x 576 embedding, a final norm; 30 equal decoder layers
    assert m.root_params == 49152 * 576 + 576 and m.largest_layer_params * 30 == m.layer_params
    assert b["gathered_weights"][0] == pytest.approx((m.root_params + 2 * m.largest_layer_params) * 2 * 3 / 4)


def test_shard_grad_op_keeps_every_parameter_gathered():
    w = workload("full", number_gpus=4, batch_size=4, fsdp_sharding_strategy="SHARD_GRAD_OP")
    b = memory_breakdown(w, UNIT)
    n = w.structure.total_params
    assert b["gathered_weights"][0] == pytest.approx(n * 2 * 3 / 4)
    assert states(b) == pytest.approx(10 * n / 4)


def test_hybrid_shard_shards_within_a_node_and_no_shard_not_at_all():
    n = get_model("smollm2-135m").total_params
    hybrid = memory_breakdown(
        workload("full", number_gpus=8, number_nodes=2, batch_size=8, fsdp_sharding_strategy="HYBRID_SHARD"), UNIT
    )
    assert states(hybrid) == pytest.approx(10 * n / 4)  # 4 GPUs per node
    zero2 = memory_breakdown(
        workload("full", number_gpus=8, number_nodes=2, batch_size=8, fsdp_sharding_strategy="HYBRID_SHARD_ZERO2"), UNIT
    )
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


@pytest.mark.parametrize("reentrant", [True, False])
def test_fsdp_peft_checkpoint_copies_only_with_reentrant_checkpoints(reentrant):
    """Multi-GPU FSDP + LoRA keeps the layer inputs again under reentrant checkpointing (fms-acceleration's and
    PEFT's reentrant runs), never under non-reentrant (PEFT's FSDP guide, torchtune): copies x b s h L x 2 B."""
    props = {"number_gpus": 2, "batch_size": 4, "model_max_length": 512, "distributed_backend": "FSDP"}
    w = workload("lora", gradient_checkpointing_use_reentrant=reentrant, **props)
    assert w.reentrant_checkpointing is reentrant and w.trace_request().reentrant is reentrant
    m = w.structure
    none = activation_moments(w, UNIT)
    one = activation_moments(w, UNIT.replace(fsdp_peft_checkpoint_copies=1.0))
    copies = 2 * 512 * m.hidden * m.layers * 2  # per-device batch 2
    for name in none:
        assert one[name][0][0] - none[name][0][0] == pytest.approx(copies if reentrant else 0.0)


def test_liger_kernels_keep_what_their_autograd_functions_save():
    """Liger's SiLU-gated MLP keeps the gate and up projections' outputs, not silu(gate): without checkpointing
    the forward holds at least one intermediate-wide 16-bit tensor per layer and token less (and its RMSNorm
    keeps no fp32 copies of the input); with checkpointing the layer inputs stay and the working set shrinks."""
    plain = workload("lora", batch_size=1, model_max_length=512, gradient_checkpointing=False)
    liger = workload("lora", batch_size=1, model_max_length=512, gradient_checkpointing=False, liger_kernels=True)
    assert liger.trace_request().liger and not plain.trace_request().liger
    m = liger.structure
    intermediate = m.config.get("intermediate_size")
    saved = activation_moments(plain, UNIT)["forward"][0][0] - activation_moments(liger, UNIT)["forward"][0][0]
    assert saved >= 0.99 * 512 * m.layers * intermediate * 2
    ckpt = {"batch_size": 4, "model_max_length": 1024}
    before = activation_moments(workload("lora", **ckpt), UNIT)["last_layer"][0][0]
    after = activation_moments(workload("lora", liger_kernels=True, **ckpt), UNIT)["last_layer"][0][0]
    checkpoints = 4 * 1024 * m.hidden * m.layers * 2
    assert checkpoints < after < before
    # Gemma's Liger patch swaps an offset RMSNorm and GeGLU, which the stand-ins do not model: unchanged
    from pathlib import Path

    import tunebench

    gemma = Path(tunebench.__file__).parent / "plan/data/measurements/published/configs/gemma-2b/config.json"
    assert not workload("full", model_name=str(gemma), liger_kernels=True).trace_request().liger


def test_foak_fused_lora_ops_keep_what_their_autograd_functions_save():
    """fms-acceleration-foak's fused LoRA ops (LoRA_QKV, LoRA_W, LoRA_MLP) keep the input and one 16-bit dropped
    copy per adapted projection and the MLP's gate and up outputs; peft keeps an fp32 dropped copy and a 1-byte
    mask per projection, and transformers' SwiGLU keeps silu(gate) and the product too. Per layer and token,
    without checkpointing: q, k, v, o save 4 x (4 + 1 - 2) = 12 B per hidden element; gate and up 2 x 3 = 6 B per
    hidden element; down 3 B and the SwiGLU chain 4 B per intermediate element (e, silu(e), g, h against e, g)."""
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def qlora(fused: bool, **props):
        exp = get_experiment(EXP["qlora"])
        raw = {"model_name": "smollm2-135m", "model_max_length": 512, "number_gpus": 1, "batch_size": 1}
        raw |= {"gpu_model": "A100-80GB", "target_modules": targets, **props}
        values = effective_values(exp, make_entity(exp, raw))
        if fused:  # as fms-acceleration's foak records state it
            values["fused_lora"] = ("bitsandbytes", True)
        return build_workload(exp.method, [values])

    plain, fused = qlora(False, gradient_checkpointing=False), qlora(True, gradient_checkpointing=False)
    assert fused.trace_request().fused_lora and not plain.trace_request().fused_lora
    assert plain.trace_request().key != fused.trace_request().key
    m = plain.structure
    intermediate = m.config["intermediate_size"]
    per_layer_token = 18 * m.hidden + 7 * intermediate
    saved = activation_moments(plain, UNIT)["forward"][0][0] - activation_moments(fused, UNIT)["forward"][0][0]
    assert per_layer_token * 512 * m.layers <= saved <= 1.05 * per_layer_token * 512 * m.layers
    # with checkpointing only the layer being recomputed is smaller; the layer inputs stay
    before = activation_moments(qlora(False), UNIT)["last_layer"][0][0]
    after = activation_moments(qlora(True), UNIT)["last_layer"][0][0]
    assert 512 * m.hidden * m.layers * 2 < after < before
    # the gptq-lora experiment runs them (the SFTTrainer spec hardcodes fused_lora); a 16-bit base never does
    assert workload("gptq-lora", target_modules=("q_proj", "v_proj")).fused_lora and not workload("qlora").fused_lora
    lora = workload("lora")
    lora.settings["fused_lora"] = ("bitsandbytes", True)
    assert not lora.fused_lora
    # nor a model type foak has no rules for (Gemma): traced as peft runs it, under peft's key
    from pathlib import Path

    import tunebench

    gemma = Path(tunebench.__file__).parent / "plan/data/measurements/published/configs/gemma-2b/config.json"
    assert not qlora(True, model_name=str(gemma)).fused_lora


def test_lora_adapter_parameters_by_hand():
    # smollm2-135m: h 576, 9 heads x 64, 3 KV heads x 64, 30 layers; q_proj (576 -> 576), v_proj (576 -> 192)
    w = workload("lora", r=8)
    assert w.lora_params_per_rank == 30 * ((576 + 576) + (576 + 192))
    n_t = 8 * w.lora_params_per_rank
    b = memory_breakdown(w, UNIT)
    n = w.structure.total_params
    assert b["weights"][0] == pytest.approx(2 * n + 4 * n_t)  # frozen bf16 base + fp32 adapters
    assert b["optimizer_states"][0] == pytest.approx(8 * n_t)
    assert b["gradients"][0] == pytest.approx(4 * n_t)


@pytest.mark.slow
def test_qlora_and_gptq_bases_by_hand():
    m = structure_of(get_model("smollm2-135m"))
    assert NF4_DQ_BYTES == pytest.approx((4 + 8 / 64 + 32 / (64 * 256)) / 8)
    n_t = 4 * 30 * ((576 + 576) + (576 + 192))
    q = memory_breakdown(workload("qlora", r=4), UNIT)
    # peft's prepare_model_for_kbit_training keeps every weight that is not 4-bit in fp32
    assert q["weights"][0] == pytest.approx(
        m.quantized_params * NF4_DQ_BYTES + (m.total_params - m.quantized_params) * 4 + 4 * n_t
    )
    plugin = memory_breakdown(workload("qlora", r=4, _kbit_upcast=False), UNIT)  # fms-acceleration's bnb plugin
    assert plugin["weights"][0] == pytest.approx(
        m.quantized_params * NF4_DQ_BYTES + (m.total_params - m.quantized_params) * 2 + 4 * n_t
    )
    assert m.quantized_params == sum(lin.params for lin in m.linears if lin.part == "layers")
    g = memory_breakdown(workload("gptq-lora", r=4, target_modules="q_proj,v_proj"), UNIT)
    assert g["weights"][0] == pytest.approx(
        m.quantized_params * GPTQ_BYTES + (m.total_params - m.quantized_params) * 2 + 4 * n_t
    )


def test_prompt_tuning_trains_virtual_tokens_only():
    pt = memory_breakdown(workload("pt"), UNIT)
    assert pt["optimizer_states"][0] == pytest.approx(8 * 576 * 8)  # 8 virtual tokens x h, fp32 Adam
    assert pt["gradients"][0] == pytest.approx(4 * 8 * 576)


def test_activations_are_the_traced_peak_moment():
    w = workload("full", batch_size=2, model_max_length=512)
    b = memory_breakdown(w, UNIT)
    _, padded = w.sample_tokens()
    moment = w.activations.moments[b["moment"][0]]
    assert b["activations"][0] + b["loss"][0] == pytest.approx(float(moment.bytes(np.array(2.0), padded[0])))
    assert b["loss"][0] == pytest.approx(2 * 512 * 49152 * moment.vocab_bytes)
    off = memory_breakdown(workload("full", batch_size=2, model_max_length=512, gradient_checkpointing=False), UNIT)
    assert off["activations"][0] > 3 * b["activations"][0]  # every layer's activations stay without checkpointing


def test_fused_loss_kernels_keep_less_of_the_loss():
    hf = memory_breakdown(workload("lora", batch_size=2, model_max_length=1024), UNIT)
    liger = memory_breakdown(
        workload("lora", batch_size=2, model_max_length=1024, loss_implementation="fused_linear"), UNIT
    )
    assert liger["loss"][0] == 0 and hf["loss"][0] > 0
    # without the logits the peak may move to another moment, never above transformers' loss
    assert liger["activations"][0] + liger["loss"][0] < hf["activations"][0] + hf["loss"][0]


@pytest.mark.parametrize("release", ["current", "before #406"])
def test_liger_keeps_its_gradient_buffers_and_chunk_loop_in_the_forward(release):
    """liger-kernel's fused_linear_cross_entropy_forward (smollm2-135m: vocab 49,152, hidden 576; 2 x 1,024
    tokens: chunks of ceil(2,048 / 86) = 24 rows, next power of two 32, so several chunks): the input's
    gradient and the output layer's gradient when it trains, kept to the end of the forward, and the chunk loop:
    since #406 the previous chunk is alive while the next matmul writes (2 chunks in bf16), and a training
    output layer accumulates its gradient through a vocab x hidden bf16 product and its fp32 copy beside one
    chunk (#830); before #406 (fms-acceleration's vendored copy) the previous chunk's gradient, the new chunk and
    its fp32 upcast (8 B per element) and the forward's shifted copy of the hidden states. No logits at any
    moment. Against a fused loss that keeps nothing (UNIT's fast_loss budget is 0), only the forward moment
    differs, by exactly those bytes."""
    tokens, hidden, vocab = 2 * 1024, 576, 49152
    chunk = 32 * vocab
    old = {"_flce_chunk_upcast": True} if release != "current" else {}
    for method in ("full", "lora"):
        shape = {"batch_size": 2, "model_max_length": 1024}
        w = workload(method, **shape, loss_implementation="fused_linear", **old)
        assert w.flce_upcasts_chunks == bool(old)
        liger = activation_moments(w, UNIT)
        nothing = activation_moments(workload(method, **shape, fast_kernels=[True, False, False]), UNIT)
        head_grad = vocab * hidden * 2 if method == "full" else 0  # tied to the embedding: bf16 as stored
        if old:
            loop = chunk * (2 + 4 + 2) + tokens * hidden * 2
        elif method == "full":
            loop = max(chunk * 2 * 2, chunk * 2 + vocab * hidden * (2 + 4))
        else:
            loop = chunk * 2 * 2
        buffers = tokens * hidden * 2 + head_grad + loop
        assert liger["forward"][0][0] - nothing["forward"][0][0] == pytest.approx(buffers)
        for name in liger:
            assert liger[name][2][0] == 0  # no logits
            if name != "forward":
                assert liger[name][0][0] == pytest.approx(nothing[name][0][0])


def test_liger_chunk_loop_with_fp32_weights():
    """fp32 weights (smollm2-135m full fine-tuning, 2 x 1,024 tokens, chunks of 32 rows): without autocast the
    logits are fp32 and .float() copies nothing, so current releases keep two fp32 chunks or one beside the fp32
    head-gradient product, and the pre-#406 loop the previous chunk, its scaled gradient and the new chunk
    (12 B per element); under bf16 autocast the head's fp32 gradient takes the bf16 product in place (addmm
    with out_dtype) while autocast's cached bf16 copy of the training head stays alive."""
    tokens, hidden, vocab = 2 * 1024, 576, 49152
    chunk, head = 32 * vocab, vocab * hidden
    shape = {"batch_size": 2, "model_max_length": 1024, "loss_implementation": "fused_linear"}
    pure32 = {"torch_dtype": "float32", "bf16": False}
    amp32 = {"torch_dtype": "float32", "bf16": True}
    kept = tokens * hidden * 4 + head * 4  # the fp32 input gradient and output-layer gradient
    at = np.array([float(tokens)])
    current = fused_linear_forward_bytes(workload("full", **shape, **pure32), at)[0]
    assert current == pytest.approx(kept + max(2 * chunk * 4, chunk * 4 + head * 4))
    before = fused_linear_forward_bytes(workload("full", **shape, **pure32, _flce_chunk_upcast=True), at)[0]
    assert before == pytest.approx(kept + 3 * chunk * 4 + tokens * hidden * 4)
    autocast = fused_linear_forward_bytes(workload("full", **shape, **amp32), at)[0]
    assert autocast == pytest.approx(kept + max(2 * chunk * 2, chunk * 2) + head * 2)


def test_fms_accelerations_fast_kernels_run_the_liger_release_it_vendors():
    """foak's liger configs replace the model's forward with the pre-#406 copy under fused_ops/liger_ce."""
    w = workload("lora", loss_implementation="fused_linear", fast_kernels=[True, True, True])
    assert w.flce_upcasts_chunks
    assert not workload("lora", fast_kernels=[True, True, True]).flce_upcasts_chunks  # foak's own loss kernel


def test_liger_output_layer_gradient_is_not_split_by_sequence_parallelism():
    """Ulysses ranks hold a slice of the tokens but the whole output layer, its gradient and the product that
    accumulates it."""
    base = {"batch_size": 8, "number_gpus": 8, "model_max_length": 1024, "loss_implementation": "fused_linear"}
    one = workload("full", **base, distributed_backend="DDP")
    tokens = np.array([1024.0])
    per_rank = fused_linear_forward_bytes(one, tokens)[0]
    split = fused_linear_forward_bytes(workload("full", **base, sequence_parallel_degree=2), tokens)[0]
    head = one.structure.lm_head_params * (2 + 2 + 4)  # its bf16 gradient, and the bf16 product's fp32 copy
    assert split - head == pytest.approx((per_rank - head) / 2)


def test_liger_input_gradient_follows_the_forward_dtype():
    """An fp32 checkpoint under FSDP's mixed precision computes in bf16: Liger's input gradient is bf16 too,
    as for a bf16 checkpoint; on one GPU under autocast the residual stream stays fp32 and the fp32 output layer
    is cast to bf16 for the chunk's matmul."""
    base = {"batch_size": 8, "number_gpus": 8, "model_max_length": 1024, "loss_implementation": "fused_linear"}
    tokens = np.array([1024.0])
    lora = {"distributed_backend": "FSDP", "bf16": True}
    fp32 = fused_linear_forward_bytes(workload("lora", **base, **lora, torch_dtype="float32"), tokens)[0]
    bf16 = fused_linear_forward_bytes(workload("lora", **base, **lora, torch_dtype="bfloat16"), tokens)[0]
    assert fp32 == pytest.approx(bf16)
    one = {**base, "number_gpus": 1, "batch_size": 1}
    single32 = fused_linear_forward_bytes(workload("lora", **one, bf16=True, torch_dtype="float32"), tokens)[0]
    single16 = fused_linear_forward_bytes(workload("lora", **one, bf16=True, torch_dtype="bfloat16"), tokens)[0]
    m = workload("lora", **one).structure
    # the fp32 input gradient, and the 16-bit copy autocast makes of the frozen fp32 output layer for a matmul
    assert single32 - single16 == pytest.approx(1024 * m.hidden * 2 + m.lm_head_params * 2)


def test_fused_kernels_leave_the_checkpointed_layer_inputs_whole():
    """fms-acceleration's RMSNorm/RoPE kernels shorten element-wise chains inside a layer; the layer inputs that
    checkpointing keeps (2 h bytes per token per layer) stay, however small the fitted share."""
    w = workload("full", batch_size=4, model_max_length=1024, fast_kernels=[False, True, True])
    m = w.structure
    checkpoints = 4 * 1024 * m.hidden * m.layers * 2
    tiny = UNIT.replace(fast_kernels_activation_fraction=0.01)
    for acts, _, loss in activation_moments(w, tiny).values():
        assert acts[0] - loss[0] >= checkpoints * 0.999
    full_share = activation_moments(w, UNIT)["forward"][0][0]
    assert activation_moments(w, tiny)["forward"][0][0] < full_share  # the working set still shrinks


@pytest.mark.parametrize(
    ("method", "props", "element_bytes"),
    [
        ("full", {"torch_dtype": "float32", "bf16": True}, 4),  # autocast: the residual add promotes to fp32
        ("qlora", {"torch_dtype": "bfloat16", "bf16": True}, 4),  # prepare_model_for_kbit_training's fp32 embeddings
        ("qlora", {"torch_dtype": "bfloat16", "bf16": True, "_kbit_upcast": False}, 2),
        ("full", {"torch_dtype": "bfloat16", "bf16": True}, 2),
        # FSDP's mixed precision casts every weight to bf16 for the forward
        ("full", {"torch_dtype": "float32", "bf16": True, "number_gpus": 2, "distributed_backend": "FSDP"}, 2),
    ],
)
def test_fused_kernels_keep_the_layer_inputs_in_the_residual_streams_dtype(method, props, element_bytes):
    """The layer inputs checkpointing keeps are residual-stream elements: fp32 when the stream is fp32."""
    batch = 4 * props.get("number_gpus", 1)
    w = workload(method, batch_size=batch, model_max_length=1024, fast_kernels=[False, True, True], **props)
    m = w.structure
    assert residual_bytes(w) == element_bytes
    checkpoints = 4 * 1024 * m.hidden * m.layers * element_bytes
    tiny = UNIT.replace(fast_kernels_activation_fraction=0.01)
    held = max(acts[0] - loss[0] for acts, _, loss in activation_moments(w, tiny).values())
    assert checkpoints * 0.999 <= held <= checkpoints * 1.1  # the layer inputs, and 1 % of the working set


@pytest.mark.slow
@pytest.mark.parametrize(
    "model", ["llama3.1-8b", "mixtral-8x7b-instruct-v0.1", "granite-4.0-h-tiny", "granite-34b-code-base"]
)
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_more_gpus_with_fsdp_never_raise_per_gpu_model_states(model, method):
    props = {"model_name": model, "model_max_length": 1024, "gradient_accumulation_steps": 1}
    if method != "full":
        props["target_modules"] = "q_proj,v_proj" if "34b" not in model else "c_attn"
    for ga in (1, 4):
        previous = np.inf
        for d in (1, 2, 4, 8, 16, 32):
            b = memory_breakdown(
                workload(method, number_gpus=d, batch_size=32, **{**props, "gradient_accumulation_steps": ga}), UNIT
            )
            now = states(b)
            assert now <= previous + 1e-6, (model, method, ga, d)
            previous = now


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama3.1-8b", "granite-4.0-h-micro", "granite-vision-3.2-2b", "smollm2-135m"])
@pytest.mark.parametrize("checkpointing", [True, False])
def test_longer_sequences_never_lower_activation_memory(model, checkpointing):
    previous = -1.0
    for length in (128, 512, 1024, 4096, 16384, 32768, 65536):
        w = workload(
            "lora",
            model_name=model,
            model_max_length=length,
            gradient_checkpointing=checkpointing,
            target_modules="q_proj,v_proj",
        )
        b = memory_breakdown(w, UNIT)
        acts = float(b["activations"][0] + b["loss"][0])
        assert acts >= previous
        previous = acts


def test_oom_and_nvidia_smi_overheads():
    c = Coefficients()
    big = predict_memory(workload("full", model_name="llama3-70b"), c)
    assert not big.fits[0] and big.utilization_pct[0] > 100 and big.oom_probability[0] > 0.999
    small = predict_memory(workload("full"), c)
    assert small.fits[0] and small.oom_probability[0] < 1e-6
    assert small.nvidia_smi_gib[0] > small.reserved_gib[0] > small.allocated_gib[0]
    assert small.breakdown_gib["cuda_context"][0] == pytest.approx(c.cuda_context_gib)
    # usable is what CUDA gives the process (less than nvidia-smi's total) less the context
    gpu = get_gpu("A100-80GB")
    assert small.capacity_gib == pytest.approx(gpu.memory_gib)
    assert small.usable_gib[0] == pytest.approx(gpu.cuda_memory_bytes / 2**30 - c.cuda_context_gib)
    assert small.usable_gib[0] < small.capacity_gib - c.cuda_context_gib


def test_the_driver_reserve_turns_a_run_at_nvidia_smis_total_into_out_of_memory():
    """A run whose need sits between CUDA's total and nvidia-smi's total does not fit (the driver keeps the
    difference: H100 80GB HBM3 prints 'total capacity of 79.11 GiB' against nvidia-smi's 81,559 MiB)."""
    c = Coefficients().replace(cuda_context_gib=0.5, peak_log_sigma=0.02)
    w = workload("full", gpu_model="H100")
    need = predict_memory(w, c).required_gib[0]
    gpu = get_gpu("H100")
    # a GPU whose CUDA total is exactly the need plus the context: on the boundary (P = 0.5)
    edge = dataclasses.replace(gpu, cuda_memory_mib=(need + 0.5) * 1024)
    assert predict_memory(dataclasses.replace(w, gpu=edge), c).oom_probability[0] == pytest.approx(0.5, abs=1e-6)
    # the need sits between CUDA's total and nvidia-smi's: nvidia-smi's total would say it fits, CUDA's does not
    between = dataclasses.replace(
        gpu, memory_mib=int((need + 0.5) * 1024 / 0.97) + 1, cuda_memory_mib=(need + 0.5) * 1024 * 0.97
    )
    m = predict_memory(dataclasses.replace(w, gpu=between), c)
    assert m.capacity_gib - c.cuda_context_gib > need and not m.fits[0]


def test_each_phase_needs_its_own_peak_plus_the_fragmentation_of_its_own_transients():
    """Out of memory is judged phase by phase: a full fine-tuning run whose peak is the optimizer step needs
    that peak plus a share of the step's foreach temporaries, not of the forward's activations, which
    are freed by then (fms-acceleration: Llama-3-8B full on one A100 at 4 x 4,096 tokens, 74.8 GiB at the
    step, ran)."""
    c = Coefficients().replace(oom_fragmentation_fraction=0.25)
    w = workload("full", batch_size=1, model_max_length=512)
    b = memory_breakdown(w, c)
    assert b["peak_optimizer_step"][0] > b["peak_forward_backward"][0]  # AdamW states: the step is the peak
    m = predict_memory(w, c)
    step = (b["peak_optimizer_step"][0] + 0.25 * b["optimizer_step_transient"][0]) / 2**30
    assert m.required_gib[0] == pytest.approx(step)
    assert m.allocated_gib[0] == pytest.approx(b["peak_optimizer_step"][0] / 2**30)
    # a long sequence moves the peak into the backward: its activations' share counts there
    long = workload("lora", batch_size=8, model_max_length=8192)
    lb = memory_breakdown(long, c)
    need = (lb["peak_forward_backward"][0] + 0.25 * (lb["transient"][0] + lb["loss"][0])) / 2**30
    assert predict_memory(long, c).required_gib[0] == pytest.approx(need)


def test_oom_probability_is_the_normal_error_of_the_log_ratio():
    usable = 80.0
    assert oom_probability(np.array([80.0]), usable, 0.1)[0] == pytest.approx(0.5)
    # one standard deviation above: Phi(1) = 0.8413; below: 0.1587
    assert oom_probability(np.array([80.0 * np.exp(0.1)]), usable, 0.1)[0] == pytest.approx(0.841345, abs=1e-5)
    assert oom_probability(np.array([80.0 * np.exp(-0.1)]), usable, 0.1)[0] == pytest.approx(0.158655, abs=1e-5)


@pytest.mark.slow
def test_config_json_models_plan_like_their_catalog_twin(tmp_path):
    spec = get_model("llama3.2-1b")
    cfg = {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    from_config = get_model(str(path))
    assert structure_of(from_config).total_params == spec.total_params
    a = memory_breakdown(workload("full", model_name=str(path)), UNIT)
    b = memory_breakdown(workload("full", model_name="llama3.2-1b"), UNIT)
    for key in ("weights", "optimizer_states", "activations", "loss"):
        assert a[key][0] == pytest.approx(b[key][0], rel=1e-9)


def test_config_json_moe_model(tmp_path):
    cfg = {
        "model_type": "mixtral",
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "moe" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    a = structure_of(get_model(str(path.parent)))
    per_layer_attn = 512 * 512 * 2 + 512 * 128 * 2
    experts = 4 * 3 * 512 * 1024
    assert a.total_params == 4 * (per_layer_attn + experts + 512 * 4 + 2 * 512) + 2 * 1000 * 512 + 512
    assert a.expert_params == 4 * experts and a.experts == 4 and a.top_k == 2
    assert a.matmul_params_per_token == pytest.approx(4 * (per_layer_attn + experts / 2 + 512 * 4) + 1000 * 512)


def test_a_short_chunked_loss_leaves_the_moments_without_logits_alone():
    """The chunked loss's one chunk is alive only where the logits are: the embedding backward of a full
    fine-tuning (its vocab x hidden gradient, in the level as the chunk is) is the same at any length. A micro-batch
    shorter than one chunk took that gradient off too (llama3.2-3b at 128 tokens: 0.28 GiB at the tail for 2.2,
    the FSDP peak's moment)."""
    moments = {
        loss: activation_moments(
            workload("full", model_name="llama3.2-3b", model_max_length=128, loss_implementation=loss), UNIT
        )
        for loss in ("upcast", "chunked")
    }
    for name in ("tail", "first_layer", "last_layer"):  # no logits alive
        assert moments["chunked"][name][0][0] == pytest.approx(moments["upcast"][name][0][0]), name
    assert moments["chunked"]["tail"][0][0] > 2 * GIB
