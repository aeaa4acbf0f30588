"""Activation memory from real training steps of a reduced model, traced on fake tensors.

The model of the entity's config, cut to one or two decoder layers, is built on the meta device,
given the entity's method (PEFT LoRA or prompt tuning), dtype, autocast,
gradient checkpointing and attention implementation, and runs a real forward and backward under
torch's ``FakeTensorMode`` (no memory, no compute) while ``MemTracker``
(``torch.distributed._tools.mem_tracker``, the tracker torchtitan's memory estimator builds on)
accounts every tensor the step creates. The step is split into phases by the decoder layers'
module hooks (PHASES: forward, the head's backward, the last and the first decoder layer's backward,
the embeddings'); in each phase two moments are recorded, each with the parameter-gradient bytes
alive then: the most activation memory (activations and backward temporaries), and the most
activation + gradient memory (gradients build up while activations are freed). The planner takes
the largest of these candidates once gradients are sharded, accumulated or kept in another dtype.
Traced at a few sequence lengths (batch 1) and for 1 and 2 layers of each layer kind, every
quantity is extrapolated per layer and per token:
``act(b, s) = a0 + b (a1 s + a2 s^2)`` for the whole model, where ``a0`` holds the token-independent
temporaries (e.g. the embedding's gradient) and ``a2`` the quadratic attention terms (eager
attention scores, materialised masks). Two more traces with half the vocabulary measure the loss's
bytes per vocabulary entry per token (the slope over length), so fused loss kernels can be accounted.
Profiles are cached on disk per (config, method, checkpointing and its mode, dtype, autocast, attention,
adapters and their dtype, loss path, Liger's layer kernels). Liger's RMSNorm and SwiGLU kernels are Triton
code: autograd functions that save what theirs save stand in for them (``_liger_layers``). The profiles
the shipped calibration was fitted with ship with the package (``data/traces.json.gz``, SHIPPED): with
the library versions they were traced with (torch's local build tag aside: fake tensors trace the same
on a CPU and a CUDA build), the catalog's models at the calibration runs' set-ups plan without tracing
(101 profiles: a few minutes of tracing on 2 cores).

What tracing cannot see stays outside: CUDA context, allocator caching, NCCL buffers, FSDP gathers,
4-bit weight bytes and dequantisation transients, kernels outside PyTorch (flash-attention 2 is
traced as PyTorch's flash SDPA kernel, which keeps the same output and log-sum-exp).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tunebench.errors import InputError
from tunebench.paths import write_atomic
from tunebench.plan.meta_model import enable_checkpointing, quiet
from tunebench.plan.structure import Structure, cache_dir, library_versions, write_json
from tunebench.spec.properties import LOSS_CHUNK_TOKENS

log = logging.getLogger(__name__)

TRACE_VERSION = 4  # 2: the loss's vocabulary bytes from slopes over two lengths; 3: tied weights swapped once;
# 4: hybrid models by the working layer's kind and per-layer peaks (profiles cached with 3 are traced again)
# (profiles cached before could hold an attention fallback the garbage collector caused: _to_fake_empty)
# Traced at batch 1 (fake tensors: the cost does not depend on the size). Long enough that in every
# phase the token-proportional tensors, not a fixed-size one (an output-layer gradient), set the peak.
SEQUENCE_LENGTHS = (1024, 2048, 4096)
TRACE_RANK = 8  # LoRA rank of the traced adapters (adapter memory is accounted exactly elsewhere)
# Phases of a traced step, told apart by the decoder layers' module hooks: the forward, the backward
# of the head (loss, output layer, final norm), of the last decoder layer (the first one backward
# reaches), of the first decoder layer, and the tail (embeddings). The moment of most activation
# memory in each phase, with the gradients alive then, is a candidate for the step's peak.
MOMENTS = ("forward", "head", "last_layer", "first_layer", "tail")
UNMASKED = "tunebench_unmasked"  # flash-attention-2 proxy: causal SDPA with no materialised mask


@dataclass(frozen=True)
class TraceRequest:
    """What an activation profile depends on."""

    config_key: str
    method: str  # "full" | "lora" | "pt" (QLoRA / GPTQ-LoRA trace as "lora" on a 16-bit base)
    kbit_upcast: bool  # QLoRA through peft's prepare_model_for_kbit_training: non-4-bit weights in fp32
    checkpointing: bool
    reentrant: bool
    dtype: str  # load dtype: bfloat16 | float16 | float32
    autocast: str | None  # bfloat16 | float16 under AMP, else None
    attention: str  # "flash" | "sdpa" | "eager"
    target_modules: tuple[str, ...] | str | None
    lora_dropout: bool
    virtual_tokens: int
    selective: bool = False  # op-level selective activation checkpointing (torchtitan's policy)
    adapter_dtype: str = "float32"  # trainable adapters' dtype (peft upcasts to fp32 by default)
    loss: str = "upcast"  # "upcast" (transformers' ForCausalLMLoss) | "chunked" | "model_dtype" (training.loss)
    liger: bool = False  # liger_kernels: Liger-Kernel's RMSNorm and SwiGLU kernels, as autograd sees them
    fused_lora: bool = False  # fms-acceleration-foak's fused LoRA ops on a 4-bit base, as autograd sees them
    mamba_kernel: bool = False  # Mamba-2 layers through mamba_ssm's fused kernel (GPU), not transformers' scan

    @property
    def key(self) -> str:
        fields = asdict(self)
        for name in ("fused_lora", "mamba_kernel"):  # added after TRACE_VERSION 3: requests without them keep
            if not fields[name]:  # their keys (and profiles)
                del fields[name]
        if self.loss == "chunked":  # 3: the chunk's level (Moment.vocab_level_bytes) by halving the chunk; other
            fields["loss_version"] = 3  # losses keep their keys
        text = json.dumps({**fields, "version": TRACE_VERSION}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Moment:
    """Activation bytes ``a0 + b (a1 s + a2 s^2)`` and the share of parameter gradients alive."""

    a0: float
    a1: float
    a2: float
    grad_share: float = 0.0  # gradients alive / all trainable-parameter gradients, at this moment
    vocab_bytes: float = 0.0  # of a1: bytes per vocabulary entry (the loss's logits and their gradients)
    # of a0: the chunked loss's one chunk of LOSS_CHUNK_TOKENS tokens, in bytes per vocabulary entry (what halving
    # the chunk takes off, twice: a weight's vocab-sized gradient stays out); a shorter micro-batch's chunk is its
    # own tokens (plan.memory)
    vocab_level_bytes: float = 0.0

    def bytes(self, batch: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.a0 + batch * (self.a1 * tokens + self.a2 * tokens**2)


@dataclass(frozen=True)
class ActivationProfile:
    """Traced activation memory of one model and training set-up (see module docstring)."""

    key: str
    moments: dict[str, Moment]
    written: Moment  # bytes of all activations/temporaries created in a step (memory traffic proxy)
    source: str  # "traced" | "formula (...)"
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "moments": {k: asdict(m) for k, m in self.moments.items()},
            "written": asdict(self.written),
            "source": self.source,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ActivationProfile:
        return cls(
            d["key"],
            {k: Moment(**m) for k, m in d["moments"].items()},
            Moment(**d["written"]),
            d["source"],
            tuple(d.get("notes", ())),
        )


_PROFILES: dict[str, ActivationProfile] = {}
SHIPPED = (
    Path(__file__).parent / "data" / "traces.json.gz"
)  # written by ship_profiles (tunebench calibrate --ship-traces)


def profile(structure: Structure, request: TraceRequest) -> ActivationProfile:
    """The activation profile of a request: in memory, on disk, shipped, else traced (seconds) and cached."""
    key = request.key
    if key in _PROFILES:
        return _PROFILES[key]
    path = cache_dir() / f"trace-{key}.json"
    try:
        result = ActivationProfile.from_dict(json.loads(path.read_text()))
        if _extrapolates_downward(result):
            raise ValueError("fitted before the slope and curvature were bounded at 0")
        if _untraced_experts(result):
            raise ValueError("the llama formula, cached when experts of this dtype could not be traced")
    except (OSError, ValueError, TypeError, KeyError):
        result = shipped_profiles().get(key)
        if result is None:
            with _tracing_notice(structure.name):
                result = _traced_or_formula(structure, request)
            write_json(path, result.to_dict())
    _PROFILES[key] = result
    return result


def _release(versions: str) -> str:
    """Library versions without torch's local build tag (2.13.0+cpu and 2.13.0+cu128 trace alike)."""
    return "-".join(part.split("_", 1)[0] if part[:1].isdigit() else part for part in versions.split("-"))


