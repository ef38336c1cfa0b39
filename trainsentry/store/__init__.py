"""The store: SQLAlchemy Core schema and engine (SQLite by default, PostgreSQL for HA)."""

from trainsentry.store.engine import StoreError, async_url, check_reachable, create_engine, migrate

__all__ = ["StoreError", "async_url", "check_reachable", "create_engine", "migrate"]
