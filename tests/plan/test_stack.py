"""The planner's stack settings: DeepSpeed ZeRO and offload, FSDP CPU offload, device_map, the loss
path, attention, adapter dtype, selective checkpointing and torch.compile, against hand-computed bytes
(ZeRO paper, Fig. 1) and against each other."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from plan.test_memory import UNIT, states, workload

from tunebench.errors import InputError
from tunebench.plan.coefficients import Coefficients
from tunebench.plan.memory import memory_breakdown, predict_memory, trainable_params
from tunebench.plan.predictor import predict
from tunebench.plan.throughput import (
    _link_gbps,
    dequant_seconds,
    offload_seconds,
    optimizer_seconds,
    predict_throughput,
)
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.validity import check_values

GIB = 2**30
N8 = {"number_gpus": 8, "batch_size": 8}
DS = {**N8, "distributed_backend": "DeepSpeed"}


@pytest.mark.parametrize(
    ("stage", "bytes_per_param"), [(0, 2 + 2 + 16), (1, 2 + 2 + 16 / 8), (2, 2 + 18 / 8), (3, 20 / 8)]
)
def test_zero_stages_partition_as_the_zero_paper_says(stage, bytes_per_param):
    # mixed precision AdamW: 16-bit params and grads, K = 12 B of fp32 master + m + v (Rajbhandari et al. 2020),
    # and the step's fp32 copy of the gradient partition (4 B, partitioned like the states)
    w = workload("full", **DS, deepspeed_zero_stage=stage, bf16=True, optim="adamw_torch_fused")
    b = memory_breakdown(w, UNIT)
    n = w.structure.total_params
    assert states(b) == pytest.approx(bytes_per_param * n)
    assert (b["gathered_weights"][0] > 0) == (stage == 3)


def test_zero_without_16bit_keeps_peft_adapters_and_their_states_in_fp32():
    """Without bf16/fp16 DeepSpeed casts nothing: PEFT's fp32 adapters on a bf16 base keep 4 B weights and
    gradients and 2 x 4 B AdamW states, with no master copy; with bf16 the module, adapters included, is
    16-bit and the optimizer holds the fp32 master and states (ZeRO paper, K = 12)."""
    shared = {**DS, "deepspeed_zero_stage": 0, "torch_dtype": "bfloat16", "optim": "adamw_torch_fused"}
    w = workload("lora", **shared)
    n = trainable_params(w)[0]
    b = memory_breakdown(w, UNIT)
    assert b["gradients"][0] == pytest.approx(4 * n)
    assert b["optimizer_states"][0] == pytest.approx(8 * n)
    cast = memory_breakdown(workload("lora", **shared, bf16=True), UNIT)
    assert cast["gradients"][0] == pytest.approx(2 * n)
    assert cast["optimizer_states"][0] == pytest.approx(12 * n)
    assert b["weights"][0] - cast["weights"][0] == pytest.approx(2 * n)


def test_zero_1_and_2_gradient_buckets_on_any_gpu_count_sized_by_the_run_config():
    """DeepSpeed stage 1/2's backward allocates its contiguous-gradient buffers (two with overlap_comm) of
    reduce_bucket_size 16-bit elements whatever the world size: hidden^2 under transformers' "auto", or what a
    record's config states (``_ds_bucket_elements``); stage 3 has none of them."""
    one = {"number_gpus": 1, "batch_size": 1, "distributed_backend": "DeepSpeed", "bf16": True}
    auto = workload("lora", **one, deepspeed_zero_stage=2)
    hidden = auto.structure.hidden
    assert memory_breakdown(auto, UNIT)["ddp_buckets"][0] == pytest.approx(2 * hidden**2 * 2)
    sized = workload("lora", **one, deepspeed_zero_stage=2, _ds_bucket_elements=2e8)
    assert memory_breakdown(sized, UNIT)["ddp_buckets"][0] == pytest.approx(2 * 2e8 * 2)
    assert memory_breakdown(workload("lora", **one, deepspeed_zero_stage=3), UNIT)["ddp_buckets"][0] == 0


