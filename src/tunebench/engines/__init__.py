"""Training engines: what really trains when the measuring actuator runs an entity.

- ``native``: tunebench's own worker (tunebench.worker) on the project's transformers/peft: the quick
  path, no extra environment; the ``measure`` actuator.
- ``fms-hf-tuning``: fms-hf-tuning's own ``tuning.sft_trainer`` at the version the entity names
  (``fms_hf_tuning_version``), in an environment of its own (tunebench.engines.envs), with
  tunebench's metrics callback passed through ``train(..., additional_callbacks=...)``
  (tunebench.engines.fms_worker); the ``fms-hf-tuning`` actuator.

The engine is part of a measurement's identity: each is its own actuator name in the store, so
their results never mix. docs/engines.md says which to use when.
"""

NATIVE = "native"
FMS = "fms-hf-tuning"
ENGINES = (NATIVE, FMS)  # also tunebench.inputs.Engine, the CLI's --engine

# An fms-hf-tuning environment's manifest (tunebench.engines.envs), and the packages whose exact
# versions it and every measurement record (tunebench.engines.fms_worker).
MANIFEST = "tunebench-engine.json"
RECORDED = ("fms-hf-tuning", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers",
            "fms-acceleration", "fms-acceleration-foak", "fms-acceleration-moe", "fms-acceleration-peft",
            "fms-acceleration-aadp")  # fmt: skip
