"""Phone providers against local servers checking the exact request shape, and the channel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree

import pytest

from tests.support.feishu_server import FeishuContractServer
from tests.support.phone_server import PhoneContractServer
from trainsentry.alerts import Person, Priority
from trainsentry.config.channels import PhoneSettings
from trainsentry.gateway.policy.escalation import EscalationPolicy as Policy
from trainsentry.gateway.policy.escalation import (
    Escalator,
    Layer,
    Roster,
    call_payload,
    call_text,
    new_state,
)
from trainsentry.notifiers.base import (
    OutboundNotification,
    PermanentError,
    RateLimitedError,
    RetryableError,
)
from trainsentry.notifiers.feishu.app import FeishuAppClient
from trainsentry.notifiers.phone.base import PhoneCall
from trainsentry.notifiers.phone.feishu import FeishuUrgentPhoneProvider
from trainsentry.notifiers.phone.notifier import (
    CALL_KIND,
    PhoneNotifier,
)
from trainsentry.notifiers.phone.twilio import TwilioProvider
from trainsentry.notifiers.phone.webhook import WebhookPhoneProvider, render_body

ALICE = Person("alice", phone="+8613800000001", feishu_open_id="ou_alice")
TEMPLATE = (
    '{"CalledNumber": {{ phone|tojson }}, "TtsCode": "TTS_1",'
    ' "TtsParam": {{ {"text": text, "who": name}|tojson|tojson }}, "OutId": {{ idempotency_key|tojson }}}'  # noqa: E501
)


def _call(person: Person = ALICE, text: str = "P0 alert GpuXidError") -> PhoneCall:
    return PhoneCall(person, text, alert_id=42, idempotency_key="esc:42:0:alice")


@pytest.fixture
async def phones() -> AsyncIterator[PhoneContractServer]:
    async with PhoneContractServer() as srv:
        yield srv


async def test_twilio_request_shape(phones: PhoneContractServer) -> None:
    provider = TwilioProvider(
        phones.account_sid, phones.auth_token, phones.from_number, base_url=phones.base_url
    )
    try:
        receipt = await provider.call(_call(text="GPU <3> & rank 27 down"))
    finally:
        await provider.aclose()
    assert receipt.call_id and receipt.call_id.startswith("CA")
    [form] = phones.twilio_calls
    assert set(form) == {"To", "From", "Twiml"}
    assert form["To"] == ALICE.phone and form["From"] == phones.from_number
    says = [s.text for s in ElementTree.fromstring(form["Twiml"]).iter("Say")]
    assert says == ["GPU <3> & rank 27 down"] * 2  # escaped on the wire, intact when read
    assert "twilio-token" not in repr(provider)


async def test_twilio_errors(phones: PhoneContractServer) -> None:
    bad_auth = TwilioProvider(
        phones.account_sid, "wrong", phones.from_number, base_url=phones.base_url
    )
    good = TwilioProvider(
        phones.account_sid, phones.auth_token, phones.from_number, base_url=phones.base_url
    )
    try:
        with pytest.raises(PermanentError):
            await bad_auth.call(_call())
        with pytest.raises(PermanentError):
            await good.call(_call(Person("bob", phone="12345")))  # not E.164
        with pytest.raises(PermanentError, match="no phone"):
            await good.call(_call(Person("nophone")))
        phones.fail_next[:] = [429, 503]
        with pytest.raises(RateLimitedError):
            await good.call(_call())
        with pytest.raises(RetryableError):
            await good.call(_call())
    finally:
        await bad_auth.aclose()
        await good.aclose()
    assert phones.twilio_calls == []
    assert [r[1] for r in phones.refused] == [401, 400, 429, 503]


async def test_webhook_template_request_shape(phones: PhoneContractServer) -> None:
    provider = WebhookPhoneProvider(
        phones.base_url + "/voice/call",
        TEMPLATE,
        headers={"X-Api-Key": phones.gateway_token},
        success_field="Code",
        success_value="OK",
    )
    tricky = Person('eve "the" \\ admin', phone="+15550002222")
    try:
        receipt = await provider.call(_call(tricky, text='say "hi"\nnow'))
    finally:
        await provider.aclose()
    assert receipt.call_id and receipt.call_id.startswith("req-")
    [(headers, body)] = phones.gateway_calls
    assert headers["Idempotency-Key"] == "esc:42:0:alice"
    assert body["CalledNumber"] == "+15550002222" and body["OutId"] == "esc:42:0:alice"
    assert json.loads(body["TtsParam"]) == {"text": 'say "hi"\nnow', "who": 'eve "the" \\ admin'}


async def test_webhook_failures(phones: PhoneContractServer) -> None:
    wrong_key = WebhookPhoneProvider(
        phones.base_url + "/voice/call", TEMPLATE, headers={"X-Api-Key": "nope"}
    )
    try:
        with pytest.raises(PermanentError):
            await wrong_key.call(_call())
    finally:
        await wrong_key.aclose()
    with pytest.raises(PermanentError, match="template"):
        WebhookPhoneProvider("http://x", "{not json {{ phone }}")
    with pytest.raises(PermanentError, match="template"):
        render_body("{{ undefined_thing }}", _call())


async def test_feishu_urgent_phone_provider() -> None:
    async with FeishuContractServer(apps={"cli": "sec"}, users={"ou_alice"}) as feishu:
        provider = FeishuUrgentPhoneProvider(FeishuAppClient(feishu.base_url, "cli", "sec"))
        try:
            first = await provider.call(_call())
            await provider.call(_call())  # the outbox retried: same DM (uuid), rung again
            with pytest.raises(PermanentError, match="cannot ring"):
                await provider.call(_call(Person("ghost", feishu_open_id="ou_ghost")))
            with pytest.raises(PermanentError, match="feishu_open_id"):
                await provider.call(_call(Person("nobody", phone="+15550003333")))
        finally:
            await provider.aclose()
        dms = [m for m in feishu.messages.values() if m["receive_id"] == "ou_alice"]
        assert len(dms) == 1 and dms[0]["receive_id_type"] == "open_id"
        assert feishu.urgent_calls[0] == (first.call_id, ["ou_alice"])


async def test_feishu_phone_message_mentions_nobody_and_links_nowhere() -> None:
    """The DM the call rings about is a Feishu text message, whose words come from the alert:
    `<at user_id="all">` (text messages' mention of everyone) and `[text](url)` form
    nothing in what the contract server received."""
    words = call_text(
        "P0", "GpuXidError", "ml/llama", '<at user_id="all"></at> [ACK HERE](https://evil.example)'
    )
    async with FeishuContractServer(apps={"cli": "sec"}, users={"ou_alice"}) as feishu:
        provider = FeishuUrgentPhoneProvider(FeishuAppClient(feishu.base_url, "cli", "sec"))
        try:
            await provider.call(_call(text=words))
        finally:
            await provider.aclose()
    [dm] = feishu.messages.values()
    text = json.loads(dm["content"])["text"]
    assert "GpuXidError" in text and "ACK HERE" in text
    assert "<at" not in text and "](" not in text and "[ACK" not in text, text


async def test_escalation_to_phone_channel_end_to_end(phones: PhoneContractServer) -> None:
    """plan() -> call_payload -> outbox row -> PhoneNotifier -> Twilio, layer by layer."""
    settings = PhoneSettings.model_validate(
        {
            "provider": "twilio",
            "twilio": {
                "base_url": phones.base_url,
                "account_sid": phones.account_sid,
                "auth_token_env": "TWILIO_TOKEN",
                "from_number": phones.from_number,
            },
        }
    )
    notifier = PhoneNotifier.from_settings(settings, env={"TWILIO_TOKEN": phones.auth_token})
    bob = Person("bob", phone="+15550004444")
    esc = Escalator(Roster((Layer("l1", (ALICE,)), Layer("l2", (bob,)))), Policy())
    t0 = datetime(2026, 11, 22, 3, tzinfo=UTC)
    state = esc.open(new_state(), 42, Priority.P0, t0)
    placed = []
    try:
        for minutes in (0, 3, 5, 9, 11):
            state, due = esc.plan(state, t0 + timedelta(minutes=minutes))
            for n, call in enumerate(due):
                text = call_text("P0", "GpuXidError", "team-a/llama", "XID 79 on GPU 3")
                row = OutboundNotification(
                    id=len(placed) + n, channel="phone", kind=CALL_KIND, priority=call.priority,
                    payload=call_payload(call, text), idempotency_key=call.idempotency_key,
                    group_key="42", created_at=t0,
                )  # fmt: skip
                placed.append(await notifier.send(row))
        resolved = OutboundNotification(
            id=99, channel="phone", kind=CALL_KIND, priority=Priority.P0,
            payload={**call_payload(due[0] if due else call, "x"), "status": "resolved"},
            idempotency_key="k", group_key="42", created_at=t0,
        )  # fmt: skip
        with pytest.raises(PermanentError, match="resolved"):
            await notifier.send(resolved)
    finally:
        await notifier.aclose()
    assert [c["To"] for c in phones.twilio_calls] == [ALICE.phone, bob.phone]
    assert "team-a/llama" in phones.twilio_calls[0]["Twiml"]
    assert all(r.provider_id for r in placed)
