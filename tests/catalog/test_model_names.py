"""Model names people type: short names of catalog models, and any Hugging Face id whose config.json is in
the local Hugging Face cache (a fake cache built here: no download)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from huggingface_hub import constants

from tunebench.catalog import get_model
from tunebench.errors import InputError

# mistralai/Mistral-7B-v0.3's config.json (its 32,768-token vocabulary is what sets it apart from v0.1)
MISTRAL_V03 = {
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32768,
}  # fmt: skip
REPO = "mistralai/Mistral-7B-v0.3"
COMMIT = "0d4b76e1efeb5eb6f6b5e757c79870472e04bd3a"


def fake_hub_cache(root, repo=REPO, config=MISTRAL_V03):
    """A Hugging Face hub cache holding one model's config.json, in huggingface_hub's layout:
    models--ORG--NAME/refs/main (the commit) and snapshots/COMMIT/config.json."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("mistral-7b", "mistral-7b-v0.1"),
        ("Mistral-7B", "mistral-7b-v0.1"),
        ("llama-3.1-8b", "llama3.1-8b"),
        ("llama-3-8b", "llama3-8b"),
        ("llama-2-70b", "llama2-70b"),
        ("meta-llama/Llama-3.1-8B", "llama3.1-8b"),
    ],
)
def test_short_names_and_hub_ids_of_catalog_models(typed, name):
    assert get_model(typed).name == name


def test_a_base_name_suggests_the_catalogs_instruct_model():
    with pytest.raises(InputError) as info:
        get_model("granite-3.1-8b")
    assert info.value.field == "model_name"
    assert "Did you mean 'granite-3.1-8b-instruct'" in str(info.value)


def test_a_hub_id_in_the_local_cache_is_read_from_its_config(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(fake_hub_cache(tmp_path)))
    spec = get_model(REPO)
    assert spec.name == REPO and spec.model_type == "mistral"
    assert (spec.vocab_size, spec.num_key_value_heads, spec.hidden_size) == (32768, 8, 4096)
    assert spec.config_path.startswith(str(tmp_path)) and spec.config_path.endswith("config.json")


def test_a_hub_id_outside_the_cache_is_an_input_error_naming_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(InputError) as info:
        get_model(REPO)
    assert info.value.field == "model_name" and str(tmp_path) in str(info.value)
    assert "HF_HUB_CACHE" in str(info.value)


ENTITY = ["model_max_length=4096", "number_gpus=1", "batch_size=4", "gpu_model=H100", "target_modules=q_proj,v_proj"]


def _plan(hf_home, *more):
    """`tunebench plan` of the LoRA experiment for REPO in a fresh process reading HF_HOME (its hub/ folder)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_CACHE"}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tunebench",
            "plan",
            "finetune_lora_benchmark-v1.0.0",
            f"model_name={REPO}",
            *ENTITY,
            *more,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_plan_a_hub_id_from_the_cache_under_hf_home(tmp_path):
    fake_hub_cache(tmp_path / "hub")
    out = _plan(tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["entity_id"].startswith(f"model_name.{REPO}-") and plan["is_valid"]
    # 7.25 B parameters in bf16: the weights alone are 13.5 GiB
    assert 13.0 < plan["breakdown"]["weights"] < 14.0


def test_plan_an_unknown_hub_id_exits_2_with_one_line(tmp_path):
    out = _plan(tmp_path)  # an empty cache
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model_name: unknown model"), out.stderr
