"""The ack form on a Feishu card (an input and the buttons that submit it, as Feishu's form
container is documented) and the comment read back from a callback's `form_value`, in both
callback schemes."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.notifiers.helpers import alert_payload
from tests.support.feishu_server import card_problems
from trainsentry.notifiers.feishu.callback import CallbackRejected, CardAction, parse_callback
from trainsentry.notifiers.feishu.card import COMMENT_FIELD, CardOptions, alert_card
from trainsentry.notifiers.payload_contract import parse_payload

TOKEN = "v-token"
NOW = 1_790_000_000


def test_the_buttons_sit_in_a_form_with_the_comment_input() -> None:
    card = alert_card(parse_payload(alert_payload()), CardOptions(actions=True))
    assert card_problems(card) == []
    [form] = [e for e in card["body"]["elements"] if e["tag"] == "form"]
    assert form["elements"][0] == {
        "tag": "input", "name": COMMENT_FIELD, "max_length": 1000,
        "placeholder": {"tag": "plain_text", "content": "Comment (optional)"},
    }  # fmt: skip
    buttons = [c["elements"][0] for c in form["elements"][1]["columns"]]
    assert [b["form_action_type"] for b in buttons] == ["submit"] * 4
    assert [b["name"] for b in buttons] == [
        "ack_42", "silence_42_3600", "silence_42_14400", "silence_42_86400"
    ]  # fmt: skip
    # the contract server knows a form off the root, and one with no submit button, is wrong
    nested = {**card, "body": {"elements": [{"tag": "column_set", "columns": [
        {"tag": "column", "elements": [form]}]}]}}  # fmt: skip
    assert any("root" in p for p in card_problems(nested))
    unsent = {**form, "elements": form["elements"][:1]}
    assert any("submit" in p for p in card_problems({**card, "body": {"elements": [unsent]}}))


def test_a_legacy_callback_carries_the_comment_too() -> None:
    body = json.dumps(
        {
            "open_id": "ou_alice",
            "open_message_id": "om_1",
            "action": {
                "value": {"action": "silence", "alert_id": 7, "duration_s": 3600},
                "tag": "button",
                "name": "silence_7_3600",
                "form_value": {COMMENT_FIELD: " swapping the cable "},
            },
        }
    ).encode()
    headers = {"X-Lark-Request-Timestamp": str(NOW), "X-Lark-Request-Nonce": "n"}
    digest = hashlib.sha1(f"{NOW}n{TOKEN}".encode() + body).hexdigest()
    headers["X-Lark-Signature"] = digest
    action = parse_callback(headers, body, verification_token=TOKEN, now=NOW)
    assert isinstance(action, CardAction)
    assert (action.action, action.duration_s, action.comment) == (
        "silence", 3600, "swapping the cable"
    )  # fmt: skip
    bad = json.loads(body)
    bad["action"]["form_value"] = "comment"
    raw = json.dumps(bad).encode()
    headers["X-Lark-Signature"] = hashlib.sha1(f"{NOW}n{TOKEN}".encode() + raw).hexdigest()
    with pytest.raises(CallbackRejected, match="form_value"):
        parse_callback(headers, raw, verification_token=TOKEN, now=NOW)


def test_a_form_press_without_a_value_is_read_from_the_button_name() -> None:
    """Feishu's form buttons may submit without a `behaviors` value: the name says it."""
    for name, expected in (("silence_7_3600", ("silence", 7, 3600)), ("ack_9", ("ack", 9, None))):
        body = json.dumps(
            {
                "schema": "2.0",
                "header": {"event_id": f"ev-{name}", "token": TOKEN},
                "event": {
                    "operator": {"open_id": "ou_alice"},
                    "action": {"tag": "button", "name": name, "form_value": {"comment": "ok"}},
                },
            }
        ).encode()
        action = parse_callback({}, body, verification_token=TOKEN, now=NOW)
        assert isinstance(action, CardAction)
        assert (action.action, action.alert_id, action.duration_s, action.comment) == (
            *expected, "ok"
        )  # fmt: skip
    for name in ("ack_x", "silence_7_-1", "nope_1", "ack_1_2_3"):
        body = json.dumps(
            {
                "schema": "2.0",
                "header": {"token": TOKEN},
                "event": {"operator": {"open_id": "ou_a"}, "action": {"name": name}},
            }
        ).encode()
        with pytest.raises(CallbackRejected):
            parse_callback({}, body, verification_token=TOKEN, now=NOW)
