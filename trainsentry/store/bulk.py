"""Bulk writes that hand pre-encoded rows straight to the database driver.

SQLAlchemy Core runs a Python bind processor for every value of every row (UTC conversion,
SQLite's datetime text, JSON encoding) and builds a parameter dict per row. At intake rates
that was about 40% of the gateway's CPU (bench/bench_intake.py), so the hot writes of the
intake and the policy encode each value once (`Encoder`) and send multi-row statements through
`exec_driver_sql`. Reads and all other writes stay on Core.

The encodings are the ones Core uses, so rows written either way read back the same through
the Core tables (tests/store/test_bulk.py): on SQLite a time is naive UTC text
`YYYY-MM-DD HH:MM:SS.ffffff` (what `schema.UTCDateTime` over SQLite's DATETIME stores), on
PostgreSQL an aware datetime; JSON is text on both (the asyncpg dialect's jsonb codec takes
text).

Row counts are split into power-of-two chunks, so each table needs at most a dozen distinct
statements and the drivers' prepared-statement caches keep hitting.

A write made of several statements can be written once as *steps*: a generator that yields
`Fetch`/`ExecuteMany` and is sent each statement's rows back (`run_steps`). On SQLite the whole
generator runs on the driver's thread in one hop, so the event loop is free (parsing the next
webhooks) while SQLite works; on PostgreSQL each step is awaited on the connection. Only the
statement runner differs between the backends, not the write's logic.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, TypeVar

import orjson
from sqlalchemy import Table
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.dialect import is_sqlite

# Both backends allow 32,766+ bound parameters per statement; stay well below.
_MAX_PARAMS = 30_000
_MAX_ROWS_PER_STATEMENT = 256


class Encoder:
    """Turns Python values into what the connection's driver stores for our column types."""

    def __init__(self, dialect: str) -> None:
        self.sqlite = dialect == "sqlite"
        # Times recur across a batch's rows (the receipt's time in every row): encode each once.
        # An encoder lives for one batch, which bounds this.
        self._times: dict[datetime, Any] = {}

    def time(self, value: datetime | None) -> Any:
        if value is None:
            return None
        encoded = self._times.get(value)
        if encoded is None:
            encoded = self._times[value] = self._encode_time(value)
        return encoded

    def _encode_time(self, value: datetime) -> Any:
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use timezone-aware UTC")
        if value.tzinfo is not UTC:
            value = value.astimezone(UTC)
        if self.sqlite:
            return value.replace(tzinfo=None).isoformat(" ", "microseconds")
        return value

    @staticmethod
    def json(value: Any) -> str:
        return orjson.dumps(value, default=_plain).decode()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):  # e.g. an alert's labels given as a read-only mapping
        return dict(value)
    raise TypeError(f"cannot store {type(value).__name__} as JSON")


def decode_time(value: Any) -> datetime:
    """A time as the driver returns it (SQLite: UTC text; PostgreSQL: aware) → aware UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def decode_json(value: Any) -> Any:
    """JSON as the driver returns it (SQLite: text; PostgreSQL: text through SQLAlchemy's
    asyncpg codec, or already decoded)."""
    return orjson.loads(value) if isinstance(value, str | bytes) else value


def encoder(conn: AsyncConnection) -> Encoder:
    return Encoder(conn.dialect.name)


@lru_cache(maxsize=512)
def _numbered(sql: str) -> str:
    """`?` placeholders → PostgreSQL's `$1, $2, ...` (our statements hold no literal `?`)."""
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], start=1))


@lru_cache(maxsize=512)
def _insert_sql(table: str, columns: tuple[str, ...], rows: int, tail: str) -> str:
    row = "(" + ",".join("?" * len(columns)) + ")"
    return f"INSERT INTO {table} ({','.join(columns)}) VALUES {','.join([row] * rows)} {tail}"


