"""A headless Chromium driven over the DevTools protocol (aiohttp's websocket client): enough
for the console's browser tests and its screenshots. Nothing is downloaded: it runs the
Debian package's `/usr/bin/chromium` (scripts/install-deps.sh), and `CHROMIUM` is None where
that is absent (the tests then skip).

    async with Browser.launch(tmp_path) as page:
        await page.goto(url)
        await page.wait_for("document.querySelector('.card') !== null")
        await page.click("#action-ack")
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = next(
    (p for p in (os.environ.get("CHROMIUM_BIN"), shutil.which("chromium"), "/usr/bin/chromium")
     if p and os.access(p, os.X_OK)),
    None,
)  # fmt: skip


class BrowserError(RuntimeError):
    pass


class Page:
    """One tab: commands by id over its websocket, events kept for `wait_event`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: list[dict[str, Any]] = []
        self._event_arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self._events.append(data)
                self._event_arrived.set()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(BrowserError("the browser closed the connection"))

    async def send(self, method: str, within: float = 15.0, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        await self._ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        answer = await asyncio.wait_for(future, within)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return dict(answer.get("result") or {})

    async def wait_event(self, method: str, within: float = 15.0) -> dict[str, Any]:
        """The first event `method` not consumed yet (waiting for it up to `within` s)."""
        deadline = time.monotonic() + within
        while True:
            for index, event in enumerate(self._events):
                if event.get("method") == method:
                    del self._events[index]
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {method} within {within} s")
            self._event_arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event_arrived.wait(), remaining)

    async def goto(self, url: str) -> None:
        self._events = [e for e in self._events if e.get("method") != "Page.loadEventFired"]
        answer = await self.send("Page.navigate", url=url)
        if answer.get("errorText"):
            raise BrowserError(f"navigating to {url}: {answer['errorText']}")
        await self.wait_event("Page.loadEventFired")

    async def evaluate(self, expression: str) -> Any:
        answer = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression!r}: {answer['exceptionDetails']}")
        return answer.get("result", {}).get("value")

    async def wait_for(self, expression: str, within: float = 20.0) -> Any:
        """Polls `expression` until it is truthy (for up to `within` s); its value."""
        deadline = time.monotonic() + within
        while True:
            try:
                value = await self.evaluate(expression)
            except BrowserError:  # between two documents (a navigation in progress)
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still false after {within} s")
            await asyncio.sleep(0.1)

    async def text(self, selector: str = "body") -> str:
        """The element's text, once it exists: a load event of the document before the
        navigation (the tab's first about:blank) can arrive after `goto` started waiting."""
        found = json.dumps(selector)
        await self.wait_for(f"document.querySelector({found}) !== null")
        return str(await self.evaluate(f"document.querySelector({found}).innerText"))

    async def text_with(self, selector: str, needle: str, within: float = 20.0) -> str:
        """The element's text once it includes `needle`: a page that draws or redraws a
        region after its load event (the console's live region) is read when it shows what
        the test reads, never before. TimeoutError names the text it last saw."""
        found, wanted = json.dumps(selector), json.dumps(needle)
        deadline = time.monotonic() + within
        seen = ""
        while True:
            try:
                seen = str(
                    await self.evaluate(
                        f"(() => {{ const el = document.querySelector({found});"
                        " return el ? el.innerText : ''; })()"
                    )
                    or ""
                )
            except BrowserError:  # between two documents (a navigation in progress)
                seen = ""
            if needle in seen:
                return seen
            if time.monotonic() > deadline:
                raise TimeoutError(f"{selector} never showed {wanted} in {within} s: {seen!r}")
            await asyncio.sleep(0.1)

    async def click(self, selector: str) -> None:
        """Clicks like a user would: the element must exist (a navigation it starts is waited
        for by the caller, e.g. with `wait_for`)."""
        found = await self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            " if (!el) return false; el.click(); return true; })()"
        )
        if not found:
            raise BrowserError(f"nothing matches {selector}")

    async def fill(self, selector: str, value: str) -> None:
        found = await self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            f" if (!el) return false; el.value = {json.dumps(value)}; return true; }})()"
        )
        if not found:
            raise BrowserError(f"nothing matches {selector}")

    async def viewport(self, width: int, height: int) -> None:
        """The window's size as a page sees it (below 600 px wide: a phone, touch)."""
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=height, deviceScaleFactor=1, mobile=width < 600,
        )  # fmt: skip

    async def press(self, key: str) -> None:
        """One key pressed and released, as the keyboard sends it (`j`, `Tab`, `Enter`)."""
        codes = {"Enter": 13, "Tab": 9}
        event: dict[str, Any] = {"key": key, "code": key if len(key) > 1 else f"Key{key.upper()}"}
        if key in codes:
            event["windowsVirtualKeyCode"] = codes[key]
        text = {"Enter": "\r", "Tab": ""}.get(key, key)
        await self.send("Input.dispatchKeyEvent", type="keyDown", text=text, **event)
        await self.send("Input.dispatchKeyEvent", type="keyUp", **event)

    async def screenshot(self, path: Path, width: int = 1100, height: int = 800) -> None:
        """A PNG of the page's first `height` pixels at `width`."""
        await self.viewport(width, height)
        shot = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


class Browser:
    """A Chromium process with its own profile directory, one page."""

    @staticmethod
    @contextlib.asynccontextmanager
    async def launch(workdir: Path) -> AsyncIterator[Page]:
        if CHROMIUM is None:
            raise BrowserError("no chromium: install the Debian package `chromium`")
        profile = workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        args = [
            CHROMIUM, "--headless=new", "--remote-debugging-port=0", f"--user-data-dir={profile}",
            "--no-first-run", "--no-default-browser-check", "--disable-gpu",
            "--disable-extensions", "--disable-background-networking", "--disable-sync",
            "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
            "--window-size=1100,800", "about:blank",
        ]  # fmt: skip
        if os.geteuid() == 0:  # Chromium refuses its sandbox as root (containers, CI)
            args.insert(1, "--no-sandbox")
        log = (workdir / "chromium.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            *args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        session = aiohttp.ClientSession()
        page: Page | None = None
        try:
            port = await _devtools_port(profile, process)
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            target = next(t for t in targets if t.get("type") == "page")
            ws = await session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=64 << 20)
            page = Page(ws)
            await page.send("Page.enable")
            await page.send("Runtime.enable")
            yield page
        finally:
            if page is not None:
                await page.close()
            await session.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
            log.close()


async def _devtools_port(profile: Path, process: asyncio.subprocess.Process) -> int:
    """Chromium writes the port it chose to DevToolsActivePort in the profile directory."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise BrowserError(f"chromium exited with {process.returncode} (see chromium.log)")
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(marker.read_text().splitlines()[0])
        await asyncio.sleep(0.05)
    raise BrowserError("chromium did not open its DevTools port within 30 s")
