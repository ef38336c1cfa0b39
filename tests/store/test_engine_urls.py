"""Database URLs: a password never reaches a message, and libpq's sslmode works with asyncpg
(against the real PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from trainsentry.store.engine import async_url, create_engine, migrate
from trainsentry.store.errors import StoreError, StoreMissing

SECRET = "s3cret"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql//u:{SECRET}@h/db",  # the missing colon
        f"postgresql:/u:{SECRET}@h/db",
        f"mysql://u:{SECRET}@h/db",
        f"postgresql://u:{SECRET}@h/db?sslmode=sometimes",
        f"postgresql://u:{SECRET}@h/db?sslmode=require&ssl=disable",
    ],
)
def test_refused_urls_never_show_the_password(url: str) -> None:
    with pytest.raises(StoreError) as caught:
        create_engine(url)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("command", ["report", "export"])
def test_the_cli_never_prints_the_password_of_a_bad_url(command: str, tmp_path: Path) -> None:
    url = f"postgresql//u:{SECRET}@h/db"
    args = {
        "report": ["report", "render", "--db", url, "--out", str(tmp_path / "r.html")],
        "export": ["export", "--db", url, "--out", str(tmp_path / "x.csv")],
    }[command]
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("TRAINSENTRY_")},
        timeout=60,
    )
    assert done.returncode == 2, done
    assert SECRET not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "not a database URL" in done.stdout + done.stderr


def test_libpq_certificate_parameters_are_refused_with_the_way_out() -> None:
    with pytest.raises(StoreError) as caught:
        async_url(f"postgresql://u:{SECRET}@h/db?sslmode=verify-full&sslrootcert=/ca.pem")
    assert "PGSSLROOTCERT" in str(caught.value)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u:p@h/db?sslmode=require", "postgresql+asyncpg://u:p@h/db?ssl=require"),
        (
            "postgres://u:p@h/db?sslmode=verify-full",
            "postgresql+asyncpg://u:p@h/db?ssl=verify-full",
        ),
        (
            "postgresql://u:p@h/db?application_name=x&sslmode=disable",
            "postgresql+asyncpg://u:p@h/db?application_name=x&ssl=disable",
        ),
        ("postgresql://u:p@h/db?ssl=require", "postgresql+asyncpg://u:p@h/db?ssl=require"),
        # psycopg understands libpq's parameters itself
        (
            "postgresql+psycopg://u:p@h/db?sslmode=require",
            "postgresql+psycopg://u:p@h/db?sslmode=require",
        ),
    ],
)
def test_libpq_sslmode_becomes_asyncpgs_ssl(given: str, expected: str) -> None:
    assert async_url(given) == expected


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer"])
async def test_a_sslmode_url_connects_to_the_real_postgresql(pg_url: str, mode: str) -> None:
    # The local server runs without TLS: these modes connect in plain text.
    engine = create_engine(f"{pg_url}?sslmode={mode}")
    try:
        await migrate(engine)
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await engine.dispose()


async def test_sslmode_require_is_enforced_not_rejected_as_an_argument(pg_url: str) -> None:
    # Without TLS on the server, require must fail because of TLS (as libpq would), not with
    # "connect() got an unexpected keyword argument 'sslmode'".
    engine = create_engine(f"{pg_url}?sslmode=require")
    try:
        with pytest.raises(Exception) as caught:
            await migrate(engine)
        assert not isinstance(caught.value, TypeError)
        assert "sslmode" not in str(caught.value)
        assert "SSL" in str(caught.value)
    finally:
        await engine.dispose()


def test_require_existing_names_the_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreMissing) as caught:
        create_engine("sqlite:///nowhere/trainsentry.db", must_exist=True)
    assert str(tmp_path / "nowhere" / "trainsentry.db") in str(caught.value)
    assert not (tmp_path / "nowhere").exists()
