"""The host CPU's training rate, measured once and cached: what the planner divides CPU FLOPs by.

A CPU's training rate depends on its cores, vector units (AVX-512, AMX) and how the entity's dtype,
autocast and gradient checkpointing run there, none of which a catalog can know. So the planner trains
a small probe model on this host for ``MEASURE_SECONDS`` in the entity's configuration and divides
the FLOPs it counts by its fastest step time. The result is cached in memory (one measurement per
process and configuration) and on disk in ``<tunebench home>/host_flops.json``, keyed by CPU model,
usable cores, torch threads and torch version, so later processes reuse it.
"""

from __future__ import annotations

import json
import os
import platform
import time

from tunebench import paths

CACHE_FILE = "host_flops.json"
MEASURE_SECONDS = 1.5  # per dtype, after one untimed warm-up step
DTYPES = ("float32", "bfloat16", "float16")

_MEMO: dict[str, float] = {}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, else os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def host_key(dtype: str, autocast: str | None, checkpointing: bool) -> str:
    """Cache key: what changes the measured rate (CPU model, cores, torch threads and version, and the
    entity's dtype, autocast and checkpointing)."""
    import torch

    return (
        f"{cpu_model()} | {usable_cores()} cores | {torch.get_num_threads()} threads | torch {torch.__version__}"
        f" | {dtype} | autocast {autocast or 'no'} | checkpointing {'yes' if checkpointing else 'no'}"
    )


# The probe: a small Llama (transformers' own modelling code, random weights) trained for
# MEASURE_SECONDS: its matmuls, norms, rotary embeddings, attention and casts in the entity's dtype run
# at the rate a CPU run of a small model reaches. A bare matmul does not: bfloat16 matmuls are fast on
# CPUs with AMX, while bfloat16 training on the same host ran 6x slower than float32 (measured: a
# 4-layer, 256-wide Llama on 2 EPYC cores, 85 against 495 tokens/s).
PROBE = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256}  # fmt: skip
PROBE_TOKENS = 128  # one sequence of 128 tokens per step


def probe_flops_per_step(model, tokens: int, checkpointing: bool) -> float:
    """FLOPs of one training step of the probe, counted as the planner counts them (plan.throughput.
    flops_per_token): 6 per matmul weight per token (forward 2, backward 4; Kaplan et al. 2020), 2 more
    for the layers' recomputed forward under checkpointing, plus the attention core, 2 x layers x
    hidden x tokens per token and pass, 3 passes (4 with recomputation; PaLM App. B)."""
    cfg = model.config
    weights = {n: p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n}
    body = sum(v for n, v in weights.items() if ".layers." in n)
    passes = 4 if checkpointing else 3
    attention = passes * 2 * cfg.num_hidden_layers * cfg.hidden_size * tokens
    return tokens * (6 * sum(weights.values()) + 2 * body * checkpointing + attention)


def measure_training_flops(
    dtype: str, autocast: str | None = None, checkpointing: bool = False, seconds: float = MEASURE_SECONDS
) -> float:
    """FLOP/s a training step reaches on this CPU with weights in ``dtype``, ``autocast`` (or None) and
    gradient checkpointing as the entity runs them: the probe's FLOPs over the fastest step run in
    ``seconds`` (at least 3, after one untimed warm-up step; other processes only ever slow a step)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**PROBE)).to(getattr(torch, dtype)).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    ids = torch.randint(0, PROBE["vocab_size"], (1, PROBE_TOKENS))
    flops = probe_flops_per_step(model, PROBE_TOKENS, checkpointing)
    cast = getattr(torch, autocast) if autocast else torch.bfloat16

    def step() -> float:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=cast, enabled=autocast is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    step()  # warm-up: thread pool, allocator, kernel selection
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < seconds and len(times) < 1000):
        times.append(step())
    return flops / min(times)


def _read_cache() -> dict[str, float]:
    path = paths.home() / CACHE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return (
        {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and v > 0}
        if isinstance(data, dict)
        else {}
    )


def _write_cache(cache: dict[str, float]) -> None:
    path = paths.home() / CACHE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only home: the in-process memo still saves re-measuring


def host_flops(dtype: str, autocast: str | None = None, checkpointing: bool = False) -> float:
    """This host's training FLOP/s with weights in ``dtype`` (float32, bfloat16 or float16), ``autocast``
    and ``checkpointing``: memo, else disk cache, else measured (about MEASURE_SECONDS) and cached."""
    if dtype not in DTYPES:
        dtype = "float32"
    if autocast not in DTYPES:
        autocast = None
    key = host_key(dtype, autocast, bool(checkpointing))
    if key in _MEMO:
        return _MEMO[key]
    cache = _read_cache()
    if key not in cache:
        cache[key] = measure_training_flops(dtype, autocast, bool(checkpointing))
        _write_cache(cache)
    _MEMO[key] = cache[key]
    return cache[key]
