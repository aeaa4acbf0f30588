"""This host CPU's training rates, measured once and cached: what the planner divides CPU FLOPs by.

A CPU's training rate depends on its cores, vector units (AVX-512, AMX), the shapes of the matrices
and how the entity's dtype, autocast and gradient checkpointing run there, none of which a catalog can
know. So the planner trains probes on this host and divides the FLOPs it counts by their step times:

- the entity's own architecture (``entity_rate``): two of its decoder layers with its output layer and
  vocabulary, and the same two layers with a 512-entry vocabulary, with its attention implementation and
  LoRA adapters, on a micro-batch shaped like its own (``probe_shape``: at most 1,024 tokens); a step of
  all its layers is the first plus (layers - 2) / 2 times the second, and the rate is the planner's FLOPs
  count of the entity over that time. The optimizer step (gradient clipping and torch AdamW, as the
  Trainer runs them) is timed on the same probes, per trainable parameter. With a small probe only, a
  576-wide model ran 2x faster than predicted: wide matrices and long sequences reach more of a CPU than
  small ones; and LoRA saves 7 % of a CPU step where its FLOPs count says 26 % (docs/planner.md §5).
- a small generic Llama (``host_flops``, ``generic_rate``; the optimizer step timed on one flat tensor):
  for entities whose probe would take too long (wide models on a slow CPU) or too much memory, that
  cannot be built, or whose layers differ (hybrid, interleaved dense and MoE layers, vision towers).

Results are cached in memory (one measurement per process and probe) and on disk in
``<tunebench home>/host_flops.json``, keyed by CPU model, usable cores, torch threads and torch version,
so later processes reuse them. A measurement taken while other work competes for the cores (the 1-minute
load average above the usable cores, or the probe's threads getting under ``BUSY_CPU_SHARE`` of the CPU
time the wall clock allowed them) is marked busy: a later process measures it again once the host is
quiet (two busy measurements within 10 % of each other are the host's own rate, e.g. under a CPU
quota). On a busy host an entity's probes are not run at all (they would take cores from the work
running there): the generic rate stands in. A probe that fails is remembered for the process (its
error logged once) and the generic rate used.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tunebench import paths

log = logging.getLogger(__name__)

CACHE_FILE = "host_flops.json"
MEASURE_SECONDS = 1.5  # per probe, after one untimed warm-up step
DTYPES = ("float32", "bfloat16", "float16")
BUSY_LOAD = 1.0  # 1-minute load average per usable core above which a measurement is marked busy
# Share of the CPU time (threads x wall time) a probe's timed steps must get; OpenMP threads of two
# processes on the same cores lose 2-50x (measured: 2 EPYC cores, a second 2-thread process running)
BUSY_CPU_SHARE = 0.6
PROBE_MAX_TOKENS = 1024  # an entity probe's micro-batch (batch x sequence): at most this many tokens
PROBE_STEP_SECONDS = 2.0  # longest probe step the planner waits for (estimated at the generic rate)
PROBE_MEMORY_SHARE = 0.25  # of the host's available memory a probe may take (weights, gradients, AdamW)
PROBE_VOCAB = 512  # the second probe's vocabulary: its output layer is negligible
OPTIMIZER_PROBE_PARAMS = 1 << 22  # the generic AdamW timing: one flat tensor of 4 M parameters
# config keys of models whose decoder layers are not all alike (dense layers among MoE layers)
MIXED_LAYER_KEYS = ("first_k_dense_replace", "decoder_sparse_step", "mlp_only_layers", "moe_layer_freq")

_MEMO: dict[str, dict] = {}
_LOCK = threading.RLock()  # one measurement at a time in a process: parallel probes would slow each other


@functools.cache
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


def _train_step(model, ids, autocast: str | None, optimizer=None, positions=None) -> tuple[float, float]:
    """Seconds of one forward and backward of ``model`` on ``ids`` (and of ``optimizer``'s step, else 0);
    ``positions``: the position ids of a padding-free row (restarting at each sample), else None."""
    import torch

    cast = getattr(torch, autocast) if autocast else torch.bfloat16
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=cast, enabled=autocast is not None):
        extra = {} if positions is None else {"position_ids": positions}
        loss = model(input_ids=ids, labels=ids, **extra).loss
    loss.backward()
    t1 = time.perf_counter()
    if optimizer is not None:
        _optimizer_step(optimizer)
    t2 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1


def _optimizer_step(optimizer) -> None:
    """What the Trainer does once per optimizer step: clip the gradients' norm to max_grad_norm (1.0 by
    default, transformers TrainingArguments) and step AdamW."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


