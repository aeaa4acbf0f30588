"""Traced activation memory: the reduced-model extrapolation against tracing the whole (small) model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tunebench.catalog import get_model
from tunebench.plan.structure import structure_of
from tunebench.plan.trace import (
    MAMBA2_KERNEL_MODELS,
    MOMENTS,
    TraceRequest,
    extrapolate,
    extrapolate_layer_peak,
    fit_tokens,
    layer_plans,
    profile,
    trace_step,
)


def small_model(tmp_path, name: str, cfg: dict):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return structure_of(get_model(str(path)))


def request(s, method="lora", checkpointing=False, attention="flash", dtype="bfloat16", targets=("q_proj", "v_proj")):
    return TraceRequest(
        s.config_key,
        method,
        False,
        checkpointing,
        False,
        dtype,
        None,
        attention,
        targets if method == "lora" else None,
        method == "lora",
        0,
    )


LLAMA = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 6,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 8192}  # fmt: skip


@pytest.mark.parametrize(
    ("method", "checkpointing", "attention"),
    [
        ("lora", False, "flash"),
        ("lora", True, "flash"),
        ("full", False, "flash"),
        ("full", True, "sdpa"),
        ("lora", False, "eager"),
    ],
)
@pytest.mark.slow
def test_extrapolated_profile_equals_tracing_every_layer(tmp_path, method, checkpointing, attention):
    s = small_model(tmp_path, "llama", LLAMA)
    req = request(s, method, checkpointing, attention)
    p = profile(s, req)
    assert p.source == "traced"
    for length, batch in ((768, 1), (1536, 1)):
        whole = trace_step(s, req, ("layer",) * 6, length)
        for m in MOMENTS:
            predicted = float(p.moments[m].bytes(np.array(batch), np.array(length)))
            assert predicted == pytest.approx(whole[m][0], rel=0.02, abs=64 * 1024), (m, length)


HYBRID = {"model_type": "granitemoehybrid", "hidden_size": 64, "intermediate_size": 32, "shared_intermediate_size": 128,
          "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 500,
          "layer_types": ["mamba", "mamba", "attention", "mamba", "attention"], "num_local_experts": 0,
          "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_chunk_size": 64,
          "max_position_embeddings": 8192}  # fmt: skip


M, A = "mamba", "attention"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layer_types", "method", "checkpointing"),
    [
        ([M, M, A, M, A], "full", False),  # backward starts in an attention layer
        ([M, A, M, A, M], "full", False),  # ... in a Mamba layer
        ([M, M, A, M, A], "lora", False),  # base: attention (q_proj, v_proj); the Mamba layers before keep nothing
        ([A, M, M, A, M], "lora", True),  # checkpointed: the largest working set, not the last, sets the forward
        ([A, M, M, M, M, A], "full", True),
        ([M, M, A, M, M, M, M, A], "lora", True),  # checkpointed: the Mamba layers before the first adapter keep
    ],
)
def test_hybrid_layers_extrapolate_per_kind(tmp_path, layer_types, method, checkpointing):
    """Every moment of a Mamba/attention hybrid, extrapolated from 1- to 3-layer models, equals the whole
    model's: the working layer's kind (the last, or the first) is not an increment per layer, and with
    checkpointing the forward peaks in the layer with the largest working set."""
    cfg = {**HYBRID, "layer_types": layer_types, "num_hidden_layers": len(layer_types)}
    s = small_model(tmp_path, "hybrid", cfg)
    mamba = next(k for k in s.layer_types if "attention" not in k or k.startswith("linear"))  # transformers' names
    attention = next(k for k in s.layer_types if k != mamba)
    kinds = tuple(mamba if k == M else attention for k in layer_types)
    assert s.layer_types == kinds and dict(s.layer_kinds) == {
        mamba: layer_types.count(M),
        attention: layer_types.count(A),
    }
    req = request(s, method, checkpointing=checkpointing)
    p = profile(s, req)
    # without checkpointing, a LoRA's Mamba layers before its first adapted layer keep nothing and have no
    # backward, so the tracker of the whole model never reaches its "first layer"; the model without them
    # has every moment of the whole one, and its first layer is the first adapted one
    trim = method == "lora" and not checkpointing
    adapted = kinds[kinds.index(attention) :] if trim else kinds
    for length in (768, 1536):
        whole = trace_step(s, req, kinds, length)
        trimmed = trace_step(s, req, adapted, length) if trim else whole
        # the last layer's moment: the largest backward of any layer after the first with a backward (the
        # first_layer moment; the layers after one have freed theirs)
        start = len(kinds) - len(adapted)
        largest = max(whole.get(f"backward_layer{j}", (0, 0))[0] for j in range(start + 1, len(kinds)))
        for m in MOMENTS:
            predicted = float(p.moments[m].bytes(np.array(1), np.array(length)))
            measured = (trimmed if m in ("first_layer", "tail") else whole)[m][0]
            if m == "last_layer":
                measured = max(measured, largest)
            assert predicted == pytest.approx(measured, rel=0.02, abs=64 * 1024), (m, length, predicted / measured)
            if m not in ("first_layer", "tail"):  # the model without the Mamba layers that keep nothing
                assert trimmed[m][0] == pytest.approx(whole[m][0], rel=0.001), (m, length)


def test_layer_peaks_by_hand():
    plans = [("a",), ("a", "a"), ("a", "b"), ("a", "b", "a")]
    # c = 10, each layer keeps 1 (a) or 2 (b) behind it, works with 5 (a) or 20 (b): per-layer forward peaks
    peaks = [[15], [15, 16], [15, 31], [15, 31, 18]]
    # backward: c' = 3, working sets 7 (a) or 30 (b); the first layer's backward (first_layer) is left out
    backward = [[99], [99, 3 + 1 + 7], [99, 3 + 1 + 30], [99, 3 + 1 + 2 + 7, 3 + 1 + 30]]
    assert extrapolate_layer_peak(plans, ("a", "b", "a", "a"), True, peaks, backward) == 3 + 1 + 30
    assert extrapolate_layer_peak(plans, ("b", "a", "a"), True, peaks, backward) == 3 + 2 + 1 + 7
    # a, b, a, a: 15, 16 + 20 - 5 = 31 at the b layer, 10 + 1 + 2 + 5 = 18, 19 at the last
    assert extrapolate_layer_peak(plans, ("a", "b", "a", "a"), True, peaks) == 31
    assert extrapolate_layer_peak(plans, ("a",) * 12 + ("b",), True, peaks) == 10 + 12 * 1 + 20
    # the layers before the first of the base kind keep nothing and are left out
    assert extrapolate_layer_peak(plans, ("b", "b", "a", "a"), False, peaks) == 10 + 1 + 5


def test_hybrid_plans():
    from types import SimpleNamespace

    hybrid = SimpleNamespace(layer_kinds=(("m", 3), ("a", 2)), layer_types=("m", "m", "a", "m", "a"), layers=5)
    assert layer_plans(hybrid) == ([("m",), ("m", "m"), ("m", "a"), ("m", "a", "m")], {"m": 3, "a": 2})
    # a LoRA whose targets are in the attention layers only is traced on them; (m, a) has the first layer's kind
    assert layer_plans(hybrid, "a")[0] == [("a",), ("a", "a"), ("a", "m"), ("a", "m", "a"), ("m", "a")]


def test_extrapolate_and_fit_by_hand():
    plans = [("a",), ("a", "a"), ("a", "b"), ("a", "b", "a")]
    # base 10, first kind +3 per layer, second kind +5: (a,) = 13, (a, a) = 16, (a, b) = 18, (a, b, a) = 21
    for last, at in ((None, "last"), ("b", "last"), ("b", "first")):
        assert extrapolate(plans, {"a": 4, "b": 2}, [13, 16, 18, 21], last, at) == 10 + 4 * 3 + 2 * 5
    # the last layer works, holding x(a) = 7 or x(b) = 1 in place of its 3 or 5: (a,) = 17, (a, a) = 20,
    # (a, b) = 10 + 3 + 1 = 14, (a, b, a) = 10 + 3 + 5 + 7 = 25
    assert extrapolate(plans, {"a": 4, "b": 2}, [17, 20, 14, 25], "b", "last") == 10 + 4 * 3 + 5 + 1
    assert extrapolate(plans, {"a": 4, "b": 2}, [17, 20, 14, 25], "a", "last") == 10 + 3 * 3 + 2 * 5 + 7
    # the first layer (kind a) works, holding 7; behind it a keeps 1, b 2: (a,) = 17, (a, a) = 18, (a, b) = 19
    assert extrapolate(plans, {"a": 4, "b": 2}, [17, 18, 19, 20], "b", "first") == 10 + 7 + 3 * 1 + 2 * 2
    a0, a1, a2 = fit_tokens(
        (100, 200, 400),
        [5 + 2 * 100 + 0.5 * 100**2, 5 + 2 * 200 + 0.5 * 200**2, 5 + 2 * 400 + 0.5 * 400**2],
        quadratic=True,
    )
    assert (a0, a1, a2) == pytest.approx((5, 2, 0.5))
    # bytes that fall as the sequence grows (a hybrid's layer plans combined) are never extrapolated downward:
    # a negative curvature is dropped, a negative slope is flat at the values' least-squares level
    lengths = (1024, 2048, 4096)
    a0, a1, a2 = fit_tokens(lengths, [10e9, 14e9, 1e9], quadratic=True)
    assert a1 == 0 and a2 == 0 and a0 == pytest.approx(25e9 / 3)
    a0, a1, a2 = fit_tokens(lengths, [1e9 + 3e5 * s - 20 * s**2 for s in lengths], quadratic=True)
    assert a2 == 0 and a1 >= 0
    assert all(a0 + a1 * s >= 0 for s in (8192, 32768, 131072))


def test_eager_attention_grows_with_the_square_of_the_length(tmp_path):
    s = small_model(tmp_path, "llama", LLAMA)
    eager = profile(s, request(s, attention="eager")).moments["head"]
    flash = profile(s, request(s, attention="flash")).moments["head"]
    assert flash.a2 == 0 and eager.a2 > 0
    # eager keeps the softmax scores of every layer: heads x s^2 x 2 bytes per layer, at least
    assert eager.a2 >= 6 * 4 * 2


@pytest.mark.slow
def test_lora_dropout_and_more_targets_cost_activations(tmp_path):
    s = small_model(tmp_path, "llama", LLAMA)
    few = profile(s, request(s, targets=("q_proj",))).moments["head"].a1
    many = profile(s, request(s, targets="all-linear")).moments["head"].a1
    assert many > few


def test_loss_bytes_per_vocabulary_entry_are_measured(tmp_path):
    s = small_model(tmp_path, "llama", LLAMA)
    head = profile(s, request(s)).moments["head"]
    # transformers' loss holds bf16 logits, their fp32 upcast and gradients: between 6 and 16 bytes
    assert 6 <= head.vocab_bytes <= 16


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_chunked_loss_shorter_than_one_chunk_is_sized_by_its_own_tokens(tmp_path, method):
    """Traced at 1,024-4,096 tokens, the chunked loss's one 1,024-token chunk is part of the level (a0); a shorter
    micro-batch is one chunk of its own tokens (plan.memory takes the difference off, vocab_level_bytes): at 256 and
    512 tokens this equals tracing the whole model (was 0.477 GiB of activations against 0.008 for smollm2 at 237).
    Full fine-tuning too, whose embedding gradient (vocab x hidden) is in the level as well, and is no chunk."""
    from dataclasses import replace

    from tunebench.spec.properties import LOSS_CHUNK_TOKENS

    s = small_model(tmp_path, "llama", {**LLAMA, "vocab_size": 8000})
    req = replace(request(s, method), loss="chunked")
    p = profile(s, req)
    assert p.moments["head"].vocab_level_bytes > 0
    for length in (256, 512):
        whole = trace_step(s, req, ("layer",) * 6, length)
        short = 1 - min(length, LOSS_CHUNK_TOKENS) / LOSS_CHUNK_TOKENS
        for m in MOMENTS:
            moment = p.moments[m]
            predicted = float(moment.bytes(np.array(1), np.array(length)))
            predicted -= s.vocab * moment.vocab_level_bytes * short if moment.vocab_bytes > 0 else 0.0  # plan.memory
            assert predicted == pytest.approx(whole[m][0], rel=0.03, abs=64 * 1024), (m, length)
    assert profile(s, request(s)).moments["head"].vocab_level_bytes == 0  # upcast: nothing token-independent


MOE = {"model_type": "granitemoe", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 3,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "num_local_experts": 4,
       "num_experts_per_tok": 2, "max_position_embeddings": 8192}  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_moe_experts_of_any_dtype_are_traced(tmp_path, monkeypatch, dtype):
    """grouped_mm's meta function takes bf16 only: fp32 experts fell back to the llama formula, printing a
    traceback. They trace now, keeping more than bf16 in fp32; a formula profile cached then is traced again."""
    from tunebench.plan import trace as module

    s = small_model(tmp_path, "moe", MOE)
    req = request(s, method="full", dtype=dtype)
    got = profile(s, req)
    assert got.source == "traced" and not any("formula" in n for n in got.notes), got.notes
    bf16 = profile(s, request(s, method="full")).moments["head"].a1
    assert got.moments["head"].a1 == pytest.approx(bf16) if dtype == "float16" else got.moments["head"].a1 > bf16
    stale = module.formula_profile(s, req, f"RuntimeError: {module.GROUPED_MM_BF16_ONLY} but got ...")
    (module.cache_dir() / f"trace-{req.key}.json").write_text(json.dumps(stale.to_dict()))
    module._PROFILES.clear()
    assert profile(s, req).source == "traced"


def test_profiles_are_cached_on_disk(tmp_path, monkeypatch):
    from tunebench.plan import trace as module

    s = small_model(tmp_path, "llama", LLAMA)
    req = request(s)
    first = profile(s, req)
    module._PROFILES.clear()
    monkeypatch.setattr(module, "trace_profile", lambda *a: pytest.fail("traced again instead of read"))
    assert profile(s, req).to_dict() == first.to_dict()


def test_the_shipped_profiles_cover_the_calibration_and_are_what_tracing_gives_now(tmp_path, monkeypatch):
    """plan/data/traces.json.gz holds the profile of every calibration run's set-up (so the calibration,
    the accuracy benchmark and a first plan of a catalog model need no tracing), and tracing a few of them
    again, one per method, in a fresh home gives exactly the shipped profile: a change to tracing that is
    not followed by `tunebench calibrate --ship-traces` fails here."""
    from tunebench.plan import trace
    from tunebench.plan.calibration import Batch
    from tunebench.plan.measurements import default_records

    shipped = trace.shipped_profiles()
    groups = Batch.of(default_records()).groups
    keys = {w.trace_request().key for w, _ in groups}
    assert keys <= set(shipped), f"{len(keys - set(shipped))} calibration set-ups have no shipped profile"
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path))  # an empty cache: every profile below is traced
    chosen = {}
    for w, _ in sorted(groups, key=lambda g: g[0].trace_request().key):
        chosen.setdefault(w.method, w)
    assert set(chosen) >= {"full", "lora", "qlora"}
    with trace.without_shipped():
        for w in chosen.values():
            request = w.trace_request()
            again = trace.profile(w.structure, request)
            assert again.source == shipped[request.key].source
            assert _same(again, shipped[request.key]), (w.structure.name, w.method)
    assert any(tmp_path.rglob("trace-*.json"))  # traced, not read


def _same(a, b) -> bool:
    """Profiles equal to 1e-9 relative in every moment (floats through JSON). The least-squares intercept a0 of a
    moment holding next to nothing (a few bytes) differs in its thousandths of a byte between BLAS builds: it
    is compared to within one byte."""
    if set(a.moments) != set(b.moments) or a.notes != b.notes:
        return False
    pairs = [(a.written, b.written), *((a.moments[k], b.moments[k]) for k in a.moments)]
    return all(
        getattr(x, f) == pytest.approx(getattr(y, f), rel=1e-9, abs=1.0 if f == "a0" else 1e-6)
        for x, y in pairs
        for f in ("a0", "a1", "a2", "grad_share", "vocab_bytes")
    )


def test_ship_traces_writes_a_set_the_planner_reads(tmp_path, monkeypatch):
    """calibrate --ship-traces's step: the profiles of the given runs, traced afresh, in a file the planner
    reads in place of tracing (with these library versions; another version's set is ignored)."""
    import gzip

    from tunebench.plan import trace
    from tunebench.plan.calibration import Batch, ship_traces
    from tunebench.plan.measurements import default_records

    runs = [r for r in default_records() if r.method == "lora"][:1]
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path / "home"))
    path = tmp_path / "traces.json.gz"
    assert ship_traces(runs, path) == 1
    monkeypatch.setattr(trace, "SHIPPED", path)
    trace._load_shipped.cache_clear()
    try:
        ((w, _),) = Batch.of(runs).groups
        assert set(trace.shipped_profiles()) == {w.trace_request().key}
        data = json.loads(gzip.decompress(path.read_bytes()))
        data["versions"] = data["versions"].replace("transformers-", "transformers-0.")
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
        trace._load_shipped.cache_clear()
        assert trace.shipped_profiles() == {}  # traced with other versions: not used
    finally:
        trace._load_shipped.cache_clear()


