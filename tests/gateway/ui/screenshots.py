"""Draws the screenshots of docs/console.md with the browser driver (tests/support/browser.py)
against a real in-process gateway holding a few incidents and a diagnosed hang, and the
demo's preview (`trainsentry demo`'s index.html, docs/images/demo-preview.png).

    .venv/bin/python -m tests.gateway.ui.screenshots docs/images
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.gateway.ui.helpers import alert, hang_verdict, post_alerts, start, store_verdict
from tests.support.browser import Browser
from tests.support.webhook_factory import make_alert
from trainsentry.alerts import Person
from trainsentry.demo.replay import run_demo
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.policy.escalation import EscalationPolicy, Escalator, Layer, Roster
from trainsentry.store.console_incidents import incidents_of


async def draw(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        roster = Roster(
            (Layer("primary", (Person("alice"),)), Layer("secondary", (Person("bob"),)))
        )
        escalator = Escalator(roster, EscalationPolicy())
        server = await start(f"sqlite:///{work / 's.db'}", escalator=escalator)
        try:
            hang = {"priority": "P0", "component": "training", "node": "gpu-0005"}
            await post_alerts(
                server,
                [
                    {**make_alert(5, name="TrainingJobHang", labels=hang), "annotations": {
                        "summary": "llama-70b stopped making progress",
                        "runbook_url": "https://runbooks.example.com/hang"}},
                    alert(1, priority="P0", node="gpu-0017", gpu="3"),
                    alert(2, priority="P1", component="fabric", device="mlx5_3", port="1"),
                    alert(3, priority="P2", trainingjob="bert-ft", node="gpu-0102"),
                    alert(4, priority="P3", trainingjob="bert-ft", node="gpu-0103"),
                    *(alert(i, alertname="NodeFilesystemSpaceLow", priority="P2", node=f"gpu-00{i}",
                            mountpoint="/checkpoints") for i in range(40, 46)),
                ],
            )  # fmt: skip
            await store_verdict(server, 1, hang_verdict(work, world=64, culprit=37))
            service = server.app[GATEWAY_KEY].maintenance
            assert service is not None
            now = datetime.now(UTC)
            await service.create({
                "matchers": {"node": "gpu-0102"}, "reason": "PSU replacement",
                "starts_at": now.isoformat(), "ends_at": (now + timedelta(hours=3)).isoformat(),
                "created_by": "ops-jane",
            })  # fmt: skip
            async with Browser.launch(work) as page:
                await page.goto(str(server.make_url("/ui/")))
                await page.screenshot(out / "console-now.png", 1000, 720)
                async with server.app[GATEWAY_KEY].engine.connect() as conn:
                    hang_incident = (await incidents_of(conn, [1]))[1]
                await page.goto(str(server.make_url(f"/ui/incidents/{hang_incident}")))
                await page.screenshot(out / "console-incident.png", 1000, 900)
                await page.goto(str(server.make_url("/ui/job?namespace=ml&name=llama-70b")))
                await page.screenshot(out / "console-job.png", 1000, 720)
                await page.goto(str(server.make_url("/ui/")))
                await page.screenshot(out / "console-phone.png", 390, 760)
        finally:
            await server.close()
        demo = work / "demo"
        await run_demo(demo)
        (work / "preview").mkdir()
        async with Browser.launch(work / "preview") as page:  # a browser profile of its own
            await page.goto((demo / "index.html").as_uri())
            await page.screenshot(out / "demo-preview.png", 1120, 820)
        small_png(out / "demo-preview.png")


def small_png(path: Path, colours: int = 128) -> None:
    """The PNG in `colours` colours (a third of the bytes; text stays sharp)."""
    from PIL import Image  # matplotlib's dependency

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=colours)
    small.save(path, optimize=True)


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")
    target.mkdir(parents=True, exist_ok=True)
    asyncio.run(draw(target))