_shipped_off = threading.Event()  # set while without_shipped() runs


@contextmanager
def without_shipped() -> Iterator[None]:
    """Trace what the user's cache lacks even where a shipped profile exists (to ship them afresh)."""
    _shipped_off.set()
    _PROFILES.clear()
    try:
        yield
    finally:
        _shipped_off.clear()


def shipped_profiles() -> dict[str, ActivationProfile]:
    """The profiles shipped with the package, by key; none when they were traced with other library versions."""
    return {} if _shipped_off.is_set() else _load_shipped()


@functools.cache
def _load_shipped() -> dict[str, ActivationProfile]:
    try:
        data = json.loads(gzip.decompress(SHIPPED.read_bytes()))
        if _release(data["versions"]) != _release(library_versions()) or data["trace_version"] != TRACE_VERSION:
            return {}
        return {key: ActivationProfile.from_dict(d) for key, d in data["profiles"].items()}
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError):  # missing or damaged: trace
        log.warning("the shipped activation profiles in %s cannot be read: tracing instead", SHIPPED)
        return {}


def ship_profiles(profiles: Iterable[ActivationProfile], path: Path = SHIPPED) -> int:
    """Write profiles as the package's shipped set (replacing it); returns how many. Maintainers run it through
    ``tunebench calibrate --ship-traces`` after a change to tracing or to the calibration runs."""
    by_key = {p.key: p.to_dict() for p in profiles}
    data = {"versions": library_versions(), "trace_version": TRACE_VERSION, "profiles": dict(sorted(by_key.items()))}
    write_atomic(path, gzip.compress(json.dumps(data, sort_keys=True).encode(), mtime=0))
    _load_shipped.cache_clear()
    return len(by_key)


NOTICE_AFTER_S = 2.0  # a trace that takes longer than this is announced (a cached profile takes milliseconds)
_announced: set[str] = set()  # the models announced in this process: once each
_trace = threading.local()  # this thread's trace: its model, start, steps done and planned


@contextmanager
def _tracing_notice(name: str) -> Iterator[None]:
    """While a trace runs: once per model, at the first traced step that ends NOTICE_AFTER_S or more after
    the start, an INFO line on stderr saying what is traced and about how long it takes in all (the time
    per step so far times the steps planned)."""
    _trace.state = {"name": name, "started": time.monotonic(), "done": 0, "planned": 0}
    try:
        yield
    finally:
        _trace.state = None


def _count_step(planned: int = 0) -> None:
    """A traced step is done (planned > 0: that many steps are planned from now on, none done)."""
    state = getattr(_trace, "state", None)
    if state is None:
        return
    if planned:
        state["planned"] = state["done"] + planned
        return
    state["done"] += 1
    elapsed = time.monotonic() - state["started"]
    if elapsed >= NOTICE_AFTER_S and state["name"] not in _announced:
        _announced.add(state["name"])
        total = elapsed / state["done"] * max(state["planned"], state["done"])
        log.info("tracing %s (first plan of this architecture, ~%.0f s)", state["name"], total)


def _traced_or_formula(structure: Structure, request: TraceRequest) -> ActivationProfile:
    """Trace; a model whose code rejects the flash-attention proxy is traced with sdpa, then eager; a
    model that cannot be traced at all gets the llama formula, with a note saying so."""
    from dataclasses import replace

    fallbacks = {"flash": ("flash", "sdpa", "eager"), "sdpa": ("sdpa", "eager")}.get(request.attention, ("eager",))
    error: Exception | None = None
    for attention in fallbacks:
        try:
            result = trace_profile(structure, replace(request, attention=attention))
        except InputError:
            raise
        except Exception as exc:  # an exotic model the tracer cannot run this way
            error = error or exc
            continue
        if attention != request.attention:
            note = (
                f"{structure.model_type} cannot be traced with {request.attention} attention: traced with {attention}"
            )
            result = ActivationProfile(
                request.key, result.moments, result.written, result.source, (*result.notes, note)
            )
        return result
    log.warning("tracing %s failed (%s): activations from the llama formula", structure.name, error)
    return formula_profile(structure, request, f"{type(error).__name__}: {str(error)[:200]}")


# --- extrapolation ------------------------------------------------------------------------------------
def layer_plans(structure: Structure, first: str | None = None) -> tuple[list[tuple[str, ...]], dict[str, int]]:
    """Reduced models to trace (as layer-kind lists) and each kind's count in the full model.

    Uniform models: 1 and 2 layers. Models whose config lists layer_types (hybrid Mamba/attention,
    sliding/full attention): the base kind b alone (the first kind, unless `first` says which), (b, b), and
    for every other kind k, (b, k) (k the last layer) and (b, k, b) (k between two); and (k0, b) when the
    first layer's kind k0 is not b (k0 the first layer): see extrapolate.
    """
    if not structure.layer_kinds:
        return [("layer",), ("layer", "layer")], {"layer": structure.layers}
    kinds = [k for k, _ in structure.layer_kinds]
    base = first or kinds[0]
    others = [k for k in kinds if k != base]
    plans = [(base,), (base, base), *[(base, k) for k in others], *[(base, k, base) for k in others]]
    if structure.layer_types and structure.layer_types[0] != base:
        plans.append((structure.layer_types[0], base))
    return plans, dict(structure.layer_kinds)


