"""The store: SQLAlchemy Core schema and engine (SQLite by default, PostgreSQL for HA)."""

from trainsentry.store.engine import async_url, check_reachable, create_engine, migrate
from trainsentry.store.errors import StoreError

__all__ = ["StoreError", "async_url", "check_reachable", "create_engine", "migrate"]
