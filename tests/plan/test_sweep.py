"""Quick sweeps without a space file: plan --grid, max-batch and max-length (tunebench.plan.sweep)."""

from __future__ import annotations

import json

import pytest

from tunebench.commands.main import main
from tunebench.errors import InputError
from tunebench.plan.predictor import PlanOptions
from tunebench.plan.recommend import evaluate
from tunebench.plan.sweep import grid_values, largest, method_job, parse_grid, plan_grid
from tunebench.spec.experiments import get_experiment

LORA = "finetune_lora_benchmark-v1.0.0"
JOB = ["model_name=llama3.1-8b", "number_gpus=1", "gpu_model=L40S"]


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("512..8192", ["512", "1024", "2048", "4096", "8192"]),
        ("500..600", ["512"]),
        ("1..1", ["1"]),
        ("3..20", ["4", "8", "16"]),
        ("1,2,4", ["1", "2", "4"]),
        ("true,false", ["true", "false"]),
    ],
)
def test_grid_values(text, values):
    assert grid_values("batch_size", text) == values


@pytest.mark.parametrize(
    ("text", "message"), [("600..1000", "no power of two"), ("8..4", "runs backwards"), ("1,,2", "empty value")]
)
def test_grid_values_refused(text, message):
    with pytest.raises(InputError) as info:
        grid_values("batch_size", text)
    assert info.value.field == "batch_size" and message in str(info.value)


def test_parse_grid_names_the_spec_property():
    exp = get_experiment(LORA)
    assert parse_grid(exp, ["batch_size=1,2", "model_max_length=512..1024"]) == {
        "batch_size": ["1", "2"],
        "model_max_length": ["512", "1024"],
    }
    with pytest.raises(InputError) as info:
        parse_grid(exp, ["seq_len=512..1024"])
    assert info.value.field == "seq_len" and "Did you mean 'model_max_length'" in str(info.value)
    with pytest.raises(InputError) as info:
        parse_grid(exp, ["batch_size=1", "batch_size=2"])
    assert info.value.field == "batch_size"
    with pytest.raises(InputError) as info:
        parse_grid(exp, ["batch_size=1..65536", "model_max_length=1..65536", "r=1..1024", "lora_alpha=1..65536"])
    assert info.value.field == "--grid" and "points" in str(info.value)
    with pytest.raises(InputError) as info:  # each end as typed, in the property's domain
        parse_grid(exp, ["r=1..65536"])
    assert (info.value.field, info.value.message) == ("r", "'65536' is outside the domain")


def test_plan_grid_judges_every_point_in_order():
    exp = get_experiment(LORA)
    base = {"model_name": "llama3.1-8b", "number_gpus": 1, "gpu_model": "L40S"}
    points = plan_grid(exp, base, {"batch_size": ["1", "16"], "model_max_length": ["512", "8192"]}, PlanOptions())
    assert [(p.values["batch_size"], p.values["model_max_length"]) for p in points] == [
        (1, 512),
        (1, 8192),
        (16, 512),
        (16, 8192),
    ]
    verdicts = [p.verdict for p in points]
    assert verdicts[0] == "fits" and verdicts[-1] == "OOM"  # 16 x 8192 tokens of an 8 B model on 48 GB
    assert points[-1].candidate.oom_probability > 0.5 > points[0].candidate.oom_probability


def _fits(exp, values, name, n):
    return evaluate(exp, [{**values, name: n}], PlanOptions())[0].fits


@pytest.mark.parametrize(("gpus", "length"), [(1, 2048), (2, 4096)])
def test_largest_batch_fits_and_the_next_multiple_of_the_gpus_does_not(gpus, length):
    exp, values, _ = method_job(
        "lora",
        {
            "model_name": "llama3.1-8b",
            "gpu_model": "A100-80GB",
            "number_gpus": gpus,
            "batch_size": gpus,
            "model_max_length": length,
        },
    )
    found = largest(exp, values, "batch_size", PlanOptions())
    assert found.value is not None and found.value % gpus == 0 and found.next_value == found.value + gpus
    assert _fits(exp, values, "batch_size", found.value)
    assert not _fits(exp, values, "batch_size", found.value + gpus)


