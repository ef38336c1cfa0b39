"""`trainsentry demo` end to end: the CLI replays the incident through the real gateway; its
preview drawn in headless Chromium; `--serve` leaves an incident to acknowledge in the
console, and every alert of the recorded incident is reachable from it."""

from __future__ import annotations

import asyncio
import csv
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.browser import CHROMIUM, Browser

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The demo run once for the module's tests: its output folder and its JSON summary."""
    out = tmp_path_factory.mktemp("demo") / "out"
    result = subprocess.run(
        [sys.executable, "-m", "trainsentry", "demo", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out, json.loads(result.stdout)


def test_demo_replays_the_incident_and_writes_what_would_be_sent(
    demo: tuple[Path, dict[str, Any]],
) -> None:
    out, summary = demo
    # 1 XID 79 + 5 occurrences of the flapping port + 200 disk/OOM alerts, each fired and
    # resolved, + the node-not-ready alert of the maintenance window (trainsentry/demo)
    assert summary["alert occurrences stored"] == 207
    assert summary["state changes"] == 414
    assert summary["repeats ignored (duplicates)"] == 1
    assert summary["handoff notices"] == 1  # the demo's daily rotation hands over once
    sent = summary["notifications by channel"]
    assert sent["sheet"] == 414  # every change archived, storm or maintenance or not
    assert summary["maintenance window"]["notices held back while it was open"] >= 1
    assert sent["feishu"] < 100  # the 200-alert burst collapsed into storm summaries
    # issue 34: one card per incident, kept up to date (57 cards before incidents; 9 new
    # cards and 13 updates before a storm card waited for something folded): at most 15
    # Feishu messages, the updates in place counted apart
    messages = summary["feishu messages"]
    assert messages["new cards"] <= 15, messages
    assert messages["new cards"] + messages["card updates"] == sent["feishu"]
    assert len(calls_of(out)) <= 3

    with (out / "sheet.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 207 and all(row["status"] == "resolved" for row in rows)

    calls = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    assert calls[0]["alertname"] == "GPUFellOffBus"
    assert len({c["alertname"] for c in calls}) == len(calls)  # the flapping port paged once

    cards = sorted((out / "cards").glob("*.json"))
    assert len(cards) == sent["feishu"]
    assert all(path.stat().st_size <= 20 * 1024 for path in cards)
    bodies = [json.loads(path.read_text())["card"] for path in cards]
    titles = [card["header"]["title"]["content"] for card in bodies]
    # without --serve no console outlives the run: no card points at its port (issue 47;
    # before, every incident card's Incident button did); with --serve they do (below)
    assert not [t for c, t in zip(bodies, titles, strict=True) if "127.0.0.1:" in json.dumps(c)]
    assert any("GPUFellOffBus" in t for t in titles)
    assert any("storm" in json.dumps(card).lower() for card in bodies)
    assert any("FLAPPING" in t.upper() for t in titles)
    # the maintenance window: announced before its end, its alert sent at the end, saying why
    assert any(t.startswith("Maintenance window ends") for t in titles)
    held = [json.dumps(card) for card, t in zip(bodies, titles, strict=True) if "NodeNotReady" in t]
    assert len(held) == 2 and "held by maintenance window" in held[0]

    html = (out / "index.html").read_text()
    assert "GPUFellOffBus" in html and "<script" not in html
    report = (out / "report.html").read_text()
    assert "GPUFellOffBus" in report or "gpu-node-17" in report
    # the 200 disk and OOM alerts are two incidents' cards: nothing folded, no storm card,
    # so the report (which reads the storm messages) counts none
    assert "Storms: 0" in report
    console = (out / "console.jsonl").read_text().splitlines()
    assert len(console) == sent["console"]


def calls_of(out: Path) -> list[str]:
    return (out / "calls.jsonl").read_text().splitlines()


def test_demo_help_lists_exit_codes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainsentry", "demo", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "Exit codes" in result.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
async def test_the_preview_draws_each_card_as_feishu_does(
    demo: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """index.html in headless Chromium: the summary is a table; each new card is drawn
    once (markdown rendered, buttons as buttons, the grey footer as a footer), its updates
    in place as its versions; no raw markdown or font tag shows."""
    out, summary = demo
    messages = summary["feishu messages"]
    async with Browser.launch(tmp_path) as page:
        await page.goto((out / "index.html").as_uri())
        text = await page.text("body")
        for raw in ("**", "<font", "&lt;", "{'"):
            assert raw not in text, f"{raw!r} shows in the preview"
        rows = await page.evaluate("document.querySelectorAll('table.summary > tbody > tr').length")
        assert rows == len([k for k in summary if k != "outputs"])
        nested = "table.summary tr table th"
        assert "new cards" in await page.evaluate(
            f"[...document.querySelectorAll('{nested}')].map(e => e.innerText).join(' ')"
        )
        drawn = await page.evaluate("document.querySelectorAll('.chat > .msg > .fs-card').length")
        assert drawn == messages["new cards"]
        versions = await page.evaluate("document.querySelectorAll('.version .fs-card').length")
        updated = await page.evaluate("document.querySelectorAll('.msg .updated').length")
        assert versions - updated == messages["card updates"]  # each updated card: sent + updates
        footers = await page.evaluate("document.querySelectorAll('.msg > .fs-card .fs-footer')")
        assert footers is not None
        assert await page.evaluate(
            "[...document.querySelectorAll('.chat > .msg > .fs-card')]"
            ".every(c => c.querySelector('.fs-footer') !== null)"
        )
        assert await page.evaluate("document.querySelectorAll('.fs-card b').length") > 0
        links = await page.evaluate(
            "[...document.querySelectorAll('.chat > .msg > .fs-card a.fs-button')]"
            ".map(a => a.textContent)"
        )
        assert {"Runbook", "Source"} <= set(links)
        assert "Incident" not in links  # no console outlives a run without --serve
        assert await page.evaluate("document.querySelectorAll('script').length") == 0


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("stop_with", "sigint_ignored_at_start"),
    [
        # Started the way a shell's background job or another program's child may be: SIGINT
        # ignored, which Python's KeyboardInterrupt then never sees (this hung the test in
        # full runs, where an earlier test left SIGINT ignored in pytest's process).
        (signal.SIGINT, True),
        (signal.SIGTERM, False),  # docker stop, a pod's end
    ],
    ids=["sigint-inherited-ignored", "sigterm"],
)
def test_demo_serve_leaves_an_incident_to_acknowledge_and_every_alert_reachable(
    tmp_path: Path, stop_with: signal.Signals, sigint_ignored_at_start: bool
) -> None:
    """`demo --serve`: the console of its run, signed in with the demo token it prints; one
    incident left open, acknowledged from Now by a newcomer; every alert of the recorded
    incident listed on its incident's page in the console; it ends on SIGINT or SIGTERM."""
    import collections
    import threading

    process = subprocess.Popen(
        [sys.executable, "-m", "trainsentry", "demo", "--out", str(tmp_path / "d"), "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint if sigint_ignored_at_start else None,
    )
    try:
        assert process.stdout is not None
        url = token = None
        for line in process.stdout:  # the replay, the token, then the console's address
            if found := re.search(r"demo token: (\S+)", line):
                token = found.group(1)
            if found := re.search(r"incident console: (http://127\.0\.0\.1:\d+/ui/)", line):
                url = found.group(1)
                break
        assert url is not None and token is not None, "no console address or token printed"
        # every incident's card links its page in this console (policy grouping.url)
        files = sorted((tmp_path / "d" / "cards").glob("*.json"))
        cards = [json.loads(p.read_text())["card"] for p in files]
        incident_cards = [
            json.dumps(c) for c in cards if "— ml/" in c["header"]["title"]["content"]
        ]
        assert incident_cards and all(f"{url}incidents/" in c for c in incident_cards)
        # Keep reading what the demo prints, so a full pipe never blocks its shutdown, and
        # keep the last lines to say why, should it not end.
        tail: collections.deque[str] = collections.deque(maxlen=40)
        reader = threading.Thread(target=tail.extend, args=(process.stdout,), daemon=True)
        reader.start()
        asyncio.run(_newcomer(url, token))
        process.send_signal(stop_with)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"demo --serve did not end 30 s after {stop_with.name}:\n" + "".join(tail))
        assert code == 0, "".join(tail)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def _newcomer(url: str, token: str) -> None:
    api = {"Authorization": f"Bearer {token}"}
    root = url.removesuffix("/ui/")
    jar = aiohttp.CookieJar(unsafe=True)
    async with (
        aiohttp.ClientSession(cookie_jar=jar) as browser,
        aiohttp.ClientSession(headers=api) as client,
    ):

        async def page(path: str) -> str:
            async with browser.get(root + path) as r:
                assert r.status == 200, (path, r.status)
                return await r.text()

        # signing in with the printed token, as the console's form does
        login = await page("/ui/login")
        nonce = re.search(r'name="csrf" value="([^"]+)"', login)
        assert nonce is not None
        form = {"csrf": nonce.group(1), "name": "newcomer", "token": token, "next": "/ui/"}
        async with browser.post(root + "/ui/login", data=form, allow_redirects=False) as r:
            assert r.status == 303, await r.text()
        history = await page("/ui/history?days=7")
        assert "GPUFellOffBus" in history and "gpu-node-17" in history
        # the incident left open, acknowledged from Now
        async with client.get(root + "/api/v1/incidents?status=firing") as r:
            [open_one] = (await r.json())["items"]
        assert open_one["alertname"] == "GPUThermalThrottling" and open_one["acked_by"] is None
        now = await page("/ui/")
        action = f'action="/ui/incidents/{open_one["id"]}/ack"'
        assert action in now
        csrf = re.search(r'name="csrf" value="([^"]+)"', now)
        assert csrf is not None
        ack = {"csrf": csrf.group(1), "from": "now"}
        target = f"{root}/ui/incidents/{open_one['id']}/ack"
        headers = {"Origin": root}
        async with browser.post(target, data=ack, headers=headers, allow_redirects=False) as r:
            assert r.status == 303, await r.text()
        async with client.get(f"{root}/api/v1/incidents/{open_one['id']}") as r:
            acked = await r.json()
        # signed in with the token: break-glass, recorded with the token it came with
        assert acked["acked_by"] == "newcomer (break-glass token)"
        assert {a["acked_by"] for a in acked["alerts"]} == {"newcomer (break-glass token)"}
        # every alert of the recorded incident is on its incident's page in the console
        alerts: set[int] = set()
        before = ""
        while True:
            async with client.get(f"{root}/api/v1/alerts?limit=1000{before}") as r:
                listed = await r.json()
            alerts |= {a["id"] for a in listed["items"]}
            if listed["next_before"] is None:
                break
            before = f"&before={listed['next_before']}"
        async with client.get(root + "/api/v1/incidents?limit=1000") as r:
            incidents = (await r.json())["items"]
        drawn: set[int] = set()
        for incident in incidents:
            html = await page(f"/ui/incidents/{incident['id']}")
            drawn |= {int(i) for i in re.findall(r'href="/ui/alerts/(\d+)"', html)}
        assert len(alerts) == 207 + 3 and drawn == alerts


# --- issue 47: the demo's cards say what is true ------------------------------------------


def _card_texts(out: Path) -> list[tuple[str, str]]:
    """(title, every text of the card joined by newlines) of each card file, in order."""

    def walk(node: Any, texts: list[str]) -> list[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("content", "text") and isinstance(value, str):
                    texts.append(value)
                else:
                    walk(value, texts)
        elif isinstance(node, list):
            for item in node:
                walk(item, texts)
        return texts

    cards = [json.loads(p.read_text())["card"] for p in sorted((out / "cards").glob("*.json"))]
    return [(c["header"]["title"]["content"], "\n".join(walk(c["body"], []))) for c in cards]


def test_reason_lines_read_as_sentences(demo: tuple[Path, dict[str, Any]]) -> None:
    """Every card's Reason is a sentence: no rule id ("label:priority"), no "priority label
    P1" fragment; and so is the reason the store keeps, which the console shows (before:
    "priority: label:priority: priority label P1")."""
    import sqlite3

    out, _ = demo
    reasons = [
        line.split("**Reason:** ", 1)[1]
        for _, text in _card_texts(out)
        for line in text.splitlines()
        if line.startswith("**Reason:** ")
    ]
    assert reasons
    with sqlite3.connect(out / "demo.db") as db:
        stored = [r for (r,) in db.execute("SELECT DISTINCT priority_reason FROM alerts") if r]
    assert stored
    for reason in reasons + stored:
        assert reason[0].isupper() and reason.endswith("."), reason
        assert not re.search(r"\b(label|alertname|severity|blast-radius|xid):", reason), reason
        assert "priority label P" not in reason, reason
    assert any("Its priority label is P2" in r and "raises P2 to P1" in r for r in reasons)


def test_the_maintenance_notice_is_a_notice(demo: tuple[Path, dict[str, Any]]) -> None:
    """Before: "[P1] FIRING: MaintenanceWindowEnding — gpu-node-17", its headline repeated
    as its Reason, footer "alert ?"."""
    out, _ = demo
    [(title, text)] = [(t, x) for t, x in _card_texts(out) if "aintenance" in t]
    assert "FIRING" not in title and "[P" not in title, title
    assert title.startswith("Maintenance window") and "ends" in title, title
    assert "alert ?" not in text and "**Reason:**" not in text, text
    assert "NodeNotReady (#207)" in text and "GPU 3 swap after XID 79" in text
    assert len(re.findall(r"GPU 3 swap after XID 79", title + text)) == 1


def test_every_p0_card_says_what_to_do_first(demo: tuple[Path, dict[str, Any]]) -> None:
    """Before: the OOM card, paged as P0, gave no next step (only a Runbook button)."""
    out, _ = demo
    firing_p0 = [(t, x) for t, x in _card_texts(out) if t.startswith("[P0] FIRING")]
    assert any("NodeOOMKills" in t for t, _ in firing_p0)
    for title, text in firing_p0:
        assert "**First:** " in text, title
    [oom] = {x for t, x in firing_p0 if "NodeOOMKills" in t and "8 firing" in x}
    assert "journalctl -k" in oom


def test_the_disk_incident_leads_with_what_its_alerts_share(
    demo: tuple[Path, dict[str, Any]],
) -> None:
    """The disk incident (alerts on /checkpoints, /data and /scratch of 64 nodes): before,
    every card of it led with one alert, "/checkpoints on gpu-node-00 is 93% full", with
    **Node:** gpu-node-00 and `mountpoint=/checkpoints`, even once gpu-node-00 resolved."""
    out, _ = demo
    disk = [(t, x) for t, x in _card_texts(out) if "NodeFilesystemSpaceLow" in t]
    assert disk
    for _title, text in disk:
        assert "gpu-node-00 is" not in text and "**Node:** gpu-node-00" not in text, text
        assert "mountpoint=" not in text, text  # a mountpoint is no "label" of the incident
        headline = text.splitlines()[0]
        assert headline.startswith("**NodeFilesystemSpaceLow on ") and " nodes" in headline
    last = disk[-1][1].splitlines()[0]
    assert "64 nodes" in last and "all 192 alerts resolved" in last, last
    # and what its alerts name besides nodes: three filesystems (issue 47)
    assert "on 3 mountpoints of 64 nodes" in last, last


def test_the_archive_names_the_alerts_priority_and_its_incidents(
    demo: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """sheet.csv and `trainsentry export` carry both priorities in named columns. Before:
    one `priority` column, P2 for NodeFilesystemSpaceLow in the sheet while the cards and the
    export said P1, and nothing said whose priority it was."""
    out, _ = demo
    export = tmp_path / "export.csv"
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", "export", "--db", f"sqlite:///{out / 'demo.db'}",
         "--out", str(export)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for path in (out / "sheet.csv", export):
        with path.open() as handle:
            rows = list(csv.DictReader(handle))
        assert "priority" not in rows[0], path
        by_name: dict[str, set[tuple[str, str]]] = {}
        for row in rows:
            by_name.setdefault(row["alertname"], set()).add(
                (row["alert_priority"], row["incident_priority"])
            )
        # the disk alerts were P2 on their own, P1 once on 8+ nodes; their incident is P1
        assert {i for _, i in by_name["NodeFilesystemSpaceLow"]} == {"P1"}, (path, by_name)
        assert "P2" in {a for a, _ in by_name["NodeFilesystemSpaceLow"]} or path == export
        assert {i for _, i in by_name["NodeOOMKills"]} == {"P0"}, path
        assert {i for _, i in by_name["GPUFellOffBus"]} == {"P0"}, path
