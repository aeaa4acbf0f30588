"""Model catalog: look-ups, aliases, and models given as a config.json."""

from __future__ import annotations

import json

import pytest

from tunebench.catalog import get_model, list_models
from tunebench.errors import InputError


def test_catalog_holds_every_spec_model_with_sources():
    names = {m.name for m in list_models()}
    assert {"smollm2-135m", "llama3.1-405b", "granite-4.0-h-tiny", "llava-v1.6-mistral-7b"} <= names
    assert len(names) >= 41
    for m in list_models():
        assert m.source, f"{m.name} has no source"
        assert m.confidence in ("verified", "inferred", "missing")


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("smollm2-135m", "smollm2-135m"),
        ("SmolLM2-135M", "smollm2-135m"),
        ("HuggingFaceTB/SmolLM2-135M", "smollm2-135m"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-instruct-v0.1"),
        ("GRANITE-4.0-H-TINY", "granite-4.0-h-tiny"),
        ("ibm-granite/granite-4.0-h-tiny", "granite-4.0-h-tiny"),
    ],
)
def test_lookup_by_name_alias_and_hf_id(alias, name):
    assert get_model(alias).name == name


def test_catalog_facts():
    smol = get_model("smollm2-135m")
    assert (smol.hidden_size, smol.num_hidden_layers, smol.num_key_value_heads) == (576, 30, 3)
    assert smol.total_params == 134_515_008 and smol.tie_word_embeddings
    mixtral = get_model("mixtral-8x7b-instruct-v0.1")
    assert (mixtral.num_local_experts, mixtral.num_experts_per_tok) == (8, 2) and mixtral.is_moe
    vision = get_model("granite-vision-3.2-2b")
    assert vision.is_vision and vision.wrap_classes == "GraniteDecoderLayer,SiglipEncoderLayer"


def test_unknown_model_is_an_input_error_with_suggestion():
    with pytest.raises(InputError) as err:
        get_model("llama3.1-8bb")
    assert str(err.value).startswith("model_name: unknown model")
    assert "llama3.1-8b" in str(err.value)


def test_unknown_hugging_face_id_says_how_to_cache_its_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: the id is not there
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(InputError) as err:
        get_model("Qwen/Qwen2.5-7B")
    message = str(err.value)
    assert message.startswith("model_name: unknown model 'Qwen/Qwen2.5-7B'") and "\n" not in message
    assert "`hf download Qwen/Qwen2.5-7B config.json`" in message
    with pytest.raises(InputError) as err:
        get_model("qwen-7b-chatt")  # no org/name: no download hint
    assert "hf download" not in str(err.value)


