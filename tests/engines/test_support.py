"""What the native engine runs (tunebench.engines.support): an attn_implementation the model's transformers class
lacks is judged before anything runs, the ones it has train for real; gradient_checkpointing_mode is judged only
where checkpointing is on; fms-hf-tuning's 16-bit loss is fast_loss, never tunebench's chunked loss."""

from __future__ import annotations

import json

import pytest
from actuators.test_measure import PARAMS, entity_of, opts
from tiny_models import TINY_LLAMA

import tunebench.actuators.measure as measure_module
from tunebench.actuators.measure import measure
from tunebench.engines import FMS, NATIVE
from tunebench.engines.fms_worker import loss_facts
from tunebench.engines.support import unsupported
from tunebench.spec.experiments import get_experiment
from tunebench.worker.args import parse_args

LORA = "finetune_lora_benchmark-v1.0.0"
BLOOM = "hf-tiny-model-private/tiny-random-BloomForCausalLM"  # transformers 5: no sdpa, no flash-attention


@pytest.mark.parametrize(
    "settings, reason",
    [
        (
            {"attn_implementation": "sdpa"},
            "attn_implementation sdpa: bloom's transformers class BloomForCausalLM has no sdpa attention",
        ),
        (  # flash_attn's default on a GPU entity asks for flash-attention 2
            {"number_gpus": 1, "gpu_model": "NVIDIA-A100-SXM4-80GB"},
            "flash_attn (on with GPUs): bloom's transformers class BloomForCausalLM has no flash_attention_2",
        ),
    ],
)
def test_an_attention_the_models_class_lacks_is_judged_before_anything_runs(tmp_path, monkeypatch, settings, reason):
    """Was: the worker loaded the data and failed in from_config (ValueError), a failed measurement that an
    exploration retries; a GPU entity of such a model failed on every GPU (flash_attn's default)."""

    def no_process(*args, **kwargs):
        raise AssertionError("a judged entity started a process")

    monkeypatch.setattr(measure_module, "run_logged", no_process)
    exp = get_experiment(LORA, PARAMS)
    result = measure(exp, entity_of(exp, BLOOM, target_modules="query_key_value", **settings), opts(tmp_path))
    assert result.status == "invalid" and result.properties == {"is_valid": 0}, (result.error, result.reasons)
    assert any(reason in r for r in result.reasons), result.reasons
    assert not (tmp_path / "run").exists()


def test_the_rule_judges_only_what_the_class_lacks():
    base = {"model_name": BLOOM, "number_gpus": 0, "distributed_backend": "FSDP", "deepspeed_zero_stage": 2}
    assert unsupported({**base, "attn_implementation": "eager"}, NATIVE) == []
    assert unsupported({**base, "number_gpus": 1, "flash_attn": False}, NATIVE) == []  # transformers' default
    llama = {**base, "model_name": "smollm2-135m"}
    assert unsupported({**llama, "attn_implementation": "sdpa"}, NATIVE) == []
    assert unsupported({**llama, "attn_implementation": "eager"}, NATIVE) == []
    # fms-hf-tuning runs its own transformers: its attention rule (eager and sdpa judged) is its own
    assert not any("BloomForCausalLM" in r for r in unsupported({**base, "attn_implementation": "sdpa"}, FMS))


@pytest.mark.slow
def test_the_attention_a_models_class_has_trains_for_real(tmp_path):
    exp = get_experiment(LORA, {**PARAMS, "max_steps": 1})
    result = measure(
        exp, entity_of(exp, BLOOM, target_modules="query_key_value", attn_implementation="eager"), opts(tmp_path)
    )
    assert result.status == "valid", (result.error, result.reasons, result.log_tail)
    assert result.metadata["attn_implementation"] == "eager" and result.metadata["model_type"] == "bloom"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


@pytest.mark.slow
def test_checkpointing_mode_without_checkpointing_runs_as_the_planner_plans_it(tmp_path, tiny):
    """gradient_checkpointing_mode is the granularity of gradient_checkpointing: with it off nothing is checkpointed,
    which the planner plans (selective_checkpointing needs checkpointing) and the worker runs. Was: selective judged
    "planning only" while the planner planned the entity."""
    exp = get_experiment(LORA, {**PARAMS, "max_steps": 1})
    off = entity_of(exp, tiny, gradient_checkpointing=False, gradient_checkpointing_mode="selective")
    result = measure(exp, off, opts(tmp_path / "off"))
    assert result.status == "valid", (result.error, result.reasons, result.log_tail)
    assert result.metadata["gradient_checkpointing_on"] is False
    on = entity_of(exp, tiny, gradient_checkpointing_mode="selective")
    (reason,) = measure(exp, on, opts(tmp_path / "on")).reasons
    assert reason.startswith("gradient_checkpointing_mode selective (op-level) is planning only")
    assert not (tmp_path / "on" / "run").exists()


def test_fms_hf_tuning_never_measures_a_run_labelled_chunked(tmp_path, tiny, monkeypatch):
    """fms-hf-tuning's 16-bit loss is foak's fast cross-entropy, which the planner budgets apart from tunebench's
    chunked loss (plan.workload: "fast_loss" for fast_kernels with loss_implementation None, the traced chunked loss
    for chunked). Was: chunked with fast_loss was measured (foak's loss) while the plan was the chunked loss's, and
    its result said "chunked" as the one with loss_implementation None did."""

    def no_process(*args, **kwargs):
        raise AssertionError("a judged entity started a process")

    monkeypatch.setattr(measure_module, "run_logged", no_process)
    monkeypatch.setattr(measure_module, "runtime", no_process)  # no engine environment either
    exp = get_experiment(LORA, PARAMS)
    gpu = {"number_gpus": 1, "gpu_model": "NVIDIA-A100-SXM4-80GB", "fast_kernels": [True, False, False]}
    result = measure(exp, entity_of(exp, tiny, loss_implementation="chunked", **gpu), opts(tmp_path), engine=FMS)
    assert result.status == "invalid", (result.error, result.reasons)
    assert any("loss_implementation chunked is tunebench's chunked loss" in r for r in result.reasons), result.reasons
    assert not (tmp_path / "run").exists()


def test_the_fms_result_names_its_loss_as_the_planner_does():
    base = ["--training_data_path", "d.jsonl", "--output_dir", "o", "--result_path", "r"]
    fast, _ = parse_args([*base, "--fast_kernels", "True", "False", "False"])
    assert loss_facts(fast) == {"implementation": "fast_loss", "function": "fms-acceleration-foak fast cross-entropy"}
    assert loss_facts(parse_args(base)[0])["implementation"] == "upcast"