def test_zero_offload_moves_states_to_the_host_per_node():
    on_gpu = workload("full", **DS, deepspeed_zero_stage=2, bf16=True, optim="adamw_torch_fused")
    off = workload(
        "full", **DS, deepspeed_zero_stage=2, bf16=True, optim="adamw_torch_fused", offload_optimizer_device="cpu"
    )
    n = off.structure.total_params
    b = memory_breakdown(off, UNIT)
    assert b["optimizer_states"][0] == 0 and b["gradients"][0] == 0 and b["weights"][0] == 2 * n
    assert states(b) < states(memory_breakdown(on_gpu, UNIT))
    m = predict_memory(off, UNIT)
    # per process: fp32 master + m + v + fp32 gradients (16 B) over 8 ranks; 8 processes on the node
    assert m.host_gib[0] == pytest.approx(16 * n / GIB)
    # stage 1 keeps the whole 16-bit gradients on the GPU until the step's reduce, offload or not
    stage1 = {"deepspeed_zero_stage": 1, "bf16": True, "optim": "adamw_torch_fused"}
    kept = memory_breakdown(workload("full", **DS, **stage1, offload_optimizer_device="cpu"), UNIT)
    assert kept["gradients"][0] == memory_breakdown(workload("full", **DS, **stage1), UNIT)["gradients"][0] == 2 * n
    assert kept["optimizer_states"][0] == 0
    infinity = workload(
        "full",
        **DS,
        deepspeed_zero_stage=3,
        bf16=True,
        optim="adamw_torch_fused",
        offload_optimizer_device="cpu",
        offload_param_device="cpu",
    )
    mi = predict_memory(infinity, UNIT)
    assert memory_breakdown(infinity, UNIT)["weights"][0] == 0
    assert mi.host_gib[0] == pytest.approx((16 + 2) * n / GIB)
    nvme = predict_memory(
        workload(
            "full", **DS, deepspeed_zero_stage=3, offload_optimizer_device="nvme", bf16=True, optim="adamw_torch_fused"
        ),
        UNIT,
    )
    assert nvme.host_gib[0] == 0 and nvme.nvme_gib[0] == pytest.approx(16 * n / GIB)


def test_a_records_stated_network_sets_the_inter_node_bandwidth_unless_the_option_does():
    """Multi-node collectives run at the NIC's rate: 25 GB/s per node with enable_roce, the rate a record states
    it ran on (``_network_gbps``, GB/s per node), and the plan option above both."""
    two_nodes = {"number_gpus": 16, "number_nodes": 2, "batch_size": 16, "distributed_backend": "FSDP"}
    roce = workload("full", **two_nodes, enable_roce=True, bf16=True)
    stated = workload("full", **two_nodes, enable_roce=True, bf16=True, _network_gbps=200.0)
    at_roce = predict_throughput(roce, UNIT).comm_seconds[0]
    assert predict_throughput(stated, UNIT).comm_seconds[0] == pytest.approx(at_roce * 25 / 200)
    assert predict_throughput(stated, UNIT, network_gbps=25.0).comm_seconds[0] == pytest.approx(at_roce)
    one_node = workload("full", number_gpus=8, batch_size=8, distributed_backend="FSDP", bf16=True, _network_gbps=1.0)
    nvlink = workload("full", number_gpus=8, batch_size=8, distributed_backend="FSDP", bf16=True)
    assert predict_throughput(one_node, UNIT).comm_seconds[0] == pytest.approx(
        predict_throughput(nvlink, UNIT).comm_seconds[0]
    )


def test_hybrid_shard_puts_only_the_shards_all_reduce_on_the_network():
    """HYBRID_SHARD gathers and reduce-scatters within a node; across nodes each GPU all-reduces its shard, so a
    node's NIC carries 2 (n-1)/n of the gradient: on a slow network it is far faster than FULL_SHARD, and what
    the network adds to it is no more than what it adds to DDP's all-reduce."""
    two_nodes = {"number_gpus": 16, "number_nodes": 2, "batch_size": 16}  # bf16 weights and gradients in both
    setups = {
        "full": {"distributed_backend": "FSDP"},
        "hybrid": {"distributed_backend": "FSDP", "fsdp_sharding_strategy": "HYBRID_SHARD"},
        "ddp": {"distributed_backend": "DDP"},
    }

    def comm(name: str, network_gbps: float) -> float:
        w = workload("full", **two_nodes, **setups[name])
        return predict_throughput(w, UNIT, network_gbps=network_gbps).comm_seconds[0]

    assert comm("hybrid", 4.0) < comm("full", 4.0)
    network = {name: comm(name, 4.0) - comm(name, 400.0) for name in setups}
    assert 0 < network["hybrid"] <= network["ddp"] < network["full"]
    one_node = {"number_gpus": 8, "batch_size": 8, "bf16": True, "distributed_backend": "FSDP"}
    same = [
        predict_throughput(workload("full", **one_node, fsdp_sharding_strategy=s), UNIT).comm_seconds[0]
        for s in ("FULL_SHARD", "HYBRID_SHARD")
    ]
    assert same[1] == pytest.approx(same[0])  # on one node HYBRID_SHARD is FULL_SHARD


def test_offload_is_slower_than_keeping_states_on_the_gpu():
    fast = predict_throughput(workload("full", **DS, deepspeed_zero_stage=2, bf16=True), UNIT)
    slow = predict_throughput(
        workload("full", **DS, deepspeed_zero_stage=2, bf16=True, offload_optimizer_device="cpu"), UNIT
    )
    assert slow.step_seconds[0] > fast.step_seconds[0]
    z3 = predict_throughput(
        workload("full", **DS, deepspeed_zero_stage=3, bf16=True, gradient_accumulation_steps=4), UNIT
    )
    z1 = predict_throughput(
        workload("full", **DS, deepspeed_zero_stage=1, bf16=True, gradient_accumulation_steps=4), UNIT
    )
    assert z3.comm_seconds[0] > z1.comm_seconds[0]  # ZeRO-3 gathers parameters every micro-batch


