"""The sample store: SQLAlchemy tables, schema migrations, claims with leases, CSV import/export.

from tunebench.store import Store
store = Store()                      # $TUNEBENCH_STORE or the default SQLite file
store = Store("sqlite:///x.db")      # any SQLAlchemy URL, or a plain path to an SQLite file
"""

from tunebench.store.db import default_path, store_url
from tunebench.store.migrations import SCHEMA_VERSION, SchemaError
from tunebench.store.schema import DONE, FAILED, INVALID, PENDING, RUNNING, STATES, VALID
from tunebench.store.store import Claim, Record, Registered, Store, owner_id

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