def extrapolate(
    plans: list[tuple[str, ...]],
    counts: dict[str, int],
    values: list[float],
    last: str | None = None,
    at: str = "last",
    first: str | None = None,
) -> float:
    """A quantity of the full model from its values on the reduced models (plans and counts from layer_plans).

    At a moment of the step each layer holds what it keeps, s(kind), except one that is working and holds its
    working set as well: the last layer (at="last": the loss's peak, the backward of the last layer, where
    backward starts), or the first (at="first": its backward, then the embeddings'). value(plan) = c + sum
    over its layers but the working one of s(kind) + x(working layer's kind). With v(plan) the traced values
    and b the base kind: s(b) = v(b, b) - v(b); at="last": s(k) = v(b, k, b) - v(b, b) and x(k) - x(b) =
    v(b, k) - v(b) - s(b); at="first": s(k) = v(b, k) - v(b) and x(k) - x(b) = v(k, b) - v(b) - s(b). A
    quantity that adds up over layers (gradients, bytes written) fits this with x(k) = s(k) + c'.

    counts: the layers of each kind that keep anything (keeping_layers). last, first: the full model's last
    and first working layers' kinds (None: b, as in a uniform model, where this is value(1) + (n - 1)
    increments).
    """
    v = dict(zip(plans, values, strict=True))
    base = plans[0][0]
    one = v[(base,)]
    saved_base = v[(base, base)] - one

    def saved(k: str) -> float:
        if k == base:
            return saved_base
        return v[(base, k, base)] - v[(base, base)] if at == "last" else v[(base, k)] - one

    working = (last if at == "last" else first) or base
    if working == base:
        extra = 0.0
    else:
        extra = v[(base, working) if at == "last" else (working, base)] - one - saved_base
    return one + sum(n * saved(k) for k, n in counts.items()) - saved(working) + extra


def extrapolate_layer_peak(
    plans: list[tuple[str, ...]],
    layer_types: tuple[str, ...],
    keeping: bool,
    forward: list[list[float]],
    backward: list[list[float]] | None = None,
) -> float:
    """The peak of a hybrid model's forward (or, given `backward`, its backward) inside its decoder layers: the
    largest, over its layers, of what the layers before one keep plus that layer's working set. With
    checkpointing each keeps only its input, and the layer with the largest working set sets the peak wherever
    it is; in backward the layers after it have freed theirs.

    forward[p][i], backward[p][i]: the peak of plan p while its layer i runs forward, backward. With b the base
    kind: what a layer keeps, s(b) and s(k), from the forward of the layer after it in (b, b) and (b, k, b);
    the working sets against b's, x(k) - x(b), from the second layer of (b, k) against that of (b, b); the
    level from the first layer of (b,) (forward: c + x(b)) or the second of (b, b) less s(b) (backward). The
    first layer with a backward is left out of the backward's largest: it is the first_layer moment.
    keeping: False where the layers before the first of the base kind keep nothing (keeping_layers); they
    have no backward, and their forward, with nothing kept before it, is left out.
    """
    f = dict(zip(plans, forward, strict=True))
    base = plans[0][0]
    s = {base: f[(base, base)][1] - f[(base, base)][0]}
    for k in {k for k in layer_types if k != base}:
        s[k] = f[(base, k, base)][2] - f[(base, k, base)][0] - s[base]
    w = f if backward is None else dict(zip(plans, backward, strict=True))  # the working sets' peaks
    x = {k: (w[(base, k)][1] - w[(base, base)][1] if k != base else 0.0) for k in s}
    level = f[(base,)][0] if backward is None else w[(base, base)][1] - s[base]
    start = 0 if keeping else layer_types.index(base)
    best, kept = -np.inf, 0.0
    for position, kind in enumerate(layer_types[start:]):
        if backward is None or position > 0:
            best = max(best, level + kept + x[kind])
        kept += s[kind]
    return float(best)


def keeping_layers(structure: Structure, counts: dict[str, int], base: str, request: TraceRequest) -> dict[str, int]:
    """Per kind, the layers that keep activations when the trace's base kind is `base`: all, unless `base`
    is not the first layer's kind (_trace_profile moves a LoRA's base off kinds none of its targets is in)
    and nothing makes the embeddings' output need a gradient: then the layers before the first of the base
    kind hold no adapter and nothing before them needs a gradient, so autograd saves nothing of theirs.
    With checkpointing transformers makes the input need one (activation_checkpointing_enable calls
    enable_input_require_grads for models that take input_ids), so every layer keeps its input."""
    if not structure.layer_types or structure.layer_types[0] == base:
        return counts
    if request.checkpointing or request.method != "lora":
        return counts
    counts = dict(counts)
    for kind in structure.layer_types[: structure.layer_types.index(base)]:
        counts[kind] -= 1
    return counts


def fit_tokens(lengths: tuple[int, ...], values: list[float], quadratic: bool) -> tuple[float, float, float]:
    """(a0, a1, a2) with value = a0 + a1 s + a2 s^2 through the traced lengths (least squares; a2 = 0
    unless the attention holds s^2 tensors). a1 and a2 are bounded at 0: more tokens never hold fewer
    bytes, and a negative slope or curvature (a hybrid model's layer plans combined by ``extrapolate``)
    would turn negative at the long sequences the profile is extrapolated to."""
    s = np.array(lengths, dtype=float)
    y = np.array(values, dtype=float)
    columns = np.stack([np.ones_like(s), s] + ([s**2] if quadratic else []), axis=1)
    a, *_ = np.linalg.lstsq(columns, y, rcond=None)
    scale = np.abs(columns).max(axis=0)  # each term at the longest traced length
    if (a[1:] * scale[1:] < -1e-9 * np.abs(y).max()).any():  # beyond rounding: least squares with a1, a2 >= 0
        from scipy.optimize import lsq_linear

        lower = [-np.inf] + [0.0] * (len(scale) - 1)
        a = lsq_linear(columns / scale, y, bounds=(lower, np.inf), method="bvls").x / scale
    return float(a[0]), float(a[1]), float(a[2]) if quadratic else 0.0


def _untraced_experts(p: ActivationProfile) -> bool:
    """A formula profile cached because grouped_mm's meta function refused fp32/fp16 experts (a user's cache,
    before _grouped_experts_of_any_dtype): retrace it."""
    return p.source == "formula" and any(GROUPED_MM_BF16_ONLY in note for note in p.notes)


def _extrapolates_downward(p: ActivationProfile) -> bool:
    """A profile fitted before fit_tokens bounded the slope and curvature at 0 (a user's cache): retrace it.
    Relative to the moment's size at the longest traced length, and looser (1e-6) than fit_tokens' own
    rounding allowance (1e-9), so a profile fitted now is never traced again."""
    s = SEQUENCE_LENGTHS[-1]

    def downward(m: Moment) -> bool:
        size = abs(m.a0) + abs(m.a1) * s + abs(m.a2) * s**2
        return min(m.a1 * s, m.a2 * s**2) < -1e-6 * size

    return any(downward(m) for m in (*p.moments.values(), p.written))


def trace_profile(structure: Structure, request: TraceRequest) -> ActivationProfile:
    """Trace the reduced models at SEQUENCE_LENGTHS and extrapolate (see module docstring)."""
    with quiet():
        return _trace_profile(structure, request)


def _trace_profile(structure: Structure, request: TraceRequest) -> ActivationProfile:
    # LoRA needs a target in every reduced model: a hybrid's layer kind without one (a Mamba layer for
    # q_proj) cannot be traced alone, so the first kind that can is the base
    kinds = [k for k, _ in structure.layer_kinds] or [None]
    for i, first in enumerate(kinds):
        try:
            return _trace_with_base(structure, request, first)
        except ValueError as exc:
            if "not found in the base model" not in str(exc) or i == len(kinds) - 1:
                raise
    raise AssertionError("unreachable")