def test_zero_1_and_2_move_only_the_trainable_parameters_of_a_peft_run():
    """ZeRO stages 1-2 partition and all-gather what the optimizer updates (DeepSpeed stage_1_and_2.py keeps
    the params with requires_grad): LoRA moves its adapters' gradients and updated values, never the frozen
    base; stage 3 partitions every parameter and gathers the base in each micro-batch's forward and backward."""
    two_nodes = {**DS, "number_nodes": 2, "gradient_accumulation_steps": 4, "bf16": True}
    lora = {stage: workload("lora", **two_nodes, deepspeed_zero_stage=stage) for stage in (1, 2, 3)}
    comm = {stage: predict_throughput(w, UNIT).comm_seconds[0] for stage, w in lora.items()}
    w = lora[2]
    ring = 7 / 8
    grad_bytes = trainable_params(w)[0] * 2
    link = _link_gbps(w, UNIT, None)[0]
    assert comm[2] == pytest.approx((4 + 1) * grad_bytes * ring / link)  # 4 reduce-scatters + 1 all-gather
    assert comm[1] == pytest.approx(2 * grad_bytes * ring / link)
    assert comm[3] > 100 * comm[2]  # the frozen base is gathered twice per micro-batch
    full = workload("full", **two_nodes, deepspeed_zero_stage=2)
    assert predict_throughput(full, UNIT).comm_seconds[0] > 100 * comm[2]
    # without bf16/fp16 DeepSpeed keeps the fp32 adapters and communicates in fp32 (communication_data_type)
    fp32 = workload("lora", **{**two_nodes, "bf16": False}, deepspeed_zero_stage=2)
    assert predict_throughput(fp32, UNIT).comm_seconds[0] == pytest.approx(2 * comm[2])


def test_fsdp_and_zero_3_pay_their_per_layer_hooks_and_other_backends_do_not():
    """FSDP and ZeRO-3 gather and release every layer from host hooks in each micro-batch's forward and
    backward: sharded_unit_overhead_s per layer and micro-batch, on top of the launches every run pays;
    ZeRO-3 hooks its layers on one GPU too; ZeRO-1/2, DDP, FSDP's NO_SHARD and one GPU shard no layer."""
    c, none = UNIT.replace(sharded_unit_overhead_s=0.01), UNIT.replace(sharded_unit_overhead_s=0.0)
    layers = workload("full").structure.layers
    shared = {"number_gpus": 8, "batch_size": 8, "gradient_accumulation_steps": 2, "bf16": True}

    def compute_s(coefficients, **entity):
        return predict_throughput(workload("full", **{**shared, **entity}), coefficients).compute_seconds[0]

    zero3 = {"distributed_backend": "DeepSpeed", "deepspeed_zero_stage": 3}
    for sharded in ({"distributed_backend": "FSDP"}, zero3, {**zero3, "number_gpus": 1, "batch_size": 1}):
        assert compute_s(c, **sharded) - compute_s(none, **sharded) == pytest.approx(2 * layers * 0.01)
    for unsharded in (
        {"distributed_backend": "DDP"},
        {"distributed_backend": "DeepSpeed", "deepspeed_zero_stage": 2},
        {"distributed_backend": "FSDP", "fsdp_sharding_strategy": "NO_SHARD"},
        {"distributed_backend": "FSDP", "number_gpus": 1, "batch_size": 1},
    ):
        assert compute_s(c, **unsharded) == pytest.approx(compute_s(none, **unsharded))


def test_a_calibration_fitted_before_the_sharded_term_keeps_its_per_layer_cost_whole():
    """A calibration file without sharded_unit_overhead_s fitted layer_overhead_s with that cost inside: it
    loads the sharded term at 0 rather than the prior (no double count); a misspelt coefficient is an error."""
    old = Coefficients.from_dict({"layer_overhead_s": 0.0048})
    assert old.sharded_unit_overhead_s == 0.0 and old.layer_overhead_s == 0.0048
    assert Coefficients.from_dict({}).sharded_unit_overhead_s == Coefficients().sharded_unit_overhead_s
    with pytest.raises(TypeError, match="layer_overhead"):
        UNIT.replace(layer_overhead=0.01)


