"""Vision fine-tuning on the CPU: tiny random LlavaNext models built from the catalog's two VLMs, the
offline processor (image tokens expanded per tile), a real 2-step LoRA and full run of the worker on a
generated vision data set, and the image-token count checked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tunebench.catalog import get_model
from tunebench.datasets.generate import generate_dataset
from tunebench.spec.measured import BENCHMARK_MEASURED
from tunebench.training import vision
from tunebench.training.tokenizer import train_bpe_tokenizer
from tunebench.worker.run import main

pytestmark = pytest.mark.slow
DATASET = "vision-384x768-64plus-entries-4"  # width 384, height 768


def _image_tokens_by_hand(height: int, width: int, size: int, patch: int, pinpoints) -> int:
    """LlavaNext feature count from first principles: best grid (most effective pixels, then least waste),
    base tile, the grid's patches unpadded to the image's aspect ratio, one newline per feature row."""

    def score(pin):
        h, w = pin
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        return (effective, -(w * h - effective))

    grid_h, grid_w = max(pinpoints, key=score)
    per_side = size // patch
    rows, cols = per_side * grid_h // size, per_side * grid_w // size
    if width / height > cols / rows:
        rows -= 2 * ((rows - round(height * cols / width)) // 2)
    else:
        cols -= 2 * ((cols - round(width * rows / height)) // 2)
    return per_side * per_side + rows * cols + rows  # CLIP's CLS is dropped by the "default" strategy


@pytest.mark.parametrize("model", ["granite-vision-3.2-2b", "llava-v1.6-mistral-7b"])
def test_image_tokens_per_sample_match_a_hand_count(model):
    spec = get_model(model)
    tok = train_bpe_tokenizer(["the market rose after earnings"] * 32, 512)
    processor = vision.build_processor(spec, tok)
    from tunebench.datasets.vision import jpeg

    chat = [
        {"role": "user", "content": [{"type": "text", "text": "what is shown"}, {"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "two circles"}]},
    ]
    ex = vision.tokenize_row(processor, chat, vision.process_image(processor, jpeg(384, 768)), 8192)
    # the same ids as the processor's own expansion of the whole prompt
    import io

    from PIL import Image

    direct = processor(images=[Image.open(io.BytesIO(jpeg(384, 768)))], text=[vision.render(chat)[0]])
    assert ex.input_ids[: len(direct["input_ids"][0])] == list(direct["input_ids"][0])
    vc = spec.extra["vision_config"]
    expected = _image_tokens_by_hand(768, 384, vc["image_size"], vc["patch_size"], vision.grid_pinpoints(spec))
    assert ex.input_ids.count(tok.convert_tokens_to_ids(vision.IMAGE_TOKEN)) == expected
    # granite-vision: 384 px tiles of 27x27 SigLIP patches, grid 768x384 -> 729 + 54*27 + 54 = 2241
    assert model != "granite-vision-3.2-2b" or expected == 729 + 54 * 27 + 54 == 2241
    # labels on the response only: the prompt (with every image token) is masked
    first_label = next(i for i, v in enumerate(ex.labels) if v != -100)
    assert first_label > max(
        i for i, t in enumerate(ex.input_ids) if t == tok.convert_tokens_to_ids(vision.IMAGE_TOKEN)
    )
    assert ex.labels[-1] == tok.eos_token_id and ex.pixel_values.shape[0] == 3  # base tile + 2 grid tiles


@pytest.mark.parametrize("model,method", [("granite-vision-3.2-2b", "lora"), ("llava-v1.6-mistral-7b", "none")])
def test_vision_training_run_returns_every_property(tmp_path, model, method):
    rc, r, agg = _run(tmp_path, model=model, method=method)
    assert rc == 0 and r["status"] == "ok" and agg["status"] == "ok", r.get("reason")
    props = agg["properties"]
    missing = [p for p in BENCHMARK_MEASURED[:-1] if p not in props]
    assert not missing, missing
    meta = r["metadata"]
    assert meta["model_class"] == "LlavaNextForConditionalGeneration" and meta["weights"] == "random"
    n_img = r["data"]["image_tokens_per_record"][0]
    assert n_img > 1000  # the image tokens are in every record
    steps = r["steps"]
    tokens = steps["global"]["dataset_tokens"]
    assert len(tokens) == 2 and all(t > n_img for t in tokens)  # 1 record a step: its image tokens counted
    assert math.isclose(
        props["dataset_tokens_per_second"], sum(tokens[steps["warmup"] :]) / r["train_runtime"], rel_tol=1e-6
    )
    # the spec's note 3 counts the entry, not the EOS appended for training (no record is cut here)
    assert [n - t for n, t in zip(steps["global"]["non_pad_tokens"], tokens)] == [1, 1]
    if method == "lora":
        assert "language_model" in meta["peft"]["target_modules"]
        assert meta["parameters"]["trainable"] < meta["parameters"]["total"] / 2
    else:
        assert meta["parameters"]["trainable"] == meta["parameters"]["total"]


def test_lora_adapts_only_the_language_models_q_and_v():
    from tunebench.training import adapters

    spec = get_model("granite-vision-3.2-2b")
    tok = train_bpe_tokenizer(["the market rose after earnings"] * 32, 512)
    vision.build_processor(spec, tok)
    model = vision.build_model(
        spec,
        tiny=True,
        tokenizer_vocab=len(tok),
        special_ids={},
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        dtype=torch.float32,
        device=torch.device("cpu"),
        attn_implementation=None,
    )
    assert any("vision_tower" in n and n.endswith("q_proj") for n, _ in model.named_modules())  # SigLIP has q_proj too
    settings = adapters.PeftSettings(
        peft_method="lora",
        target_modules=[vision.language_model_targets(["q_proj", "v_proj"])],
        r=4,
        lora_alpha=16,
        lora_dropout=0.05,
        num_virtual_tokens=8,
        prompt_tuning_init="RANDOM",
        prompt_tuning_init_text="",
        gradient_checkpointing=False,
        gradient_checkpointing_kwargs={},
    )
    peft_model, _ = adapters.apply_peft(settings, model, "")
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in peft_model.named_modules() if n.endswith("lora_A")}
    assert adapted and all("language_model" in n and n.endswith(("q_proj", "v_proj")) for n in adapted)
    assert len(adapted) == 2 * 2  # 2 tiny decoder layers x (q_proj, v_proj)


def test_pretrained_vision_checkpoint_from_a_local_directory(tmp_path):
    spec = get_model("llava-v1.6-mistral-7b")
    tok = train_bpe_tokenizer(["the market rose after earnings"] * 32, 512)
    processor = vision.build_processor(spec, tok)
    model = vision.build_model(
        spec,
        tiny=True,
        tokenizer_vocab=len(tok),
        special_ids={"pad_token_id": tok.pad_token_id},
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        dtype=torch.float32,
        device=torch.device("cpu"),
        attn_implementation=None,
    )
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    processor.save_pretrained(ckpt)
    rc, r, agg = _run(
        tmp_path, model="llava-v1.6-mistral-7b", method="lora", model_name_or_path=str(ckpt), weights="pretrained"
    )
    assert rc == 0 and agg["status"] == "ok", r.get("reason")
    assert r["metadata"]["weights"] == "pretrained" and r["metadata"]["weights_source"] == str(ckpt)
    assert r["data"]["image_tokens_per_record"][0] == 1776  # 576 + 48 x 24 + 48 (the hand count above)


def _run(tmp_path: Path, *, model: str, method: str, **flags: str) -> tuple[int, dict, dict]:
    generate_dataset(DATASET, tmp_path / "data")
    data = tmp_path / "data" / f"{DATASET}.parquet"
    argv = {
        "tunebench_model": model,
        "tunebench_tiny": "True",
        "weights": "random",
        "training_data_path": str(data),
        "dataset_text_field": "output",
        "dataset_image_field": "images",
        "max_steps": "2",
        "per_device_train_batch_size": "1",
        "max_seq_length": "4096",
        "torch_dtype": "float32",
        "use_flash_attn": "False",
        "peft_method": method,
        "output_dir": str(tmp_path / "out"),
        "result_path": str(tmp_path / "result.json"),
        "metrics_interval_seconds": "0.2",
        **flags,
    }
    rc = main([x for k, v in argv.items() for x in (f"--{k}", v)])
    r = json.loads((tmp_path / "result.json.rank0.json").read_text())
    agg_path = tmp_path / "result.json"
    return rc, r, json.loads(agg_path.read_text()) if agg_path.exists() else {}


def test_measuring_actuator_runs_the_vision_lora_experiment(tmp_path):
    """The spec's command (LoRA benchmark, granite-vision-3.2-2b, a vision data set) through the measuring
    actuator in a real subprocess; --tunebench_tiny shrinks the catalog model so the CPU can train it."""
    from tunebench.actuators.measure import measure
    from tunebench.spec.experiments import get_experiment, make_entity

    exp = get_experiment(
        "finetune_lora_benchmark-v1.0.0", {"max_steps": 2, "dataset_id": DATASET, "gradient_accumulation_steps": 1}
    )
    entity = make_entity(
        exp, {"model_name": "granite-vision-3.2-2b", "model_max_length": 4096, "number_gpus": 0, "batch_size": 1}
    )
    result = measure(
        exp,
        entity,
        {
            "weights": "random",
            "output_dir": str(tmp_path / "run"),
            "data_dir": str(tmp_path / "data"),
            "timeout_seconds": 300,
            "extra_worker_args": ("--tunebench_tiny", "True"),
        },
    )
    assert result.status == "valid", (result.error, result.log_tail)
    p = result.properties
    assert set(BENCHMARK_MEASURED) <= set(p) and p["is_valid"] == 1
    # 2 steps of one record each, every record holds 2241 image tokens (the hand count above)
    assert p["dataset_tokens_per_second"] * p["train_runtime"] > 2 * 2241


def test_a_text_model_on_a_vision_data_set_fails_clearly(tmp_path):
    rc, r, agg = _run(tmp_path, model="llama3-8b", method="lora")
    assert rc == 1 and r["status"] == "error" and not agg
    assert "needs a vision model; llama3-8b is not one" in r["reason"]
