"""The sample store: every (experiment, entity) measurement, its state and its results.

``Store`` is one object with three parts, each in its own module:

- the queue (store/queue.py): operations, register, claim, renew, complete, release, requeue_stale;
- the reads (store/reads.py): counts, states, request_ids, rows, table, results_of;
- the bulk import (store/imports.py): record_many.

Memoisation keys (ado-sfttrainer.md §12.4, pitfall 18): the canonical entity id (values, not
spelling; defaults dropped) + the experiment id including its parameterisation + the actuator name
(a prediction never stands in for a measurement).
"""

from __future__ import annotations

from tunebench.store.imports import Imports
from tunebench.store.queue import Queue, owner_id
from tunebench.store.reads import Reads
from tunebench.store.rows import Claim, Outcomes, Record, Registered, Selection, clean_json, no_gc, properties_of

__all__ = [
    "Claim",
    "Outcomes",
    "Record",
    "Registered",
    "Selection",
    "Store",
    "clean_json",
    "no_gc",
    "owner_id",
    "properties_of",
]


class Store(Queue, Reads, Imports):
    """A sample store at an SQLAlchemy URL (created and migrated on first use)."""
