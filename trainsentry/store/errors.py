"""The store's exception types, as the stages see them (they never import SQLAlchemy).

These are aliases of SQLAlchemy's classes (the store raises what its driver raises), named
here so that only trainsentry/store/ imports SQLAlchemy:
- `DatabaseError`: any failure of the store (SQLAlchemy's base class);
- `DriverError`: the database driver refused or failed (DBAPIError);
- `StoreDown`: the database cannot be reached or is locked (OperationalError);
- `Conflict`: a uniqueness or foreign-key constraint refused a write (IntegrityError).
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError

DatabaseError = SQLAlchemyError
DriverError = DBAPIError
StoreDown = OperationalError
Conflict = IntegrityError

__all__ = ["Conflict", "DatabaseError", "DriverError", "StoreDown"]
