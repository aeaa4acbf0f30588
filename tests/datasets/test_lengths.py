"""model_max_length beyond the model's limit: sequences are truncated at min(max_seq_length, the
tokenizer's model_max_length) (spec 004 note 3), stand-in tokenizers included; beyond 64 bits it is
an input error (the store's INTEGER columns hold no more)."""

from __future__ import annotations

import pytest

from tunebench.catalog import get_model
from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.training import model as model_mod
from tunebench.training import tokenizer as tok_mod

TEXTS = ["Write a response. ### Response: " + "word " * 400] * 8


@pytest.mark.parametrize("context", [64, 8192])
def test_a_stand_in_tokenizer_declares_the_models_context(tmp_path, context):
    resolved = tok_mod.resolve_tokenizer(None, None, TEXTS, 512, tmp_path / "tok", context_length=context)
    assert resolved.kind == "in-process-bpe"
    assert resolved.tokenizer.model_max_length == context
    assert tok_mod.max_length(resolved.tokenizer, 2**63 - 1) == context  # a huge model_max_length is capped
    assert tok_mod.max_length(resolved.tokenizer, 32) == 32  # a smaller one is kept


def test_without_a_known_context_nothing_is_declared(tmp_path):
    resolved = tok_mod.resolve_tokenizer(None, None, TEXTS, 512, tmp_path / "tok")
    assert tok_mod.max_length(resolved.tokenizer, 10**12) == 10**12


def test_context_length_of_random_weights_models():
    spec = get_model("smollm2-135m")
    assert model_mod.context_length(spec) == spec.max_position_embeddings == 8192
    assert model_mod.context_length(spec, tiny=True) == 4096  # shrink() caps a tiny model's positions
    assert model_mod.context_length(None) is None


@pytest.mark.parametrize("value", [2**63, 10**32, -(2**63) - 1])
def test_integers_beyond_64_bits_are_input_errors(value):
    exp = get_experiment("finetune_lora_benchmark-v1.0.0")
    values = {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 0, "batch_size": 1}
    with pytest.raises(InputError, match="64-bit"):
        make_entity(exp, {**values, "batch_size": value})
    entity = make_entity(exp, {**values, "model_max_length": 2**63 - 1})  # the largest is a valid request
    assert entity.values["model_max_length"] == 2**63 - 1
