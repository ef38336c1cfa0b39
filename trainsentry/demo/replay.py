"""Replays the demo incident through a real, in-process gateway (see trainsentry.demo)."""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from pydantic import SecretStr

from trainsentry.alerts import utcnow
from trainsentry.config import GatewaySettings, Settings
from trainsentry.demo.html import write_preview
from trainsentry.demo.incident import OPEN_NODES, Incident, load_incident, open_incident
from trainsentry.demo.maintenance_scene import SPAN, replay_window
from trainsentry.demo.previews import CallPreview, CardPreview, PreviewLog, SheetPreview
from trainsentry.gateway.public import GATEWAY_KEY, WEBHOOK_PATH, Gateway, create_app, oncall_of
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.reports.delivery import write_preview as write_report_preview
from trainsentry.store.queries import counts

ON_CALL = "+86 138-0000-0000 (demo on-call, layer 1)"
POLICY_FILE = "policy.yaml"  # the shipped policy, with the incident cards' console link
SETTLE_AFTER_S = 1800  # after the last webhook: held resolutions and storms calm down


def demo_oncall(base: datetime) -> dict[str, Any]:
    """A one-layer daily rotation whose handoff falls 45 minutes into the incident, so the
    replay shows a handoff notice (docs/oncall.md)."""
    start = (base - timedelta(hours=23, minutes=15)).replace(tzinfo=None).isoformat()
    layer = {"name": "primary", "start": start, "shift": "1d", "members": ["ana", "ben"]}
    return {
        "people": {"ana": {"phone": "+8613800000000"}, "ben": {"phone": "+8613800000001"}},
        "schedules": {"demo": {"timezone": "UTC", "layers": [layer]}},
    }


class VirtualClock:
    """The replay's time: it stands where the replay puts it; once `run()` is called it
    goes on from there at the wall clock's pace (for the console of `--serve`)."""

    def __init__(self, start: datetime) -> None:
        self.current = start
        self._since: float | None = None

    def run(self) -> None:
        self._since = time.monotonic()

    def __call__(self) -> datetime:
        if self._since is None:
            return self.current
        return self.current + timedelta(seconds=time.monotonic() - self._since)


