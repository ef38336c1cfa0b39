"""The console under load next to the alert path (issue 32 finding 11), for the test and
`bench/bench_console.py --under-load`: a real `trainsentry gateway` process on SQLite with
many open alerts, console readers looping on the Now page in a process of their own, and a
P0 webhook whose Feishu card is timed at the Feishu contract server (tests/support/
feishu_server.py), which runs in the caller's event loop.

    async with ConsoleLoad(tmp_path) as load:
        await load.seed(20_000)
        quiet = await load.p0_to_card(1)
        with load.readers(12):
            loaded = await load.p0_to_card(2)

The readers are a separate process (`python -m tests.support.console_load readers ...`) so
their HTTP clients take no CPU from the contract server's loop that times the card.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import aiohttp
import yaml

from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import start_gateway
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.gateway.api.app import WEBHOOK_PATH

TOKEN = "load-token"
HOOK = "p0-bot"
USER_HEADER = "X-Load-User"
BATCH = 1000


@dataclass(frozen=True)
class CardTiming:
    answered_s: float  # the webhook's 200
    card_s: float  # the card accepted by the Feishu contract server


def open_alert(index: int, priority: str) -> dict[str, object]:
    """Spread over 200 jobs and 2,500 nodes, as a large cluster's open alerts are."""
    return make_alert(
        index,
        name=("GPUXidError", "IBLinkFlapping", "NodeDiskFull", "GPUMemoryRemapped")[index % 4],
        labels={
            "priority": priority,
            "trainingjob": f"job-{index % 200:03d}",
            "namespace": ("ml", "research")[index % 2],
            "node": f"gpu-{index % 2500:04d}",
            "gpu": str(index % 8),
        },
    )


class ConsoleLoad:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.feishu = FeishuContractServer(hooks={HOOK: Hook()})
        self.gateway: RunningServer | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ConsoleLoad:
        await self.feishu.start()
        config = self.tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "gateway": {
                        # the readers sign in as a trusted proxy's user (no login round trip)
                        "console": {"trusted_proxies": ["127.0.0.1/32"], "user_header": USER_HEADER}
                    },
                    "channels": {
                        "feishu_bot": {
                            "groups": {"critical": {"priorities": ["P0"], "url_env": "P0_BOT_URL"}}
                        }
                    },
                }
            )
        )
        env = {"P0_BOT_URL": self.feishu.hook_url(HOOK)}
        self.gateway = await asyncio.to_thread(
            start_gateway,
            self.tmp_path,
            f"sqlite:///{self.tmp_path / 'store.db'}",
            token=TOKEN,
            config=config,
            env=env,
            console_file=self.tmp_path / "console.jsonl",
        )
        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"})
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
        if self.gateway is not None:
            if exc_type is not None:
                self.gateway.print_logs()
            self.gateway.stop()
        await self.feishu.stop()

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    def logs(self) -> str:
        assert self.gateway is not None
        return self.gateway.logs()

    async def _post(self, alerts: list[dict[str, object]], group_key: str) -> None:
        assert self._session is not None
        body = encode(make_body(alerts, group_key=group_key))
        async with self._session.post(self.url + WEBHOOK_PATH, data=body) as answer:
            assert answer.status == 200, await answer.text()

    async def backlog(self) -> float:
        """Alerts answered but not yet recorded (the intake journal), alert events the policy
        has not planned, and notifications not sent yet."""
        assert self._session is not None
        async with self._session.get(self.url + "/metrics") as answer:
            text = await answer.text()
        waiting = [
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("trainsentry_policy_inbox_depth ")
            or line.startswith("trainsentry_intake_journal_depth ")
            or (line.startswith("trainsentry_outbox_depth{") and 'status="pending"' in line)
        ]
        assert waiting, "no trainsentry_policy_inbox_depth in /metrics"
        return sum(waiting)

    async def seed(self, count: int, timeout_s: float = 600) -> None:
        """`count` open P3 alerts, planned by the policy and their notices written (the P3
        route is the console file alone: the bot takes P0), so the gateway is idle after."""
        for start in range(0, count, BATCH):
            batch = [open_alert(i, "P3") for i in range(start, min(start + BATCH, count))]
            await self._post(batch, group_key=f"seed-{start}")
        deadline = time.monotonic() + timeout_s
        while await self.backlog() > 0:
            assert time.monotonic() < deadline, "the seeded alerts were not planned and sent"
            await asyncio.sleep(0.5)

    async def p0_to_card(self, index: int, timeout_s: float = 60) -> CardTiming:
        """Posts one P0 of another job and waits for its card at the Feishu contract server."""
        before = len(self.feishu.accepted[HOOK])
        alert = make_alert(
            10_000_000 + index,
            name="GPUFellOffBus",
            labels={"priority": "P0", "trainingjob": f"other-{index}", "node": f"p0-{index}"},
        )
        started = time.monotonic()
        await self._post([alert], group_key=f"p0-{index}")
        answered = time.monotonic() - started
        deadline = started + timeout_s
        while len(self.feishu.accepted[HOOK]) == before:
            assert time.monotonic() < deadline, f"no P0 card within {timeout_s:.0f} s"
            await asyncio.sleep(0.01)
        arrived = self.feishu.accepted[HOOK][before][0]
        return CardTiming(answered, arrived - started)

    @contextlib.contextmanager
    def readers(self, count: int, path: str = "/ui/") -> Iterator[Path]:
        """`count` concurrent readers, each fetching `path` again as soon as it has it, in a
        process of their own (`{i}` in `path`: the reader's number, 000, 001, ...); yields
        the file their counts are written to when they stop."""
        out = self.tmp_path / f"readers-{time.monotonic_ns()}.json"
        argv = [sys.executable, "-m", "tests.support.console_load", "readers"]
        argv += ["--url", self.url + path, "--count", str(count), "--out", str(out)]
        process = subprocess.Popen(argv, env=os.environ.copy())
        try:
            yield out
        finally:
            process.terminate()
            process.wait(timeout=30)


async def _read_loop(url: str, counts: dict[str, list[float]], stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession(headers={USER_HEADER: "reader"}) as session:
        while not stop.is_set():
            started = time.monotonic()
            try:
                async with session.get(url, allow_redirects=False) as answer:
                    await answer.read()
                    key = str(answer.status)
            except aiohttp.ClientError as exc:
                key = type(exc).__name__
            counts.setdefault(key, []).append(time.monotonic() - started)


async def _readers(url: str, count: int, out: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    counts: dict[str, list[float]] = {}
    urls = [url.replace("{i}", f"{i:03d}") for i in range(count)]  # a filter per reader
    await asyncio.gather(*(_read_loop(each, counts, stop) for each in urls))
    await asyncio.to_thread(out.write_text, json.dumps(counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["readers"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    asyncio.run(_readers(args.url, args.count, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
