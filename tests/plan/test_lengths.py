"""Your data's sample lengths in the planner (plan.lengths): --avg-tokens and --lengths on plan and
recommend, api.plan(avg_tokens=, lengths=); time and cost follow the mean, peak memory the longest."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest

from tunebench import api
from tunebench.commands.main import main
from tunebench.datasets import offline
from tunebench.errors import InputError
from tunebench.plan.lengths import SampleLengths

LORA = "finetune_lora_benchmark-v1.0.0"
# the default data set's entries have 16,384+ tokens: at model_max_length 4096 every sample is 4096 long
ENTITY = ["model_name=llama3.1-8b", "number_gpus=1", "gpu_model=A100-80GB", "batch_size=8", "model_max_length=4096"]
SMALL = ["model_name=smollm2-135m", "number_gpus=1", "gpu_model=A100-80GB", "batch_size=8"]


def plan_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["plan", LORA, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_avg_tokens_shortens_time_and_cost_as_the_throughput_model_says(capsys):
    from tunebench.plan.predictor import _effective_values
    from tunebench.plan.throughput import flops_per_token
    from tunebench.plan.workload import build_workload
    from tunebench.spec.experiments import get_experiment, make_entity, parse_assignments

    full = plan_json(capsys, *ENTITY)
    short = plan_json(capsys, *ENTITY, "--avg-tokens", "256")
    one = plan_json(capsys, *ENTITY, "--avg-tokens", "1")
    assert full["tokens_per_sample"] == 4096 and short["tokens_per_sample"] == 256
    # the same samples and steps (only their lengths change): time is steps x step time
    assert short["steps"] == full["steps"]
    ratio = short["train_runtime"] / full["train_runtime"]
    assert ratio == pytest.approx(short["step_seconds"] / full["step_seconds"], rel=1e-3)
    assert short["cost"] / full["cost"] == pytest.approx(ratio, rel=1e-3)  # one GPU, one price: cost follows time
    # A step's compute is tokens x FLOPs per token (attention's share grows with the length) plus costs per step
    # that do not shrink with the samples (optimizer step, per-layer launches). So the time is at least the
    # tokens' share scaled by the FLOPs per token, and at most the tokens' share plus the fixed part, which the
    # same plan at 1 token per sample measures.
    experiment = get_experiment(LORA)
    _, values = _effective_values(experiment, make_entity(experiment, parse_assignments(ENTITY)), {})
    fpt = {
        n: flops_per_token(build_workload("lora", [values], lengths=SampleLengths((n,), "", False)))[0]
        for n in (256, 4096)
    }
    assert fpt[256] < fpt[4096]
    assert ratio >= 256 / 4096 * fpt[256] / fpt[4096]
    assert ratio <= 256 / 4096 + one["step_seconds"] / full["step_seconds"]
    assert 0.0625 < ratio < 0.1  # here: the time of 1/16 of the tokens is 6.3-10 % of the time
    assert short["dataset_tokens_per_second"] < full["dataset_tokens_per_second"]  # fixed costs per fewer tokens
    # peak memory is sized for model_max_length: a mean says nothing of the longest sample
    assert short["gpu_memory_peak_gib"] == full["gpu_memory_peak_gib"]
    assert any("peak memory is sized for model_max_length" in n for n in short["notes"])


def test_recommend_and_the_api_take_the_lengths_too(capsys):
    capsys.readouterr()
    args = ["recommend", LORA, *ENTITY, "--max-gpus", "2", "--json"]
    assert main(args) == 0
    full = json.loads(capsys.readouterr().out)
    assert main([*args, "--avg-tokens", "256"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert short["cheapest"]["train_runtime"] < 0.1 * full["cheapest"]["train_runtime"]
    # the job's notes say what the plans assume of the samples, once (the candidates keep their rules and reasons)
    (note,) = [n for n in short["notes"] if n.startswith("samples as long as yours (--avg-tokens 256")]
    assert note.endswith(f"(at {short['minimum']['number_gpus']} GPU(s))")
    assert not any(n.startswith("samples as long as yours") for n in full["notes"])
    # where nothing fits, the diagnosis does not say it again
    longer = [a for a in ENTITY if not a.startswith("model_max_length")] + ["model_max_length=131072"]
    assert main(["recommend", LORA, *longer, "--max-gpus", "1", "--avg-tokens", "256", "--json"]) == 0
    none = json.loads(capsys.readouterr().out)
    assert none["minimum"] is None and [n for n in none["notes"] if n.startswith("samples as long as yours")]
    assert not [n for n in none["diagnosis"]["notes"] if n.startswith("samples as long as yours")]
    row = dict(a.split("=") for a in ENTITY)
    plans = api.plan([row, row], LORA, avg_tokens=256)
    assert plans["tokens_per_sample"].tolist() == [256, 256]
    assert plans["train_runtime"].iloc[0] == pytest.approx(
        plan_json(capsys, *ENTITY, "--avg-tokens", "256")["train_runtime"], rel=1e-3
    )
    rec = api.recommend(LORA, row, max_gpus=2, avg_tokens=256)
    assert rec["cheapest"]["train_runtime"] == pytest.approx(short["cheapest"]["train_runtime"], rel=1e-3)
    with pytest.raises(InputError) as err:
        api.plan([row], LORA, avg_tokens=0)
    assert err.value.field == "avg_tokens"


def write_samples(path, texts: list[str]) -> None:
    rows = [{"output": t} for t in texts[:-2]] + [{"text": texts[-2]}]
    rows.append({"messages": [{"role": "user", "content": texts[-1]}]})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")


def test_a_jsonl_file_gives_its_mean_and_memory_its_longest(tmp_path, capsys):
    texts = [" ".join(f"word{i}" for i in range(n)) for n in (5, 30, 60, 120, 90, 7)]
    write_samples(tmp_path / "data.jsonl", texts)
    tok = offline.load("smollm2")  # smollm2-135m's own tokenizer, offline
    counts = [len(tok.encode(t).ids) for t in texts]
    assert len(set(counts)) == 6 and max(counts) < 2048
    out = plan_json(capsys, *SMALL, "model_max_length=2048", "--lengths", str(tmp_path / "data.jsonl"))
    assert out["tokens_per_sample"] == pytest.approx(np.mean(counts), rel=1e-4)
    capped = plan_json(capsys, *SMALL, "model_max_length=64", "--lengths", str(tmp_path / "data.jsonl"))
    assert capped["tokens_per_sample"] == pytest.approx(np.mean(np.minimum(counts, 64)), rel=1e-4)
    # memory: the longest sample, as the data set's samples cut at that length; a mean alone sizes 2048
    longest = plan_json(capsys, *SMALL, f"model_max_length={max(counts)}")
    assert out["gpu_memory_peak_gib"] == pytest.approx(longest["gpu_memory_peak_gib"], rel=1e-4)
    mean_only = plan_json(capsys, *SMALL, "model_max_length=2048", "--avg-tokens", str(np.mean(counts)))
    assert mean_only["gpu_memory_allocated_peak_gib"] > out["gpu_memory_allocated_peak_gib"]
    # padding to the longest of each micro-batch of 8: more time than samples of the mean length
    assert out["train_runtime"] > mean_only["train_runtime"]
    assert any(f"longest sample ({max(counts)} tokens" in n and "exact" in n for n in out["notes"])
    assert api.plan(
        [dict(a.split("=") for a in [*SMALL, "model_max_length=2048"])], LORA, lengths=tmp_path / "data.jsonl"
    )["tokens_per_sample"].iloc[0] == pytest.approx(np.mean(counts), rel=1e-4)


def test_the_printed_note_keeps_the_tokenizers_brackets_and_the_file_name(tmp_path, capsys, monkeypatch):
    """Notes are plain text: "[offline, exact]" and a file named "[mine].jsonl" are printed, not read as
    rich markup (which dropped them, leaving "(llama-models) ;")."""
    monkeypatch.setenv("COLUMNS", "200")  # one line per note
    write_samples(tmp_path / "[mine].jsonl", ["a few words here", "and a few more words there"])
    for command in ("plan", "recommend"):
        capsys.readouterr()
        args = [*SMALL, "model_max_length=2048", "--lengths", str(tmp_path / "[mine].jsonl")]
        if command == "recommend":
            args.remove("number_gpus=1")
        assert main([command, LORA, *args]) == 0
        (line,) = [line for line in capsys.readouterr().out.splitlines() if "samples as long as yours" in line]
        assert "[mine].jsonl: 2 samples" in line and "[offline, exact]; mean" in line, line


def test_padding_free_processes_the_samples_own_tokens(tmp_path, capsys):
    """padding_free (one flattened row per micro-batch) processes the mean tokens, not the micro-batch's expected
    longest; peak memory stays sized for batch x the longest sample with flash-attention; eager and sdpa attend
    over the whole row under a block-diagonal mask, so their s^2 terms grow with the row's square."""
    texts = [" ".join(f"word{i}" for i in range(n)) for n in (5, 30, 60, 120, 90, 7, 400, 15)]
    write_samples(tmp_path / "data.jsonl", texts)
    lengths = ["model_max_length=2048", "--lengths", str(tmp_path / "data.jsonl")]
    padded = plan_json(capsys, *SMALL, *lengths)
    free = plan_json(capsys, *SMALL, *lengths, "padding_free=1")
    assert free["tokens_per_sample"] == padded["tokens_per_sample"]  # the same samples
    # tokens processed: the micro-batch of 8 padded to its expected longest sample, or the samples' own
    counts = [len(offline.load("smollm2").encode(t).ids) for t in texts]
    sample = SampleLengths(tuple(counts), "", True)
    expected = sample.padded(np.array([2048.0]), np.array([8.0]))[0] / sample.real(np.array([2048.0]))[0]
    assert expected > 2
    processed = {k: v["train_tokens_per_second"] * v["train_runtime"] for k, v in (("free", free), ("padded", padded))}
    assert processed["padded"] / processed["free"] == pytest.approx(expected, rel=1e-4)
    assert free["train_runtime"] < padded["train_runtime"]
    # the notes say what the padding costs, and that padding_free removes it
    waste = f"{1 - 1 / expected:.0%} of them padding: padding_free=1 processes only the samples' own"
    assert any(waste in n for n in padded["notes"]), padded["notes"]
    assert any("padding_free: each micro-batch is one row" in n for n in free["notes"]), free["notes"]
    # the spec's train_tokens_per_second counts padding: nothing is padded, so it is the data set's rate
    assert free["train_tokens_per_second"] == pytest.approx(free["dataset_tokens_per_second"], rel=1e-6)
    assert padded["train_tokens_per_second"] > 1.5 * padded["dataset_tokens_per_second"]
    # memory: the padded batch holds 8 x the longest sample; a flattened row of 8 samples drawn at random holds
    # their sum, the largest of the run's rows sets the peak, and with flash-attention it is a 1-sample batch
    # of that many tokens
    note = next(n for n in free["notes"] if "the expected largest of the run's" in n)
    rows, row = (
        int(x.replace(",", "")) for x in re.search(r"run's ([\d,]+) rows of 8 .*?\(([\d,]+) tokens", note).groups()
    )
    assert rows == free["steps"] * 4  # the experiment's gradient_accumulation_steps 4, one GPU
    assert row == round(sample.largest_row(np.array([2048.0]), np.array([8.0]), np.array([float(rows)]))[0])
    assert max(counts) <= row < 8 * max(counts)
    one = [a for a in SMALL if not a.startswith("batch_size")]
    alone = plan_json(capsys, *one, "batch_size=1", f"model_max_length={row}")
    for key in ("gpu_memory_allocated_peak_gib", "gpu_memory_peak_gib"):  # the note rounds the row to a token
        assert free[key] == pytest.approx(alone[key], rel=1e-4) and free[key] < padded[key]
    # eager attention over the flattened row: its score matrices are the row's square, as a 1-sample batch's
    eager = plan_json(capsys, *SMALL, *lengths, "attn_implementation=eager", "padding_free=1")
    eager_alone = plan_json(capsys, *one, "batch_size=1", f"model_max_length={int(row)}", "attn_implementation=eager")
    assert eager["gpu_memory_allocated_peak_gib"] == pytest.approx(
        eager_alone["gpu_memory_allocated_peak_gib"], rel=1e-4
    )
    assert eager["gpu_memory_allocated_peak_gib"] > free["gpu_memory_allocated_peak_gib"]  # sdpa/flash keep no scores
    # no suggestion where padding_free cannot run: one process over 2 GPUs (DataParallel), prompt tuning (its
    # virtual tokens are not padding)
    two = [a for a in SMALL if not a.startswith(("number_gpus", "batch_size"))]
    dp = plan_json(capsys, *two, "number_gpus=2", "batch_size=16", "distributed_backend=None", *lengths)
    assert not any("padding_free=1" in n for n in dp["notes"]), dp["notes"]
    capsys.readouterr()
    pt = ["plan", "finetune_pt_benchmark-v1.0.0", *SMALL, "model_max_length=512", "--avg-tokens", "40", "--json"]
    assert main(pt) == 0
    assert not any("padding_free" in n for n in json.loads(capsys.readouterr().out)["notes"])
    # a flattened row cannot carry prompt tuning's per-sample virtual tokens
    capsys.readouterr()
    assert (
        main(["plan", "finetune_pt_benchmark-v1.0.0", *SMALL, "model_max_length=512", "padding_free=1", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "invalid" and any("prompt tuning" in r for r in out["reasons"]), out


def test_padding_is_the_expected_longest_of_a_micro_batch():
    lengths = SampleLengths((100, 200, 200, 400), "", True)
    for b in (1, 2, 3):  # every ordered draw of b samples, equally likely
        draws = list(itertools.product(lengths.counts, repeat=b))
        expected = np.mean([max(d) for d in draws])
        assert lengths.padded(np.array([4096.0]), np.array([float(b)]))[0] == pytest.approx(expected)
    assert lengths.padded(np.array([150.0]), np.array([2.0]))[0] == pytest.approx(150 - 50 / 16)  # cut at 150
    assert lengths.real(np.array([150.0]))[0] == pytest.approx((100 + 150 * 3) / 4)
    assert lengths.longest(np.array([300.0, 8192.0])).tolist() == [300, 400]
    # padding-free flash-attention: a token attends over its own sample, E[s^2] / E[s] over the tokens
    assert lengths.attended(np.array([4096.0]))[0] == pytest.approx((100**2 + 2 * 200**2 + 400**2) / 900)
    assert lengths.attended(np.array([150.0]))[0] == pytest.approx((100**2 + 3 * 150**2) / 550)

    # padding-free rows: the expected largest of a run's rows of b samples drawn at random, at least the longest
    def largest(b, rows, cap=4096.0, of=lengths):
        return of.largest_row(np.array([cap]), np.array([float(b)]), np.array([float(rows)]))[0]

    for b, rows in ((2, 3), (3, 2)):  # every ordered draw of rows x b samples, equally likely
        sums = [sum(d) for d in itertools.product(lengths.counts, repeat=b)]
        expected = np.mean([max(r) for r in itertools.product(sums, repeat=rows)])
        assert largest(b, rows) == pytest.approx(expected, rel=1e-9)
    assert largest(1, 1000) == 400 and largest(1, 1) == 400  # at least the longest, never more for one sample
    assert 400 <= largest(4, 1) < largest(4, 100) < largest(4, 10_000) == pytest.approx(1600)  # more rows, larger
    assert largest(4, 10_000, cap=150.0) == pytest.approx(600)  # each sample capped first
    assert largest(64, 10, of=SampleLengths((100,) * 8, "", True)) == pytest.approx(6400)  # more than the file has
    assert SampleLengths((300,), "", False).largest_row(np.array([1024.0]), np.array([2.0]), np.array([5.0]))[0] == 2048


def test_padding_free_rows_never_shrink_as_the_batch_grows():
    """The run's samples fixed, a larger per-device batch has fewer, longer rows: its expected largest row is never
    smaller (max-batch's search assumes it), on a long-tailed file, and on a grid coarser than a token (a row of
    b x the longest over ROW_GRID_POINTS tokens)."""
    rng = np.random.default_rng(1)
    tailed = SampleLengths(tuple(int(x) + 1 for x in rng.lognormal(6, 1, 500)), "", True)
    samples = 40_000
    sizes = [*range(1, 80), 127, 128, 129]
    rows = [tailed.largest_row(np.array([4096.0]), np.array([float(b)]), np.array([samples / b]))[0] for b in sizes]
    assert all(a <= b for a, b in zip(rows, rows[1:], strict=False)), rows
    assert rows[0] == max(min(c, 4096) for c in tailed.counts)  # one sample a row: the longest
    # past 2^20 tokens a row (b x the longest) the grid is coarser than a token: a count between two points is
    # split between them, so a row's mean stays exact and short samples are not all rounded one way (rounding
    # put 50-token samples on a 1.008-token grid at 49.6, and b 259 below b 258)
    bimodal = SampleLengths((50,) * 2990 + (120_000,) * 10, "", True)
    at = [bimodal.largest_row(np.array([4096.0]), np.array([b]), np.array([4096 / b]))[0] for b in (258.0, 259.0)]
    assert at[0] == pytest.approx(24_142.4, abs=1) and at[1] == pytest.approx(24_209.2, abs=1)
    short = SampleLengths((27,) * 199 + (4000,), "", True)  # b x the longest: 20 Mi tokens, a 32-token grid
    row = short.largest_row(np.array([4096.0]), np.array([5000.0]), np.array([1.0]))[0]
    assert row == pytest.approx(5000 * (199 * 27 + 4000) / 200, rel=0.01)  # one row: about its mean, 234,325
    # a row no GPU holds (over MAX_EXACT_ROW samples): the normal approximation, not one sample's length
    huge = short.largest_row(np.array([4096.0]), np.array([2.0**21]), np.array([1.0]))[0]
    assert huge == pytest.approx(2**21 * (199 * 27 + 4000) / 200, rel=0.01)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--avg-tokens", "0"], "--avg-tokens"),
        (["--avg-tokens", "nan"], "--avg-tokens"),
        (["--avg-tokens", "many"], "--avg-tokens"),
        (["--avg-tokens", "256", "--lengths", "{ok}"], "--avg-tokens"),
        (["--lengths", "{tmp}/missing.jsonl"], "--lengths"),
        (["--lengths", "{tmp}/empty.jsonl"], "--lengths"),
        (["--lengths", "{tmp}/notjson.jsonl"], "--lengths notjson.jsonl line 2"),
        (["--lengths", "{tmp}/notext.jsonl"], "--lengths notext.jsonl line 1"),
        (["--lengths", "{tmp}/blank.jsonl"], "--lengths blank.jsonl line 2"),
        (["--lengths", "{tmp}/silent.jsonl"], "--lengths silent.jsonl line 1"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "recommend", "max-batch"])
def test_bad_lengths_are_one_line_exit_2(tmp_path, capsys, args, field, command):
    (tmp_path / "ok.jsonl").write_text('{"output": "a b c"}\n')
    (tmp_path / "empty.jsonl").write_text("\n\n")
    (tmp_path / "notjson.jsonl").write_text('{"output": "a"}\n{"output": \n')
    (tmp_path / "notext.jsonl").write_text('{"output": 3}\n')
    (tmp_path / "blank.jsonl").write_text('{"text": "a b"}\n{"text": "  "}\n')  # 0 tokens: nothing to size
    (tmp_path / "silent.jsonl").write_text('{"messages": [{"role": "user"}]}\n')  # a chat without content
    args = [a.format(tmp=tmp_path, ok=tmp_path / "ok.jsonl") for a in args]
    capsys.readouterr()
    job = [LORA, *ENTITY] if command != "max-batch" else ["llama3.1-8b", "--gpu-model", "A100-80GB"]
    assert main([command, *job, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}:"), err


def test_max_batch_sizes_your_samples(tmp_path, capsys):
    """max-batch --lengths: a padded micro-batch holds b x the longest sample (here cut at model_max_length, as
    the data set's samples are: the same answer), a padding-free one the largest of the run's rows, so far more
    samples fit."""
    texts = [" ".join(f"word{i}" for i in range(n)) for n in [200] * 40 + [3500, 4000]]
    write_samples(tmp_path / "data.jsonl", texts)
    job = ["max-batch", "llama3.1-8b", "--gpu-model", "A100-80GB", "--model-max-length", "4096", "--json"]

    def largest(*args: str) -> dict:
        capsys.readouterr()
        assert main([*job, *args]) == 0
        return json.loads(capsys.readouterr().out)

    plain = largest()
    padded = largest("--lengths", str(tmp_path / "data.jsonl"))
    free = largest("--lengths", str(tmp_path / "data.jsonl"), "padding_free=1")
    assert padded["largest"] == plain["largest"] and free["largest"] > 2 * padded["largest"], (padded, free)
    assert any("padding_free=1 processes only the samples' own" in n for n in padded["notes"])
    assert any("the expected largest of the run's" in n for n in free["notes"])


def test_counting_a_file_off_a_terminal_logs_its_progress(tmp_path, monkeypatch, capsys):
    """Piped or logged (no terminal for the bar), counting --lengths says how far it is, its rate and ETA in log
    lines on stderr (the guide: every step that can take more than a few seconds shows progress, in logs too)."""
    from tunebench.commands.datasets import ProgressBar

    monkeypatch.setattr(ProgressBar, "LOG_EVERY_S", 0.0)
    monkeypatch.setattr(ProgressBar, "SHOW_AFTER_S", 0.0)
    write_samples(tmp_path / "data.jsonl", [f"sample {i} " * 40 for i in range(3000)])
    capsys.readouterr()
    assert (
        main(["max-batch", "llama3.1-8b", "--gpu-model", "A100-80GB", "--lengths", str(tmp_path / "data.jsonl")]) == 0
    )
    lines = [line for line in capsys.readouterr().err.splitlines() if "counting tokens of data.jsonl: " in line]
    assert lines, "no progress line"
    assert re.search(r"counting tokens of data.jsonl: 3,000 of 3,000 \([\d,]+ entries/s\)$", lines[-1]), lines
    assert all(re.search(r"of 3,000 \([\d,]+ entries/s, ETA [\d,]+ s\)$", line) for line in lines[:-1]), lines
