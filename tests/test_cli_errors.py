"""Common mistakes on the command line get one clear line and exit code 2 (usage error, as the
README says), never a traceback; and read-only commands never create a store where there was
none. Every case runs the real CLI as a process."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainsentry.store import create_engine, migrate


def run_cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m trainsentry ARGS` in `cwd`, with no
    TRAINSENTRY_* variables from the test's own environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSENTRY_")}
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


def assert_usage_error(result: tuple[int, str, str], *expected: str) -> None:
    code, out, err = result
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    for text in expected:
        assert text in out + err, (out, err)


def make_store(path: Path) -> str:
    url = f"sqlite:///{path}"

    async def go() -> None:
        engine = create_engine(url)
        try:
            await migrate(engine)
        finally:
            await engine.dispose()

    asyncio.run(go())
    return url


def send_config(tmp_path: Path) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "channels": {"email": {"host": "127.0.0.1", "port": 9, "sender": "ts@example.com"}},
                "reports": {"recipients": ["sre@example.com"]},
            }
        )
    )
    return config


# --- read-only commands on a store that is not there ---------------------------------------


def test_report_render_refuses_a_missing_store_and_creates_none(tmp_path: Path) -> None:
    # the default store, sqlite:///trainsentry.db, relative to where the command runs
    result = run_cli(tmp_path, "report", "render", "--out", "r.html")
    assert_usage_error(result, str(tmp_path / "trainsentry.db"), "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_report_render_refuses_a_wrong_path(tmp_path: Path) -> None:
    make_store(tmp_path / "store.db")
    result = run_cli(tmp_path, "report", "render", "--db", "sqlite:///stor.db", "--out", "r.html")
    assert_usage_error(result, str(tmp_path / "stor.db"))
    assert not (tmp_path / "stor.db").exists() and not (tmp_path / "r.html").exists()


def test_report_send_refuses_a_missing_store_and_creates_none(tmp_path: Path) -> None:
    config = send_config(tmp_path)
    result = run_cli(tmp_path, "report", "send", "--config", str(config), "--db", "sqlite:///x.db")
    assert_usage_error(result, str(tmp_path / "x.db"))
    assert not (tmp_path / "x.db").exists()


def test_report_send_refuses_an_existing_file_without_a_store(tmp_path: Path) -> None:
    config = send_config(tmp_path)
    (tmp_path / "empty.db").touch()
    result = run_cli(
        tmp_path, "report", "send", "--config", str(config), "--db", "sqlite:///empty.db"
    )
    assert_usage_error(result, "no trainsentry store")
    with sqlite3.connect(tmp_path / "empty.db") as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_report_render_reads_an_existing_store(tmp_path: Path) -> None:
    url = make_store(tmp_path / "store.db")
    code, out, err = run_cli(tmp_path, "report", "render", "--db", url, "--out", "r.html")
    assert code == 0, err
    assert "0 alerts" in out and (tmp_path / "r.html").is_file()


def test_export_refuses_a_missing_store_and_creates_none(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "export", "--db", "sqlite:///nope.db", "--out", "x.csv")
    assert_usage_error(result, str(tmp_path / "nope.db"))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- usage mistakes: one line, exit code 2, no traceback -----------------------------------


def test_an_empty_gateway_section_with_an_override(tmp_path: Path) -> None:
    url = make_store(tmp_path / "store.db")
    config = tmp_path / "config.yaml"
    config.write_text("gateway:\n")
    code, _, err = run_cli(
        tmp_path, "report", "render", "--config", str(config), "--db", url, "--out", "r.html"
    )
    assert code == 0, err
    assert "Traceback" not in err


def test_a_gateway_section_that_is_not_a_mapping(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("gateway: sqlite\n")
    result = run_cli(
        tmp_path, "report", "render", "--config", str(config), "--db", "sqlite:///x.db",
        "--out", "r.html",
    )  # fmt: skip
    assert_usage_error(result, "gateway")


@pytest.mark.parametrize("policy", ["missing", "invalid"])
def test_gateway_with_a_bad_policy_file(tmp_path: Path, policy: str) -> None:
    policy_file = tmp_path / "policy.yaml"
    if policy == "invalid":
        policy_file.write_text("rules: [not, a, policy\n")
    result = run_cli(
        tmp_path, "gateway", "--listen", "127.0.0.1:0", "--db", "sqlite:///g.db",
        env={"TRAINSENTRY_POLICY_FILE": str(policy_file)},
    )  # fmt: skip
    assert_usage_error(result, "policy.yaml")
    assert not (tmp_path / "g.db").exists()


def test_gateway_with_a_policy_regex_re2_refuses(tmp_path: Path) -> None:
    """A look-ahead (Python's re has one, RE2 and Alertmanager do not): the policy file's path
    and the place of the pattern, and no store made."""
    policy_file = tmp_path / "policy.yaml"
    routes = [{"id": "r", "labels": {"node": "gpu-(?!17)"}, "channels": ["console"]}]
    policy_file.write_text(yaml.safe_dump({"routing": {"routes": routes}}))
    result = run_cli(
        tmp_path, "gateway", "--listen", "127.0.0.1:0", "--db", "sqlite:///g.db",
        env={"TRAINSENTRY_POLICY_FILE": str(policy_file)},
    )  # fmt: skip
    assert_usage_error(result, "policy.yaml", "routing.routes.0.labels", "RE2 syntax")
    assert not (tmp_path / "g.db").exists()


def test_gateway_with_a_total_window_cap_below_one_window(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump({"maintenance": {"max_window_hours": 48, "max_total_hours": 24}})
    )
    result = run_cli(
        tmp_path, "gateway", "--listen", "127.0.0.1:0", "--db", "sqlite:///g.db",
        "--config", str(config),
    )  # fmt: skip
    assert_usage_error(result, "maintenance", "max_total_hours must be at least max_window_hours")


def test_gateway_with_an_unusable_database_url(tmp_path: Path) -> None:
    result = run_cli(
        tmp_path, "gateway", "--listen", "127.0.0.1:0", "--db", "mysql://u:s3cret@h/db"
    )
    assert_usage_error(result, "unsupported database")
    assert "s3cret" not in result[1] + result[2]


@pytest.mark.parametrize(
    "args",
    [
        ["gateway", "--log-level", "debugg"],
        ["report", "render", "--out", "r.html", "--log-level", "debugg"],
        ["report", "send", "--log-level", "verbose"],
    ],
)
def test_an_unknown_log_level(tmp_path: Path, args: list[str]) -> None:
    assert_usage_error(run_cli(tmp_path, *args), "--log-level")


def test_a_lower_case_log_level_is_accepted(tmp_path: Path) -> None:
    url = make_store(tmp_path / "store.db")
    code, _, err = run_cli(
        tmp_path, "report", "render", "--db", url, "--out", "r.html", "--log-level", "debug"
    )
    assert code == 0, err


def test_report_render_on_an_unsupported_database(tmp_path: Path) -> None:
    result = run_cli(
        tmp_path, "report", "render", "--db", "mysql://u:s3cret@h/db", "--out", "r.html"
    )
    assert_usage_error(result, "unsupported database 'mysql'")
    assert "s3cret" not in result[1] + result[2]


@pytest.mark.parametrize("option", ["--out", "--text", "--csv"])
def test_report_render_into_a_missing_directory(tmp_path: Path, option: str) -> None:
    url = make_store(tmp_path / "store.db")
    args = ["--out", "r.html"] if option != "--out" else []
    result = run_cli(tmp_path, "report", "render", "--db", url, *args, option, "nodir/part")
    assert_usage_error(result, "nodir/part")


def test_export_into_a_missing_directory(tmp_path: Path) -> None:
    url = make_store(tmp_path / "store.db")
    result = run_cli(tmp_path, "export", "--db", url, "--out", "nodir/x.csv")
    assert_usage_error(result, "nodir/x.csv")


@pytest.mark.parametrize(
    "args",
    [
        ["ack", "5", "--gateway", "http://127.0.0.1:90g5"],
        ["probe", "status", "http://127.0.0.1:94O1"],
        ["probe", "dump", "http://127.0.0.1:94O1"],
        ["ack", "5", "--gateway", "127.0.0.1:9095"],  # no scheme
        ["probe", "status", "127.0.0.1:9401"],
    ],
)
def test_an_invalid_url(tmp_path: Path, args: list[str]) -> None:
    env = {"TRAINSENTRY_PROBE_TOKEN": "t"}
    assert_usage_error(run_cli(tmp_path, *args, env=env), args[-1])


# --- issue 47: each mistake one clear line naming the fix ------------------------------------


def test_analyze_json_into_a_closed_pipe_ends_without_a_traceback(tmp_path: Path) -> None:
    """`trainsentry analyze --json DUMPS | head`: the reader goes away before the report is
    written. Before: a BrokenPipeError traceback. Now: nothing on stderr, exit 141 (what a
    shell reports for SIGPIPE, as the top-level --help says). The read end is closed before
    the command writes, so the pipe is closed whatever the timing."""
    from tests.support.nccl_artifacts import nccl_dir

    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSENTRY_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "trainsentry", "analyze", "--json",
         str(nccl_dir() / "hang" / "watchdog")],
        cwd=tmp_path, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, err
    assert err == ""


@pytest.mark.parametrize("name", ["x.json", "x.txt", "x"])
def test_export_refuses_a_suffix_it_does_not_write(tmp_path: Path, name: str) -> None:
    """Before: `--out x.json` said "wrote 0 rows to x.json" and wrote CSV into it."""
    url = make_store(tmp_path / "store.db")
    result = run_cli(tmp_path, "export", "--db", url, "--out", name)
    assert_usage_error(result, f"--out {name}", ".csv or .xlsx")
    assert len((result[1] + result[2]).strip().splitlines()) == 1
    assert not (tmp_path / name).exists()


def test_gateway_with_a_missing_database_directory_names_the_path(tmp_path: Path) -> None:
    """Before: SQLAlchemy's `OperationalError ... unable to open database file`, no path."""
    missing = tmp_path / "var" / "lib" / "trainsentry"
    result = run_cli(
        tmp_path, "gateway", "--listen", "127.0.0.1:0", "--db", f"sqlite:///{missing}/g.db"
    )
    assert_usage_error(result, str(missing), "does not exist")
    assert "OperationalError" not in result[1] + result[2]
    assert len(result[2].strip().splitlines()) == 1, result[2]


def test_a_yaml_syntax_error_in_the_config_is_readable(tmp_path: Path) -> None:
    """Before: one log line holding the YAML error with its newlines escaped (`\\n`). Now
    the file, the line and column, and what is wrong, in lines a person reads."""
    config = tmp_path / "config.yaml"
    config.write_text("gateway:\n  listen: 127.0.0.1:9095\n channels: [feishu\n")
    code, out, err = run_cli(
        tmp_path, "gateway", "--listen", "127.0.0.1:0", "--db", "sqlite:///g.db",
        "--config", str(config),
    )  # fmt: skip
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "\\n" not in err, err
    first = err.strip().splitlines()[0]
    assert str(config) in first and "line 3" in first and "not valid YAML" in first, err
    assert not (tmp_path / "g.db").exists()
