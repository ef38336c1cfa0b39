"""Feishu app API client and `feishu_app` channel against the contract server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from tests.notifiers.helpers import alert_payload, notification
from tests.support.feishu_server import FeishuContractServer, card_problems
from trainsentry.alerts import Priority
from trainsentry.notifiers.base import PermanentError, RateLimitedError
from trainsentry.notifiers.feishu.app import (
    FeishuAppClient,
    FeishuAppNotifier,
    app_message_gate,
    dedup_uuid,
)
from trainsentry.notifiers.ratelimit import RateLimit

APP_ID, APP_SECRET = "cli_test", "app-secret-value"


@pytest.fixture
async def server() -> AsyncIterator[FeishuContractServer]:
    srv = FeishuContractServer(apps={APP_ID: APP_SECRET}, users={"ou_alice", "ou_bob"})
    async with srv:
        yield srv


async def test_token_is_cached(server: FeishuContractServer) -> None:
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    try:
        for i in range(5):
            await client.send_message("oc_chat", "text", {"text": f"hello {i}"})
    finally:
        await client.aclose()
    assert client.tokens_fetched == 1
    assert len(server.messages) == 5


async def test_token_expiry_mid_run_refreshes_without_losing_messages(
    server: FeishuContractServer,
) -> None:
    server.token_ttl_s = 0.6
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    sent = []
    try:
        for i in range(24):
            sent.append(await client.send_message("oc_chat", "text", {"text": f"m{i}"}))
            await asyncio.sleep(0.07)
    finally:
        await client.aclose()
    assert client.tokens_fetched >= 3  # ~1.7 s of sending with 0.6 s tokens
    assert server.tokens_issued >= 3
    texts = sorted(json.loads(m["content"])["text"] for m in server.messages.values())
    assert texts == sorted(f"m{i}" for i in range(24))
    # Refreshed half-way through each token's life, so an expired token is at most a rare
    # straggler on a loaded machine (and then refreshed and retried, as asserted above).
    assert len([r for r in server.rejections if r[0] == "auth"]) <= 1


async def test_token_revoked_early_is_refreshed_and_call_retried(
    server: FeishuContractServer,
) -> None:
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    try:
        await client.send_message("oc_chat", "text", {"text": "before"})
        server.revoke_tokens()
        await client.send_message("oc_chat", "text", {"text": "after"})
    finally:
        await client.aclose()
    assert ("auth", 99991663) in server.rejections
    assert client.tokens_fetched == 2
    assert [json.loads(m["content"])["text"] for m in server.messages.values()] == [
        "before",
        "after",
    ]


async def test_wrong_app_secret_is_permanent(server: FeishuContractServer) -> None:
    client = FeishuAppClient(server.base_url, APP_ID, "nope")
    try:
        with pytest.raises(PermanentError):
            await client.send_message("oc_chat", "text", {"text": "x"})
    finally:
        await client.aclose()


async def test_urgent_phone_rings_known_users(server: FeishuContractServer) -> None:
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    try:
        mid = await client.send_message(
            "ou_alice", "text", {"text": "P0"}, receive_id_type="open_id"
        )
        invalid = await client.urgent_phone(mid, ["ou_alice", "ou_ghost"])
        with pytest.raises(PermanentError):
            await client.urgent_phone("om_missing", ["ou_alice"])
    finally:
        await client.aclose()
    assert invalid == ["ou_ghost"]
    assert server.urgent_calls == [(mid, ["ou_alice"])]


async def test_app_channel_sends_interactive_card_once_per_idempotency_key(
    server: FeishuContractServer,
) -> None:
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    notifier = FeishuAppNotifier(client, {Priority.P0: "oc_oncall"})
    note = notification(7, alert_payload("P0"), channel="feishu_app")
    try:
        first = await notifier.send(note)
        again = await notifier.send(note)  # an outbox retry after a lost answer
        ack = notification(
            8,
            alert_payload("P0", acked_by="ou_bob", message_id=first.provider_id),
            channel="feishu_app",
            kind="ack",
        )
        updated = await notifier.send(ack)
        with pytest.raises(PermanentError, match="no Feishu chat"):
            await notifier.send(notification(9, alert_payload("P2"), channel="feishu_app"))
    finally:
        await notifier.aclose()
    assert first.provider_id == again.provider_id == updated.provider_id
    assert len(server.messages) == 1
    message = server.messages[str(first.provider_id)]
    card = json.loads(message["content"])
    assert card_problems(card) == []
    values = [
        b["behaviors"][0]["value"]
        for e in card["body"]["elements"]
        for row in [e, *e.get("elements", [])]  # the ack form's button row too
        for c in row.get("columns", [])
        for b in c["elements"]
        if b["behaviors"][0]["type"] == "callback"
    ]
    assert {"action": "ack", "alert_id": 42} in values
    [update] = message["updates"]
    assert "Acknowledged by" in json.dumps(update, ensure_ascii=False)


def test_dedup_uuid_fits_feishu_limit() -> None:
    assert dedup_uuid("short") == "short"
    long_key = "x" * 80
    assert len(dedup_uuid(long_key)) <= 50 and dedup_uuid(long_key) == dedup_uuid(long_key)
    assert "app-secret" not in repr(FeishuAppClient("http://x", APP_ID, APP_SECRET))


async def test_the_contract_server_updates_only_what_feishu_documents(
    server: FeishuContractServer,
) -> None:
    """Feishu's limits on updating a card (im/v1/messages PATCH): a card this app sent, not
    recalled, within 14 days, a shared card (update_multi) before and after, 5 a second."""
    server.apps["cli_other"] = "other-secret"
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    other = FeishuAppClient(server.base_url, "cli_other", "other-secret")
    # a second client of the same app: its own count of each card's updates (the client
    # keeps to 5 a second itself, so only another one shows the server refusing)
    again = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    card = {"schema": "2.0", "config": {"update_multi": True}, "body": {"elements": []}}
    private = {"schema": "2.0", "body": {"elements": []}}  # not a shared card
    try:
        mid = await client.send_message("oc_chat", "interactive", card)
        text = await client.send_message("oc_chat", "text", {"text": "plain"})
        unshared = await client.send_message("oc_chat", "interactive", private)
        old = await client.send_message("oc_chat", "interactive", card)
        recalled = await client.send_message("oc_chat", "interactive", card)
        server.messages[old]["sent_at"] -= 14 * 86400 + 60
        server.recall(recalled)
        await client.update_card(mid, card)  # allowed
        refused = {
            "another app's card": (other, mid, card),
            "a text message": (client, text, card),
            "a card sent unshared": (client, unshared, card),
            "a new card unshared": (again, mid, private),
            "a card sent 14 days ago": (client, old, card),
            "a recalled card": (client, recalled, card),
            "an unknown message": (client, "om_missing", card),
        }
        for why, (sender, message_id, new) in refused.items():
            with pytest.raises(PermanentError) as caught:
                await sender.update_card(message_id, new)
            assert caught.value.code in (230001, 230011), why
        for _ in range(4):  # 5 a second per message: the first one above and these
            await client.update_card(mid, card)
        with pytest.raises(RateLimitedError) as limited:
            await again.update_card(mid, card)
        assert limited.value.code == 230020
    finally:
        await client.aclose()
        await other.aclose()
        await again.aclose()
    assert len(server.messages[mid]["updates"]) == 5
    assert ("update", 230011) in server.rejections


async def test_the_client_keeps_a_cards_updates_to_five_a_second(
    server: FeishuContractServer,
) -> None:
    """Feishu refuses a sixth update of one message within a second (230020): the client
    waits its turn instead, so a burst of an incident's redraws all land, none refused."""
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    card = {"schema": "2.0", "config": {"update_multi": True}, "body": {"elements": []}}
    try:
        mid = await client.send_message("oc_chat", "interactive", card)
        started = time.monotonic()
        for _ in range(7):
            await client.update_card(mid, card)
        took = time.monotonic() - started
    finally:
        await client.aclose()
    assert len(server.messages[mid]["updates"]) == 7
    assert ("update", 230020) not in server.rejections
    assert took >= 0.9, "the sixth waited for the first's second to pass"