def _trace_with_base(structure: Structure, request: TraceRequest, first: str | None) -> ActivationProfile:
    plans, counts = layer_plans(structure, first)
    types, base = structure.layer_types, plans[0][0]
    keeping = keeping_layers(structure, counts, base, request)
    all_keep = keeping == counts
    if not all_keep:  # the first layer with a backward is of the base kind: no (k0, b) to trace
        plans = [plan for plan in plans if plan[0] == base]
    lengths = _lengths(structure)
    # the chunked loss's one chunk is in the level where the shortest traced length holds it whole (a small position
    # limit traces shorter: the chunk grows with the tokens, in the slope)
    chunked = request.loss == "chunked" and lengths[0] >= LOSS_CHUNK_TOKENS
    _count_step(planned=len(plans) * len(lengths) + 2 + chunked)  # + the half-vocabulary and half-chunk steps below
    measured = [[_counted(trace_step(structure, request, plan, s)) for s in lengths] for plan in plans]
    quadratic = request.attention != "flash"  # eager scores and materialised masks grow with s^2
    half = structure.vocab // 2
    # the loss's bytes per vocabulary entry per token: the slope over two lengths with half the vocabulary
    # against the full one (a token-independent vocabulary-sized buffer, such as one chunk of a chunked
    # loss, changes the level, not the slope)
    half_vocab = [
        _counted(trace_step(structure, request, plans[0], s, vocab=structure.vocab - half)) for s in lengths[:2]
    ]
    span = lengths[1] - lengths[0]
    half_chunk = None
    if chunked:
        half_chunk = _counted(trace_step(structure, request, plans[0], lengths[0], chunk_tokens=LOSS_CHUNK_TOKENS // 2))

    last = types[-1] if types else None
    first = (types[0] if all_keep else base) if types else None  # the first layer with a backward

    def full(quantity, i: int, at: str = "last", layers: dict[str, int] = counts) -> float:
        """A quantity of the full model at lengths[i]."""
        values = [quantity(measured[p][i]) for p in range(len(plans))]
        return extrapolate(plans, layers, values, last, at, first)

    def layer_peak(direction: str, i: int) -> float:
        """A hybrid's peak at lengths[i] inside its layers' forward or backward (extrapolate_layer_peak); a
        layer that keeps nothing has no backward (its peak reads 0, and is not used)."""
        fwd = [[measured[p][i][f"forward_layer{j}"][0] for j in range(len(plan))] for p, plan in enumerate(plans)]
        if direction == "forward":
            return extrapolate_layer_peak(plans, types, all_keep, fwd)
        bwd = [
            [measured[p][i].get(f"backward_layer{j}", (0, 0))[0] for j in range(len(plan))]
            for p, plan in enumerate(plans)
        ]
        return extrapolate_layer_peak(plans, types, all_keep, fwd, bwd)

    moments = {}
    for m in MOMENTS:
        at = "first" if m in ("first_layer", "tail") else "last"  # the layer that works at this moment
        layers_win = False
        if m == "forward" and types:  # the head's forward (every layer keeps what it saved) or a layer's
            rest = [full(lambda r: r["forward_rest"][0], i, "last", keeping) for i in range(len(lengths))]
            inside = [layer_peak("forward", i) for i in range(len(lengths))]
            acts = [max(a, b) for a, b in zip(rest, inside, strict=True)]
            layers_win = inside[-1] > rest[-1]  # then no logits are in the peak (memory.py's loss paths)
        elif m == "last_layer" and types:  # the last layer's backward, or an earlier one's with a larger working set
            acts = [
                max(full(lambda r, m=m: r[m][0], i, at, keeping), layer_peak("backward", i))
                for i in range(len(lengths))
            ]
        else:
            acts = [full(lambda r, m=m: r[m][0], i, at, keeping) for i in range(len(lengths))]
        alive, total = full(lambda r, m=m: r[m][1], 1, at), full(lambda r: r["grads"], 1)
        slope_full = (measured[0][1][m][0] - measured[0][0][m][0]) / span
        slope_half = (half_vocab[1][m][0] - half_vocab[0][m][0]) / span
        vocab = (slope_full - slope_half) / half if half and not layers_win else 0.0
        # the chunked loss's one chunk, per vocabulary entry: what halving the chunk takes off, twice (the step at
        # lengths[0] holds one full chunk); a weight's vocab-sized gradient
        # (the embedding's, the output layer's) is the same at either chunk size and stays out of it
        level = 0.0
        if half_chunk is not None and not layers_win:
            level = 2 * (measured[0][0][m][0] - half_chunk[m][0]) / structure.vocab
        moments[m] = Moment(
            *fit_tokens(lengths, acts, quadratic),
            grad_share=float(np.clip(alive / total, 0, 1)) if total else 0.0,
            vocab_bytes=max(0.0, vocab),
            vocab_level_bytes=max(0.0, level),
        )
    written = Moment(*fit_tokens(lengths, [full(lambda r: r["written"], i) for i in range(len(lengths))], quadratic))
    return ActivationProfile(request.key, moments, written, "traced")


def _counted(step: dict[str, Any]) -> dict[str, Any]:
    _count_step()
    return step


def _lengths(structure: Structure) -> tuple[int, ...]:
    """Traced sequence lengths, within the model's position limit (learned position embeddings)."""
    limit = structure.max_position or SEQUENCE_LENGTHS[-1]
    if limit >= SEQUENCE_LENGTHS[-1]:
        return SEQUENCE_LENGTHS
    top = max(8, int(limit))
    return (top // 4, top // 2, top)


def formula_profile(structure: Structure, request: TraceRequest, why: str) -> ActivationProfile:
    """Fallback when a model cannot be traced: the llama-style per-token widths (estimation.md §4.2).

    Per layer per token, 16-bit: 2 (7h + 2 h_kv + 4 i) bytes without checkpointing, 2h with it (+ one
    layer's working set); the loss 6 bytes per vocabulary entry (bf16 logits + fp32 upcast and gradient).
    """
    h, kv, layers = structure.hidden, structure.kv_heads * structure.head_dim, structure.layers
    width = max(
        1, structure.hidden * 4 if not structure.layers else structure.layer_params // max(1, layers) // max(1, h)
    )
    layer = 2 * (7 * h + 2 * kv + 4 * width)
    per_token = (2 * h * layers + layer) if request.checkpointing else layer * layers
    peak = Moment(0.0, per_token + 6.0 * structure.vocab, 0.0, 0.0, vocab_bytes=6.0)
    return ActivationProfile(
        request.key,
        {m: peak for m in MOMENTS},
        Moment(0.0, layer * layers, 0.0),
        "formula",
        (f"tracing failed ({why}); activations from the llama formula",),
    )


# --- one traced step ---------------------------------------------------------------------------------
def trace_step(
    structure: Structure,
    request: TraceRequest,
    plan: tuple[str, ...],
    length: int,
    vocab: int | None = None,
    chunk_tokens: int | None = None,
) -> dict[str, Any]:
    """Forward + backward of the reduced model on fake tensors: the two moments, gradients, bytes written.
    chunk_tokens: the chunked loss's chunk (None: the worker's, LOSS_CHUNK_TOKENS)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = _reduced_model(structure, request, plan, vocab, chunk_tokens)
    layers = _decoder_layer_list(model, len(plan))
    tracker = _tracker_class()(layers)
    with FakeTensorMode(allow_non_fake_inputs=True):
        _to_fake_empty(model)
        v = vocab or structure.vocab
        ids = torch.randint(0, v, (1, length))
        kwargs: dict[str, Any] = {"input_ids": ids, "labels": ids}
        if request.attention != "flash":
            kwargs["attention_mask"] = torch.ones(1, length, dtype=torch.long)
        autocast = (
            torch.autocast("cpu", dtype=torch.bfloat16)
            if request.autocast  # fp16: same bytes as bf16
            else torch.autocast("cpu", enabled=False)
        )
        # the backward recomputes checkpointed layers
        with tracker, _mamba_kernel(model, request.mamba_kernel), _grouped_experts_of_any_dtype():
            with autocast:
                loss = model(**kwargs).loss
            loss.backward()
            del loss
        grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {**tracker.moments, "grads": grads, "written": tracker.written}


def _to_fake_empty(model: Any) -> None:
    """Module.to_empty(device="cpu") under a FakeTensorMode, one new tensor per distinct parameter or buffer.

    to_empty swaps each parameter in place (torch.utils.swap_tensors, since the new one is a FakeTensor);
    a tied parameter (an output layer sharing the embedding, prompt tuning's copy of it) is visited twice,
    and the second swap fails ("Cannot swap t1 because it has weakref associated with it") whenever the
    fake mode's memo of the first swap is still alive, which depends on the garbage collector: the trace then
    fell back to another attention implementation at random. Here tied tensors stay tied, swapped once."""
    import torch

    new: dict[int, Any] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in new:
                    new[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="cpu"), requires_grad=p.requires_grad)
                module._parameters[name] = new[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                if id(b) not in new:
                    new[id(b)] = torch.empty_like(b, device="cpu")
                module._buffers[name] = new[id(b)]


def _reduced_model(
    structure: Structure,
    request: TraceRequest,
    plan: tuple[str, ...],
    vocab: int | None,
    chunk_tokens: int | None = None,
):
    """The model cut to the plan's layers, on the meta device, prepared as the worker prepares it."""
    import torch
    from transformers import AutoModelForCausalLM

    from tunebench.plan.config import ModelConfig, hf_config

    config = ModelConfig(structure.name, structure.config, structure.builder, structure.assumptions)
    overrides: dict[str, Any] = {"num_hidden_layers": len(plan)}
    text_key = "text_config" if "text_config" in config.data else None
    if structure.layer_kinds:
        overrides["layer_types"] = list(plan)
    if vocab:  # the loss trace: a smaller vocabulary (special token ids may lie beyond it)
        overrides.update(vocab_size=vocab, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    if text_key:  # vision-language model: trace its language model (the vision tower is accounted separately)
        text = dict(config.data[text_key])
        text.setdefault("model_type", "llama")
        config = ModelConfig(config.name, text, config.builder, config.assumptions)
    hf = hf_config(config, **overrides)
    hf._attn_implementation = _attention_name(request.attention)
    # fp16 is traced as bf16: the same bytes, and CPU kernels (grouped MoE matmuls) that take only bf16
    dtype = torch.bfloat16 if request.dtype == "float16" else getattr(torch, request.dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype, attn_implementation=hf._attn_implementation)
    if request.loss in ("chunked", "model_dtype"):  # the measuring worker's loss functions, traced as they run
        from tunebench.training.loss import apply, causal_lm, chunked_causal_lm_loss

        apply(model, request.loss, on_gpu=False)
        if request.loss == "chunked" and chunk_tokens:  # another chunk size: what one chunk holds (_trace_with_base)
            causal_lm(model).loss_function = functools.partial(chunked_causal_lm_loss, chunk_tokens=chunk_tokens)
    if request.kbit_upcast:
        _upcast_like_kbit(model)
    if request.liger:
        _liger_layers(model)
    if request.method == "full":
        model.requires_grad_(True)
    else:
        model = _peft(model, request)
        if request.fused_lora:
            _foak_lora_layers(model)
    if request.checkpointing:
        kwargs: dict[str, Any] = {"use_reentrant": request.reentrant}
        if request.selective:
            kwargs = {"use_reentrant": False, "context_fn": selective_checkpoint_context}
        enable_checkpointing(model, kwargs)
        if request.reentrant and request.method != "full":
            model.enable_input_require_grads()  # what transformers Trainer / peft do for reentrant checkpoints
    model.train()
    return model


# --- Liger-Kernel's layer kernels, as autograd sees them (liger_kernel/ops rms_norm.py, rope.py, swiglu.py) --
# Triton kernels do not run on fake tensors: these functions allocate and save what the kernels do and
# compute nothing. apply_liger_kernel_to_* swaps the model's RMSNorm class and its SiLU-gated MLP's forward
# (the same swaps are made here) and its apply_rotary_pos_emb, whose in-place rotation keeps what
# transformers' keeps (cos and sin: q * cos and rotate_half(q) * sin save only those), so it is not swapped.
# Model types whose apply_liger_kernel_to_* swaps in LigerRMSNorm (plain, offset 0) and, for SiLU-gated MLPs
# with gate_proj / up_proj, LigerSwiGLUMLP by default (liger_kernel/transformers/monkey_patch.py,
# MODEL_TYPE_TO_APPLY_LIGER_FN). Not here: the Gemma family (RMSNorm with offset 1, GeGLU), which the
# stand-ins do not model; any other type, which liger_kernels leaves as transformers runs it.
LIGER_LAYER_MODELS = ("llama", "mistral", "ministral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "granite", "olmo2",
                      "olmo3", "smollm3", "phi3")  # fmt: skip


def _liger_layers(model) -> None:
    """LigerRMSNorm for every RMSNorm (saves the input, the weight and one fp32 reciprocal RMS per row; a new
    output in the input's dtype) and LigerSiLUMulFunction in every SiLU-gated MLP (saves the gate and up
    projections' outputs, never silu(gate) or the product; its backward writes their gradients over them)."""
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
            module.forward = functools.partial(_liger_rms_forward, module)
        gated = all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj"))
        if gated and getattr(getattr(module, "config", None), "hidden_act", None) in ("silu", "swish"):
            module.forward = functools.partial(_liger_swiglu_forward, module)


def _liger_rms_forward(module, x):
    return _liger_functions()[0].apply(x, module.weight)


def _liger_swiglu_forward(module, x):
    return module.down_proj(_liger_functions()[1].apply(module.gate_proj(x), module.up_proj(x)))


@functools.cache
def _liger_functions():
    import torch

    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight):
            ctx.save_for_backward(x, weight, x.new_empty(x.shape[:-1], dtype=torch.float32))
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, dy):  # in_place (the default): the input's gradient over the incoming one
            weight = ctx.saved_tensors[1]
            return dy, torch.empty_like(weight) if ctx.needs_input_grad[1] else None

    class SiLUMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, dc):
            a, b = ctx.saved_tensors
            return a.detach(), b.detach()  # written over the saved inputs

    return RMSNorm, SiLUMul


# --- mamba_ssm's fused Mamba-2 layer, as autograd sees it (mamba_ssm/ops/triton/ssd_combined.py) --------------
# In training, transformers' Mamba-2 layers hand the in_proj output (zxbcdt) to mamba_split_conv1d_scan_combined
# when mamba_ssm is installed (and causal-conv1d; integrations/hub_kernels.py
# use_kernel_func_from_hub_with_fallback), else run the torch scan, which keeps every chunk's decay matrices
# for backward. The kernel (MambaSplitConv1dScanCombinedFn) saves only zxbcdt, the scan's output before the
# gated norm (out_x), the norm's fp32 reciprocal RMS and, under autocast, out_proj's weight cast to 16 bits, and
# recomputes the convolution in backward. The stand-in allocates what it allocates and saves what it saves,
# and computes nothing. Forward: the convolved x, B, C; _mamba_chunk_scan_combined_fwd's dt and its cumulative
# sum (fp32, per head and token), the chunk states (fp32, chunks x heads x head_dim x d_state), freed once
# passed (in C's dtype), C^T B per chunk (fp32, chunk x chunk per group), out_x; the gated RMSNorm's output
# and rstd; out_proj's output. Backward: the recomputed norm output and convolution, the gradients of zxbcdt
# (dz is a view of it) and of xBC, out_proj's input gradient, the norm's input gradient, and
# _mamba_chunk_scan_combined_bwd's recomputed dt, cumsum, chunk and passed states (fp32), C^T B and its
# gradient, the states' gradients (fp32 and in C's dtype), xBC transposed for the convolution's backward; then the
# weights' gradients.
MAMBA2_KERNEL_MODELS = ("bamba", "falcon_h1", "granitemoehybrid", "mamba2", "nemotron_h", "zamba2")  # models whose
# transformers code calls mamba2_split_conv1d_scan_combined in training
MAMBA2_KERNEL = "mamba2_split_conv1d_scan_combined"


# --- fused MoE experts in fp32 or fp16 (transformers integrations/moe.py _grouped_mm) ----------------------------
# torch's grouped_mm runs any dtype (CUDA and CPU fall back to one matmul per expert where the fused kernel takes
# bf16 only: aten/src/ATen/native/cuda/GroupedBlas.cpp), but its meta function, which fake tensors run, checks
# for bf16 (torch/_meta_registrations.py _meta_grouped_mm_common): an fp32 MoE model failed to trace and got the
# llama formula, with a traceback printed. transformers' own fallback op (transformers::grouped_mm_fallback)
# allocates the same output and gradients and saves the same input and weight for backward.
GROUPED_MM_BF16_ONLY = "Expected inputs of BF16 type"  # the meta function's complaint


@contextmanager
def _grouped_experts_of_any_dtype() -> Iterator[None]:
    """While the step runs: experts whose weights are not bf16 take transformers' grouped_mm_fallback op."""
    import torch

    try:
        from transformers.integrations import moe
    except ImportError:  # a transformers without fused experts: nothing to route
        yield
        return
    original = getattr(moe, "_can_use_grouped_mm", None)
    if original is None:  # a release without the check (private name): its experts trace as they are
        yield
        return

    def can_use(input, weight, offs) -> bool:
        return weight.dtype == torch.bfloat16 and original(input, weight, offs)

    moe._can_use_grouped_mm = can_use
    try:
        yield
    finally:
        moe._can_use_grouped_mm = original


@contextmanager
def _mamba_kernel(model, on: bool) -> Iterator[None]:
    """While the step runs: the model's module-level mamba2_split_conv1d_scan_combined is the stand-in."""
    import sys

    modules = {sys.modules[type(m).__module__] for m in model.modules()} if on else set()
    patched = [(mod, getattr(mod, MAMBA2_KERNEL)) for mod in modules if hasattr(mod, MAMBA2_KERNEL)]
    for mod, _ in patched:
        setattr(mod, MAMBA2_KERNEL, _mamba_split_conv1d_scan_combined)
    try:
        yield
    finally:
        for mod, original in patched:
            setattr(mod, MAMBA2_KERNEL, original)


def _mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, **kwargs):
    shape = (kwargs.get("headdim"), kwargs.get("ngroups", 1), chunk_size)
    weights = (kwargs.get("rmsnorm_weight"), kwargs.get("outproj_weight"), kwargs.get("outproj_bias"))
    return _mamba_function().apply(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, *weights, shape)


@functools.cache
def _mamba_function():
    import torch

    def sizes(zxbcdt, conv1d_weight, D, shape):
        headdim, groups, chunk = shape
        batch, length, _ = zxbcdt.shape
        heads = D.shape[0]
        dim = heads * headdim
        state = (conv1d_weight.shape[0] - dim) // groups // 2
        chunks = -(-length // chunk)
        return batch, length, heads, headdim, dim, groups, state, chunks, chunk

    class MambaSplitConv1dScanCombined(torch.autograd.Function):
        @staticmethod
        def forward(ctx, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, norm_w, out_w, out_b, shape):
            batch, length, heads, headdim, dim, groups, state, chunks, chunk = sizes(zxbcdt, conv1d_weight, D, shape)
            f32, new = torch.float32, zxbcdt.new_empty
            xbc = new(batch, length, conv1d_weight.shape[0])  # convolved x, B, C
            dt = [new(batch, heads, chunks, chunk, dtype=f32) for _ in range(2)]  # dt (softplus), its cumsum
            states = new(batch, chunks, heads, headdim, state, dtype=f32)  # _chunk_state_fwd
            passed = new(batch, chunks, heads, headdim * state)  # _state_passing_fwd (out_dtype: C's)
            del states
            cb = new(batch, chunks, groups, chunk, chunk, dtype=f32)  # _bmm_chunk_fwd: C^T B
            out_x = new(batch, length, dim)  # the scan's output, saved
            rstd = new(groups * batch * length, dtype=f32)  # the gated RMSNorm's, saved
            normed = new(batch, length, dim)
            proj_w = out_w
            if out_w is not None and torch.is_autocast_enabled("cpu"):  # the trace's autocast (the kernel: CUDA's)
                dtype = torch.get_autocast_dtype("cpu")
                normed, proj_w = normed.to(dtype), out_w.to(dtype)  # the cast weight is saved for backward
            out = normed @ proj_w.t() if proj_w is not None else normed
            del xbc, dt, passed, cb, normed
            ctx.shape = shape
            ctx.save_for_backward(
                zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, out_x, rstd, norm_w, out_w, proj_w, out_b
            )
            return out

        @staticmethod
        def backward(ctx, dout):
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, out_x, rstd, norm_w, out_w, proj_w, out_b = (
                ctx.saved_tensors
            )
            batch, length, heads, headdim, dim, groups, state, chunks, chunk = sizes(
                zxbcdt, conv1d_weight, D, ctx.shape
            )
            f32, new = torch.float32, zxbcdt.new_empty
            recomputed = new(batch, length, dim)  # the norm's output again, for out_proj's weight gradient
            xbc = new(batch, length, conv1d_weight.shape[0])  # the convolution again
            dzxbcdt = torch.empty_like(zxbcdt)  # returned; dz is a view of it
            dxbc = new(batch, length, conv1d_weight.shape[0])
            dnormed = dout @ proj_w.to(dout.dtype) if proj_w is not None else dout
            dscan = new(batch, length, dim)  # the norm's input gradient
            # _mamba_chunk_scan_combined_bwd: dt and its cumsum, chunk states and passed states (fp32 here),
            # C^T B and its gradient, the states' gradients (fp32, then in C's dtype)
            held = [new(batch, heads, chunks, chunk, dtype=f32) for _ in range(2)]
            held += [new(batch, chunks, heads, headdim, state, dtype=f32) for _ in range(3)]
            held += [new(batch, chunks, groups, chunk, chunk, dtype=f32) for _ in range(2)]
            held.append(new(batch, chunks, heads, headdim, state))
            held += [new(batch, conv1d_weight.shape[0], length) for _ in range(2)]  # xBC "b d s" for the conv
            grads = [
                torch.empty_like(t) if t is not None else None for t in (conv1d_weight, conv1d_bias, dt_bias, A, D)
            ]
            dnorm_w = torch.empty_like(norm_w) if norm_w is not None else None
            dout_w = torch.empty_like(out_w) if out_w is not None else None
            dout_b = torch.empty_like(out_b) if out_b is not None else None
            del recomputed, xbc, dxbc, dnormed, dscan, held
            return dzxbcdt, *grads, dnorm_w, dout_w, dout_b, None

    return MambaSplitConv1dScanCombined


# --- fms-acceleration-foak's fused LoRA ops, as autograd sees them (fused_ops/unsloth_lora/{bnb,gptq}/fast_lora.py) -
# foak swaps the forward of adapted projections on a 4-bit base (models/llama.py rules "llama-qkvo", "llama-mlp";
# models/utils.py build_lora_fused_ops): q, k and v in one op when all three are adapted (LoRA_QKV), o alone
# (LoRA_W), gate, up and down in one op when all three are adapted (LoRA_MLP). Each op is an autograd function:
# it saves its input and, per adapted projection, the dropped-out input in the input's dtype (dropout is applied
# inside, so no mask is kept), where peft keeps an fp32 dropped copy and a mask per projection; LoRA_MLP saves
# the gate and up outputs and never their SwiGLU product. In the backward LoRA_QKV and LoRA_MLP write the input's
# gradient over the saved input (torch.matmul(..., out=X)); LoRA_MLP first computes the down projection's input
# gradient (intermediate size) and overwrites the gate and up outputs with theirs. The stand-ins below allocate
# and save the same and compute nothing. Model types with those rules (models/__init__.py):
FOAK_LORA_MODELS = ("llama", "mistral", "mixtral", "granite", "granitemoe", "granitemoeshared")


def _is_lora(module) -> bool:
    return module is not None and all(hasattr(module, n) for n in ("lora_A", "lora_B", "base_layer"))


def _adapter(module) -> tuple[Any, Any, bool]:
    """(lora_A weight, lora_B weight, dropout on) of a peft LoRA layer's default adapter."""
    import torch

    dropout = module.lora_dropout["default"]
    on = isinstance(dropout, torch.nn.Dropout) and dropout.p > 0
    return module.lora_A["default"].weight, module.lora_B["default"].weight, on


def _foak_lora_layers(model) -> None:
    """foak's fused LoRA ops in place of peft's adapted q/k/v, o and gate/up/down projections (see above)."""
    for module in model.modules():
        qkv = [getattr(module, n, None) for n in ("q_proj", "k_proj", "v_proj")]
        if all(_is_lora(m) for m in qkv):
            _fuse_qkv(qkv)
        o = getattr(module, "o_proj", None)
        if _is_lora(o):
            o.forward = functools.partial(_foak_o_forward, o)
        mlp = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if all(_is_lora(m) for m in mlp):
            module.forward = functools.partial(_foak_mlp_forward, mlp)


def _fuse_qkv(projections: list) -> None:
    """q, k and v computed by one op on the first call, handed out one per call (build_lora_fused_ops)."""
    pending: dict[int, Any] = {}

    def forward(index: int, x):
        if not pending:
            adapters = [_adapter(p) for p in projections]
            sizes = tuple(p.base_layer.out_features for p in projections)
            flat = [w for a, b, _ in adapters for w in (a, b)]
            pending.update(enumerate(_foak_functions()[0].apply(x, sizes, adapters[0][2], *flat)))
        return pending.pop(index)

    for i, p in enumerate(projections):
        p.forward = functools.partial(forward, i)


def _foak_o_forward(module, x):
    a, b, dropout = _adapter(module)
    return _foak_functions()[1].apply(x, module.base_layer.out_features, dropout, a, b)


def _foak_mlp_forward(projections: list, x):
    adapters = [_adapter(p) for p in projections]
    flat = [w for a, b, _ in adapters for w in (a, b)]
    sizes = (projections[0].base_layer.out_features, projections[2].base_layer.out_features)
    return _foak_functions()[2].apply(x, sizes, adapters[0][2], *flat)


@functools.cache
def _foak_functions():
    import torch

    def _grads(adapters):
        return tuple(torch.empty_like(w) for w in adapters)

    class QKV(torch.autograd.Function):  # LoRA_QKV
        @staticmethod
        def forward(ctx, x, sizes, dropout, *adapters):
            dropped = [torch.empty_like(x) if dropout else x for _ in sizes]
            ctx.save_for_backward(x, *dropped, *adapters)
            ctx.adapters = len(adapters)
            return tuple(x.new_empty(*x.shape[:-1], n) for n in sizes)

        @staticmethod
        def backward(ctx, *grads):
            saved = ctx.saved_tensors
            return (saved[0].detach(), None, None, *_grads(saved[-ctx.adapters :]))  # dX over X

    class Out(torch.autograd.Function):  # LoRA_W (the attention output projection)
        @staticmethod
        def forward(ctx, x, size, dropout, a, b):
            ctx.save_for_backward(x, torch.empty_like(x) if dropout else x, a, b)
            return x.new_empty(*x.shape[:-1], size)

        @staticmethod
        def backward(ctx, dy):
            x, _, a, b = ctx.saved_tensors
            return (torch.empty_like(x), None, None, *_grads((a, b)))  # dY @ W.t(): a new tensor

    class MLP(torch.autograd.Function):  # LoRA_MLP
        @staticmethod
        def forward(ctx, x, sizes, dropout, *adapters):
            intermediate, hidden = sizes
            e = x.new_empty(*x.shape[:-1], intermediate)
            g = torch.empty_like(e)
            h = torch.empty_like(e)  # the SwiGLU product: the down projection's input, not kept
            dropped = (torch.empty_like(x), torch.empty_like(x), torch.empty_like(h)) if dropout else (x, x, x)
            ctx.save_for_backward(x, e, g, *dropped, *adapters)
            ctx.adapters = len(adapters)
            return x.new_empty(*x.shape[:-1], hidden)

        @staticmethod
        def backward(ctx, dy):
            saved = ctx.saved_tensors
            dw = torch.empty_like(saved[1])  # the down projection's input gradient; then e and g in place
            del dw
            return (saved[0].detach(), None, None, *_grads(saved[-ctx.adapters :]))  # dX over X

    return QKV, Out, MLP


def selective_checkpoint_context():
    """torchtitan's op-level selective activation checkpointing policy (torchtitan
    models/llama3/infra/parallelize.py, _apply_ac_to_transformer_block, mode "selective", option "op"):
    keep the outputs of matmuls (every second one recomputed), attention kernels and max; recompute the
    element-wise rest. A fresh counter per checkpointed block, as torchtitan's context_fn makes."""
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten.max.default,
    }
    meta: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute_mm" if ctx.is_recompute else "forward_mm"
        if func == aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _upcast_like_kbit(model) -> None:
    """What a bitsandbytes 4-bit model prepared by peft's prepare_model_for_kbit_training computes with.

    peft casts every parameter that is not 4-bit (embeddings, norms, the output layer) to fp32, so the
    residual stream runs in fp32; bitsandbytes' Linear4bit casts its input to the compute dtype (bf16)
    and its output back to the input's dtype (bitsandbytes nn/modules.py Linear4bit.forward). The
    16-bit linears here stand in for the 4-bit ones, with the same casts.
    """
    import torch

    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    # fused MoE experts (3-D weights) are quantised like linears (structure.quantized_params)
    experts = [m for m in model.modules() if any(p.ndim == 3 for p in m.parameters(recurse=False))]
    quantized = {id(p) for m in linears for p in m.parameters(recurse=False)}
    quantized |= {id(p) for m in experts for p in m.parameters(recurse=False) if p.ndim == 3}
    for p in model.parameters():
        if id(p) not in quantized and p.dtype in (torch.float16, torch.bfloat16):
            p.data = p.data.to(torch.float32)
    for m in (*linears, *experts):
        m._tb_compute_dtype = next(p.dtype for p in m.parameters(recurse=False) if id(p) in quantized)
        m.register_forward_pre_hook(_to_weight_dtype, with_kwargs=True)
        m.register_forward_hook(_to_input_dtype, with_kwargs=True)


def _to_weight_dtype(module, args, kwargs):
    x = args[0]
    module._tb_input_dtype = x.dtype  # restored on the output, as Linear4bit does
    return (x.to(module._tb_compute_dtype), *args[1:]), kwargs


def _to_input_dtype(module, args, kwargs, output):
    return output.to(module._tb_input_dtype)


def _decoder_layer_list(model, n: int) -> list:
    """The reduced model's decoder layers (the ModuleList of n layers; see structure._decoder_layers)."""
    from tunebench.plan.meta_model import _decoder_layers

    return _decoder_layers(model, n)[1]


def _peft(model, request: TraceRequest):
    import peft

    if request.method == "pt":
        cfg = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=request.virtual_tokens)
    else:
        targets = request.target_modules
        cfg = peft.LoraConfig(
            r=TRACE_RANK,
            lora_alpha=16,
            lora_dropout=0.05 if request.lora_dropout else 0.0,
            bias="none",
            task_type="CAUSAL_LM",
            target_modules=list(targets) if isinstance(targets, tuple) else targets,
        )
    # peft upcasts 16-bit adapter weights to fp32 unless asked not to (get_peft_model autocast_adapter_dtype)
    return peft.get_peft_model(model, cfg, autocast_adapter_dtype=request.adapter_dtype == "float32")