def _chunks(total: int, per_row: int) -> list[tuple[int, int]]:
    """(start, size) pieces of `total` rows: full chunks, then the rest in powers of two."""
    largest = max(1, min(_MAX_ROWS_PER_STATEMENT, _MAX_PARAMS // max(1, per_row)))
    largest = 1 << (largest.bit_length() - 1)
    pieces: list[tuple[int, int]] = []
    start = 0
    while total - start >= largest:
        pieces.append((start, largest))
        start += largest
    size = largest
    while start < total:
        size >>= 1
        if total - start >= size:
            pieces.append((start, size))
            start += size
    return pieces


Row = tuple[Any, ...]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Fetch:
    """One statement (`?` placeholders); its result rows are sent back to the steps."""

    sql: str
    params: Sequence[Any] = ()


@dataclass(frozen=True, slots=True)
class ExecuteMany:
    """One statement run for every row; an empty list of rows is sent back."""

    sql: str
    rows: Sequence[Row]


Steps = Generator[Fetch | ExecuteMany, list[Row], T]


async def _sqlite_driver(conn: AsyncConnection) -> Any | None:
    """The aiosqlite connection under `conn` on SQLite, else None.

    Statements sent to it run in the same SQLite transaction as `conn`'s (one sqlite3
    connection; pysqlite opens the transaction at the first write either way)."""
    if not is_sqlite(conn):
        return None
    raw = await conn.get_raw_connection()
    return raw.driver_connection


def _run_on_sqlite(db: sqlite3.Connection, steps: Steps[T]) -> T:
    """Runs every step on the sqlite3 connection (called on aiosqlite's thread)."""
    result: list[Row] = []
    step: Fetch | ExecuteMany | None = None
    try:
        while True:
            step = steps.send(result) if step is not None else next(steps)
            if isinstance(step, Fetch):
                result = db.execute(step.sql, tuple(step.params)).fetchall()
            else:
                if step.rows:
                    db.executemany(step.sql, step.rows)
                result = []
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except sqlite3.Error as exc:
        # What SQLAlchemy would raise for it, so callers handle both backends alike.
        sql = step.sql if step is not None else ""
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
    finally:
        steps.close()


async def run_steps(conn: AsyncConnection, steps: Steps[T]) -> T:
    """Runs a multi-statement write inside `conn`'s transaction; returns the steps' result."""
    driver = await _sqlite_driver(conn)
    if driver is not None:
        # aiosqlite's own way to run a function on its connection's thread; there is no
        # public one. One hop instead of one per statement (about 90 µs each here).
        result: T = await driver._execute(_run_on_sqlite, driver._conn, steps)
        return result
    rows: list[Row] = []
    try:
        step = next(steps)
        while True:
            if isinstance(step, Fetch):
                found = await conn.exec_driver_sql(_numbered(step.sql), tuple(step.params))
                rows = [tuple(row) for row in found] if found.returns_rows else []
            else:
                if step.rows:
                    await conn.exec_driver_sql(_numbered(step.sql), list(step.rows))
                rows = []
            step = steps.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        steps.close()


def _fetch_steps(sql: str, params: Sequence[Any]) -> Steps[list[Row]]:
    return (yield Fetch(sql, params))


async def fetch(conn: AsyncConnection, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    """One statement written with `?` placeholders; its result rows as tuples."""
    return await run_steps(conn, _fetch_steps(sql, params))


def insert_steps(
    table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, tail: str = ""
) -> Steps[list[Row]]:
    """INSERT INTO table (columns) VALUES (row), (row), ... `tail`; `tail` is an optional
    ON CONFLICT and/or RETURNING clause. Values must be encoded (`Encoder`). Returns the rows
    RETURNING produced (tuples, in no particular order)."""
    returned: list[Row] = []
    names = tuple(columns)
    for start, size in _chunks(len(rows), len(names)):
        sql = _insert_sql(table, names, size, tail)
        params = [value for row in rows[start : start + size] for value in row]
        returned.extend((yield Fetch(sql, params)))
    return returned


# On SQLite every row a statement hands back (RETURNING, SELECT) and every row of an
# executemany is one sqlite3_step, and pysqlite releases the GIL around each. While the event
# loop is busy (parsing webhooks, planning), taking the GIL back can wait the interpreter's
# switch interval (5 ms) per step: a 400-row executemany took 1 ms beside an idle thread and
# 3 s beside a busy one. So the SQLite forms below touch many rows in few steps: rows read
# back as one JSON aggregate, updates as one statement per chunk.


def insert_returning_steps(
    table: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    returning: Sequence[str],
    conflict: str = "",
    sqlite: bool,
) -> Steps[list[Row]]:
    """Inserts rows (`conflict`: an optional ON CONFLICT clause); returns the `returning`
    columns of the rows inserted, not of those the conflict clause skipped.

    On SQLite, rows one INSERT adds get consecutive rowids (it holds the write lock), so they
    are read back by rowid range, in one aggregate row per chunk. The table's key must be
    one SQLite assigns (INTEGER PRIMARY KEY, not given in the rows); a count check refuses
    anything else rather than pair the wrong rows."""
    if not sqlite:
        tail = f"{conflict} RETURNING {', '.join(returning)}".strip()
        return (yield from insert_steps(table, columns, rows, tail=tail))
    names = tuple(columns)
    found: list[Row] = []
    for start, size in _chunks(len(rows), len(names)):
        params = [value for row in rows[start : start + size] for value in row]
        yield Fetch(_insert_sql(table, names, size, conflict), params)
        ((last, inserted),) = yield Fetch("SELECT last_insert_rowid(), changes()")
        if not inserted:
            continue
        ((packed,),) = yield Fetch(
            _packed_rows_sql(table, tuple(returning)), (last - inserted, last)
        )
        chunk = [tuple(row) for row in orjson.loads(packed)]
        if len(chunk) != inserted:  # not consecutive after all: never guess which row is which
            raise RuntimeError(f"{table}: {inserted} rows inserted, {len(chunk)} read back")
        found.extend(chunk)
    return found


@lru_cache(maxsize=64)
def _packed_rows_sql(table: str, columns: tuple[str, ...]) -> str:
    return (
        f"SELECT json_group_array(json_array({', '.join(columns)})) FROM {table} "
        "WHERE rowid > ? AND rowid <= ?"
    )


def update_steps(
    table: str,
    columns: Sequence[str],
    key: str,
    rows: Sequence[Sequence[Any]],
    *,
    sqlite: bool,
) -> Steps[None]:
    """UPDATE table SET column = ... WHERE key = ... for every row: (values of `columns`, key).
    Keys must be unique among the rows."""
    if not rows:
        return
    if not sqlite:
        sets = ", ".join(f"{column} = ?" for column in columns)
        yield ExecuteMany(f"UPDATE {table} SET {sets} WHERE {key} = ?", [tuple(r) for r in rows])
        return
    names = (*columns, key)
    for start, size in _chunks(len(rows), len(names)):
        params = [value for row in rows[start : start + size] for value in row]
        yield Fetch(_update_from_values_sql(table, tuple(columns), key, size), params)


@lru_cache(maxsize=256)
def _update_from_values_sql(table: str, columns: tuple[str, ...], key: str, rows: int) -> str:
    names = (*columns, key)
    row = "(" + ",".join("?" * len(names)) + ")"
    sets = ", ".join(f"{column} = v.{column}" for column in columns)
    return (
        f"WITH v({', '.join(names)}) AS (VALUES {','.join([row] * rows)}) "
        f"UPDATE {table} SET {sets} FROM v WHERE {table}.{key} = v.{key}"
    )


async def insert_rows(
    conn: AsyncConnection,
    table: Table,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    tail: str = "",
) -> list[Row]:
    """`insert_steps` on its own."""
    return await run_steps(conn, insert_steps(table.name, columns, rows, tail=tail))
