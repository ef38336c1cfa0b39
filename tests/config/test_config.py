"""Settings are validated once, when they are loaded: every problem of every section is in
one ConfigError, each with its path from the top of the file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from trainsentry.config import ConfigError, load_settings, validate_settings
from trainsentry.gateway.sections import default_escalator

SCHEDULE = {
    "timezone": "Europe/Berlin",
    "layers": [{"name": "primary", "start": "2026-10-19T09:00", "shift": "1w", "members": ["a"]}],
}

LAYERS = {"layers": [{"name": "primary", "members": [{"name": "a", "phone": "+4915100000001"}]}]}

# One mistake in each section (two in oncall:), and the path each is reported under.
MISTAKES = {
    "gateway": ({"listen": "nowhere"}, ["gateway.listen"]),
    "diagnosis": ({"checkpoint_limit_seconds": 1}, ["diagnosis.checkpoint_limit_seconds"]),
    "channels": ({"feishu_app": {"chats": {}}}, ["channels.feishu_app.app_id"]),
    "reports": ({"week_start": "someday"}, ["reports.week_start"]),
    "job_alerting": ({"concurrency": 0}, ["job_alerting.concurrency"]),
    "topology": ({"levels": ["rack"], "refresh_seconds": 1}, ["topology.refresh_seconds"]),
    "remediation": ({"cordon": "sometimes"}, ["remediation.cordon"]),
    "oncall": (
        {"people": {"a": {"phone": "12"}}, "schedules": {"s": {**SCHEDULE, "timezone": "Mars"}}},
        ["oncall.people.a.phone", "oncall.schedules.s.timezone"],
    ),
}


def test_every_problem_of_every_section_is_reported_at_once_with_its_path(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({name: raw for name, (raw, _) in MISTAKES.items()}))
    with pytest.raises(ConfigError) as caught:
        load_settings(config, env={})
    expected = sorted(path for _, paths in MISTAKES.values() for path in paths)
    assert sorted(problem.path for problem in caught.value.problems) == expected
    message = str(caught.value)
    assert message.startswith(f"{len(expected)} invalid setting(s): "), message
    for path in expected:
        assert f"{path}: " in message, (path, message)


def test_a_valid_file_loads_every_section_typed(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "diagnosis": {"checkpoint_limit_seconds": 600},
                "topology": {"levels": ["rack"], "nodes": {"n0": {"rack": "r1"}}},
                "oncall": {"people": {"a": {}}, "schedules": {"s": SCHEDULE}, "escalation": LAYERS},
            }
        )
    )
    settings = load_settings(config, env={})
    assert settings.diagnosis.checkpoint_limit_seconds == 600
    assert settings.topology.levels == ("rack",)
    assert settings.remediation is None  # no section: nothing to cordon through
    assert settings.oncall.rota is not None and list(settings.oncall.rota.schedules) == ["s"]
    assert settings.oncall.escalation is not None  # beside the rota, in the one home


def test_escalation_has_one_home_and_the_old_place_is_a_deprecated_alias(
    caplog: pytest.LogCaptureFixture,
) -> None:
    home = validate_settings({"oncall": {"escalation": LAYERS}})
    assert home.oncall.escalation is not None and home.oncall.rota is None  # no rota: no on-call
    with caplog.at_level(logging.WARNING, logger="trainsentry.config"):
        alias = validate_settings({"channels": {"escalation": LAYERS}})
    assert "channels.escalation is deprecated" in caplog.text
    assert alias.oncall == home.oncall and alias.channels is None  # moved to its home
    escalator = default_escalator(alias)
    assert escalator is not None and [layer.name for layer in escalator.roster.layers] == [
        "primary"
    ]
    with pytest.raises(ConfigError) as caught:
        validate_settings({"channels": {"escalation": LAYERS}, "oncall": {"escalation": LAYERS}})
    assert [p.path for p in caught.value.problems] == ["channels.escalation"]


def test_phone_calls_need_someone_to_call() -> None:
    phone = {"phone": {"provider": "feishu"}, "feishu_app": {"app_id": "cli_x"}}
    with pytest.raises(ConfigError) as caught:
        validate_settings({"channels": phone})
    assert str(caught.value.problems[0]).startswith("channels.phone: needs oncall.escalation")
    validate_settings({"channels": phone, "oncall": {"escalation": LAYERS}})
    validate_settings({"channels": {**phone, "escalation": LAYERS}})  # the alias


def test_what_the_file_cannot_say_is_a_config_error_too(tmp_path: Path) -> None:
    """app_from_settings raises ConfigError alone: for a secret missing from the
    environment, and for the policy file (gateway.policy_file)."""
    from trainsentry.gateway.assemble import app_from_settings

    db = f"sqlite:///{tmp_path / 'store.db'}"
    static = {"static_endpoints": {"ml/llama": ["127.0.0.1:9401"]}}
    settings = validate_settings({"gateway": {"db": db}, "diagnosis": static})
    with pytest.raises(ConfigError, match="TRAINSENTRY_PROBE_TOKEN"):
        app_from_settings(settings, env={})
    policy = tmp_path / "policy.yaml"
    policy.write_text("routing: {routes: [{id: r, channels: [console], colour: red}]}\n")
    settings = validate_settings({"gateway": {"db": db, "policy_file": str(policy)}})
    with pytest.raises(ConfigError, match="colour"):
        app_from_settings(settings, env={})


def test_a_webhook_channel_needs_its_url_when_the_settings_load() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_settings({"webhooks": {"pager": {"timeout_s": 5}}})
    assert [str(p) for p in caught.value.problems] == ["webhooks.pager: set url or url_env"]


def test_a_diagnosis_deadline_not_below_its_hold_is_refused(tmp_path: Path) -> None:
    """The diagnosis must end before its held page goes out (issue 48: a checkpoint whose
    verdict came after the hold was paged)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"diagnosis": {"hold_seconds": 4, "deadline_seconds": 4}}))
    with pytest.raises(ConfigError) as caught:
        load_settings(config, env={})
    assert "diagnosis: deadline_seconds (4) must be below hold_seconds (4)" in str(caught.value)
    config.write_text(yaml.safe_dump({"diagnosis": {"hold_seconds": 5, "deadline_seconds": 4}}))
    assert load_settings(config, env={}).diagnosis.deadline_seconds == 4
    # Left unset, the deadline follows a short hold (two thirds of it).
    config.write_text(yaml.safe_dump({"diagnosis": {"hold_seconds": 3}}))
    assert load_settings(config, env={}).diagnosis.deadline_seconds == 2


