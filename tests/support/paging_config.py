"""The gateway configuration of the end-to-end paging tests (incidents, correlation, node
death): Feishu bot groups, docs/channels.md's HTTP voice gateway for calls, and the escalation
layers under `oncall.escalation`, their one home. Each test brings its own policy, groups and
layers; this writes them as the gateway reads them and returns the environment they name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# docs/channels.md's HTTP voice gateway example
VOICE_TEMPLATE = (
    '{"CalledNumber": {{ phone|tojson }}, "TtsParam": {{ {"text": text}|tojson|tojson }}}'
)
VOICE_KEY = "voice-key"


def voice_gateway() -> dict[str, Any]:
    """The `channels.phone` section calling through docs/channels.md's HTTP voice gateway,
    its URL and key read from VOICE_URL and VOICE_KEY."""
    return {
        "provider": "webhook",
        "webhook": {
            "url_env": "VOICE_URL",
            "header_secrets_env": {"X-Api-Key": "VOICE_KEY"},
            "body_template": VOICE_TEMPLATE,
            "success_field": "Code",
            "success_value": "OK",
        },
    }


def write_paging_config(
    tmp: Path,
    *,
    token: str,
    policy: dict[str, Any],
    groups: dict[str, Any],
    voice_url: str,
    escalation: dict[str, Any],
    env: dict[str, str] | None = None,
) -> tuple[Path, dict[str, str]]:
    """Write policy.yaml and gateway.yaml under `tmp`; return the config's path and the
    environment the gateway needs (the webhook token, the voice gateway's URL and key, and
    `env`, e.g. the bot groups' `url_env` values)."""
    policy_file = tmp / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy))
    config = tmp / "gateway.yaml"
    phone = voice_gateway()
    config.write_text(
        yaml.safe_dump(
            {
                "gateway": {"policy_file": str(policy_file)},
                "channels": {"feishu_bot": {"groups": groups}, "phone": phone},
                "oncall": {"escalation": escalation},
            }
        )
    )
    needed = {"TRAINSENTRY_WEBHOOK_TOKEN": token, "VOICE_URL": voice_url, "VOICE_KEY": VOICE_KEY}
    return config, {**needed, **(env or {})}