def _attention_name(attention: str) -> str:
    if attention == "flash":
        _register_unmasked_attention()
        return UNMASKED
    return attention


@functools.cache
def _register_unmasked_attention() -> None:
    """Register the flash-attention-2 proxy with transformers (attention + mask functions)."""
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        # FA2 keeps the output and a fp32 log-sum-exp per head and token, never the score matrix:
        # PyTorch's flash SDPA kernel does the same, and grouped K/V heads are not repeated.
        gqa = key.shape[1] != query.shape[1]
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa
        )
        return out.transpose(1, 2).contiguous(), None

    def no_mask(*args, **kwargs):
        return None

    AttentionInterface.register(UNMASKED, attention)
    AttentionMaskInterface.register(UNMASKED, no_mask)


@functools.cache
def _tracker_class():  # over 60 lines: a class defined here so torch is imported only when tracing
    """MemTracker recording, per phase of the step, the activation peak and the gradients alive then."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _UpdateType

    acts = (_MemRefType.ACT, _MemRefType.TEMP, _MemRefType.OTH)

    class StepTracker(MemTracker):
        def __init__(self, layers) -> None:
            super().__init__()
            self.layers = list(layers)
            # phase -> (activation bytes, gradient bytes); also forward_layer<i> and backward_layer<i> (the forward
            # and the backward of the reduced model's layer i) and forward_rest (the forward outside the decoder
            # layers: embeddings, head)
            self.moments = {m: (0, 0) for m in MOMENTS}
            self.written = 0
            self.first_seen = self.last_seen = False

        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            # MemTracker hooks every parameter's gradient, which fails on frozen (PEFT) parameters
            param_mem = buffer_mem = 0
            for p in module.parameters():
                param_mem += sum(w.mem_consumed for w in self._update_and_maybe_create_winfos(p, _MemRefType.PARAM))
                if p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                    self._param_to_grad_hook_handles[p] = (
                        p.register_hook(self._grad_hook),
                        p.register_post_accumulate_grad_hook(self._post_grad_hook),
                    )
            for b in module.buffers():
                buffer_mem += sum(w.mem_consumed for w in self._update_and_maybe_create_winfos(b, _MemRefType.BUFFER))
            return param_mem, buffer_mem

        def _grad_hook(self, grad):
            self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

        def _post_grad_hook(self, param):
            self._update_and_maybe_create_winfos(param.grad, _MemRefType.GRAD)

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            if u_type == _UpdateType.ADD and winfo.reftype in acts:
                self.written += winfo.mem_consumed
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)

        def _phases(self) -> tuple[str, ...]:
            """The phase(s) the current operator belongs to (a one-layer model's layer is first and last)."""
            active = self._mod_tracker.parents
            i = next((i for i, m in enumerate(self.layers) if self._mod_tracker.get_known_fqn(m) in active), None)
            if not self._mod_tracker.is_bw:
                return ("forward", "forward_rest" if i is None else f"forward_layer{i}")
            each = () if i is None else (f"backward_layer{i}",)  # the backward of the reduced model's layer i
            if i == 0:
                self.first_seen = True
                return ("first_layer", "last_layer", *each) if len(self.layers) == 1 else ("first_layer", *each)
            if self.first_seen:
                return ("tail",)
            if i == len(self.layers) - 1:
                self.last_seen = True
                return ("last_layer", *each)
            return each if self.last_seen else ("head",)  # the layers in between: their own phase only

        def _update_peak_stats(self, peak_state) -> None:
            # called after every operator: only the per-phase peaks are kept (no per-module snapshots)
            for snap in self._curr_mem_snap.values():
                act = sum(snap[k] for k in acts)
                grad = snap[_MemRefType.GRAD]
                for phase in self._phases():
                    if act > self.moments.get(phase, (0, 0))[0]:
                        self.moments[phase] = (act, grad)

    return StepTracker