def _best_times(
    model, shape: tuple[int, int], vocab: int, autocast, seconds: float, optimizer=None, packed: int | None = None
) -> tuple[float, float, float]:
    """Fastest forward-backward and optimizer-step seconds over steps of a (batch, sequence) micro-batch run
    for ``seconds`` (at least 2, after one untimed warm-up step: thread pool, allocator, kernel selection;
    other processes only ever slow a step), and the share of CPU time its threads got meanwhile. ``packed``:
    the tokens of each sample of a padding-free row (its position ids restart at each, so transformers masks
    the row block-diagonally, as the run does), else None."""
    import torch

    ids = torch.randint(0, vocab, shape)
    positions = None if packed is None else (torch.arange(shape[1]) % packed).expand(shape)
    _train_step(model, ids, autocast, optimizer, positions)
    times: list[tuple[float, float]] = []
    start, cpu = time.perf_counter(), time.process_time()
    while len(times) < 2 or (time.perf_counter() - start < seconds and len(times) < 1000):
        times.append(_train_step(model, ids, autocast, optimizer, positions))
    share = (time.process_time() - cpu) / max((time.perf_counter() - start) * torch.get_num_threads(), 1e-9)
    return min(t for t, _ in times), min(o for _, o in times), share


def measure_training_flops(
    dtype: str, autocast: str | None = None, checkpointing: bool = False, seconds: float = MEASURE_SECONDS
) -> dict[str, float]:
    """The generic probe on this CPU with weights in ``dtype``, ``autocast`` (or None) and gradient
    checkpointing as the entity runs them: {"flops": its FLOPs over its fastest step,
    "optimizer_s_per_param": AdamW on one flat tensor, "cpu_share": see _best_times}."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tunebench.plan.meta_model import enable_checkpointing, quiet

    with quiet():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**PROBE)).to(getattr(torch, dtype)).train()
        if checkpointing:
            enable_checkpointing(model, {"use_reentrant": False})
        model.config.use_cache = False
        step, _, share = _best_times(model, (1, PROBE_TOKENS), PROBE["vocab_size"], autocast, seconds)
        flat = torch.nn.Parameter(torch.zeros(OPTIMIZER_PROBE_PARAMS, dtype=getattr(torch, dtype)))
        flat.grad = torch.zeros_like(flat)
        optimizer = torch.optim.AdamW([flat], lr=1e-5)  # the Trainer's adamw_torch
        _optimizer_step(optimizer)  # allocates the states
        opt = min(_timed(lambda: _optimizer_step(optimizer)) for _ in range(3))
    return {
        "flops": probe_flops_per_step(model, PROBE_TOKENS, checkpointing) / step,
        "optimizer_s_per_param": opt / OPTIMIZER_PROBE_PARAMS,
        "cpu_share": share,
    }


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass(frozen=True)
class HostRate:
    """How fast this CPU trains one entity: FLOP/s of its forward and backward (the planner's FLOPs count)
    and seconds of the optimizer step per trainable parameter; ``probe`` says what was measured."""

    flops: float
    optimizer_s_per_param: float
    probe: str  # "<model> at <batch> x <sequence> tokens[, LoRA]" or "generic"
    tokens: int = 0  # the probe's micro-batch tokens (0: generic)


@dataclass(frozen=True)
class Adapters:
    """The LoRA adapters a probe carries (the entity's target modules; rank and dropout as the planner's
    trace takes them: the adapters' own FLOPs are negligible, the layers they wrap are not)."""

    target_modules: tuple[str, ...] | str | None
    dropout: bool
    rank: int = 8


def probe_shape(tokens: float, sequence: float) -> tuple[int, int]:
    """The entity probe's (batch, sequence) for a micro-batch of ``tokens`` in sequences of ``sequence``: the
    nearest powers of two, PROBE_MAX_TOKENS at most in all (the sequence kept first)."""
    seq = min(_pow2(sequence), PROBE_MAX_TOKENS)
    batch = max(1, min(_pow2(tokens / max(sequence, 1)), PROBE_MAX_TOKENS // seq))
    return batch, seq


def _pow2(x: float) -> int:
    """The power of two nearest to ``x`` (>= 1) on a log scale."""
    return 1 << max(0, round(math.log2(max(x, 1.0))))


def _probe_model(structure, vocab: int | None, dtype: str, checkpointing: bool, attention: str, adapters):
    """Two decoder layers of the entity's architecture (its vocabulary, or ``vocab``) with random weights on
    the CPU, with its attention implementation and LoRA adapters, prepared as the measuring worker
    prepares a model."""
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
    hf = hf_config(config, **overrides)
    model = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, dtype), attn_implementation=attention)
    model.train()
    if checkpointing:
        enable_checkpointing(model, {"use_reentrant": False})
    model.config.use_cache = False
    if adapters is not None:
        from peft import LoraConfig, get_peft_model

        targets = adapters.target_modules
        lora = LoraConfig(
            r=adapters.rank,
            lora_alpha=2 * adapters.rank,
            lora_dropout=0.05 if adapters.dropout else 0.0,
            target_modules=list(targets) if isinstance(targets, tuple) else targets,
        )
        model = get_peft_model(model, lora)
    return model


def _probe_params(structure) -> float:
    """Parameters of the larger probe (two layers, the embeddings and output layer), from the structure."""
    per_layer = structure.layer_params / max(structure.layers, 1)
    return 2 * per_layer + structure.embedding_params + (0 if structure.tied else structure.lm_head_params)


def measure_entity(
    structure,
    dtype: str,
    autocast: str | None,
    checkpointing: bool,
    shape: tuple[int, int],
    attention: str = "sdpa",
    adapters: Adapters | None = None,
    seconds: float = MEASURE_SECONDS,
    packed: int | None = None,
) -> dict[str, float]:
    """Time the entity's two probes on a ``shape`` (batch, sequence) micro-batch and compose a step of all
    its layers (module docstring): {"seconds_per_token": forward and backward, "optimizer_s_per_param":
    per trainable parameter, "cpu_share": the smaller of the two probes' (_best_times)}."""
    import torch

    from tunebench.plan.meta_model import quiet

    runs = []
    with quiet():
        for vocab in (None, PROBE_VOCAB):
            model = _probe_model(structure, vocab, dtype, checkpointing, attention, adapters)
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=1e-5)  # the Trainer's adamw_torch
            step, opt, share = _best_times(
                model, shape, vocab or structure.vocab, autocast, seconds / 2, optimizer, packed
            )
            runs.append((step, opt, sum(p.numel() for p in trainable), share))
            del model, optimizer, trainable
    (step_a, opt_a, params_a, share_a), (step_b, opt_b, params_b, share_b) = runs
    rest = max(structure.layers - 2, 0) / 2  # the other layers, in pairs like the second probe's
    return {
        "seconds_per_token": (step_a + rest * step_b) / (shape[0] * shape[1]),
        "optimizer_s_per_param": (opt_a + rest * opt_b) / (params_a + rest * params_b),
        "cpu_share": min(share_a, share_b),
    }


def _read_cache() -> dict[str, object]:
    path = paths.home() / CACHE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(cache: dict[str, object]) -> None:
    path = paths.home() / CACHE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{CACHE_FILE}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only home: the in-process memo still saves re-measuring


def host_busy() -> bool:
    """Whether other work fills this host's cores now (1-minute load average > BUSY_LOAD x usable cores)."""
    try:
        return os.getloadavg()[0] > BUSY_LOAD * usable_cores()
    except (AttributeError, OSError):  # Windows: no load average
        return False


def _usable(entry: object, fields: tuple[str, ...]) -> dict | None:
    """A cache entry with every one of ``fields`` a positive number, else None (an older tunebench's bare
    number counts as a busy {"flops": ...})."""
    if isinstance(entry, (int, float)) and not isinstance(entry, bool):
        entry = {"flops": float(entry), "busy": True}
    if not isinstance(entry, dict):
        return None
    ok = all(isinstance(entry.get(k), (int, float)) and entry[k] > 0 for k in fields)
    return entry if ok else None


def _cached(
    key: str, measure: Callable[[], dict], what: str, fields: tuple[str, ...], when_busy: bool = True
) -> dict | None:
    """The memo's entry for ``key``, else the disk cache's, else ``measure()``'s, written to disk marked busy
    when other work competed meanwhile; a busy entry is measured again once the host is quiet. With
    ``when_busy`` False nothing is measured on a busy host (None): a probe would take cores from the work
    running there (measurements of a parallel exploration) and measure another machine."""
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key]
        entry = _usable(_read_cache().get(key), fields)
        if entry is None and not when_busy and host_busy():
            return None
        if entry is None or (entry.get("busy") and not host_busy()):
            log.info("CPU probe (once): %s", what)  # short: a terminal line of 80 columns
            loaded = host_busy()
            measured = dict(measure())
            share = measured.pop("cpu_share", 1.0)
            busy = bool(loaded or host_busy() or share < BUSY_CPU_SHARE)
            if busy and entry is not None and _agree(entry, measured, fields[0]):
                busy = False  # measured twice alike: the host's own rate (a CPU quota, threads > cores)
            entry = {**measured, "busy": busy}
            cache = _read_cache()  # another process may have written meanwhile
            cache[key] = entry
            _write_cache(cache)
        _MEMO[key] = entry
        return entry


