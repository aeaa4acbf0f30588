"""Vision fine-tuning (LlavaNext models): image-text records, processor, model config, collator.

Records (ado-sfttrainer.md §10.3): parquet with an image column (``{"bytes": <jpeg>, ...}``) and a
chat column (a user turn of text + one image, an assistant turn of text). Each record becomes
``<user marker> text <image> <assistant marker> response EOS``; the LlavaNext processor expands
``<image>`` into one token per image feature (base tile + tiles of the best grid pinpoint + one
newline per feature row, transformers LlavaNextProcessor._get_number_of_features), so the image
tokens are part of ``input_ids`` and of the data set tokens tunebench counts (ado-sfttrainer.md §7.3:
vision entries are counted with the processor's tokenization; the appended EOS is not counted, the
spec's note 3). Labels cover only the response (and EOS).

The processor is built offline from the architecture's values (image size, patch size, grid
pinpoints, feature selection strategy) and the run's tokenizer with ``<image>`` added.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import torch

from tunebench.catalog import ModelSpec
from tunebench.training.data import IGNORE_INDEX, Example, TokenizedDataset, _prefix_chars

IMAGE_TOKEN = "<image>"  # LlavaNextProcessor's default image placeholder
USER_MARKER = "<|user|>\n"  # granite-vision chat template roles (a plain-text rendering of the chat)
ASSISTANT_MARKER = "\n<|assistant|>\n"
# SigLIP normalises with mean = std = 0.5, CLIP with OpenAI's values (the checkpoints' preprocessor configs).
NORMALIZE = {
    "siglip_vision_model": ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
    "clip_vision_model": ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]),
}
MAX_TILES_AREA = 10  # granite-vision pinpoints: every (h, w) multiple of 384 with (h/384)*(w/384) <= 10 (27 of them)
# Tiny vision tower for tests: image and patch size are kept (they decide the image-token count).
TINY_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "projection_dim": 32}


def read_parquet(path: str, text_field: str, image_field: str) -> list[tuple[list[dict], bytes]]:
    """(chat, image bytes) of every row of a vision data set."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=[image_field, text_field])
    rows = []
    for image, chat in zip(table.column(image_field).to_pylist(), table.column(text_field).to_pylist()):
        rows.append((chat, image["bytes"] if isinstance(image, dict) else image))
    if not rows:
        raise ValueError(f"{path}: no records")
    return rows


def grid_pinpoints(spec: ModelSpec) -> list[list[int]]:
    """The model's tile grids [height, width] in pixels (catalog list, else granite-vision's rule)."""
    pins = spec.extra.get("image_grid_pinpoints")
    if isinstance(pins, list):
        return [list(p) for p in pins]
    size = int(spec.extra["vision_config"]["image_size"])
    return [
        [h * size, w * size]
        for h in range(1, MAX_TILES_AREA + 1)
        for w in range(1, MAX_TILES_AREA + 1)
        if h * w <= MAX_TILES_AREA
    ]


def _vision_config(spec: ModelSpec, tiny: bool) -> tuple[dict[str, Any], Any, str]:
    """(vision tower config, vision_feature_layer, select strategy); tiny keeps the number of feature layers."""
    vc = dict(spec.extra["vision_config"])
    layer, strategy = vc.pop("vision_feature_layer", -2), vc.pop("vision_feature_select_strategy", "default")
    vc = {k: v for k, v in vc.items() if k not in ("base", "note", "params", "params_without_head")}
    if tiny:
        n_features = len(layer) if isinstance(layer, list) else 2
        vc.update(TINY_VISION, num_hidden_layers=n_features)
        layer = list(range(-n_features, 0)) if isinstance(layer, list) else -2
        if vc["model_type"] != "clip_vision_model":
            vc.pop("projection_dim")
    return vc, layer, strategy


def config_dict(spec: ModelSpec, text_config: dict[str, Any], tiny: bool) -> dict[str, Any]:
    """LlavaNextConfig kwargs from the catalog entry and the (already shrunk) language-model config."""
    vision, layer, strategy = _vision_config(spec, tiny)
    return {
        "model_type": "llava_next",
        "text_config": text_config,
        "vision_config": vision,
        "vision_feature_layer": layer,
        "vision_feature_select_strategy": strategy,
        "image_grid_pinpoints": grid_pinpoints(spec),
        "image_token_index": spec.extra.get("image_token_index"),
        "projector_hidden_act": spec.extra.get("projector_hidden_act", "gelu"),
        "tie_word_embeddings": bool(spec.tie_word_embeddings),
    }