# Minimal config.json bodies per model_type, with the key names each family really uses.
CONFIGS = {
    "llama": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256},
    "mistral": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 512, "sliding_window": 64},
    "mixtral": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 512, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True},
    "gemma": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 512},
    "phi3": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 512},
    "granite": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 512},
    "granitemoe": {"hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 512, "num_local_experts": 4, "num_experts_per_tok": 2},
    "granitemoehybrid": {"hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                         "num_local_experts": 4, "num_experts_per_tok": 2,
                         "layer_types": ["mamba", "attention", "mamba", "mamba"]},
    "gpt_bigcode": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "vocab_size": 512,
                    "multi_query": True},
    "bloom": {"hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512},
    "llava_next": {"text_config": {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
                                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                   "vocab_size": 512},
                   "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32}},
}  # fmt: skip
EXPECTED = {  # (hidden, layers, heads, kv, intermediate, tied, wrap)
    "llama": (64, 2, 4, 2, 128, False, "LlamaDecoderLayer"),
    "mistral": (64, 2, 4, 2, 128, False, "MistralDecoderLayer"),
    "mixtral": (64, 2, 4, 2, 128, False, "MixtralDecoderLayer"),
    "qwen2": (64, 2, 4, 2, 128, True, "Qwen2DecoderLayer"),
    "gemma": (64, 2, 4, 1, 128, True, "GemmaDecoderLayer"),
    "phi3": (64, 2, 4, 4, 128, False, "Phi3DecoderLayer"),
    "granite": (64, 2, 4, 2, 128, False, "GraniteDecoderLayer"),
    "granitemoe": (64, 2, 4, 2, 32, False, "GraniteMoeDecoderLayer"),
    "granitemoehybrid": (64, 4, 4, 2, 32, False, "GraniteMoeHybridDecoderLayer"),
    "gpt_bigcode": (64, 2, 4, 1, 256, True, "GPTBigCodeBlock"),
    "bloom": (64, 2, 4, 4, 256, True, "BloomBlock"),
    "llava_next": (64, 2, 4, 2, 128, False, "MistralDecoderLayer,CLIPEncoderLayer"),
}


def test_every_case_has_its_expected_reading():
    assert set(CONFIGS) == set(EXPECTED)


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        # MPT (transformers' own names): d_model, n_heads, n_layers, expansion_ratio, attn_config.kv_n_heads
        (
            {
                "model_type": "mpt",
                "d_model": 64,
                "n_heads": 4,
                "n_layers": 2,
                "expansion_ratio": 4,
                "vocab_size": 512,
                "max_seq_len": 2048,
                "attn_config": {"kv_n_heads": 2},
            },
            (64, 2, 4, 2, 256, 2048),
        ),
        # first-generation Qwen (remote code): kv_channels is the head dimension, seq_length the context
        (
            {
                "model_type": "qwen",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 344,
                "vocab_size": 512,
                "kv_channels": 16,
                "seq_length": 8192,
            },
            (64, 2, 4, 4, 344, 8192),
        ),
        # ChatGLM (remote code): num_layers, multi_query_group_num (with multi_query_attention, whose default in
        # THUDM configuration_chatglm.py is False), padded_vocab_size, ffn_hidden_size
        (
            {
                "model_type": "chatglm",
                "hidden_size": 64,
                "num_layers": 2,
                "num_attention_heads": 4,
                "multi_query_attention": True,
                "multi_query_group_num": 2,
                "ffn_hidden_size": 128,
                "padded_vocab_size": 512,
            },
            (64, 2, 4, 2, 128, None),
        ),
        (
            {
                "model_type": "chatglm",
                "hidden_size": 64,
                "num_layers": 2,
                "num_attention_heads": 4,
                "multi_query_group_num": 2,
                "ffn_hidden_size": 128,
                "padded_vocab_size": 512,
            },
            (64, 2, 4, 4, 128, None),
        ),
    ],
)
def test_any_model_type_is_read_by_its_usual_field_names(tmp_path, cfg, expected):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = get_model(str(path))
    got = (
        spec.hidden_size,
        spec.num_hidden_layers,
        spec.num_attention_heads,
        spec.num_key_value_heads,
        spec.intermediate_size,
        spec.max_position_embeddings,
    )
    assert got == expected and spec.model_type == cfg["model_type"] and spec.vocab_size == 512


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_config_json_models(tmp_path, model_type):
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, **CONFIGS[model_type]}))
    for given in (str(folder / "config.json"), str(folder)):  # the file or the folder holding it
        spec = get_model(given)
        got = (
            spec.hidden_size,
            spec.num_hidden_layers,
            spec.num_attention_heads,
            spec.num_key_value_heads,
            spec.intermediate_size,
            spec.tie_word_embeddings,
            spec.wrap_classes,
        )
        assert got == EXPECTED[model_type]
        assert spec.name == str((folder / "config.json").resolve()) == spec.config_path
        assert spec.vocab_size == 512


def test_config_json_errors(tmp_path):
    with pytest.raises(InputError, match="^model_name: no config.json"):
        get_model(str(tmp_path / "missing" / "config.json"))
    untyped = tmp_path / "untyped.json"
    untyped.write_text('{"hidden_size": 64}')
    with pytest.raises(InputError, match="has no model_type"):
        get_model(str(untyped))
    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        get_model(str(array))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(InputError, match="cannot read"):
        get_model(str(broken))