def _agree(a: dict, b: dict, field: str, tolerance: float = 0.1) -> bool:
    """Whether two measurements of ``field`` are within ``tolerance`` of each other."""
    x, y = a.get(field), b.get(field)
    return isinstance(x, (int, float)) and isinstance(y, (int, float)) and abs(x - y) <= tolerance * max(x, y)


def _normal(dtype: str, autocast: str | None) -> tuple[str, str | None]:
    return (dtype if dtype in DTYPES else "float32"), (autocast if autocast in DTYPES else None)


def generic_rate(dtype: str, autocast: str | None = None, checkpointing: bool = False) -> HostRate:
    """This host's rate on the generic probe with weights in ``dtype`` (float32, bfloat16 or float16),
    ``autocast`` and ``checkpointing``: memo, else disk cache, else measured (about MEASURE_SECONDS)."""
    dtype, autocast = _normal(dtype, autocast)
    key = host_key(dtype, autocast, bool(checkpointing))
    entry = _cached(
        key,
        lambda: measure_training_flops(dtype, autocast, bool(checkpointing)),
        f"generic, {dtype} (~{MEASURE_SECONDS + 0.5:.0f} s)",
        ("flops", "optimizer_s_per_param"),
    )
    return HostRate(entry["flops"], entry["optimizer_s_per_param"], "generic" + _busy_mark(entry))


