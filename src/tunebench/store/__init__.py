"""The sample store: SQLAlchemy tables, schema migrations, claims with leases, CSV import/export.

from tunebench.store import Store
store = Store()                      # $TUNEBENCH_STORE or the default SQLite file
store = Store("sqlite:///x.db")      # any SQLAlchemy URL, or a plain path to an SQLite file

Names are loaded on first use (PEP 562 module __getattr__), so that importing a command module that
names the store (store/cli.py) does not import SQLAlchemy: `tunebench --help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunebench.store.db import default_path, store_url
    from tunebench.store.migrations import SCHEMA_VERSION, SchemaError
    from tunebench.store.schema import DONE, FAILED, INVALID, PENDING, RUNNING, STATES, VALID
    from tunebench.store.store import Claim, Record, Registered, Store, owner_id

_HOMES = {
    "tunebench.store.db": ("default_path", "store_url"),
    "tunebench.store.migrations": ("SCHEMA_VERSION", "SchemaError"),
    "tunebench.store.schema": ("DONE", "FAILED", "INVALID", "PENDING", "RUNNING", "STATES", "VALID"),
    "tunebench.store.store": ("Claim", "Record", "Registered", "Store", "owner_id"),
}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "DONE",
    "FAILED",
    "INVALID",
    "PENDING",
    "RUNNING",
    "SCHEMA_VERSION",
    "STATES",
    "VALID",
    "Claim",
    "Record",
    "Registered",
    "SchemaError",
    "Store",
    "default_path",
    "owner_id",
    "store_url",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tunebench.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
