"""The store's aiosqlite connection: a close that is interrupted by a forced stop finishes.

aiosqlite 0.22's own class waits forever there (the worker thread has ended and nobody
answers the second stop); SQLAlchemy's pool does exactly that when a task holding a
connection is cancelled during a graceful close, and the event loop's shutdown then hung
for the whole test timeout (CI, the handoff-notices test's teardown, 300 s)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiosqlite
import pytest
from sqlalchemy import text

from trainsentry.store import create_engine
from trainsentry.store.sqlite_driver import StoreConnection, connect


async def _close_cancelled_then_stopped(conn: aiosqlite.Connection) -> bool:
    """What SQLAlchemy's terminate does under cancellation: a graceful close is under way
    (queued on the worker), it is cancelled, and the pool stops the connection by force.
    True when the close task finishes within 3 s."""
    closing = asyncio.create_task(conn.close())
    await asyncio.sleep(0)  # the close is queued on the worker thread
    closing.cancel()
    conn.stop()
    done, _ = await asyncio.wait({closing}, timeout=3)
    closing.cancel()  # a stuck one: end it here, not in the loop's shutdown
    return bool(done)


async def test_plain_aiosqlite_hangs_there_so_the_store_needs_its_own_connection(
    tmp_path: Path,
) -> None:
    # When this fails, aiosqlite's stop() became idempotent: drop store/sqlite_driver.py.
    conn = aiosqlite.connect(tmp_path / "plain.db")
    conn._thread.daemon = True  # as SQLAlchemy sets it
    await conn
    assert not await _close_cancelled_then_stopped(conn)


async def test_the_store_connection_finishes_a_close_interrupted_by_a_forced_stop(
    tmp_path: Path,
) -> None:
    conn = await connect(str(tmp_path / "store.db"))
    await conn.execute("CREATE TABLE t (x)")
    assert await _close_cancelled_then_stopped(conn)
    assert not conn._thread.is_alive() or await asyncio.to_thread(conn._thread.join, 3) is None


async def test_a_second_stop_after_the_close_returns_nothing_to_wait_for(tmp_path: Path) -> None:
    conn = await connect(str(tmp_path / "store.db"))
    await conn.close()
    assert conn.stop() is None
    await asyncio.to_thread(conn._thread.join, 3)
    assert not conn._thread.is_alive()


async def test_the_engine_opens_store_connections_with_the_urls_arguments(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    engine = create_engine(f"sqlite:///{path}")
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (x)"))
            raw = await conn.get_raw_connection()
            assert isinstance(raw.driver_connection, StoreConnection)
            assert raw.driver_connection._thread.daemon
            mode = (await conn.execute(text("PRAGMA journal_mode"))).scalar()
            assert mode == "wal"  # the connect listener still runs on our connections
    finally:
        await engine.dispose()
    read_only = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    try:
        async with read_only.connect() as conn:
            with pytest.raises(Exception, match="readonly"):
                await conn.execute(text("INSERT INTO t VALUES (1)"))
    finally:
        await read_only.dispose()


async def test_a_pool_terminate_cancelled_midway_leaves_no_task_behind(tmp_path: Path) -> None:
    """SQLAlchemy's own path: the adapted connection's terminate() (a shielded graceful close,
    then a forced stop when cancelled) run in a task that is cancelled while it closes."""
    engine = create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        conn = await engine.connect()
        raw = await conn.get_raw_connection()
        adapted = raw.dbapi_connection
        before = asyncio.all_tasks()
        terminating = asyncio.create_task(conn.run_sync(lambda _sync: adapted.terminate()))
        await asyncio.sleep(0.01)  # inside the shielded close
        terminating.cancel()
        await asyncio.wait({terminating}, timeout=3)
        assert terminating.done()
        left = asyncio.all_tasks() - before - {asyncio.current_task()}
        if left:
            await asyncio.wait(left, timeout=3)
        assert all(task.done() for task in left), "a close task is stuck"
        await conn.invalidate()
    finally:
        await engine.dispose()