def host_flops(dtype: str, autocast: str | None = None, checkpointing: bool = False) -> float:
    """FLOP/s of the generic probe (generic_rate)."""
    return generic_rate(dtype, autocast, checkpointing).flops


def entity_rate(
    structure,
    dtype: str,
    autocast: str | None,
    checkpointing: bool,
    shape: tuple[int, int],
    flops_per_token: float,
    attention: str = "sdpa",
    adapters: Adapters | None = None,
    packed: int | None = None,
) -> HostRate:
    """This host's rate for an entity of ``structure`` whose micro-batch probe_shape gives ``shape`` and
    whose step the planner counts at ``flops_per_token`` (plan.throughput.flops_per_token): its own probes
    (measure_entity), halved in batch, then sequence, until a step takes PROBE_STEP_SECONDS at the generic
    rate; else (too slow even at 128 tokens, too large for PROBE_MEMORY_SHARE of the free memory, layers
    that differ, a vision tower, a probe that fails) the generic rate. ``packed``: a padding-free entity's tokens
    per sample, whose row the probe masks per sample as the run does (_best_times)."""
    dtype, autocast = _normal(dtype, autocast)
    generic = generic_rate(dtype, autocast, checkpointing)
    if not _probe_fits(structure, dtype):
        return generic
    batch, seq = shape
    while (
        batch * seq > 128 and _probe_seconds(structure, batch * seq, checkpointing, generic.flops) > PROBE_STEP_SECONDS
    ):
        batch, seq = (batch // 2, seq) if batch > 1 else (batch, seq // 2)
    if _probe_seconds(structure, batch * seq, checkpointing, generic.flops) > PROBE_STEP_SECONDS:
        return generic
    attention = "eager" if attention == "eager" else "sdpa"  # flash-attention has no CPU kernels
    packed = packed if packed is not None and packed < seq else None  # a row of one sample is the plain probe
    lora = (
        "" if adapters is None else f", LoRA on {adapters.target_modules}{' with dropout' if adapters.dropout else ''}"
    )
    key = (
        f"{host_key(dtype, autocast, bool(checkpointing))} | {structure.name} {structure.config_key}"
        f" | {batch} x {seq} tokens | {attention}{lora}"
        + ("" if packed is None else f" | padding-free samples of {packed} tokens")
    )
    if key in _MEMO and "failed" in _MEMO[key]:
        return generic
    est = 2 * MEASURE_SECONDS + 6 * _probe_seconds(structure, batch * seq, checkpointing, generic.flops)
    what = f"{structure.name}, {batch} x {seq} tokens{', LoRA' if adapters else ''}, {dtype} (~{est:.0f} s)"
    try:
        entry = _cached(
            key,
            lambda: measure_entity(
                structure,
                dtype,
                autocast,
                bool(checkpointing),
                (batch, seq),
                attention,
                adapters,
                packed=packed,
            ),
            what,
            ("seconds_per_token", "optimizer_s_per_param"),
            when_busy=False,
        )
    except Exception as exc:  # noqa: BLE001 - a modelling class that will not run on the CPU: the generic probe
        reason = " ".join(str(exc).split())[:200]
        log.warning(
            "the CPU probe of %s failed (%s); its speed is planned at the generic probe's rate", structure.name, reason
        )
        log.debug("the CPU probe's error", exc_info=True)
        _MEMO[key] = {"failed": reason}
        return generic
    if entry is None:  # a busy host: the generic rate, measured once even there
        return HostRate(generic.flops, generic.optimizer_s_per_param, "generic (the host was busy)")
    rows = "" if packed is None else f" (padding-free samples of {packed} tokens)"
    probe = (
        f"{structure.name} at {batch} x {seq} tokens{rows}{', LoRA' if adapters is not None else ''}{_busy_mark(entry)}"
    )
    return HostRate(flops_per_token / entry["seconds_per_token"], entry["optimizer_s_per_param"], probe, batch * seq)


def _busy_mark(entry: dict) -> str:
    """What a probe's label adds where other work competed while it was measured (_cached marks it busy and
    measures it again once the host is quiet): its rate is low by however much the host was shared."""
    return " (measured while the host was busy: slower than this host alone)" if entry.get("busy") else ""


def _probe_fits(structure, dtype: str) -> bool:
    """Whether the entity's probes represent it and fit in memory: alike decoder layers, no vision tower,
    weights, gradients and two AdamW states of the larger probe within PROBE_MEMORY_SHARE of the free memory."""
    from tunebench.limits import available_memory

    kinds = {kind for kind, _ in structure.layer_kinds}
    mixed = len(kinds) > 1 or any(structure.config.get(k) for k in MIXED_LAYER_KEYS)
    if mixed or structure.vision:
        return False
    size = 4 if dtype == "float32" else 2
    return _probe_params(structure) * 4 * size <= PROBE_MEMORY_SHARE * available_memory()


def _probe_seconds(structure, tokens: int, checkpointing: bool, generic: float) -> float:
    """Estimated seconds of the larger probe's step (two layers and the output layer) at the generic rate."""
    per_layer = (structure.matmul_params_per_token - structure.lm_head_params) / max(structure.layers, 1)
    per_token = 6 * (2 * per_layer + structure.lm_head_params) + 2 * checkpointing * 2 * per_layer
    return tokens * per_token / generic