def test_a_damaged_shipped_set_is_traced_around(tmp_path, monkeypatch, caplog):
    """A truncated or malformed traces.json.gz (an interrupted write) means tracing, with a warning, never a crash."""
    import gzip

    from tunebench.plan import trace

    path = tmp_path / "traces.json.gz"
    monkeypatch.setattr(trace, "SHIPPED", path)
    for damaged in (gzip.compress(b'{"versions": "x"')[:-6], gzip.compress(b'{"profiles": 3}'), b"not gzip"):
        path.write_bytes(damaged)
        trace._load_shipped.cache_clear()
        try:
            assert trace.shipped_profiles() == {}
        finally:
            trace._load_shipped.cache_clear()
    assert "cannot be read: tracing instead" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize(("method", "checkpointing"), [("full", False), ("lora", False), ("lora", True)])
def test_mamba_kernel_keeps_what_mamba_ssm_keeps(tmp_path, method, checkpointing):
    """On a GPU the Mamba-2 layers run mamba_ssm's fused kernel: per token and Mamba layer it keeps the in_proj
    output and the scan's output (and the in_proj input, for its weight), far less than transformers' torch
    scan keeps; the extrapolation still equals the whole model's trace."""
    from dataclasses import replace

    s = small_model(tmp_path, "hybrid", HYBRID)
    torch_scan = request(s, method, checkpointing=checkpointing)
    kernel = replace(torch_scan, mamba_kernel=True)
    assert kernel.key != torch_scan.key
    p, q = profile(s, kernel), profile(s, torch_scan)
    kinds = tuple(k for k in s.layer_types)
    length = 1024
    whole = trace_step(s, kernel, kinds, length)
    # the last layer's moment: the largest backward after the first layer with one (LoRA without
    # checkpointing: the first attention layer, kinds[2])
    start = 2 if method == "lora" and not checkpointing else 0
    layers = max(whole.get(f"backward_layer{j}", (0, 0))[0] for j in range(start + 1, len(kinds)))
    for m in ("forward", "head", "last_layer"):
        predicted = float(p.moments[m].bytes(np.array(1), np.array(length)))
        measured = max(whole[m][0], layers) if m == "last_layer" else whole[m][0]
        assert predicted == pytest.approx(measured, rel=0.02, abs=64 * 1024), m
    if method == "full":
        assert p.moments["forward"].a1 < q.moments["forward"].a1 / 2  # the torch scan keeps far more
        # a Mamba layer more keeps at least its in_proj output (zxbcdt, bf16) and the scan's output (out_x)
        proj = 2 * 128 + 2 * 16 + 4  # 2 x (heads x head_dim) + 2 x (groups x d_state) + heads
        more = trace_step(s, kernel, (s.layer_types[0], *kinds), length)["forward"][0] - whole["forward"][0]
        assert more >= 2 * (proj + 128) * length


def test_mamba_kernel_models_call_the_kernel_in_transformers():
    import importlib

    for model_type in MAMBA2_KERNEL_MODELS:
        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        assert hasattr(module, "mamba2_split_conv1d_scan_combined"), model_type
