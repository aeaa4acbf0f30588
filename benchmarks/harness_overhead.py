"""Harness overhead: tokens/s of a tunebench measurement against a bare PyTorch loop (issue 4 target: >= 0.95).

Both train the same random-weight Llama-shaped model (full fine-tuning, pure fp32 or bf16, AdamW, no
gradient checkpointing, batch 4 x 256 tokens, every sample truncated so no padding) for the same
number of optimizer steps on the CPU. The measurement's dataset_tokens_per_second (its own step
timer, excluding process start-up and model loading) is compared with the bare loop's tokens / time
over the same steps. Runs alternate (bare, tunebench, bare, tunebench, ...) to share the noise.

    python benchmarks/harness_overhead.py [--steps 12] [--repeats 3] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

CONFIG = {
    "model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 1024,
}  # fmt: skip
BATCH, SEQ = 4, 256


def bare_loop(steps: int, dtype: str) -> float:
    """Tokens/s of a plain PyTorch loop: forward, backward, AdamW step, zero_grad."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**CONFIG)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.config.use_cache = False
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    batches = [torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ)) for _ in range(steps)]
    start = time.perf_counter()
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
    return steps * BATCH * SEQ / (time.perf_counter() - start)


def tunebench_run(steps: int, dtype: str, config_path: str, out: Path) -> float:
    from tunebench.spec.experiments import get_experiment, make_entity
    from tunebench.actuators.measure import measure

    exp = get_experiment(
        "finetune_full_benchmark-v1.0.0",
        {"max_steps": steps, "dataset_id": "news-chars-1024-entries-64", "gradient_accumulation_steps": 1,
         "gradient_checkpointing": False, "torch_dtype": dtype},
    )  # fmt: skip
    entity = make_entity(exp, {"model_name": config_path, "model_max_length": SEQ, "number_gpus": 0, "batch_size": BATCH})
    result = measure(exp, entity, {"weights": "random", "output_dir": str(out), "timeout_seconds": 1800})
    if result.status != "valid":
        sys.exit(f"measurement {result.status}: {result.error or result.reasons}\n{result.log_tail}")
    tokens = result.properties["dataset_tokens_per_second"]
    padded = result.properties["train_tokens_per_second"]
    assert abs(tokens - padded) / padded < 1e-9, "samples were padded: the comparison would be unfair"
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="harness-overhead-"))
    (tmp / "config.json").write_text(json.dumps(CONFIG))
    bare, ours = [], []
    for i in range(args.repeats):
        bare.append(bare_loop(args.steps, args.dtype))
        ours.append(tunebench_run(args.steps, args.dtype, str(tmp / "config.json"), tmp / f"run{i}"))
        print(f"repeat {i + 1}: bare {bare[-1]:,.0f} tokens/s, tunebench {ours[-1]:,.0f} tokens/s, "
              f"ratio {ours[-1] / bare[-1]:.3f}", flush=True)  # fmt: skip
    ratio = statistics.median(ours) / statistics.median(bare)
    print(f"model llama {CONFIG['hidden_size']}x{CONFIG['num_hidden_layers']} layers, batch {BATCH} x {SEQ} tokens, "
          f"{args.steps} steps, {args.dtype}, {args.repeats} repeats")  # fmt: skip
    print(f"median bare loop   {statistics.median(bare):,.0f} tokens/s")
    print(f"median tunebench   {statistics.median(ours):,.0f} tokens/s")
    print(f"ratio tunebench/bare = {ratio:.3f}  (target >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})")


if __name__ == "__main__":
    main()