def test_largest_batch_with_tensor_parallelism_moves_in_data_parallel_ranks():
    # 8 GPUs in groups of tp 4: 2 data-parallel ranks, so any even batch_size is valid (rule 1); the search
    # used to step by 8 and answer 128 where plan calls 130 a fit
    exp, values, _ = method_job(
        "lora",
        {
            "model_name": "llama3.1-8b",
            "gpu_model": "A100-80GB",
            "number_gpus": 8,
            "tensor_parallel_degree": 4,
            "batch_size": 8,
            "model_max_length": 2048,
        },
    )
    found = largest(exp, values, "batch_size", PlanOptions())
    assert found.value is not None and found.value % 2 == 0 and found.next_value == found.value + 2
    assert _fits(exp, values, "batch_size", found.value)
    assert not _fits(exp, values, "batch_size", found.value + 2)


def test_largest_length_on_a_data_set_of_long_samples():
    exp, values, _ = method_job(
        "lora",
        {
            "model_name": "llama3.1-8b",
            "gpu_model": "L40S",
            "number_gpus": 1,
            "batch_size": 1,
            "model_max_length": 1,
            "dataset_id": "news-tokens-128kplus-entries-320",
        },
    )
    found = largest(exp, values, "model_max_length", PlanOptions())
    assert 4096 < found.value < 131072 and found.next_value == found.value + 1
    assert _fits(exp, values, "model_max_length", found.value)
    assert not _fits(exp, values, "model_max_length", found.value + 1)


def test_largest_length_stops_at_the_models_context():
    exp, values, _ = method_job(
        "full",
        {"model_name": "mistral-7b", "gpu_model": "H100", "number_gpus": 1, "batch_size": 1, "model_max_length": 1},
    )
    found = largest(exp, values, "model_max_length", PlanOptions())
    assert found.value == 32768 and found.next_value is None and "max_position_embeddings" in found.limited_by


def test_nothing_fits():
    exp, values, _ = method_job(
        "full",
        {"model_name": "llama3.1-8b", "gpu_model": "L40S", "number_gpus": 1, "batch_size": 1, "model_max_length": 512},
    )
    found = largest(exp, values, "batch_size", PlanOptions())
    assert found.value is None and found.next_value == 1 and not found.next_fit.fits