def text_config_dict(spec: ModelSpec) -> dict[str, Any]:
    """The language model's config kwargs (the catalog's text_config)."""
    tc = {k: v for k, v in spec.extra["text_config"].items() if k not in ("architectures", "base", "note")}
    tc.setdefault("head_dim", spec.head_dim)
    return {k: v for k, v in tc.items() if v is not None}


def build_processor(spec: ModelSpec, tokenizer: Any) -> Any:
    """LlavaNextProcessor from the architecture's values and the run's tokenizer (``<image>`` added)."""
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    if IMAGE_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    vc = spec.extra["vision_config"]
    size = int(vc["image_size"])
    mean, std = NORMALIZE[vc["model_type"]]
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_grid_pinpoints=grid_pinpoints(spec),
        image_mean=mean,
        image_std=std,
    )
    strategy = vc.get("vision_feature_select_strategy", "default")
    return LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=int(vc["patch_size"]),
        vision_feature_select_strategy=strategy,
        image_token=IMAGE_TOKEN,
        # CLIP keeps a CLS token that the "default" strategy drops (llava-v1.6 processor config: 1); SigLIP has none.
        num_additional_image_tokens=1 if vc["model_type"] == "clip_vision_model" else 0,
    )


def render(chat: list[dict]) -> tuple[str, str]:
    """(prompt, response) text of a chat: user parts (images as ``<image>``), then the assistant's text."""
    prompt, response = USER_MARKER, ""
    for turn in chat:
        parts = [IMAGE_TOKEN if p.get("type") == "image" else (p.get("text") or "") for p in turn["content"]]
        if turn["role"] == "assistant":
            response += " ".join(parts)
        else:
            prompt += "\n".join(parts)
    return prompt + ASSISTANT_MARKER, response


@dataclass
class VisionExample(Example):
    pixel_values: torch.Tensor | None = None  # (tiles, 3, H, W)
    image_size: tuple[int, int] | None = None  # (height, width) of the original image


@dataclass(frozen=True)
class ProcessedImage:
    pixel_values: torch.Tensor  # (tiles, 3, H, W)
    image_size: tuple[int, int]  # (height, width) of the original image
    image_tokens: int  # how many tokens the processor expands <image> into


def process_image(processor: Any, image_bytes: bytes) -> ProcessedImage:
    """Tiles of one image and its image-token count (the processor's own expansion of one <image>)."""
    from PIL import Image

    image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    enc = processor(images=[image], text=[IMAGE_TOKEN], return_tensors="pt")
    n = int((enc["input_ids"][0] == processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)).sum())
    return ProcessedImage(enc["pixel_values"][0], tuple(enc["image_sizes"][0].tolist()), n)


def tokenize_row(processor: Any, chat: list[dict], image: ProcessedImage, max_length: int) -> VisionExample:
    """Ids with the image tokens expanded, labels on the response only, truncated to max_length.

    As LlavaNextProcessor does: the prompt is tokenized with ``<image>`` as one special token, which is
    then repeated image.image_tokens times (the image is processed once per distinct image, not per row).
    """
    tok = processor.tokenizer
    prompt, response = render(chat)
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    prompt_ids: list[int] = []
    for t in tok(prompt)["input_ids"]:
        prompt_ids += [t] * image.image_tokens if t == image_id else [t]
    if len(prompt_ids) > max_length:
        raise ValueError(
            f"max_seq_length {max_length} is shorter than the prompt with its image tokens ({len(prompt_ids)}): "
            "the image would be cut"
        )
    room = max_length - len(prompt_ids)
    # As data.tokenize_record: a character prefix is enough when it yields well over the tokens kept.
    cut = _prefix_chars(room)
    response_ids = tok(response[:cut], add_special_tokens=False)["input_ids"]
    if len(response) > cut and len(response_ids) <= room + 8:
        response_ids = tok(response, add_special_tokens=False)["input_ids"]
    elif len(response) > cut:
        response_ids = response_ids[:room]  # truncated anyway: no EOS fits after it
    dataset_tokens = min(len(prompt_ids) + len(response_ids), max_length)  # the spec's note 3: without the EOS
    response_ids = response_ids + [tok.eos_token_id]
    ids = (prompt_ids + response_ids)[:max_length]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + response_ids)[:max_length]
    return VisionExample(ids, labels, True, dataset_tokens, image.pixel_values, image.image_size)


