"""Write the random-weight checkpoint an fms-hf-tuning run loads: ``python -m tunebench.engines.checkpoint <worker flags>``.

Run by tunebench.engines.fms_worker (local rank 0) with the project's own interpreter: the catalog
architecture (shrunk with --tunebench_tiny) with random weights, in the dtype the run trains in,
and its tokenizer (the architecture's, or one trained on the data set's texts for tiny models), saved
with ``save_pretrained`` to ``<output_dir>/tunebench-model``; ``tunebench-facts.json`` (what the
record's metadata says of the weights) is written last, so a present file means a whole checkpoint.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tunebench.engines.fms_worker import FACTS, MODEL_DIR
from tunebench.training import data
from tunebench.training import model as model_mod
from tunebench.worker import train as steps
from tunebench.worker.args import parse_args


def write_checkpoint(argv: list[str]) -> Path:
    """Build and save the checkpoint of this command line's model; returns its folder."""
    from transformers import set_seed

    config, _unknown = parse_args(argv)  # the worker passes its torch_dtype (as run) and --output_dir
    set_seed(config.seed)  # seeded as the native worker is before it builds the model
    target = Path(config.output_dir) / MODEL_DIR
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    texts = data.read_jsonl(config.training_data_path, config.dataset_text_field)
    spec = model_mod.architecture_spec(config.tunebench_model, config.model_name_or_path)
    resolved = steps.text_tokenizer(config, texts, None, spec, tmp, 0)
    model, facts = steps.build_model(config, False, resolved.tokenizer, None, spec)  # built on the CPU
    model.save_pretrained(tmp)
    resolved.tokenizer.save_pretrained(tmp)
    _portable_tokenizer_config(tmp / "tokenizer_config.json")
    facts["tokenizer"] = resolved.describe()
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    (target / FACTS).write_text(json.dumps(facts, default=str))
    return target


def _portable_tokenizer_config(path: Path) -> None:
    """transformers 5 names its generic fast tokenizer class TokenizersBackend; the releases fms-hf-tuning
    pins (transformers 4.x) know the same class as PreTrainedTokenizerFast (tokenizer.json is unchanged)."""
    if not path.exists():
        return
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2))


if __name__ == "__main__":
    print(f"tunebench.engines.checkpoint: wrote {write_checkpoint(sys.argv[1:])}", flush=True)
