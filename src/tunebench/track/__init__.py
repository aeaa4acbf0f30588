"""Measurements to experiment trackers, MLflow and Aim, through their own client libraries (docs/tracking.md).

- targets.py: ``mlflow[:URI]`` / ``aim[:REPO]`` parsed (the embedded defaults under tunebench's home), and the
  one-line error naming the extra to install when a tracker's library is missing;
- runs.py: one stored result -> one tracker-independent TrackedRun (name, params, metrics, tags, series, logs);
- mlflow_writer.py, aim_writer.py: a TrackedRun into MLflow (MlflowClient) or Aim (aim.Run), idempotently;
- send.py: trackers opened and checked before anything is measured, then fed from the store (``run``,
  ``explore``), and ``export`` of a whole store.

Neither tracker library is imported until a tracker is used; nothing here imports the command line.
"""

from tunebench.track.send import Sent, Trackers, export, open_trackers
from tunebench.track.targets import KINDS, Target, parse_target, parse_targets

__all__ = ["KINDS", "Sent", "Target", "Trackers", "export", "open_trackers", "parse_target", "parse_targets"]