class VisionDataset(TokenizedDataset):
    """Pre-processed image-text records; item i also carries its image's pixel values and size."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        ex = self.examples[i]
        return {
            "input_ids": ex.input_ids,
            "labels": ex.labels,
            "pixel_values": ex.pixel_values,
            "image_size": ex.image_size,
            "entry_index": i,
            "dataset_tokens": ex.dataset_tokens,
        }


def build_dataset(processor: Any, rows: list[tuple[list[dict], bytes]], max_length: int) -> tuple[VisionDataset, dict]:
    """Dataset plus the facts the result records (as tunebench.training.data.build_dataset)."""
    cache: dict[bytes, ProcessedImage] = {}
    examples = []
    for chat, image in rows:
        if image not in cache:
            cache[image] = process_image(processor, image)
        examples.append(tokenize_row(processor, chat, cache[image], max_length))
    lengths = [len(e.input_ids) for e in examples]
    image_token = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    info = {
        "records": len(examples),
        "records_without_response_template": 0,
        "max_length": max_length,
        "tokens_min": min(lengths),
        "tokens_max": max(lengths),
        "tokens_mean": sum(lengths) / len(lengths),
        "records_at_max_length": sum(n >= max_length for n in lengths),
        "image_tokens_per_record": [e.input_ids.count(image_token) for e in examples[:8]],
        "distinct_images": len(cache),
    }
    return VisionDataset(examples), info


@dataclass
class VisionCollator:
    """Right-pads ids/labels like CompletionCollator; pads the tiles of each image to the batch's most."""

    pad_token_id: int
    dtype: torch.dtype = torch.float32  # the model's: pixel values are fed in its precision

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        from tunebench.training.data import CompletionCollator

        batch = CompletionCollator(self.pad_token_id)(features)
        tiles = max(f["pixel_values"].shape[0] for f in features)
        shape = features[0]["pixel_values"].shape[1:]
        pixels = torch.zeros((len(features), tiles, *shape), dtype=self.dtype)
        for i, f in enumerate(features):
            pixels[i, : f["pixel_values"].shape[0]] = f["pixel_values"]
        batch["pixel_values"] = pixels
        batch["image_sizes"] = torch.tensor([list(f["image_size"]) for f in features], dtype=torch.long)
        return batch


def language_model_targets(names: list[str]) -> str:
    """LoRA targets restricted to the language model (the vision tower has q_proj/v_proj too): a peft regex."""
    return r".*language_model.*\.(" + "|".join(names) + r")$"


def build_model(
    spec: ModelSpec,
    *,
    tiny: bool,
    tokenizer_vocab: int,
    special_ids: dict[str, int | None],
    image_token_id: int,
    dtype: torch.dtype,
    device: torch.device,
    attn_implementation: str | None,
) -> torch.nn.Module:
    """A LlavaNext model with random weights (tiny: language model shrunk as model.shrink, vision tower
    to TINY_VISION with the same number of feature layers; image and patch size kept)."""
    from transformers import CONFIG_MAPPING, AutoModelForImageTextToText

    from tunebench.training.model import training_config_dict

    text = text_config_dict(spec)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        text.setdefault(key, getattr(spec, key))
    cfg = config_dict(spec, training_config_dict(text, tiny, tokenizer_vocab, special_ids), tiny)
    cfg["image_token_index"] = image_token_id  # the run's tokenizer decides the placeholder's id
    cfg.pop("model_type")
    config = CONFIG_MAPPING["llava_next"](**cfg)
    with device:
        return AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=attn_implementation)


def load_pretrained(
    path: str, *, dtype: torch.dtype, device: torch.device, attn_implementation: str | None
) -> tuple[Any, torch.nn.Module]:
    """(processor, model) of a local VLM checkpoint (local_files_only: never downloads)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": attn_implementation}
    if device.type == "cuda":
        kwargs["device_map"] = {"": device.index}
    model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True, **kwargs)
    model.config.get_text_config().use_cache = False  # training (fms-hf-tuning loads with use_cache=False)
    return processor, model
