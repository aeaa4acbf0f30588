"""``open_store``: the one way commands, the Python API and the planner's comparisons open a store.

It imports SQLAlchemy only when called, so a command module that names it keeps ``tunebench --help`` fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunebench.store.store import Store


def open_store(url: str | None, *, create: bool = True) -> Store:
    """The store at url (default: $TUNEBENCH_STORE, else the user's); InputError (--store) if it cannot be used.

    create=False (commands that only read): the store is opened read-only; one that does not exist, or a
    database without one (empty, or another program's tables), is an error, not a new empty store.
    """
    from sqlalchemy.exc import ArgumentError, DatabaseError

    from tunebench.errors import InputError
    from tunebench.secrets import mask_secrets
    from tunebench.store.db import check_location, store_url
    from tunebench.store.migrations import SchemaError
    from tunebench.store.store import Store

    target = store_url(url)
    check_location(target, create=create)
    try:
        return Store(target, readonly=not create)
    except (ArgumentError, DatabaseError, SchemaError) as exc:
        why = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise InputError("--store", f"cannot open the store {mask_secrets(target)}: {mask_secrets(why)}") from None
    except ModuleNotFoundError as exc:  # e.g. a PostgreSQL URL without its driver
        raise InputError("--store", f"the store's database driver is not installed: {exc}") from None