def test_the_trigger_port_is_off_unless_set_and_set_by_file_environment_or_flag(
    tmp_path: Path,
) -> None:
    """`gateway.trigger_listen` (docs/gateway.md, "Hang triggers"): unset, blank or set by
    the file, TRAINSENTRY_TRIGGER_LISTEN, or `--trigger-listen`, in that rising order."""
    assert load_settings(env={}).gateway.trigger_address is None
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"gateway": {"trigger_listen": "0.0.0.0:9096"}}))
    assert load_settings(config, env={}).gateway.trigger_address == ("0.0.0.0", 9096)
    env = {"TRAINSENTRY_TRIGGER_LISTEN": "[::]:9097"}
    assert load_settings(config, env=env).gateway.trigger_address == ("::", 9097)
    flag = {"gateway": {"trigger_listen": "127.0.0.1:0"}}
    assert load_settings(config, env=env, overrides=flag).gateway.trigger_address == (
        "127.0.0.1",
        0,
    )
    config.write_text(yaml.safe_dump({"gateway": {"trigger_listen": ""}}))
    assert load_settings(config, env={}).gateway.trigger_address is None
    config.write_text(yaml.safe_dump({"gateway": {"trigger_listen": "9096"}}))
    with pytest.raises(ConfigError, match=r"gateway\.trigger_listen"):
        load_settings(config, env={})
