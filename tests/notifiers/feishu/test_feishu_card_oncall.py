"""What on-call adds to the Feishu cards: "on call now" on a firing P0, the ack comment on the
redrawn card, and the handoff notice card; each a card Feishu accepts."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from tests.notifiers.helpers import alert_payload
from tests.support.feishu_server import card_problems
from trainsentry.gateway.stages.services.handoff import notice_payload
from trainsentry.notifiers.feishu.card import build_card
from trainsentry.notifiers.payload_contract import parse_payload
from trainsentry.oncall.config import parse_oncall
from trainsentry.oncall.handoffs import handoffs

ON_CALL = "alice (gpu-infra, until 2026-11-23 09:00 +0100)"


def text(card: dict[str, object]) -> str:
    return json.dumps(card, ensure_ascii=False)


def test_a_firing_p0_card_says_who_is_on_call_now() -> None:
    card = build_card("alert", parse_payload(alert_payload("P0", on_call=ON_CALL)))
    assert f"**On call now:** {ON_CALL}" in text(card) and card_problems(card) == []
    # not once someone took it, and not when resolved
    acked = build_card("ack", parse_payload(alert_payload("P0", on_call=ON_CALL, acked_by="bob")))
    resolved = build_card("alert", parse_payload(alert_payload("P0", "resolved", on_call=ON_CALL)))
    assert "On call now" not in text(acked) and "On call now" not in text(resolved)


def test_the_redrawn_card_shows_the_ack_comment_escaped() -> None:
    payload = alert_payload("P0", acked_by="bob", ack_comment="rebooting **node 17** <at id=all>")
    card = build_card("ack", parse_payload(payload))
    shown = text(card)
    assert "Acknowledged by" in shown and "rebooting" in shown
    assert "<at id=all>" not in shown and card_problems(card) == []


def test_the_handoff_card() -> None:
    config = parse_oncall(
        {
            "people": {"alice": {}, "bob": {}},
            "schedules": {
                "s": {
                    "timezone": "Europe/Berlin",
                    "layers": [
                        {"name": "primary", "start": "2026-11-16T09:00", "shift": "1w",
                         "members": ["alice", "bob"]}
                    ],
                }
            },
        }
    )  # fmt: skip
    schedule = config.schedules["s"]
    start, end = datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 24, tzinfo=UTC)
    [handoff] = handoffs(schedule, start, end)
    card = build_card("handoff", parse_payload(notice_payload(schedule, handoff)))
    shown = text(card)
    assert card["header"]["title"]["content"] == "On-call handoff: s"  # type: ignore[index]
    assert "**Now on call:** bob (primary)" in shown and "**Before:** alice" in shown
    assert "2026-11-30T09:00:00+01:00" in shown and card_problems(card) == []
