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
    lora = peft.get_peft_model(
        real_model(cfg), peft.LoraConfig(r=4, target_modules=targets if isinstance(targets, str) else list(targets))
    )
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    per_rank, unmatched = structure_of(get_model(str(path))).lora_params_per_rank(targets)
    assert 4 * per_rank == trainable
    assert unmatched == ()


def test_unmatched_lora_targets_are_reported(tmp_path):
    path, _ = write_config(tmp_path, "llama")
    per_rank, unmatched = structure_of(get_model(str(path))).lora_params_per_rank(("q_proj", "c_attn"))
    assert per_rank == 2 * (64 + 64) and unmatched == ("c_attn",)


@pytest.mark.slow
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
    qwen = {
        "model_type": "qwen",
        "architectures": ["QWenLMHeadModel"],
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "intermediate_size": 22016,
        "vocab_size": 151936,
        "kv_channels": 128,
        "seq_length": 8192,
        "no_bias": True,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "qwen" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(qwen))
    s = structure_of(get_model(str(path)))
    assert s.builder == "generic"
    assert any("remote code" in a for a in s.assumptions)
    assert any("intermediate_size / 2" in a for a in s.assumptions)
    h, i, L, V = 4096, 22016 // 2, 32, 151936
    # attention with c_attn's bias (3h), gated MLP, 2 norms per layer; embedding, output layer, final norm
    by_hand = L * (4 * h * h + 3 * h + 3 * h * i + 2 * h) + 2 * V * h + h
    assert s.total_params == by_hand  # 7.72 B, as published for Qwen-7B


def test_config_without_the_usual_fields_is_an_input_error(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"model_type": "somethingnew", "width": 10}))
    with pytest.raises(InputError, match="hidden_size missing"):
        structure_of(get_model(str(path)))