async def test_an_ack_whose_card_cannot_be_updated_is_posted_as_a_new_card(
    server: FeishuContractServer,
) -> None:
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    notifier = FeishuAppNotifier(client, {Priority.P0: "oc_oncall"})
    try:
        first = await notifier.send(notification(7, alert_payload("P0"), channel="feishu_app"))
        assert first.provider_id is not None
        server.recall(first.provider_id)
        ack = notification(
            8,
            alert_payload("P0", acked_by="ou_bob", message_id=first.provider_id),
            channel="feishu_app",
            kind="ack",
        )
        posted = await notifier.send(ack)
    finally:
        await notifier.aclose()
    assert posted.provider_id not in (None, first.provider_id)
    assert server.messages[str(first.provider_id)]["updates"] == []
    new = server.messages[str(posted.provider_id)]
    assert new["receive_id"] == "oc_oncall"
    assert "Acknowledged by" in new["content"]


async def test_a_send_past_the_apps_shared_gate_is_put_back_as_rate_limited(
    server: FeishuContractServer,
) -> None:
    """Two clients of one app share its message gate: the second client's send finds the
    limit reached by the first and is rate limited (retried later), not sent nor failed."""
    gate = app_message_gate((RateLimit(1, 10.0),), max_wait_s=0.1)
    first = FeishuAppClient(server.base_url, APP_ID, APP_SECRET, message_gate=gate)
    second = FeishuAppClient(server.base_url, APP_ID, APP_SECRET, message_gate=gate)
    try:
        await first.send_message("oc_chat", "text", {"text": "one"})
        with pytest.raises(RateLimitedError) as limited:
            await second.send_message("oc_chat", "text", {"text": "two"})
    finally:
        await first.aclose()
        await second.aclose()
    assert limited.value.retry_after is not None and 9 < limited.value.retry_after <= 11
    assert len(server.messages) == 1


async def test_the_app_channel_waits_what_feishus_ratelimit_reset_says() -> None:
    """Past the app's 50 sends a second Feishu answers 429/99991400 with `x-ogw-ratelimit-reset`
    (its "Rate limits" page): the channel waits that many seconds, whatever the number. The
    window is stretched (time_scale 10: 50 sends per 10 s) so the reset is well over 1 s."""
    async with FeishuContractServer(apps={APP_ID: APP_SECRET}, time_scale=10.0) as server:
        notifier = FeishuAppNotifier(
            FeishuAppClient(server.base_url, APP_ID, APP_SECRET), {Priority.P1: "oc_oncall"}
        )
        try:
            for i in range(50):
                await notifier.send(notification(i, alert_payload("P1"), channel="feishu_app"))
            with pytest.raises(RateLimitedError) as limited:
                await notifier.send(notification(50, alert_payload("P1"), channel="feishu_app"))
        finally:
            await notifier.aclose()
    [reset] = server.limit_resets
    assert reset > 1  # what the test is about: not the 1 s a fixed rule would wait
    assert limited.value.code == 99991400
    assert limited.value.retry_after == float(reset)