def test_dequantisation_outside_the_matmul_costs_memory_traffic_per_micro_batch():
    """4-bit weights dequantised before each use: bitsandbytes 4.5 B per weight in the forward, the recomputed
    forward and the backward; AutoGPTQ's torch path 18.5 B in both forwards and the saved fp16 weight read in the
    backward (below 128 rows its fused CUDA kernel runs instead); fms-acceleration's fused triton kernels
    nothing. Per micro-batch: the same at any length."""
    bandwidth = 2039e9  # A100-80GB, catalog
    rows = np.array([4096.0])
    qlora = workload("qlora")
    n = qlora.structure.quantized_params
    assert qlora.dequantization == "bitsandbytes"
    assert dequant_seconds(qlora, rows)[0] == pytest.approx(n * 4.5 * 3 / bandwidth)
    assert dequant_seconds(qlora, rows / 64)[0] == dequant_seconds(qlora, rows)[0]
    no_ckpt = workload("qlora", gradient_checkpointing=False)
    assert dequant_seconds(no_ckpt, rows)[0] == pytest.approx(n * 4.5 * 2 / bandwidth)
    gptq = {"target_modules": ["q_proj", "v_proj"]}
    fused = workload("gptq-lora", **gptq)
    assert fused.dequantization == "triton_fused" and dequant_seconds(fused, rows)[0] == 0
    torch_path = workload("gptq-lora", **gptq, _gptq_kernel="autogptq_torch")
    assert dequant_seconds(torch_path, rows)[0] == pytest.approx(n * (18.5 * 2 + 2) / bandwidth)
    assert dequant_seconds(torch_path, np.array([64.0]))[0] == 0
    assert dequant_seconds(workload("lora"), rows)[0] == 0
    fast = predict_throughput(fused, UNIT).train_tokens_per_gpu_per_second[0]
    slow = predict_throughput(torch_path, UNIT).train_tokens_per_gpu_per_second[0]
    assert slow < fast
    with pytest.raises(InputError) as err:
        _ = workload("gptq-lora", **gptq, _gptq_kernel="exllama").dequantization
    assert err.value.field == "_gptq_kernel" and "autogptq_torch" in str(err.value)


def test_fsdp_cpu_offload_leaves_only_gathered_units_on_the_gpu():
    w = workload("full", **N8, fsdp_offload_params=True)
    b = memory_breakdown(w, UNIT)
    assert b["weights"][0] == 0 and b["optimizer_states"][0] == 0
    units = w.structure.root_params + 2 * w.structure.largest_layer_params
    assert b["gathered_weights"][0] == pytest.approx(units * 2)
    assert predict_memory(w, UNIT).host_gib[0] > 0


def test_offload_and_device_map_on_a_cpu_run_change_nothing_and_say_so():
    """A CPU run's model and states are in host memory already: FSDP or DeepSpeed offload moves nothing (it moved
    the weights out of the CPU run's allocated peak into an offload line), and device_map has no GPUs to split over."""
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    job = {"model_name": "smollm2-135m", "model_max_length": 256, "number_gpus": 0, "batch_size": 1}
    plain = predict(exp, make_entity(exp, job))
    offloads = {"offload_param_device": "cpu", "offload_optimizer_device": "cpu"}
    for extra, said in (
        ({"distributed_backend": "FSDP", "fsdp_offload_params": True}, "fsdp_offload_params true has"),
        (
            dict(distributed_backend="DeepSpeed", deepspeed_zero_stage=3, device_map="auto", **offloads),
            "offload_optimizer_device cpu, offload_param_device cpu, device_map auto have",
        ),
    ):
        moved = predict(exp, make_entity(exp, {**job, **extra}))
        assert moved.properties == plain.properties
        assert moved.metadata["breakdown"] == plain.metadata["breakdown"]
        assert moved.metadata["host_memory_gib"] == 0
        assert any(f"CPU run: {said} no effect" in n for n in moved.metadata["notes"])
    assert not any("no effect" in n for n in plain.metadata["notes"])


def test_device_map_splits_states_over_the_gpus_of_one_process():
    one = workload("full")
    split = workload("full", number_gpus=4, batch_size=4, distributed_backend=None, device_map="auto")
    assert split.mode()[0] == "PP" and split.per_device_batch[0] == 4
    assert states(memory_breakdown(split, UNIT)) == pytest.approx(states(memory_breakdown(one, UNIT)) / 4)
    assert predict_memory(split, UNIT).host_gib[0] == 0


def test_loss_paths_order_by_what_they_keep():
    peaks = {
        impl: memory_breakdown(
            workload("lora", batch_size=4, model_max_length=2048, loss_implementation=impl),
            UNIT.replace(fused_loss_bytes_per_vocab=4.0),
        )["loss"][0]
        for impl in ("upcast", "model_dtype", "chunked", "fused_linear")
    }
    assert peaks["upcast"] > peaks["model_dtype"] > peaks["chunked"] > peaks["fused_linear"] == 0
    # model_dtype, traced as training.loss runs it: bf16 logits, their shifted copy and the log-softmax (2 B each)
    w = workload("lora", batch_size=4, model_max_length=2048, loss_implementation="model_dtype")
    assert max(m.vocab_bytes for m in w.activations.moments.values()) == pytest.approx(6.0, abs=0.5)
    default = workload("lora", fast_kernels=[True, True, True])
    assert default.loss_implementation == "fast_loss"  # fms-acceleration fused kernel, a fitted budget


def test_attention_implementation_is_traced_quadratic_for_eager():
    eager = workload("lora", attn_implementation="eager", model_max_length=4096, gradient_checkpointing=False)
    flash = workload(
        "lora", attn_implementation="flash_attention_2", model_max_length=4096, gradient_checkpointing=False
    )
    assert eager.attention == "eager" and flash.attention == "flash"
    assert eager.activations.moments["forward"].a2 > 0 and flash.activations.moments["forward"].a2 == 0
    a_eager = memory_breakdown(eager, UNIT)["activations"][0]
    assert a_eager > memory_breakdown(flash, UNIT)["activations"][0]
    assert workload("lora", attn_implementation="flash_attention_3").attention == "flash"


