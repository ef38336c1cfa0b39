"""Where the store's two backends differ, asked in one place: SQLite (the default) or
PostgreSQL (for several replicas), the only databases `engine.async_url` opens.

Pure: both read only the dialect of what they are given.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite


def is_sqlite(bind: Any) -> bool:
    """Pure: whether `bind` (an engine or a connection, sync or async, or a dialect) is
    SQLite; otherwise it is PostgreSQL, whose row locks (FOR UPDATE, SKIP LOCKED), advisory
    locks, sequences and JSONB the store uses where SQLite has none."""
    return bool(getattr(bind, "dialect", bind).name == "sqlite")


def dialect_insert(bind: Any, table: Table) -> Any:
    """Pure: the backend's INSERT construct for `table` (both offer ON CONFLICT)."""
    return sqlite.insert(table) if is_sqlite(bind) else postgresql.insert(table)
