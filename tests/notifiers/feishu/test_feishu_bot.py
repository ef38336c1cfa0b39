"""Feishu custom-bot channel against the local Feishu contract server."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.notifiers.helpers import alert_payload, deliver_all, hmac_sha256_by_hand, notification
from tests.support.feishu_server import FeishuContractServer, Hook
from trainsentry.alerts import Priority
from trainsentry.config.channels import FeishuBotSettings
from trainsentry.notifiers.base import PermanentError, RateLimitedError, RetryableError
from trainsentry.notifiers.feishu.bot import (
    RATE_LIMITS,
    BotWebhook,
    FeishuBotNotifier,
    WebhookRouter,
    classify_response,
)
from trainsentry.notifiers.feishu.sign import bot_sign
from trainsentry.notifiers.ratelimit import RateLimit, SlidingWindow, scale_limits

SECRET = "qwertyuiop-secret"
SCALE = 0.02  # 5/s -> 5 per 20 ms, 100/min -> 100 per 1.2 s


@pytest.mark.parametrize(
    ("timestamp", "secret"),
    [(1599360473, "demo"), (1700000000, SECRET), (0, ""), (1999999999, "ключ-ünïcode")],
)
def test_bot_sign_matches_hand_written_hmac(timestamp: int, secret: str) -> None:
    key = f"{timestamp}\n{secret}".encode()
    expected = base64.b64encode(hmac_sha256_by_hand(key, b"")).decode()
    assert bot_sign(timestamp, secret) == expected


def test_bot_sign_changes_with_timestamp_and_secret() -> None:
    assert bot_sign(1, "a") != bot_sign(2, "a")
    assert bot_sign(1, "a") != bot_sign(1, "b")


@pytest.fixture
async def server() -> AsyncIterator[FeishuContractServer]:
    srv = FeishuContractServer(
        hooks={
            "p0hook": Hook(secret=SECRET),
            "p2hook": Hook(),
            "jobhook": Hook(secret="job-secret"),
            "kwhook": Hook(keyword="trainsentry-alert-xyz"),
            "iphook": Hook(allowed_ips={"10.9.9.9"}),
        },
        time_scale=SCALE,
    )
    async with srv:
        yield srv


def _bot(server: FeishuContractServer, **routes: BotWebhook) -> FeishuBotNotifier:
    router = WebhookRouter(
        by_priority={
            Priority.P0: routes.get(
                "p0", BotWebhook("critical", server.hook_url("p0hook"), SECRET)
            ),
            Priority.P1: BotWebhook("critical", server.hook_url("p0hook"), SECRET),
            Priority.P2: routes.get("p2", BotWebhook("warning", server.hook_url("p2hook"))),
        },
        by_job={"team-b/bert": BotWebhook("job:bert", server.hook_url("jobhook"), "job-secret")},
    )
    return FeishuBotNotifier(
        router, rate_limits=scale_limits(RATE_LIMITS, SCALE), slack_s=0.01, max_wait_s=5.0
    )


async def test_signed_card_is_accepted(server: FeishuContractServer) -> None:
    bot = _bot(server)
    try:
        receipt = await bot.send(notification(1))
    finally:
        await bot.aclose()
    assert receipt.detail == {"webhook": "critical"}
    [(_, body)] = server.accepted["p0hook"]
    assert body["msg_type"] == "interactive" and body["sign"]
    assert body["card"]["header"]["template"] == "red"


async def test_routing_by_priority_group_and_job_override(server: FeishuContractServer) -> None:
    bot = _bot(server)
    job_b = alert_payload("P0", labels={"trainingjob": "bert", "namespace": "team-b"})
    try:
        await bot.send(notification(1, alert_payload("P2")))
        await bot.send(notification(2, job_b))
        with pytest.raises(PermanentError, match="no Feishu bot webhook"):
            await bot.send(notification(3, alert_payload("P3")))
    finally:
        await bot.aclose()
    assert len(server.accepted["p2hook"]) == 1
    assert len(server.accepted["jobhook"]) == 1
    assert "p0hook" not in server.accepted


async def test_wrong_secret_is_permanent_and_loud(
    server: FeishuContractServer, caplog: pytest.LogCaptureFixture
) -> None:
    bot = _bot(server, p0=BotWebhook("critical", server.hook_url("p0hook"), "wrong-secret"))
    caplog.set_level(logging.ERROR)
    try:
        with pytest.raises(PermanentError) as err:
            await bot.send(notification(1))
    finally:
        await bot.aclose()
    assert err.value.code == 19021
    assert not err.value.retryable
    assert ("feishu", 19021) not in server.rejections and ("bot", 19021) in server.rejections
    assert any(
        "feishu_bot_misconfigured" in r.message and "19021" in r.message for r in caplog.records
    )
    assert "wrong-secret" not in caplog.text and "p0hook" not in caplog.text  # no credentials


async def test_missing_signature_keyword_and_ip_are_permanent(server: FeishuContractServer) -> None:
    cases = {
        "p0": (BotWebhook("critical", server.hook_url("p0hook"), None), 19021),
        "p2": (BotWebhook("warning", server.hook_url("kwhook")), 19024),
    }
    for route, (webhook, code) in cases.items():
        bot = _bot(server, **{route: webhook})
        priority = "P0" if route == "p0" else "P2"
        try:
            with pytest.raises(PermanentError) as err:
                await bot.send(notification(1, alert_payload(priority)))
        finally:
            await bot.aclose()
        assert err.value.code == code
    bot = _bot(server, p2=BotWebhook("warning", server.hook_url("iphook")))
    try:
        with pytest.raises(PermanentError) as err:
            await bot.send(notification(1, alert_payload("P2")))
    finally:
        await bot.aclose()
    assert err.value.code == 19022


async def test_burst_of_300_all_delivered_within_limits(server: FeishuContractServer) -> None:
    bot = _bot(server)
    batch = [notification(i, alert_payload("P0", alert_id=i)) for i in range(300)]
    started = time.monotonic()
    try:
        receipts, handled = await deliver_all(bot, batch, workers=6)
    finally:
        await bot.aclose()
    elapsed = time.monotonic() - started
    assert sorted(receipts) == list(range(300))
    accepted = [t for t, _ in server.accepted["p0hook"]]
    assert len(accepted) == 300
    footers = [b["card"]["body"]["elements"][-1]["content"] for _, b in server.accepted["p0hook"]]
    assert {f.split("alert ")[1].split(" ")[0] for f in footers} == {str(i) for i in range(300)}
    # Independently of the server's own gate: no window ever held more than the limit.
    for count, seconds in ((5, 1.0 * SCALE), (100, 60.0 * SCALE)):
        for i in range(len(accepted) - count):
            assert accepted[i + count] - accepted[i] >= seconds * 0.999, (count, seconds, i)
    # 300 messages at 100 per window need at least two full windows.
    assert elapsed >= 2 * 60.0 * SCALE
    # Our gate counts each request from its answer, so the server never saw us too fast:
    # not a single 11232 (a gate-less sender gets them even on a slow, loaded machine).
    rejected = [code for what, code in server.rejections if what == "bot"]
    assert rejected == [] and handled == 0


async def test_gate_backs_off_instead_of_blocking_long(server: FeishuContractServer) -> None:
    webhook = BotWebhook("c", server.hook_url("p0hook"), SECRET)
    router = WebhookRouter(by_priority={Priority.P0: webhook})
    bot = FeishuBotNotifier(router, rate_limits=scale_limits(RATE_LIMITS, 1.0), max_wait_s=0.1)
    try:
        for i in range(5):
            await bot.send(notification(i))
        with pytest.raises(RateLimitedError) as err:
            await bot.send(notification(5))
    finally:
        await bot.aclose()
    assert err.value.retry_after is not None and 0.5 < err.value.retry_after <= 1.1
    assert len(server.accepted["p0hook"]) == 5


async def test_server_11232_becomes_rate_limited() -> None:
    """With our gate switched off the server's limit answers 11232, mapped to RateLimited."""
    async with FeishuContractServer(hooks={"h": Hook()}) as server:  # real 5/s
        router = WebhookRouter(by_priority={Priority.P2: BotWebhook("w", server.hook_url("h"))})
        bot = FeishuBotNotifier(router, rate_limits=[RATE_LIMITS[0].scaled(1e-6)], slack_s=0)
        codes = []
        try:
            for i in range(8):
                try:
                    await bot.send(notification(i, alert_payload("P2")))
                except RateLimitedError as exc:
                    codes.append((exc.code, exc.retry_after))
        finally:
            await bot.aclose()
    assert len(server.accepted["h"]) == 5
    assert codes and all(code == 11232 for code, _ in codes)