# --- the commands ---------------------------------------------------------------------------------------
def test_plan_grid_prints_one_row_per_point_at_the_terminals_width(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", LORA, *JOB, "--grid", "batch_size=1,2,4,8,16", "model_max_length=512..8192"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 25 and max(len(line) for line in lines) <= 80
    # the swept properties' columns are as wide as their names allow first (a name wraps less), then the rest
    assert rows[0].split("│")[1:4] == [" 1          ", " 512          ", " fits    "]
    assert "OOM" in rows[-1] and "15 of 25 points fit" in " ".join(lines)


def test_plan_grid_json(capsys):
    assert main(["plan", LORA, *JOB, "--grid", "batch_size=1,16", "--grid", "model_max_length=512", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["swept"] == ["batch_size", "model_max_length"] and len(out["points"]) == 2
    assert [p["verdict"] for p in out["points"]] == ["fits", "fits"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--grid", "seq_len=512..1024", "batch_size=1"], "seq_len"),
        (["--grid", "batch_size=a,b", "model_max_length=512"], "batch_size"),
        (["--grid", "batch_size=8..4", "model_max_length=512"], "batch_size"),
        (["--grid", "batch_size=1,2", "batch_size=4", "model_max_length=512"], "batch_size"),
        (["--grid", "batch_size", "model_max_length=512"], "--grid"),
    ],
)
def test_plan_grid_bad_input_is_one_line_exit_2(capsys, args, field):
    assert main(["plan", LORA, *JOB, *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), captured.err
    assert captured.out == ""


def test_max_batch_command(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["max-batch", "llama-3.1-8b", "--gpu-model", "L40S", "--model-max-length", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["property"] == "batch_size" and out["experiment_id"] == LORA
    assert out["at_largest"]["fits"] and not out["at_next"]["fits"] and out["next"] == out["largest"] + 1
    assert main(["max-batch", "llama-3.1-8b", "--gpu-model", "L40S", "--model-max-length", "2048"]) == 0
    text = capsys.readouterr().out
    assert f"largest batch_size that fits: {out['largest']}" in text and f"at {out['next']}:" in text


def test_max_commands_take_their_options_as_properties_too(capsys):
    """gpu_model=, number_gpus=, model_max_length= (max-batch) and batch_size= (max-length) as KEY=VALUE, as
    plan takes them: the same job as the options give."""
    as_options = ["--gpu-model", "L40S", "--number-gpus", "2", "--model-max-length", "2048", "--json"]
    assert main(["max-batch", "llama-3.1-8b", *as_options]) == 0
    options = json.loads(capsys.readouterr().out)
    assert (
        main(["max-batch", "llama-3.1-8b", "gpu_model=L40S", "number_gpus=2", "model_max_length=2048", "--json"]) == 0
    )
    properties = json.loads(capsys.readouterr().out)
    assert properties == options and options["job"]["number_gpus"] == 2 and options["largest"] % 2 == 0
    assert main(["max-length", "llama-3.1-8b", "gpu_model=L40S", "number_gpus=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["batch_size"] == 2  # one sample per GPU


def test_max_batch_says_what_the_plan_assumed_at_its_answer(capsys):
    """A data set of short samples sizes the batch for them: the plan's note says so beside the answer."""
    job = ["llama-3.1-8b", "gpu_model=A100-80GB", "dataset_id=news-chars-512-entries-4096", "--json"]
    assert main(["max-batch", *job]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("shorter than model_max_length 4,096: planned at their length" in n for n in out["notes"])


def test_max_batch_where_nothing_fits_says_what_else_to_change(capsys):
    """Nothing fits (8B full fine-tuning on 2 L40S, 48 GB each): the plan's notes at the smallest batch follow, as
    they do at an answer (here: FSDP's unsharded gradient accumulation, and that accumulation 1 shards them)."""
    job = ["llama-3.1-8b", "--gpu-model", "L40S", "--number-gpus", "2", "--method", "full", "--json"]
    assert main(["max-batch", *job, "gradient_accumulation_steps=4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["largest"] is None and out["next"] == 2
    assert any("gradient_accumulation_steps=1 shards them" in n for n in out["notes"]), out["notes"]


@pytest.mark.slow
def test_max_batch_of_a_cpu_run_needs_no_gpu(capsys):
    """number_gpus=0 is sized against the host's RAM, as plan sizes it: no --gpu-model to give."""
    assert main(["max-batch", "smollm2-135m", "number_gpus=0", "model_max_length=64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["job"]["number_gpus"] == 0 and out["job"]["gpu_model"] is None and out["largest"] >= 1
    assert out["at_largest"]["fits"] and "host memory" in " ".join(out["at_next"]["notes"])
    assert out["at_largest"]["oom_probability"] is None  # no GPU to run out of, as plan --json says
    # for people: judged in the host's RAM, without the GPU's out-of-memory probability
    assert main(["max-batch", "smollm2-135m", "number_gpus=0", "model_max_length=64"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"largest batch_size that fits: {out['largest']:,} (in the host's RAM)" in text
    assert "out-of-memory probability" not in text and "GiB/GPU" not in text
    grid = ["plan", LORA, "model_name=smollm2-135m", "number_gpus=0", "model_max_length=64", "--grid", "batch_size=1,2"]
    assert main(grid) == 0
    table = capsys.readouterr().out
    assert "2 of 2 points fit (in the host's RAM)" in " ".join(table.split())
    assert "peak GiB" in table and "P(OOM)" not in table and "headroom" not in table and "GiB/GPU" not in table


@pytest.mark.slow
def test_max_length_of_a_cpu_run_times_this_host_at_its_answer_only(capsys, monkeypatch):
    """The search's verdicts need memory only: the host is timed at the answer, not at each of the ~14 lengths
    the search tries (each a probe of seconds at a shape of its own)."""
    import tunebench.plan.predictor as predictor

    shapes = []
    real = predictor.entity_rate

    def counted(structure, dtype, autocast, checkpointing, shape, *args):
        shapes.append(shape)
        return real(structure, dtype, autocast, checkpointing, shape, *args)

    monkeypatch.setattr(predictor, "entity_rate", counted)
    assert main(["max-length", "smollm2-135m", "number_gpus=0", "--host-memory-gib", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["largest"] == 8192 and out["limited_by"].startswith("the model's context")
    assert len(set(shapes)) == 1, shapes  # the answer's micro-batch, once
    assert out["at_largest"]["dataset_tokens_per_second"] > 0 and out["job"]["number_gpus"] == 0
    assert (
        main(
            [
                "plan",
                LORA,
                "model_name=smollm2-135m",
                "model_max_length=8192",
                "number_gpus=0",
                "batch_size=1",
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)  # the answer's speed is the plan's: this host's, timed
    assert plan["dataset_tokens_per_second"] == pytest.approx(out["at_largest"]["dataset_tokens_per_second"], 1e-3)


def test_max_length_command(capsys):
    assert (
        main(
            [
                "max-length",
                "mistral-7b",
                "--gpu-model",
                "H100",
                "--method",
                "qlora",
                "--json",
                "dataset_id=news-tokens-128kplus-entries-320",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["experiment_id"] == "finetune_qlora_benchmark-v1.0.0" and out["property"] == "model_max_length"
    assert out["job"]["model_name"] == "mistral-7b-v0.1" and out["largest"] > 4096


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["max-batch", "llama-3.1-8b", "--gpu-model", "L40S", "--method", "sft"], "--method"),
        (["max-batch", "llama-3.1-8b"], "--gpu-model"),
        (["max-batch", "llama-3.1-8b", "--gpu-model", "L40S", "seq_len=512"], "seq_len"),
        (["max-batch", "llama-3.1-8b", "--gpu-model", "L40S", "model_name=x"], "model_name"),
        (["max-length", "no-such-model", "--gpu-model", "L40S"], "model_name"),
        (["max-length", "llama-3.1-8b", "--gpu-model", "L40S", "--max-oom-risk", "2"], "--max-oom-risk"),
        (["max-batch", "llama-3.1-8b", "--gpu-model", "L40S", "gpu_model=H100"], "gpu_model"),
        (["max-batch", "llama-3.1-8b", "--model-max-length", "512", "model_max_length=1024"], "model_max_length"),
        (["max-length", "llama-3.1-8b", "gpu_model=L40S", "number_gpus=two"], "number_gpus"),
        (["max-batch", "llama-3.1-8b", "gpu_model=L40S", "batch_size=8"], "batch_size"),
        (["max-length", "llama-3.1-8b", "gpu_model=L40S", "batch_size=0"], "batch_size"),  # rule 4 at any length
        (["max-length", "llama-3.1-8b", "gpu_model=L40S", "number_gpus=3", "batch_size=8"], "batch_size"),  # rule 1
    ],
)
def test_max_commands_bad_input_is_one_line_exit_2(capsys, args, field):
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), captured.err
    assert captured.out == ""


def test_a_probability_next_to_the_threshold_prints_with_the_digits_that_tell_them_apart():
    from tunebench.commands.printing import risk

    assert risk(0.05, 0.1) == "0.050" and risk(0.1002, 0.1) == "0.10020" and risk(0.0999, 0.1) == "0.09990"
    assert risk(0.1, 0.1) == "0.100" and risk(None, 0.1) == "-"
    assert risk(3e-9, 0.0) == "3e-09" and risk(0.0, 0.0) == "0.000"  # above a threshold of 0, not '0.000'


def test_a_grid_says_why_a_point_is_invalid(capsys, monkeypatch):
    """An invalid point's reason was only in --json; the table has a reason column where a point has one, kept
    on 80 columns before headroom and cost."""
    monkeypatch.setenv("COLUMNS", "80")
    job = ["model_name=llama3.2-1b", "model_max_length=128", "batch_size=3", "gpu_model=A100-80GB"]
    assert main(["plan", LORA, *job, "--grid", "number_gpus=1,2"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "reason" in text and "rule 1: batch_size 3 is not divisible by number_gpus 2" in text
    assert main(["plan", LORA, *job, "--grid", "number_gpus=1,3"]) == 0
    assert "reason" not in capsys.readouterr().out  # every point fits: no empty column
