"""Catalogs of models and GPUs: the facts planning and launching rely on."""

from tunebench.catalog.gpus import GPUSpec, get_gpu, list_gpus, load_gpus
from tunebench.catalog.models import (
    ModelSpec,
    default_target_modules,
    get_model,
    list_models,
    load_models,
    model_paths,
)

__all__ = [
    "GPUSpec",
    "ModelSpec",
    "default_target_modules",
    "get_gpu",
    "get_model",
    "list_gpus",
    "list_models",
    "load_gpus",
    "load_models",
    "model_paths",
]
