"""Building blocks of a measured run: tokenizer, data, model and PEFT (used by tunebench.worker)."""
