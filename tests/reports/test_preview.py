"""`trainsentry report render` opened in headless Chromium: the page is not blank, the
charts (data: URIs) are drawn, and the headline numbers of the seeded week are in the text."""

from __future__ import annotations

import argparse
import asyncio
import base64
import html
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from trainsentry.reports import report_command
from trainsentry.store import create_engine, migrate

from .seed import AFTER, TZ, seed_week

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NODE_BAR_RED = (0xD8, 0x39, 0x31)  # the "top nodes" bars and P0
P3_BLUE = (0x24, 0x5B, 0xDB)  # P3 bars and the MTTR line


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run (no network, throwaway profile)."""
    assert CHROMIUM is not None
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--mute-audio",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ]  # fmt: skip
    return subprocess.run(
        [CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=90, check=True
    )


def _render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, dict[str, object]]:
    url = f"sqlite:///{tmp_path / 'store.db'}"

    async def seed() -> None:
        engine = create_engine(url)
        try:
            await migrate(engine)
            await seed_week(engine)
        finally:
            await engine.dispose()

    asyncio.run(seed())
    out = tmp_path / "report.html"
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    args = parser.parse_args(
        ["render", "--db", url, "--tz", TZ, "--period", "2026-W46", "--out", str(out),
         "--csv", str(tmp_path / "alerts.csv"), "--json", "--now", AFTER.isoformat()]
    )  # fmt: skip
    assert report_command.run(args) == 0
    return out, json.loads(capsys.readouterr().out)


def _colour_counts(png: bytes) -> dict[tuple[int, int, int], int]:
    with Image.open(io.BytesIO(png)) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 22) or []
    return {colour: count for count, colour in colours}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_preview_in_headless_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, summary = _render(tmp_path, capsys)
    assert summary["alerts"] == 8
    page = out.read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == 3 and "cid:" not in page
    assert "<script" not in page.lower()
    assert (tmp_path / "alerts.csv").read_bytes().count(b"\r\n") == 9  # header + 8 occurrences

    dom = _chromium(tmp_path, "--dump-dom", out.as_uri()).stdout
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())
    assert "Week Mon 09 Nov – Sun 15 Nov 2026 (Asia/Shanghai)" in text
    # the headline boxes: 8 alerts, 3 P0+P1, MTTA 10 min, MTTR 16 min (960 s), 2/2 pages, 6 hw
    # faults (IBSymbolErrors is no fault)
    for box in ("Alerts 8 +6 vs last period", "P0 + P1 3", "MTTA (median) 10 min p90 15 min",
                "MTTR (median) 16 min p90 2 h 00 min", "Pages acked 2/2 3 calls",
                "Hardware faults 6 3 nodes"):  # fmt: skip
        assert box in text, box
    assert "New 5 · recurring 2 · flapping 1" in text
    assert "IBLinkErrorRecovery fabric 3 2 min 3 yes" in text

    shot = tmp_path / "shot.png"
    _chromium(tmp_path, "--window-size=760,2600", "--hide-scrollbars", f"--screenshot={shot}",
              out.as_uri())  # fmt: skip
    with Image.open(shot) as image:
        assert image.size == (760, 2600)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200  # text, tables and charts, not blank
    white = max(count for count, colour in colours if colour in ((255, 255, 255), (245, 246, 247)))
    assert white < 0.9 * 760 * 2600

    # Every bar/line pixel of the charts must be on screen: the images are drawn, 1:1 (they
    # are made exactly as wide as the mail column). Text in those colours only adds a little.
    charts = [
        base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    ]
    on_screen = _colour_counts(shot.read_bytes())
    for colour in (NODE_BAR_RED, P3_BLUE):
        in_charts = sum(_colour_counts(png).get(colour, 0) for png in charts)
        assert in_charts > 2000
        assert on_screen.get(colour, 0) >= 0.9 * in_charts, (
            colour,
            on_screen.get(colour),
            in_charts,
        )
