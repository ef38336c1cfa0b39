"""Every failure of the store, in one place: the types a caller catches (callers never
import SQLAlchemy).

trainsentry's own, one hierarchy under `StoreError` (a RuntimeError):
- `StoreError`: the store cannot be used: a schema newer than this trainsentry, or a SQLite
  too old for it (`engine.py`, at start);
  - `StoreUrlError`: the database URL is not one we can use (a usage error; the message
    never holds the URL's password);
  - `StoreMissing`: a command that only reads the store (or adds its own tables to it) was
    pointed at a store that does not exist: it must not create an empty one in its place;
  - `StoreUnavailable`: a write could not be committed (the intake's writer,
    gateway/stages/intake.py, for a webhook or a hang trigger); the sender should retry
    (HTTP 503).

The driver's, raised through the store's functions while they run: aliases of SQLAlchemy's
classes (the store raises what its driver raises), named here so that only
trainsentry/store/ imports SQLAlchemy:
- `DatabaseError`: any failure of the database (SQLAlchemy's base class);
- `DriverError`: the database driver refused or failed (DBAPIError);
- `StoreDown`: the database cannot be reached or is locked (OperationalError);
- `Conflict`: a uniqueness or foreign-key constraint refused a write (IntegrityError).

What a caller catches when a store call fails while it runs: `STORE_FAILURES`, one tuple.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError


class StoreError(RuntimeError):
    """The store cannot be used (bad URL, missing, or a schema we cannot handle), or could
    not commit a write."""


class StoreUrlError(StoreError):
    """The database URL is not one we can use (a usage error; the message never holds the
    URL's password)."""


class StoreMissing(StoreError):
    """A command that only reads the store (or adds its own tables to it) was pointed at a
    store that does not exist: it must not create an empty one in its place."""


class StoreUnavailable(StoreError):
    """The store could not commit; the sender should retry (HTTP 503)."""


DatabaseError = SQLAlchemyError
DriverError = DBAPIError
StoreDown = OperationalError
Conflict = IntegrityError

#: A store call failed while it ran: the database (`DatabaseError`, with `DriverError`,
#: `StoreDown` and `Conflict` under it) or the connection or disk under it (`OSError`). The
#: one tuple callers catch (`except STORE_FAILURES`); `StoreError`s are raised apart.
STORE_FAILURES: tuple[type[Exception], ...] = (OSError, DatabaseError)

__all__ = [
    "STORE_FAILURES",
    "Conflict",
    "DatabaseError",
    "DriverError",
    "StoreDown",
    "StoreError",
    "StoreMissing",
    "StoreUnavailable",
    "StoreUrlError",
]
