"""Shared by the console's tests: an in-process gateway, webhooks, a stored hang verdict."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.support.gateway_process import (
    post_alerts as post_alerts,  # the tests import it from here
)
from tests.support.webhook_factory import make_alert
from trainsentry.config import ConsoleSettings, GatewaySettings
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.store.alert_state import save_verdict

TOKEN = "console-test-token"


async def start(
    db_url: str, *, token: str | None = None, console: ConsoleSettings | None = None, **extra: Any
) -> TestServer:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        webhook_token=SecretStr(token) if token else None,
        api_token=SecretStr(token) if token else None,
        console=console or ConsoleSettings(),
    )
    extra.setdefault("tick_interval", 3600)
    server = TestServer(create_app(settings, **extra), host="127.0.0.1")
    await server.start_server()
    return server


def alert(index: int, **labels: str) -> dict[str, Any]:
    return make_alert(index, labels=labels or None)


def hang_verdict(
    tmp_path: Path, world: int = 16, culprit: int = 5, scenario: str = "hang"
) -> dict[str, Any]:
    """A real analyzer verdict: synthetic Flight Recorder dumps (a hang where `culprit`
    never entered the last collective, or `culprit` persistently slow), analysed as the
    gateway does (hang_enrichment)."""
    from trainsentry.diagnostics import analyze
    from trainsentry.diagnostics.synthetic import write_dumps
    from trainsentry.gateway.stages.hang.enrichment import HangVerdict, culprit_ranks, summarize

    folder = tmp_path / "dumps"
    entries = 20 if scenario == "hang" else 200
    write_dumps(
        folder, world, entries, scenario=scenario, culprit=culprit, fmt="json", prefix="rank_"
    )
    report = analyze([str(folder)], format="fr").to_dict()
    return HangVerdict(
        job="ml/llama-70b",
        verdict=str(report["verdict"]),
        summary=summarize(report, {}),
        culprit_ranks=culprit_ranks(report),
        ranks_answered=world,
        report=report,
    ).to_dict()


async def store_verdict(server: TestServer, alert_id: int, verdict: dict[str, Any]) -> None:
    gateway = server.app[GATEWAY_KEY]
    async with gateway.engine.begin() as conn:
        await save_verdict(conn, alert_id, verdict, {}, datetime.now(UTC), cancel=False)


async def signed_in(
    server: TestServer, name: str = "erin", token: str = TOKEN
) -> aiohttp.ClientSession:
    """A client session that went through the login form as a browser does."""
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with session.get(server.make_url("/ui/login")) as r:
        nonce = re.search(r'name="csrf" value="([^"]+)"', await r.text())
    assert nonce is not None
    form = {"csrf": nonce.group(1), "name": name, "token": token, "next": "/ui/"}
    async with session.post(server.make_url("/ui/login"), data=form, allow_redirects=False) as r:
        assert r.status == 303, await r.text()
    return session


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)
