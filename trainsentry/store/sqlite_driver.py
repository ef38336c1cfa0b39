"""The aiosqlite connection the store opens: aiosqlite 0.22's, with a stop that cannot hang.

Why not plain `aiosqlite.connect`: in aiosqlite 0.22 every `stop()` queues a "close and end
the worker thread" item and returns a future for it, and `close()` ends with `await stop()`.
A second `stop()` after the thread has ended waits forever: nothing is left to answer it.
SQLAlchemy reaches that when a task holding a connection is cancelled while the pool closes
it gracefully (`AsyncAdapt_terminate.terminate`: a shielded `close()`, then on cancellation a
forced `stop()` beside it): the worker runs the forced stop and exits, the shielded close's
own `stop()` is never answered, and the event loop's shutdown waits for that task for good.
That is the gateway test whose teardown hung for the whole 300 s test timeout in CI.
Upstream: omnilib/aiosqlite issues 369 and 375, sqlalchemy/sqlalchemy issue 13039 (open).

`StoreConnection.stop` is idempotent: once the worker was told to stop, a later stop returns
no future (aiosqlite's `close()` then has nothing to wait for) instead of one no thread will
ever answer. Nothing else changes. `tests/store/test_sqlite_driver.py` shows the plain class
hanging and this one not; remove this module once aiosqlite's own `stop()` is idempotent
(that test then fails and says so).
"""

from __future__ import annotations

import asyncio
import sqlite3
from functools import partial
from typing import Any

import aiosqlite

# aiosqlite.connect's default: rows fetched per round trip to the worker thread.
_ITER_CHUNK_SIZE = 64


class StoreConnection(aiosqlite.Connection):
    """An aiosqlite connection whose `stop()` may be called any number of times.

    Invariant: at most one stop request is queued to the worker thread; it is answered,
    since the worker handles every item queued before it."""

    def stop(self) -> asyncio.Future[Any] | None:
        if not self._running:
            return None
        return super().stop()


def connect(database: str, **kwargs: Any) -> StoreConnection:
    """What `aiosqlite.connect(database, **kwargs)` returns, as a StoreConnection (not yet
    awaited). SQLAlchemy calls it with the URL's arguments; see `use_store_connections`.

    The worker thread is a daemon, as SQLAlchemy makes aiosqlite's own: a pooled connection
    never keeps the process alive at exit (its data is on disk at every COMMIT)."""
    connection = StoreConnection(
        partial(sqlite3.connect, database, **kwargs), iter_chunk_size=_ITER_CHUNK_SIZE
    )
    connection._thread.daemon = True
    return connection


def use_store_connections(
    _dialect: Any, _record: Any, _cargs: list[Any], cparams: dict[str, Any]
) -> None:
    """A `do_connect` listener: SQLAlchemy's aiosqlite adapter opens its connections with
    `connect` above (its `async_creator_fn` argument) instead of `aiosqlite.connect`."""
    cparams["async_creator_fn"] = connect