def test_sharded_training_computes_in_its_16_bit_dtype_not_under_autocast():
    """DeepSpeed casts the module (adapters and a QLoRA's upcast norms included) to bf16 when bf16 is on
    (engine._configure_distributed_model); accelerate gives FSDP a bf16 MixedPrecision param_dtype: an fp32
    checkpoint traces like a bf16 one there (a 16-bit residual stream), and under autocast with an fp32
    residual stream on one GPU."""
    fp32 = {"torch_dtype": "float32", "bf16": True, "model_max_length": 1024}
    single = workload("lora", **fp32)
    fsdp = workload("lora", **N8, distributed_backend="FSDP", **fp32)
    ds = workload("lora", **DS, deepspeed_zero_stage=3, **fp32)
    ds_bf16 = workload("lora", **DS, deepspeed_zero_stage=3, **{**fp32, "torch_dtype": "bfloat16"})
    for w in (ds, fsdp):
        req = w.trace_request()
        assert (req.dtype, req.autocast, req.adapter_dtype) == ("bfloat16", None, "bfloat16")
    assert (single.trace_request().dtype, single.trace_request().autocast) == ("float32", "bfloat16")
    acts = {k: memory_breakdown(w, UNIT)["activations"][0] for k, w in (("1", single), ("ds", ds), ("b", ds_bf16))}
    assert acts["ds"] == pytest.approx(acts["b"]) and acts["ds"] < 0.8 * acts["1"]
    # FSDP around one process is no FSDP (accelerate runs it plain), DDP never casts: autocast over fp32
    for w in (
        workload("lora", distributed_backend="FSDP", **fp32),
        workload("lora", **N8, distributed_backend="DDP", **fp32),
    ):
        assert (w.trace_request().dtype, w.trace_request().autocast) == ("float32", "bfloat16")
    qlora = workload("qlora", **DS, deepspeed_zero_stage=3, bf16=True)
    assert not qlora.kbit_upcast and not qlora.trace_request().kbit_upcast
    fsdp_qlora = workload("qlora", **N8, distributed_backend="FSDP", bf16=True)
    # FSDP stores the upcast norms in fp32 (kbit_upcast) but computes with bf16 copies (the trace)
    assert fsdp_qlora.kbit_upcast and not fsdp_qlora.trace_request().kbit_upcast


def test_adapter_dtype_halves_adapter_states():
    f32 = memory_breakdown(workload("lora", r=64), UNIT)
    b16 = memory_breakdown(workload("lora", r=64, adapter_dtype="bfloat16"), UNIT)
    assert b16["optimizer_states"][0] == pytest.approx(f32["optimizer_states"][0] / 2)


def test_selective_checkpointing_keeps_more_than_full_and_less_than_none():
    def acts(**kw):
        return memory_breakdown(workload("full", model_max_length=2048, **kw), UNIT)["activations"][0]

    full, selective, none = acts(), acts(gradient_checkpointing_mode="selective"), acts(gradient_checkpointing=False)
    assert full < selective < none
    fast = predict_throughput(workload("full", gradient_checkpointing_mode="selective"), UNIT).flops_per_token[0]
    assert fast < predict_throughput(workload("full"), UNIT).flops_per_token[0]  # half the matmuls recomputed


def test_compile_keeps_fewer_activations_and_runs_faster():
    c = UNIT.replace(compile_activation_fraction=0.8, compile_speed=1.1)
    eager = workload("full", model_max_length=2048, gradient_checkpointing=False)
    compiled = workload("full", model_max_length=2048, gradient_checkpointing=False, torch_compile=True)
    assert memory_breakdown(compiled, c)["activations"][0] < memory_breakdown(eager, c)["activations"][0]
    assert predict_throughput(compiled, c).step_seconds[0] < predict_throughput(eager, c).step_seconds[0]


