"""The planner's model structure against transformers' and peft's own counts, for many model types."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tunebench.catalog import get_model, list_models
from tunebench.errors import InputError
from tunebench.plan.structure import structure_of

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256}  # fmt: skip
# Tiny configs of 26 model types transformers builds (their own field names where they differ).
MODEL_TYPES = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {"head_dim": 16}, "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16}, "gemma3_text": {"head_dim": 16}, "phi": {}, "phi3": {"pad_token_id": 0},
    "granite": {"embedding_multiplier": 12.0, "logits_scaling": 8.0}, "starcoder2": {}, "olmo2": {},
    "stablelm": {}, "cohere": {}, "gpt_neox": {},
    "falcon": {"num_kv_heads": 2, "new_decoder_architecture": True},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "granitemoe": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 64},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"], "num_local_experts": 4, "num_experts_per_tok": 2,
                         "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16},
    "deepseek_v3": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 1, "topk_group": 1},
    "gpt_bigcode": {"n_embd": 64, "n_inner": 128, "n_layer": 2, "n_head": 4, "n_positions": 256},
    "bloom": {"n_layer": 2, "n_head": 4},
    "mpt": {"d_model": 64, "n_heads": 4, "n_layers": 2, "expansion_ratio": 2, "max_seq_len": 256},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256},
    "opt": {"ffn_dim": 128, "word_embed_proj_dim": 64},
}  # fmt: skip


def write_config(tmp_path, model_type: str, extra: dict | None = None):
    folder = tmp_path / model_type
    folder.mkdir(exist_ok=True)
    cfg = {"model_type": model_type, **SMALL, **MODEL_TYPES.get(model_type, {}), **(extra or {})}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json", cfg


def real_model(cfg: dict):
    """The model transformers builds for real (random weights on the CPU), independent of the planner."""
    cfg = dict(cfg)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def unique_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def test_at_least_fifteen_model_types_are_covered():
    assert len(MODEL_TYPES) >= 15


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_parameter_counts_equal_transformers(tmp_path, model_type):
    path, cfg = write_config(tmp_path, model_type)
    model = real_model(cfg)
    s = structure_of(get_model(str(path)))
    assert s.total_params == unique_params(model)
    assert s.builder == "transformers" and s.assumptions == () or s.assumptions[0].startswith("ignored")
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    assert s.tied == tied
    assert s.lm_head_params == (head.weight.numel() if head is not None else 0)
    # the decoder layers and everything around them add up to the model
    assert s.layer_params + s.root_params == s.total_params
    assert s.layers == 2 and s.largest_layer_params <= s.layer_params


@pytest.mark.parametrize(
    ("model_type", "targets"),
    [
        ("llama", ("q_proj", "v_proj")),
        ("llama", "all-linear"),
        ("llama", ("q_proj", "lm_head", "embed_tokens")),
        ("llama", r".*\.layers\.1\.mlp\.(gate|up)_proj"),
        ("gpt_bigcode", ("c_attn", "c_proj")),
        ("falcon", ("query_key_value", "dense_4h_to_h")),
        ("phi", ("q_proj", "dense", "fc1", "fc2")),
        ("gpt_neox", "all-linear"),
        ("granitemoehybrid", ("q_proj", "in_proj", "out_proj")),
    ],
)
def test_lora_trainable_parameters_equal_peft(tmp_path, model_type, targets):
    import peft

    path, cfg = write_config(tmp_path, model_type)
    lora = peft.get_peft_model(real_model(cfg), peft.LoraConfig(r=4, target_modules=targets if isinstance(targets, str)
                                                                else list(targets)))  # fmt: skip
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    per_rank, unmatched = structure_of(get_model(str(path))).lora_params_per_rank(targets)
    assert 4 * per_rank == trainable
    assert unmatched == ()


def test_unmatched_lora_targets_are_reported(tmp_path):
    path, _ = write_config(tmp_path, "llama")
    per_rank, unmatched = structure_of(get_model(str(path))).lora_params_per_rank(("q_proj", "c_attn"))
    assert per_rank == 2 * (64 + 64) and unmatched == ("c_attn",)


def test_every_catalog_model_counts_its_parameters_exactly():
    checked = 0
    for spec in list_models():
        if spec.total_params is None:
            continue
        s = structure_of(spec)
        assert s.total_params == spec.total_params, spec.name
        if spec.active_params:
            assert s.active_params == pytest.approx(spec.active_params, rel=2e-3), spec.name
        checked += 1
    assert checked >= 40


def test_catalog_model_without_dimensions_is_an_input_error():
    with pytest.raises(InputError) as err:
        structure_of(get_model("granite-8b-japanese"))
    assert err.value.field == "model_name"


def test_remote_code_config_is_read_generically_with_its_assumptions(tmp_path):
    # first-generation Qwen (Qwen/Qwen-7B config.json): model_type "qwen" needs trust_remote_code
    qwen = {"model_type": "qwen", "architectures": ["QWenLMHeadModel"], "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "intermediate_size": 22016, "vocab_size": 151936, "kv_channels": 128,
            "seq_length": 8192, "no_bias": True, "tie_word_embeddings": False}  # fmt: skip
    path = tmp_path / "qwen" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(qwen))
    s = structure_of(get_model(str(path)))
    assert s.builder == "generic"
    assert any("remote code" in a for a in s.assumptions)
    assert any("intermediate_size / 2" in a for a in s.assumptions)
    h, i, L, V = 4096, 22016 // 2, 32, 151936
    by_hand = L * (4 * h * h + 3 * h * i + 2 * h) + 2 * V * h + h  # attention, gated MLP, 2 norms; embed, head, norm
    assert s.total_params == by_hand  # 7.72 B; the published Qwen-7B has 7.72 B (its q/k/v biases aside)


def test_config_without_the_usual_fields_is_an_input_error(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"model_type": "somethingnew", "width": 10}))
    with pytest.raises(InputError, match="lacks hidden_size"):
        structure_of(get_model(str(path)))


def test_encoder_decoder_config_is_an_input_error(tmp_path):
    path = tmp_path / "t5.json"  # T5 has no causal-LM class in transformers
    path.write_text(json.dumps({"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4, "d_ff": 128,
                                "vocab_size": 512}))  # fmt: skip
    with pytest.raises(InputError) as err:
        structure_of(get_model(str(path)))
    assert err.value.field == "model_name" and "causal" in str(err.value)


def test_structure_is_cached_on_disk_and_reread_without_building(tmp_path, monkeypatch):
    from tunebench.plan import meta_model
    from tunebench.plan import structure as module

    path, _ = write_config(tmp_path, "mistral")
    spec = get_model(str(path))
    first = structure_of(spec)
    module._structure.cache_clear()
    monkeypatch.setattr(meta_model, "build_structure", lambda config: pytest.fail("rebuilt instead of read"))
    again = structure_of(spec)
    assert again.to_dict() == first.to_dict()
