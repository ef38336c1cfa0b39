"""`trainsentry report send` against a real SMTP server (aiosmtpd) and a seeded store:
MIME structure, CID images, CSV rows, idempotency per period, --force, failure, catch-up."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiosmtpd.controller import Controller
from sqlalchemy import select

from tests.support.ports import free_port
from trainsentry.reports import report_command
from trainsentry.store import create_engine, migrate
from trainsentry.store.schema import report_runs

from .seed import AFTER, T0, TZ, seed_week

pytestmark = pytest.mark.e2e

SENDER = "trainsentry@example.com"
SRE = ["sre@example.com", "lead@example.com"]
VISION = ["vision@example.com"]


class Inbox:
    def __init__(self) -> None:
        self.mails: list[tuple[list[str], EmailMessage]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = message_from_bytes(envelope.original_content, policy=policy.default)
        assert isinstance(parsed, EmailMessage)
        self.mails.append((list(envelope.rcpt_tos), parsed))
        return "250 OK"


def main(argv: list[str]) -> int:
    """`trainsentry report ...` through the command module (as trainsentry.cli runs it)."""
    assert argv[0] == "report"
    parser = argparse.ArgumentParser(prog="trainsentry report")
    report_command.add_arguments(parser)
    return report_command.run(parser.parse_args(argv[1:]))


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def _config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "channels": {"email": {"host": "127.0.0.1", "port": port, "security": "none",
                               "sender": SENDER, "timeout_s": 10}},
        "reports": {"timezone": TZ, "recipients": SRE, "cluster_name": "gpu-east",
                    "teams": {"vision": {"recipients": VISION, "namespaces": ["team-b"]}}},
    }))  # fmt: skip
    return path


def _seed(url: str) -> None:
    async def go() -> None:
        engine = create_engine(url)
        try:
            await migrate(engine)
            await seed_week(engine)
        finally:
            await engine.dispose()

    asyncio.run(go())


def _runs(url: str) -> dict[str, dict[str, Any]]:
    async def go() -> dict[str, dict[str, Any]]:
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(select(report_runs))
                return {r.period_key: dict(r.detail) for r in rows}
        finally:
            await engine.dispose()

    return asyncio.run(go())


def _send(
    capsys: pytest.CaptureFixture[str], config: Path, url: str, *extra: str
) -> tuple[int, list[dict[str, Any]]]:
    code = main(["report", "send", "--config", str(config), "--db", url, "--json", *extra])
    out = capsys.readouterr().out
    return code, json.loads(out)["results"] if out.strip() else []


def _check_mime(mail: EmailMessage) -> None:
    """multipart/mixed [alternative [plain, related [html, png*3]], csv], CIDs all referenced."""
    assert mail.get_content_type() == "multipart/mixed"
    alternative, attachment = mail.iter_parts()
    assert alternative.get_content_type() == "multipart/alternative"
    plain, related = alternative.iter_parts()
    assert plain.get_content_type() == "text/plain"
    assert related.get_content_type() == "multipart/related"
    html_part, *images = related.iter_parts()
    assert html_part.get_content_type() == "text/html"
    assert [i.get_content_type() for i in images] == ["image/png"] * 3
    html = html_part.get_content()
    referenced = set(re.findall(r'src="cid:([^"]+)"', html))
    cids = {str(i["Content-ID"]).strip().strip("<>") for i in images}
    assert referenced == cids and len(cids) == 3
    for image in images:
        assert image.get_content().startswith(b"\x89PNG\r\n\x1a\n")
        assert image.get_content_disposition() == "inline"
    assert "<script" not in html.lower()
    assert attachment.get_content_type() == "text/csv"
    assert attachment.get_content_disposition() == "attachment"


def _csv_rows(mail: EmailMessage) -> list[dict[str, str]]:
    attachment = next(iter(mail.iter_attachments()))
    text = attachment.get_content()
    text = text.decode("utf-8-sig") if isinstance(text, bytes) else text.lstrip("\ufeff")
    return list(csv.DictReader(io.StringIO(text)))


def test_send_idempotent_force_and_parts(
    db_url: str, tmp_path: Path, smtp: tuple[Inbox, int], capsys: pytest.CaptureFixture[str]
) -> None:
    inbox, port = smtp
    config = _config(tmp_path, port)
    _seed(db_url)
    now = ["--now", AFTER.isoformat()]

    code, results = _send(capsys, config, db_url, *now)
    assert code == 0
    assert [(r["audience"], r["status"]) for r in results] == [
        ("cluster", "sent"),
        ("vision", "sent"),
    ]
    assert len(inbox.mails) == 2
    by_rcpt = {tuple(rcpts): mail for rcpts, mail in inbox.mails}
    cluster, vision = by_rcpt[tuple(SRE)], by_rcpt[tuple(VISION)]

    assert (
        cluster["Subject"]
        == "[trainsentry] Weekly report gpu-east 09 Nov–15 Nov 2026: 8 alerts, 2 P0"
    )
    assert cluster["From"] == SENDER
    _check_mime(cluster)
    _check_mime(vision)
    text = cluster.get_body(("plain",)).get_content()
    assert "New 5, recurring 2, flapping 1" in text
    assert "2 incidents paged (3 calls), 2 acknowledged" in text

    rows = _csv_rows(cluster)
    assert len(rows) == 8  # one row per occurrence of the week
    assert sorted(r["alertname"] for r in rows).count("IBLinkErrorRecovery") == 3
    flapping = [r for r in rows if r["class"] == "flapping"]
    assert len(flapping) == 1 and flapping[0]["seconds_to_resolve"] == "60"
    late = next(r for r in rows if r["alertname"] == "GPUTemperatureHigh")
    assert late["resolved_at"] == "" and late["priority"] == "P2"  # resolved after the week
    assert len(_csv_rows(vision)) == 4
    assert "(vision)" in vision["Subject"] and "4 alerts, 0 P0" in vision["Subject"]

    runs = _runs(db_url)
    key = f"weekly/cluster/week:2026-11-09:{TZ}"
    assert runs[key]["state"] == "sent" and runs[key]["sends"] == 1
    assert runs[key]["totals"]["alerts"] == 8

    # a rerun (or a second CronJob pod) sends nothing
    code, results = _send(capsys, config, db_url, *now)
    assert code == 0 and {r["status"] for r in results} == {"skipped"}
    assert len(inbox.mails) == 2

    # --force sends again, for the audience asked for only
    code, results = _send(capsys, config, db_url, *now, "--force", "--team", "cluster")
    assert code == 0 and [r["status"] for r in results] == ["sent"]
    assert len(inbox.mails) == 3 and inbox.mails[-1][0] == SRE
    assert _runs(db_url)[key]["sends"] == 2


def test_failed_send_is_not_recorded_and_catch_up(
    tmp_path: Path, smtp: tuple[Inbox, int], capsys: pytest.CaptureFixture[str]
) -> None:
    # SQLite only: the PostgreSQL paths (claim, last sent week) run in the test above.
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    inbox, port = smtp
    _seed(db_url)
    down = _config(tmp_path, free_port())  # nothing listens there
    code, results = _send(capsys, down, db_url, "--now", AFTER.isoformat(), "--team", "cluster")
    assert code == 1 and results[0]["status"] == "failed"
    assert _runs(db_url) == {}  # the claim was withdrawn: the next run tries again

    config = _config(tmp_path, port)
    code, results = _send(capsys, config, db_url, "--now", AFTER.isoformat(), "--team", "cluster")
    assert code == 0 and results[0]["status"] == "sent" and len(inbox.mails) == 1

    # the job did not run for two weeks: the next run sends both missed weeks, oldest first
    later = (AFTER + timedelta(days=14)).isoformat()
    code, results = _send(capsys, config, db_url, "--now", later, "--team", "cluster")
    assert code == 0
    assert [(r["period"], r["status"]) for r in results] == [
        (f"week:2026-11-16:{TZ}", "sent"), (f"week:2026-11-23:{TZ}", "sent"),
    ]  # fmt: skip
    assert len(inbox.mails) == 3
    assert "09 Nov" not in inbox.mails[1][1]["Subject"] and "16 Nov" in inbox.mails[1][1]["Subject"]
    # the week after the seeded one holds only E2 (Mon 00:00 local)
    assert "1 alerts, 0 P0" in inbox.mails[1][1]["Subject"]
    code, results = _send(capsys, config, db_url, "--now", later, "--team", "cluster")
    assert [r["status"] for r in results] == ["skipped"] and len(inbox.mails) == 3


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    config = _config(tmp_path, 25)
    assert main(["report", "send", "--config", str(config), "--db", url, "--period", "nope"]) == 2
    assert main(["report", "send", "--config", str(config), "--db", url, "--team", "ghost"]) == 2
    assert (
        main(
            [
                "report",
                "render",
                "--db",
                url,
                "--tz",
                "Mars/Base",
                "--out",
                str(tmp_path / "r.html"),
            ]
        )
        == 2
    )
    empty = tmp_path / "empty.yaml"
    empty.write_text("reports: {recipients: [a@example.com]}\n")
    assert main(["report", "send", "--config", str(empty), "--db", url]) == 2  # no SMTP
    err = capsys.readouterr().err
    assert "cannot read period" in err and "unknown team" in err and "no SMTP" in err


async def test_gateway_loop_sends_once(tmp_path: Path, smtp: tuple[Inbox, int]) -> None:
    """The scheduler loop (for the gateway): first round sends, later rounds skip."""
    from trainsentry.config.reports import ReportSettings
    from trainsentry.notifiers.email import SmtpConfig
    from trainsentry.reports.schedule import report_loop

    inbox, port = smtp
    engine = create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    await migrate(engine)
    await seed_week(engine)
    settings = ReportSettings(timezone=TZ, recipients=SRE)
    settings = ReportSettings(
        timezone=TZ, recipients=SRE, link_url="https://g.example/?from={start_ms}"
    )
    rounds: list[list[str]] = []
    digests: list[tuple[int, str]] = []
    stop = asyncio.Event()

    async def digest(stats: Any, report: Any, link: str) -> None:
        digests.append((stats.total, link))

    def seen(outcomes: list[Any]) -> None:
        rounds.append([o.status for o in outcomes])
        if len(rounds) == 3:
            stop.set()

    try:
        await asyncio.wait_for(
            report_loop(engine, settings, SmtpConfig("127.0.0.1", port, SENDER, "none"),
                        stop=stop, interval_s=0.01, clock=lambda: AFTER, on_result=seen,
                        digest=digest),
            timeout=60,
        )  # fmt: skip
    finally:
        await engine.dispose()
    assert rounds == [["sent"], ["skipped"], ["skipped"]]
    assert len(inbox.mails) == 1
    start_ms = int(T0.timestamp() * 1000)
    assert digests == [(8, f"https://g.example/?from={start_ms}")]  # once, with the link


async def test_two_concurrent_runs_send_once(db_url: str, smtp: tuple[Inbox, int]) -> None:
    """Two CronJob pods (or gateway replicas) at the same moment: one mail, one skip."""
    from trainsentry.config.reports import ReportSettings
    from trainsentry.notifiers.email import SmtpConfig
    from trainsentry.reports.delivery import send_reports

    inbox, port = smtp
    engines = [create_engine(db_url), create_engine(db_url)]
    try:
        await migrate(engines[0])
        await seed_week(engines[0])
        settings = ReportSettings(timezone=TZ, recipients=SRE)
        config = SmtpConfig("127.0.0.1", port, SENDER, "none")
        results = await asyncio.gather(
            *(send_reports(engine, settings, config, now=AFTER) for engine in engines)
        )
    finally:
        for engine in engines:
            await engine.dispose()
    assert sorted(outcome.status for [outcome] in results) == ["sent", "skipped"]
    assert len(inbox.mails) == 1