def test_host_memory_is_checked_against_the_nodes_ram():
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    entity = {
        "model_name": "llama3-8b",
        "number_gpus": 8,
        "batch_size": 8,
        "model_max_length": 1024,
        "gpu_model": "A100",
        "distributed_backend": "DeepSpeed",
        "deepspeed_zero_stage": 3,
        "bf16": True,
        "offload_optimizer_device": "cpu",
        "offload_param_device": "cpu",
    }
    unchecked = predict(exp, entity)
    assert unchecked.status == "valid" and unchecked.metadata["host_memory_gib"] > 100
    assert any("not checked" in n for n in unchecked.metadata["notes"])
    small = predict(exp, entity, host_memory_gib=64)
    assert small.status == "invalid" and "out of host memory" in small.reasons[0]
    assert predict(exp, entity, host_memory_gib=1024).status == "valid"
    # recommend weighs the same need: a node with too little RAM takes more nodes (offload per node shrinks)
    from tunebench.plan.predictor import PlanOptions
    from tunebench.plan.recommend import evaluate

    variants = [{**entity, "number_gpus": g, "batch_size": g, "number_nodes": g // 8} for g in (8, 16)]
    per_node = unchecked.metadata["host_memory_gib"]
    tight = evaluate(exp, variants, PlanOptions(host_memory_gib=per_node * 0.75), max_oom_risk=0.5)
    assert [c.fits for c in tight] == [False, True]
    assert "out of host memory" in tight[0].notes[0] and tight[1].host_memory_gib == pytest.approx(per_node / 2)


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"offload_optimizer_device": "cpu"}, "needs distributed_backend DeepSpeed"),
        ({"distributed_backend": "DeepSpeed", "deepspeed_zero_stage": 0, "offload_optimizer_device": "cpu"}, ">= 1"),
        (
            {"distributed_backend": "DeepSpeed", "deepspeed_zero_stage": 2, "offload_optimizer_device": "nvme"},
            "stage 3",
        ),
        ({"distributed_backend": "DeepSpeed", "deepspeed_zero_stage": 2, "offload_param_device": "cpu"}, "stage 3"),
        ({"distributed_backend": "DDP", "fsdp_offload_params": True}, "needs distributed_backend FSDP"),
        ({"distributed_backend": "FSDP", "device_map": "auto"}, "set distributed_backend None"),
        ({"flash_attn": True, "attn_implementation": "eager"}, "contradicts"),
        ({"deepspeed_zero_stage": 3}, "deepspeed_zero_stage 3 needs distributed_backend DeepSpeed"),
        ({"distributed_backend": None, "device_map": "auto", "number_nodes": 2}, "cannot span number_nodes 2"),
        # smollm2-135m: 9 attention heads, 3 key/value heads
        ({"tensor_parallel_degree": 2, "batch_size": 2}, "does not divide the model's num_attention_heads 9"),
        ({"tensor_parallel_degree": 4, "batch_size": 1}, "a multiple of the model's num_key_value_heads 3"),
        ({"gpu_model": "V100-32GB", "flash_attn": True}, "flash-attention 2 does not run on Volta GPUs"),
        ({"gpu_model": "Tesla-T4", "attn_implementation": "flash_attention_2"}, "does not run on Turing GPUs"),
        ({"attn_implementation": "flash_attention_3"}, "flash_attention_3 runs on Hopper GPUs only (got Ampere"),
    ],
)
def test_stack_settings_that_cannot_run_together_are_invalid(values, reason):
    base = {
        "model_name": "smollm2-135m",
        "number_gpus": 4,
        "batch_size": 4,
        "gpu_model": "A100",
        "distributed_backend": "FSDP",
        "deepspeed_zero_stage": 2,
    }
    v = check_values({**base, **values})
    assert not v.is_valid and any(reason in r for r in v.reasons), v.reasons
    ok = check_values(
        {
            **base,
            "distributed_backend": "DeepSpeed",
            "deepspeed_zero_stage": 3,
            "offload_optimizer_device": "nvme",
            "offload_param_device": "nvme",
        }
    )
    assert ok.is_valid


def test_sequence_parallelism_splits_each_samples_tokens():
    dense = workload("full", number_gpus=4, batch_size=4, model_max_length=4096)
    ulysses = workload("full", number_gpus=4, batch_size=1, model_max_length=4096 * 4, sequence_parallel_degree=4)
    assert ulysses.per_device_batch[0] == 1 and ulysses.data_parallel[0] == 1
    # the same tokens per GPU (4,096): the same activations, the same sharded model states
    a, b = memory_breakdown(dense, UNIT), memory_breakdown(ulysses, UNIT)
    assert b["activations"][0] == pytest.approx(a["activations"][0], rel=0.02)
    assert states(b) == pytest.approx(states(a))
    ta, tb = predict_throughput(dense, UNIT), predict_throughput(ulysses, UNIT)
    assert (
        tb.train_tokens_per_gpu_per_second[0] < ta.train_tokens_per_gpu_per_second[0]
    )  # all-to-alls, longer attention


def test_tensor_parallelism_splits_states_and_activations():
    dp = workload("full", number_gpus=4, batch_size=4, distributed_backend="DDP", model_max_length=1024)
    tp = workload(
        "full", number_gpus=4, batch_size=2, distributed_backend="DDP", model_max_length=1024, tensor_parallel_degree=2
    )
    a, b = memory_breakdown(dp, UNIT), memory_breakdown(tp, UNIT)
    assert b["weights"][0] == pytest.approx(a["weights"][0] / 2)
    assert b["activations"][0] == pytest.approx(a["activations"][0] / 2, rel=0.02)