def _prepare(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("cards",):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (
        "demo.db", "demo.db-wal", "demo.db-shm", "console.jsonl", "index.html", "report.html",
        POLICY_FILE,
    ):  # fmt: skip
        (out / name).unlink(missing_ok=True)


def _listen(port: int) -> socket.socket:
    """The demo gateway's socket on 127.0.0.1 (`port` 0: any free one), bound before the
    gateway is built, so its cards can link its console."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def _start_time() -> datetime:
    """Where the replay's clock starts: early enough that the incident, the settling after
    it and the maintenance window end about now, so the replay's times are real ones and
    the console's ages true."""
    now = utcnow().replace(microsecond=0)
    span = timedelta(seconds=load_incident(now).steps[-1].at + 2 * SETTLE_AFTER_S) + SPAN
    return now - span - timedelta(minutes=5)


def _gateway_settings(
    out: Path, port: int, console: str | None, token: str | None
) -> GatewaySettings:
    """The demo gateway's settings: on 127.0.0.1:`port`, its store in `out`, the API token
    `token` (None: no actions), and a policy (written to `out`) whose incident cards'
    "Incident" button opens the incident's page of `console`, this gateway's console, when
    it outlives the replay (`--serve`); None: no such button (no card points at a port
    that is gone when the demo ends)."""
    policy = {"grouping": {"url": console + "incidents/{incident}"}} if console else {}
    (out / POLICY_FILE).write_text(yaml.safe_dump(policy))
    return GatewaySettings(
        listen=f"127.0.0.1:{port}",
        db=f"sqlite:///{out / 'demo.db'}",
        policy_file=out / POLICY_FILE,
        api_token=SecretStr(token) if token else None,
    )


async def _replay_incident(
    gateway: Gateway, url: str, clock: VirtualClock, base: datetime, incident: Incident
) -> list[dict[str, Any]]:
    """Posts the incident's webhooks to `url` at their virtual times from `base`, the
    gateway settled after each step, then lets SETTLE_AFTER_S pass twice (held resolutions
    and storms calm down). Returns the gateway's answers, in order."""
    answers: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        for step in incident.steps:
            clock.current = base + timedelta(seconds=step.at)
            for body in step.bodies:
                answers.append(await _post(session, url, body))
            await gateway.settle()
    clock.current = base + timedelta(seconds=incident.steps[-1].at + SETTLE_AFTER_S)
    await gateway.settle()
    clock.current += timedelta(seconds=SETTLE_AFTER_S)
    await gateway.settle()
    return answers


async def _replay_maintenance(gateway: Gateway, url: str, clock: VirtualClock) -> dict[str, Any]:
    """The maintenance window's story (`replay_window`) from the clock's time on; returns
    what happened."""
    async with aiohttp.ClientSession() as session:

        def move_to(moment: datetime) -> None:
            clock.current = moment

        return await replay_window(gateway, session, url, clock, move_to)


async def _leave_open_incident(gateway: Gateway, url: str, clock: VirtualClock) -> None:
    """Five minutes on, sets the clock running at the wall clock's pace and opens the
    incident (`open_incident`) left for the console's user to acknowledge."""
    clock.current += timedelta(minutes=5)
    clock.run()
    async with aiohttp.ClientSession() as session:
        await _post(session, url, open_incident(clock()))
    await gateway.settle()


async def run_demo(
    out: Path,
    serve: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    port: int = 0,
) -> dict[str, Any]:
    """Replays the incident; `out` (absolute) receives the previews. Returns the summary.

    With `serve`, the gateway stays up after the replay (on 127.0.0.1:`port`, 0: any free
    port) while `serve(summary)` runs: `summary["incident console"]` is its console's URL,
    `summary["demo token"]` the token to sign in with (actions enabled), and one incident
    is left open (`open_incident`) to acknowledge there."""
    started = time.perf_counter()
    _prepare(out)
    base = _start_time()
    clock = VirtualClock(base)
    incident = load_incident(base)
    log = PreviewLog()
    cards = CardPreview(out, log)
    notifiers: dict[str, Notifier] = {
        "console": ConsoleNotifier(out / "console.jsonl"),
        "feishu": cards,
        "sheet": SheetPreview(out, log),
        "phone": CallPreview(out, log, ON_CALL),
    }
    sock = _listen(port)
    port = sock.getsockname()[1]
    console = f"http://127.0.0.1:{port}/ui/"
    token = secrets.token_urlsafe(12) if serve is not None else None
    settings = _gateway_settings(out, port, console if serve is not None else None, token)
    # The background ticker is not needed: the replay drives the timers at virtual times.
    oncall = oncall_of(Settings(gateway=settings, oncall=demo_oncall(base)))
    app = create_app(settings, notifiers=notifiers, clock=clock, tick_interval=3600, oncall=oncall)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    url = f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
    gateway = app[GATEWAY_KEY]
    try:
        answers = await _replay_incident(gateway, url, clock, base, incident)
        maintenance = await _replay_maintenance(gateway, url, clock)
        async with gateway.engine.connect() as conn:
            totals = await counts(conn)
        await write_report_preview(gateway.engine, out / "report.html", now=clock())
        summary = _summary(
            out, incident.title, answers, totals, maintenance, started, log, cards.updates
        )
        if serve is not None:
            await _leave_open_incident(gateway, url, clock)
            summary["incident console"] = console
            summary["demo token"] = token
            summary["open incident"] = (
                f"GPUThermalThrottling on {len(OPEN_NODES)} nodes of ml/llama-70b: sign in with "
                "the demo token and acknowledge it"
            )
            await serve(summary)
    finally:
        await runner.cleanup()
    return summary


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url, data=json.dumps(body).encode()) as response:
        answer = await response.json()
        if response.status != 200:
            raise RuntimeError(f"gateway answered {response.status}: {answer}")
        return dict(answer)


def _summary(
    out: Path,
    title: str,
    answers: list[dict[str, Any]],
    totals: dict[str, Any],
    maintenance: dict[str, Any],
    started: float,
    log: PreviewLog,
    card_updates: int,
) -> dict[str, Any]:
    by_channel = {
        channel: sum(statuses.values()) for channel, statuses in totals["notifications"].items()
    }
    summary: dict[str, Any] = {
        "incident": title,
        "webhooks received": len(answers),
        "alerts in webhooks": sum(a["alerts"] for a in answers),
        "alert occurrences stored": totals["alerts"],
        "state changes": totals["events"],
        "repeats ignored (duplicates)": sum(a["unchanged"] for a in answers),
        "notifications by channel": by_channel,
        # what the Feishu group shows: new cards, and incidents' cards redrawn in place
        "feishu messages": {
            "new cards": by_channel.get("feishu", 0) - card_updates,
            "card updates": card_updates,
        },
        "maintenance window": maintenance,
        "handoff notices": sum(1 for item in log.items if item.notification.kind == "handoff"),
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_preview(out / "index.html", title, summary, log)
    summary["outputs"] = {
        "preview": str(out / "index.html"),
        "cards": str(out / "cards"),
        "sheet": str(out / "sheet.csv"),
        "calls": str(out / "calls.jsonl"),
        "console": str(out / "console.jsonl"),
        "report": str(out / "report.html"),
        "store": str(out / "demo.db"),
    }
    return summary