def test_encoder_decoder_config_is_an_input_error(tmp_path):
    path = tmp_path / "t5.json"  # T5 has no causal-LM class in transformers
    path.write_text(
        json.dumps({"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4, "d_ff": 128, "vocab_size": 512})
    )
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


# Remote-code families: public config.json values (Hugging Face model repositories) and the parameter count
# each model card publishes. The planner builds a llama-like stand-in under the family's own module names
# (plan.config.REMOTE_LAYOUTS, from each repository's modelling code).
REMOTE = {
    # Qwen/Qwen-7B config.json; model card: 7.72 B (modeling_qwen.py: c_attn with bias, MLP of intermediate_size / 2)
    "qwen-7b": ({"model_type": "qwen", "architectures": ["QWenLMHeadModel"], "hidden_size": 4096,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 22016, "vocab_size": 151936,
                 "kv_channels": 128, "seq_length": 8192, "max_position_embeddings": 32768, "no_bias": True,
                 "layer_norm_epsilon": 1e-6, "tie_word_embeddings": False}, 7.72e9, "c_attn", 4096 + 3 * 4096),
    # THUDM/chatglm3-6b config.json; 6.24 B (modeling_chatglm.py: 28 layers, query_key_value 4096 -> 4608,
    # dense_h_to_4h 4096 -> 2 x 13696, embedding and output layer of padded_vocab_size)
    "chatglm3-6b": ({"model_type": "chatglm", "architectures": ["ChatGLMModel"], "add_bias_linear": False,
                     "add_qkv_bias": True, "ffn_hidden_size": 13696, "hidden_size": 4096, "kv_channels": 128,
                     "layernorm_epsilon": 1e-05, "multi_query_attention": True, "multi_query_group_num": 2,
                     "num_attention_heads": 32, "num_layers": 28, "padded_vocab_size": 65024, "post_layer_norm": True,
                     "rmsnorm": True, "seq_length": 8192, "tie_word_embeddings": False},
                    6.24e9, "query_key_value", 4096 + 4608),
    # baichuan-inc/Baichuan2-7B-Base config.json; 7.51 B (modeling_baichuan.py: W_pack 4096 -> 3 x 4096, rotary)
    "baichuan2-7b": ({"model_type": "baichuan", "architectures": ["BaichuanForCausalLM"], "hidden_size": 4096,
                      "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                      "vocab_size": 125696, "max_position_embeddings": 4096, "model_max_length": 4096,
                      "rms_norm_eps": 1e-6, "tie_word_embeddings": False}, 7.51e9, "W_pack", 4096 + 3 * 4096),
    # baichuan-inc/Baichuan2-13B-Base config.json (no max_position_embeddings: ALiBi); 13.9 B
    "baichuan2-13b": ({"model_type": "baichuan", "architectures": ["BaichuanForCausalLM"], "hidden_size": 5120,
                       "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 40,
                       "vocab_size": 125696, "model_max_length": 4096, "rms_norm_eps": 1e-6,
                       "tie_word_embeddings": False}, 13.9e9, "W_pack", 5120 + 3 * 5120),
    # internlm/internlm2-7b config.json; 7.74 B (modeling_internlm2.py: wqkv 4096 -> (32 + 2 x 8) x 128)
    "internlm2-7b": ({"model_type": "internlm2", "architectures": ["InternLM2ForCausalLM"], "hidden_size": 4096,
                      "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "vocab_size": 92544, "max_position_embeddings": 32768, "bias": False,
                      "rope_theta": 1000000, "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
                     7.74e9, "wqkv", 4096 + 6144),
    # 01-ai/Yi-6B config.json (first release: model_type "Yi", llama module names); 6.06 B
    "yi-6b": ({"model_type": "Yi", "architectures": ["YiForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 64000,
               "max_position_embeddings": 4096, "rope_theta": 5000000.0, "rms_norm_eps": 1e-5,
               "tie_word_embeddings": False}, 6.06e9, "q_proj", 4096 + 4096),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REMOTE))
def test_remote_code_family_is_read_as_its_modelling_code_reads_it(tmp_path, name):
    cfg, published, target, per_rank = REMOTE[name]
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    s = structure_of(get_model(str(path)))
    assert s.builder == "generic"
    assert s.total_params == pytest.approx(published, rel=0.01)
    layers = s.layers
    total, unmatched = s.lora_params_per_rank((target,))
    assert unmatched == () and total == per_rank * layers  # one module per layer, fused as the family fuses it
    assert s.lora_params_per_rank(("q_proj_missing",))[1] == ("q_proj_missing",)


def test_remote_code_module_names_and_the_trace_stand_in(tmp_path):
    path = tmp_path / "chatglm3" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(REMOTE["chatglm3-6b"][0]))
    s = structure_of(get_model(str(path)))
    leaves = {lin.leaf for lin in s.linears}
    assert leaves == {"word_embeddings", "output_layer", "query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
    assert "q_proj" not in leaves  # llama names of the stand-in match nothing, as on the real model
    assert s.lora_params_per_rank(("q_proj", "v_proj"))[1] == ("q_proj", "v_proj")
    # the fused MLP: dense_h_to_4h is 4096 -> 2 x ffn_hidden_size
    mlp = next(lin for lin in s.linears if lin.leaf == "dense_h_to_4h")
    assert (mlp.d_in, mlp.d_out, mlp.count) == (4096, 2 * 13696, 28)
    # peft in the trace adapts the stand-in's modules that the family's target names hold
    assert s.stand_in_targets(("query_key_value",)) == ("q_proj", "k_proj", "v_proj")
    assert s.stand_in_targets(r".*\.dense_h_to_4h") == ("gate_proj", "up_proj")
    assert s.stand_in_targets("all-linear") == "all-linear"


def test_chatglm_without_multi_query_attention_has_a_key_value_head_per_head(tmp_path):
    # modeling_chatglm.py SelfAttention: qkv_hidden_size = 3 x projection_size unless multi_query_attention;
    # a config may carry vocab_size beside padded_vocab_size: the embedding has padded_vocab_size rows
    cfg = {**REMOTE["chatglm3-6b"][0], "multi_query_attention": False, "vocab_size": 64794}
    path = tmp_path / "glm" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    spec = get_model(str(path))
    assert spec.num_key_value_heads == 32 and spec.vocab_size == 65024
    s = structure_of(spec)
    qkv = next(lin for lin in s.linears if lin.leaf == "query_key_value")
    assert qkv.d_out == 3 * 4096 and s.vocab == 65024 and s.kv_heads == 32