@pytest.mark.parametrize("backend", ["DDP", "FSDP", "DeepSpeed"])
def test_optimizer_and_offload_time_follow_the_states_each_rank_holds_under_tensor_parallelism(backend):
    # each rank steps the states it holds: tensor parallelism halves them under DDP; sharded over all 8
    # GPUs (FSDP, ZeRO-2) they are 1/8 with or without it, and so is the step's time
    base = {"number_gpus": 8, "distributed_backend": backend, "model_max_length": 1024, "bf16": True}
    one = workload("full", **base, batch_size=8)
    two = workload("full", **base, batch_size=4, tensor_parallel_degree=2)
    ratio = memory_breakdown(two, UNIT)["optimizer_states"][0] / memory_breakdown(one, UNIT)["optimizer_states"][0]
    assert ratio == pytest.approx(0.5 if backend == "DDP" else 1.0, rel=0.05)
    assert optimizer_seconds(two)[0] / optimizer_seconds(one)[0] == pytest.approx(ratio, rel=0.05)
    if backend != "DDP":
        off = {"fsdp_offload_params": True} if backend == "FSDP" else {"offload_optimizer_device": "cpu"}
        one_off = offload_seconds(workload("full", **base, **off, batch_size=8))[0]
        two_off = offload_seconds(workload("full", **base, **off, batch_size=4, tensor_parallel_degree=2))[0]
        assert two_off == pytest.approx(one_off, rel=0.05)


def test_a_tensor_parallel_group_larger_than_a_node_crosses_the_network():
    """16 GPUs on 2 nodes: tensor parallelism within a node (tp 8) communicates over NVLink; a group of 16 spans
    both nodes and its per-layer collectives run at the network's rate, far slower (was: NVLink for any tp)."""
    from tunebench.plan.throughput import parallel_seconds, tp_spans_nodes

    base = {"number_gpus": 16, "number_nodes": 2, "batch_size": 16, "model_max_length": 1024, "gpu_model": "H100"}
    within, across = (workload("full", **base, tensor_parallel_degree=tp) for tp in (8, 16))
    assert not tp_spans_nodes(within)[0] and tp_spans_nodes(across)[0]
    per_token = [parallel_seconds(w, UNIT, np.array([1024.0]))[0] / ((w.tp - 1) / w.tp) for w in (within, across)]
    nvlink, network = (_link_gbps(within, UNIT, None, within_node=True)[0], _link_gbps(across, UNIT, None)[0])
    assert network < nvlink / 10
    assert per_token[1] / per_token[0] == pytest.approx(nvlink / network, rel=1e-6)
    one_node = workload(
        "full", number_gpus=16, batch_size=16, model_max_length=1024, gpu_model="H100", tensor_parallel_degree=16
    )
    assert not tp_spans_nodes(one_node)[0]  # all 16 in one node: nothing to cross (a note says so, below)
    # 12 GPUs on 2 nodes of 6, tp 4: the group of ranks 4-7 straddles the two nodes
    straddles = workload("full", **{**base, "number_gpus": 12, "batch_size": 12}, tensor_parallel_degree=4)
    assert tp_spans_nodes(straddles)[0]
    halves = workload("full", **{**base, "number_gpus": 12, "batch_size": 12}, tensor_parallel_degree=3)
    assert not tp_spans_nodes(halves)[0]  # 6 = 2 groups of 3: each within a node


def test_the_plan_notes_a_layout_a_node_cannot_hold():
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    job = {"model_name": "smollm2-135m", "model_max_length": 1024, "gpu_model": "H100"}
    spans, crowded, fine = (
        predict(exp, make_entity(exp, {**job, **extra}))
        for extra in (
            {"number_gpus": 16, "number_nodes": 2, "batch_size": 16, "tensor_parallel_degree": 16},
            {"number_gpus": 64, "batch_size": 64},
            {"number_gpus": 16, "number_nodes": 2, "batch_size": 16, "tensor_parallel_degree": 8},
        )
    )
    assert any(
        "tensor_parallel_degree x sequence_parallel_degree 16 spans nodes of 8 GPUs" in n
        for n in spans.metadata["notes"]
    )
    assert any("64 GPUs in one node" in n and "give number_nodes" in n for n in crowded.metadata["notes"])
    assert not any("spans nodes" in n or "in one node" in n for n in fine.metadata["notes"]), fine.metadata["notes"]
    # a node of 16 the user declares (recommend --gpus-per-node 16, a DGX-2) is no layout to warn about
    declared = predict(exp, make_entity(exp, {**job, "number_gpus": 16, "batch_size": 16}), node_gpus=16)
    assert not any("in one node" in n for n in declared.metadata["notes"]), declared.metadata["notes"]


def test_parallel_degrees_must_divide_the_gpus_and_spread_the_batch_over_data_parallel_ranks():
    base = {"model_name": "llama3.1-8b", "number_gpus": 8, "gpu_model": "A100", "distributed_backend": "FSDP"}
    assert check_values({**base, "batch_size": 1, "sequence_parallel_degree": 8}).is_valid
    assert check_values({**base, "batch_size": 2, "tensor_parallel_degree": 4}).is_valid
    bad = check_values({**base, "batch_size": 8, "tensor_parallel_degree": 3})
    assert not bad.is_valid and "not divisible by tensor_parallel_degree" in bad.reasons[0]
    odd = check_values({**base, "batch_size": 3, "tensor_parallel_degree": 4})
    assert "the 2 data-parallel ranks" in odd.reasons[0]
    assert not check_values({**base, "batch_size": 1}).is_valid  # the spec's rule 1 without parallelism


