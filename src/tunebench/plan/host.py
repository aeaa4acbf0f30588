"""The host CPU's training rate, measured once and cached: what the planner divides CPU FLOPs by.

A CPU's training rate depends on its cores, vector units (AVX-512, AMX), the shapes of the matrices
and how the entity's dtype, autocast and gradient checkpointing run there, none of which a catalog can
know. So the planner trains probes on this host and divides the FLOPs it counts by their step times:

- the entity's own architecture (``entity_rate``): two of its decoder layers with its output layer and
  vocabulary, and the same two layers with a 512-entry vocabulary, at its micro-batch's tokens (a power
  of two from 128 to 1,024); a step of all its layers is the first plus (layers - 2) / 2 times the
  second. The optimizer step (torch AdamW, as the Trainer runs it) is timed on the same probes, per
  parameter. Measured with a small probe only, a 576-wide model ran 2x faster than predicted: wide
  matrices and long sequences reach more of a CPU than small ones (docs/planner.md section 5).
- a small generic Llama (``host_flops``): for entities whose probe would take too long (wide models on
  a slow CPU), that cannot be built, or whose layers are of several kinds.

Results are cached in memory (one measurement per process and configuration) and on disk in
``<tunebench home>/host_flops.json``, keyed by CPU model, usable cores, torch threads and torch
version, so later processes reuse them. A rate measured while other work fills the cores (load average
above ``BUSY_LOAD`` x cores) is marked so: a later process measures again once the host is quiet.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass

from tunebench import paths

log = logging.getLogger(__name__)

CACHE_FILE = "host_flops.json"
MEASURE_SECONDS = 1.5  # per dtype, after one untimed warm-up step
DTYPES = ("float32", "bfloat16", "float16")
BUSY_LOAD = 1.0  # 1-minute load average per usable core above which a measurement is marked busy
ENTITY_TOKENS = (128, 1024)  # an entity probe's sequence: a power of two in this range
PROBE_STEP_SECONDS = 2.0  # longest probe step the planner waits for (estimated at the generic rate)
PROBE_MAX_PARAMS = 1.5e9  # larger probes (two layers of a big MoE, a huge vocabulary) use the generic rate
PROBE_VOCAB = 512  # the second probe's vocabulary: its output layer is negligible

_MEMO: dict[str, object] = {}


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


def _train_step(model, ids, autocast: str | None, optimizer=None) -> tuple[float, float]:
    """Seconds of one forward and backward of ``model`` on ``ids`` (and of ``optimizer``'s step, else 0)."""
    import torch

    cast = getattr(torch, autocast) if autocast else torch.bfloat16
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=cast, enabled=autocast is not None):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    t1 = time.perf_counter()
    if optimizer is not None:
        optimizer.step()
    t2 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1


def _best_times(model, tokens: int, vocab: int, autocast, seconds: float, optimizer=None) -> tuple[float, float]:
    """Fastest forward-backward and optimizer-step seconds over steps run for ``seconds`` (at least 2, after
    one untimed warm-up step: thread pool, allocator, kernel selection; other processes only ever slow a
    step)."""
    import torch

    ids = torch.randint(0, vocab, (1, tokens))
    _train_step(model, ids, autocast, optimizer)
    times: list[tuple[float, float]] = []
    start = time.perf_counter()
    while len(times) < 2 or (time.perf_counter() - start < seconds and len(times) < 1000):
        times.append(_train_step(model, ids, autocast, optimizer))
    return min(t for t, _ in times), min(o for _, o in times)