async def test_huge_alert_is_trimmed_under_20kb_and_accepted(server: FeishuContractServer) -> None:
    labels = {f"label_{i:03d}": "v" * 200 for i in range(300)}
    payload = alert_payload("P2", annotations={"summary": "s", "description": "d" * 50_000})
    payload["labels"].update(labels)
    bot = _bot(server)
    try:
        await bot.send(notification(1, payload))
    finally:
        await bot.aclose()
    [(_, body)] = server.accepted["p2hook"]
    text = str(body["card"])
    assert "more labels not shown" in text


def test_classify_response_mapping() -> None:
    with pytest.raises(RateLimitedError):
        classify_response(429, {"retry-after": "3"}, "", "w")
    with pytest.raises(RetryableError):
        classify_response(502, {}, "", "w")
    with pytest.raises(RateLimitedError) as err:
        classify_response(200, {}, '{"code": 9499, "msg": "x"}', "w", 0.5)
    assert err.value.retry_after == 0.5
    for code in (19021, 19022, 19024):
        with pytest.raises(PermanentError):
            classify_response(200, {}, f'{{"code": {code}, "msg": "x"}}', "w")
    classify_response(200, {}, '{"StatusCode": 0, "StatusMessage": "success"}', "w")
    classify_response(200, {}, '{"code": 0, "msg": "success", "data": {}}', "w")


