"""Tiny model configs the tests build from (never downloaded): one definition for every test folder."""

# a 2-layer Llama with grouped-query attention: trains in seconds on the CPU
TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512,
}  # fmt: skip

# the least a config.json needs for the planner to read a decoder: what bad-config tests change one field of
TINY_DECODER = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "vocab_size": 1000,
}  # fmt: skip