def measure_training_flops(
    dtype: str, autocast: str | None = None, checkpointing: bool = False, seconds: float = MEASURE_SECONDS
) -> float:
    """FLOP/s a training step of the generic probe reaches on this CPU with weights in ``dtype``,
    ``autocast`` (or None) and gradient checkpointing as the entity runs them: the probe's FLOPs over its
    fastest step run in ``seconds``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tunebench.plan.meta_model import enable_checkpointing, quiet

    with quiet():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**PROBE)).to(getattr(torch, dtype)).train()
        if checkpointing:
            enable_checkpointing(model, {"use_reentrant": False})
        model.config.use_cache = False
        step, _ = _best_times(model, PROBE_TOKENS, PROBE["vocab_size"], autocast, seconds)
    return probe_flops_per_step(model, PROBE_TOKENS, checkpointing) / step


@dataclass(frozen=True)
class HostRate:
    """How fast this CPU trains one entity: FLOP/s of its forward and backward (the planner's FLOPs count)
    and seconds of the optimizer step per trainable parameter; ``probe`` says what was measured."""

    flops: float
    optimizer_s_per_param: float | None
    probe: str  # "<model> at <n> tokens" or "generic"


def entity_tokens(tokens: float) -> int:
    """The entity probe's sequence length for a micro-batch of ``tokens``: the power of two nearest below,
    within ENTITY_TOKENS."""
    lo, hi = ENTITY_TOKENS
    return int(min(hi, max(lo, 2 ** math.floor(math.log2(max(tokens, 1))))))


def full_step_flops(structure, tokens: int, checkpointing: bool) -> float:
    """FLOPs of a full fine-tuning step of one sequence of ``tokens``, counted as plan.throughput counts
    them (flops_per_token): 6 per matmul weight per token, 2 more for the recomputed layers, attention."""
    mm = structure.matmul_params_per_token
    recompute = 1.0 if checkpointing else 0.0
    dense = 6 * mm + 2 * recompute * (mm - structure.lm_head_params)
    return tokens * (dense + structure.attention_flops_per_token_per_context * tokens * (3 + recompute))


def _probe_model(structure, vocab: int | None, dtype: str, checkpointing: bool):
    """Two decoder layers of the entity's architecture (its vocabulary, or ``vocab``) with random weights on
    the CPU, prepared as the measuring worker prepares a model."""
    import torch
    from transformers import AutoModelForCausalLM

    from tunebench.plan.config import ModelConfig, hf_config
    from tunebench.plan.meta_model import enable_checkpointing

    config = ModelConfig(structure.name, structure.config, structure.builder, structure.assumptions)
    overrides: dict = {"num_hidden_layers": 2}
    if structure.layer_kinds:
        overrides["layer_types"] = [structure.layer_kinds[0][0]] * 2
    if vocab:  # special token ids may lie beyond a smaller vocabulary
        overrides.update(vocab_size=vocab, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(config, **overrides), dtype=getattr(torch, dtype)).train()
    if checkpointing:
        enable_checkpointing(model, {"use_reentrant": False})
    model.config.use_cache = False
    return model


def _probe_params(structure, vocab: int | None) -> float:
    """Parameters of a two-layer probe (an estimate from the structure, before building it)."""
    per_layer = structure.layer_params / max(structure.layers, 1)
    v = vocab or structure.vocab
    head = 0 if structure.tied else v * structure.hidden
    return 2 * per_layer + v * structure.hidden + head


def measure_entity(
    structure, dtype: str, autocast: str | None, checkpointing: bool, tokens: int, seconds: float = MEASURE_SECONDS
) -> dict[str, float]:
    """Time the entity's two probes at ``tokens`` and compose a step of all its layers (module docstring):
    {"flops": FLOP/s, "optimizer_s_per_param": seconds}."""
    import torch

    from tunebench.plan.meta_model import quiet

    runs = []
    with quiet():
        for vocab in (None, PROBE_VOCAB):
            model = _probe_model(structure, vocab, dtype, checkpointing)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)  # the Trainer's adamw_torch
            step, opt = _best_times(model, tokens, vocab or structure.vocab, autocast, seconds / 2, optimizer)
            runs.append((step, opt, sum(p.numel() for p in model.parameters())))
            del model, optimizer
    (step_a, opt_a, params_a), (step_b, opt_b, params_b) = runs
    rest = max(structure.layers - 2, 0) / 2  # the other layers, in pairs like the second probe's
    step = step_a + rest * step_b
    params = params_a + rest * params_b
    return {
        "flops": full_step_flops(structure, tokens, checkpointing) / step,
        "optimizer_s_per_param": (opt_a + rest * opt_b) / params,
    }


def _read_cache() -> dict[str, object]:
    path = paths.home() / CACHE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: v
        for k, v in data.items()
        if (isinstance(v, (int, float)) and v > 0)
        or (isinstance(v, dict) and isinstance(v.get("flops"), (int, float)) and v["flops"] > 0)
    }


def _write_cache(cache: dict[str, object]) -> None:
    path = paths.home() / CACHE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only home: the in-process memo still saves re-measuring


def host_busy() -> bool:
    """Whether other work fills this host's cores now (1-minute load average > BUSY_LOAD x usable cores):
    a rate measured then is another machine's."""
    try:
        return os.getloadavg()[0] > BUSY_LOAD * usable_cores()
    except (AttributeError, OSError):  # Windows: no load average
        return False


def _cached(key: str, measure, what: str) -> dict[str, float]:
    """The memo's value of ``key``, else the disk cache's, else ``measure()`` ({"flops": ..., ...}), written
    to disk with whether the host was busy meanwhile; a busy measurement is taken again once the host is
    quiet (as is an entry of an older tunebench, a bare number, whose load is unknown)."""
    if key in _MEMO:
        return _MEMO[key]
    cache = _read_cache()
    entry = cache.get(key)
    if isinstance(entry, (int, float)):
        entry = {"flops": float(entry), "busy": True}
    if entry is None or (entry.get("busy") and not host_busy()):
        log.info("measuring this CPU's training rate: %s (once, cached in %s)", what, paths.home() / CACHE_FILE)
        busy = host_busy()
        entry = {**measure(), "busy": busy or host_busy()}
        cache = _read_cache()  # another process may have written meanwhile
        cache[key] = entry
        _write_cache(cache)
    _MEMO[key] = entry
    return entry


def host_flops(dtype: str, autocast: str | None = None, checkpointing: bool = False) -> float:
    """This host's training FLOP/s on the generic probe with weights in ``dtype`` (float32, bfloat16 or
    float16), ``autocast`` and ``checkpointing``: memo, else disk cache, else measured (about
    MEASURE_SECONDS) and cached."""
    if dtype not in DTYPES:
        dtype = "float32"
    if autocast not in DTYPES:
        autocast = None
    key = host_key(dtype, autocast, bool(checkpointing))
    measure = lambda: {"flops": measure_training_flops(dtype, autocast, bool(checkpointing))}  # noqa: E731
    return _cached(key, measure, f"generic probe, {dtype}, ~{MEASURE_SECONDS + 0.5:.0f} s")["flops"]


def entity_rate(structure, dtype: str, autocast: str | None, checkpointing: bool, tokens: float) -> HostRate:
    """This host's rate for an entity of ``structure`` whose micro-batch holds ``tokens``: its own probes
    (measure_entity) where they run in PROBE_STEP_SECONDS at the generic rate, at the longest such length
    up to entity_tokens(tokens), else the generic probe's rate (no optimizer time)."""
    if dtype not in DTYPES:
        dtype = "float32"
    if autocast not in DTYPES:
        autocast = None
    generic = host_flops(dtype, autocast, checkpointing)
    homogeneous = len({kind for kind, _ in structure.layer_kinds}) <= 1
    if not homogeneous or structure.vision or _probe_params(structure, None) > PROBE_MAX_PARAMS:
        return HostRate(generic, None, "generic")
    n = entity_tokens(tokens)
    while n > ENTITY_TOKENS[0] and _probe_seconds(structure, n, checkpointing, generic) > PROBE_STEP_SECONDS:
        n //= 2
    if _probe_seconds(structure, n, checkpointing, generic) > PROBE_STEP_SECONDS:
        return HostRate(generic, None, "generic")
    key = f"{host_key(dtype, autocast, bool(checkpointing))} | {structure.name} {structure.config_key} | {n} tokens"
    seconds = MEASURE_SECONDS + 4 * _probe_seconds(structure, n, checkpointing, generic)  # + warm-up steps
    what = f"{structure.name}'s layers at {n} tokens, {dtype}, ~{seconds:.0f} s"
    try:
        value = _cached(key, lambda: measure_entity(structure, dtype, autocast, bool(checkpointing), n), what)
    except Exception as exc:  # noqa: BLE001 - a modelling class that will not run on the CPU: the generic probe
        log.warning("the CPU probe of %s failed (%s); using the generic probe's rate", structure.name, exc)
        log.debug("the CPU probe's error", exc_info=True)
        return HostRate(generic, None, "generic")
    return HostRate(float(value["flops"]), float(value["optimizer_s_per_param"]), f"{structure.name} at {n} tokens")


def _probe_seconds(structure, tokens: int, checkpointing: bool, generic: float) -> float:
    """Estimated seconds of the larger probe's step (two layers and the output layer) at the generic rate."""
    per_layer = (structure.matmul_params_per_token - structure.lm_head_params) / max(structure.layers, 1)
    per_token = 6 * (2 * per_layer + structure.lm_head_params) + 2 * checkpointing * 2 * per_layer
    return tokens * per_token / generic