def test_router_from_settings_reads_secrets_from_env() -> None:
    settings = FeishuBotSettings.model_validate(
        {
            "groups": {
                "critical": {"priorities": ["P0", "P1"], "url_env": "U1", "secret_env": "S1"},
                "rest": {"priorities": ["P2", "P3"], "url_env": "U2"},
            },
            "jobs": {"ns/job": {"url_env": "U3"}},
        }
    )
    env = {"U1": "http://x/1", "S1": "sec", "U2": "http://x/2", "U3": "http://x/3"}
    router = WebhookRouter.from_settings(settings, env)
    assert router.select(Priority.P1, "").url == "http://x/1"
    assert router.select(Priority.P1, "").secret == "sec"
    assert router.select(Priority.P3, "ns/job").url == "http://x/3"
    assert "sec" not in repr(router)
    with pytest.raises(ValueError, match="P1 is in bot groups"):
        FeishuBotSettings.model_validate(
            {
                "groups": {
                    "a": {"priorities": ["P1"], "url_env": "A"},
                    "b": {"priorities": ["P1"], "url_env": "B"},
                }
            }
        )
    with pytest.raises(ValueError, match="extra"):
        FeishuBotSettings.model_validate(
            {"groups": {"a": {"priorities": ["P1"], "url_env": "A", "secret": "literal"}}}
        )


async def test_network_error_is_retryable() -> None:
    router = WebhookRouter(by_priority={Priority.P0: BotWebhook("c", "http://127.0.0.1:9/hook")})
    bot = FeishuBotNotifier(router, client=httpx.AsyncClient(timeout=2))
    with pytest.raises(RetryableError):
        await bot.send(notification(1))


def test_sliding_window_counts_requests_from_their_answer() -> None:
    window = SlidingWindow([RateLimit(2, 1.0)], margin=0.0, slack_s=0.0)
    first = window.start()
    assert window.delay(0.0) == 0.0
    second = window.start()
    assert window.delay(0.5) == 1.0  # the oldest of the two is still in flight: "now"
    first.finished_at = 0.3
    assert window.delay(0.5) == pytest.approx(0.8)  # 0.3 + 1.0 - 0.5
    second.finished_at = 0.4
    assert window.delay(1.29) > 0 and window.delay(1.3) == 0.0
    window.record(1.35)
    assert window.delay(1.36) == pytest.approx(0.04)  # the second (0.4) is next to leave