def test_one_gpu_and_several_fsdp_rows_plan_as_they_would_apart():
    """Grouping splits one GPU from several (FSDP's mixed precision changes the trace): planning both kinds in
    one call gives what planning each alone does."""
    from tunebench.plan.predictor import predict_values

    exp = get_experiment("finetune_lora_benchmark-v1.0.0")
    rows = []
    for gpus in (1, 2):
        w = workload("lora", number_gpus=gpus, batch_size=2 * gpus, torch_dtype="float32", bf16=True)
        rows.append(
            (
                exp.method,
                dict(
                    w.settings,
                    model_name="smollm2-135m",
                    number_gpus=gpus,
                    batch_size=2 * gpus,
                    model_max_length=512,
                    gpu_model="A100-80GB",
                    distributed_backend="FSDP",
                ),
            )
        )
    together = predict_values(rows)["gpu_memory_allocated_peak_gib"]
    apart = [predict_values([row])["gpu_memory_allocated_peak_gib"][0] for row in rows]
    assert list(together) == pytest.approx(apart)


def test_the_new_rules_leave_every_catalog_model_and_gpu_at_its_defaults_valid():
    """The heads, ZeRO, device_map and flash-attention rules fire only on settings a user asks for: a default
    entity of every catalog model on every catalog GPU (one GPU and a node of 8) breaks none of them."""
    from tunebench.catalog.gpus import list_gpus
    from tunebench.catalog.models import list_models
    from tunebench.spec.validity import stack_reasons

    for model in list_models():
        for gpu in list_gpus():
            for gpus in (1, 8):
                values = {
                    "model_name": model.name,
                    "number_gpus": gpus,
                    "batch_size": gpus,
                    "gpu_model": gpu.name,
                    "distributed_backend": "FSDP",
                    "deepspeed_zero_stage": 2,
                }
                assert stack_reasons(values) == [], (model.name, gpu.name, gpus)
    # asked for explicitly, each names the setting to change
    t4 = {"model_name": "smollm2-135m", "number_gpus": 1, "batch_size": 1, "gpu_model": "Tesla-T4"}
    assert stack_reasons({**t4, "attn_implementation": "flash_attention_2"})[0].endswith("set attn_implementation sdpa")
    assert stack_reasons({**t4, "flash_attn": True})[0].endswith("set flash_attn 0")
    # multi-query models (one key/value head) copy it to every tensor-parallel rank
    mqa = {"model_name": "granite-20b-v2", "number_gpus": 8, "batch_size": 2, "gpu_model": "A100"}
    assert stack_reasons({**mqa, "tensor_parallel_degree": 4}) == []


def test_recommend_gives_no_figures_for_a_variant_that_breaks_a_rule():
    from tunebench.plan.predictor import PlanOptions
    from tunebench.plan.recommend import Candidate, evaluate

    figures = [f.name for f in dataclasses.fields(Candidate) if f.type == "float"]  # every predicted figure

    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    base = {"model_name": "smollm2-135m", "model_max_length": 512, "gpu_model": "A100", "number_nodes": 1}
    good, bad = evaluate(
        exp, [{**base, "number_gpus": 2, "batch_size": 2}, {**base, "number_gpus": 2, "batch_size": -2}], PlanOptions()
    )
    assert all(np.isfinite(getattr(good, f)) for f in figures)
    assert not bad.fits and "rule 4" in bad.notes[0] and all(np.isnan(getattr(bad, f)) for f in figures)
    assert bad.to_dict()["dataset_tokens_per_second"] is None and bad.cost is None


def test_an_attention_the_model_class_lacks_is_not_planned_when_asked_for():
    """transformers refuses to build bloom with sdpa or flash-attention (it has eager only), as the native engine
    judges it: asked for explicitly, the plan says why instead of planning eager; flash_attn's default on a GPU is
    the spec's and is planned with eager, noted."""
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    bloom = "hf-tiny-model-private/tiny-random-BloomForCausalLM"
    job = dict(model_name=bloom, model_max_length=256, number_gpus=1, gpu_model="A100-80GB", batch_size=1)
    for extra, said in (
        ({"attn_implementation": "sdpa"}, "attn_implementation sdpa"),
        ({"flash_attn": True}, "flash_attn 1"),
    ):
        result = predict(exp, make_entity(exp, {**job, **extra}))
        (reason,) = result.reasons
        assert reason.startswith(f"{said}: bloom's transformers class has no") and "(it has eager)" in reason
        assert not result.metadata["fits"]
    default = predict(exp, make_entity(exp, job))
    assert default.metadata["fits"] and any("bloom has no flash-attention 2" in n for n in default.metadata["notes"])
    eager = predict(exp, make_entity(exp, {**job, "attn_implementation": "eager"}))
    assert eager.metadata["fits"]
