"""The `gateway.access:` section (config/access.py): typed and validated when the settings
load, every problem named by its path; the schedules a team names must be the on-call
section's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainsentry.config import ConfigError, load_settings, validate_settings

SCHEDULE = {
    "timezone": "UTC",
    "layers": [{"name": "primary", "start": "2026-10-19T09:00", "shift": "1w", "members": ["a"]}],
}


def test_teams_load_typed_from_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "gateway": {
                    "console": {"trusted_proxies": ["10.42.0.0/16"], "groups_header": "X-G"},
                    "access": {
                        "admin_groups": ["sre"],
                        "teams": {
                            "team-a": {"namespaces": ["team-a"], "schedules": ["a-primary"]},
                            "team-b": {"namespaces": ["team-b", "team-b-dev"], "groups": ["b"]},
                        },
                    },
                },
                "oncall": {"people": {"a": {}}, "schedules": {"a-primary": SCHEDULE}},
            }
        )
    )
    settings = load_settings(config, env={})
    access = settings.gateway.access
    assert access.divided and access.admin_groups == ("sre",)
    assert access.team_groups("team-a") == ("team-a",) and access.team_groups("team-b") == ("b",)
    assert access.teams["team-b"].namespaces == ("team-b", "team-b-dev")
    assert settings.gateway.console.groups_header == "X-G"
    assert not load_settings(None, env={}).gateway.access.divided  # no section: not divided


TEAMS = "gateway.access.teams.a"
BAD = [
    ({"teams": {"a": {"namespaces": ["Team_A"]}}}, f"{TEAMS}.namespaces", "DNS"),
    ({"teams": {"a": {"namespaces": []}}}, f"{TEAMS}.namespaces", "at least"),
    ({"teams": {"a": {}}}, f"{TEAMS}.namespaces", "required"),
    ({"teams": {"a": {"namespaces": ["a"], "groups": ["x,y"]}}}, f"{TEAMS}.groups", "comma"),
    ({"admin_groups": [""]}, "gateway.access.admin_groups", "1 to 256"),
    ({"teams": {"a": {"namespaces": ["a"], "owner": "x"}}}, f"{TEAMS}.owner", "Extra"),
    ({"teams": {"a b,c": {"namespaces": ["a"]}}}, "gateway.access", "its own group"),
    (
        {"teams": {"a": {"namespaces": ["a"], "schedules": ["nope"]}}},
        f"{TEAMS}.schedules",
        "no on-call schedule 'nope'",
    ),
    (
        {"teams": {"a": {"namespaces": ["a"], "feishu": ["nobody"]}}},
        f"{TEAMS}.feishu[0]",
        "neither a person of oncall.people nor a Feishu open_id",
    ),
    ({"admin_feishu": ["x y"]}, "gateway.access.admin_feishu[0]", "Feishu open_id (ou_...)"),
]


def test_who_presses_a_teams_card_buttons_is_people_or_open_ids() -> None:
    """A team's `feishu` and `admin_feishu` name people of `oncall.people` (with an open_id)
    or open_ids: a press names its presser by open_id."""
    settings = validate_settings(
        {
            "gateway": {
                "access": {
                    "teams": {"a": {"namespaces": ["a"], "feishu": ["a", "ou_bo"]}},
                    "admin_feishu": ["ou_sam"],
                }
            },
            "oncall": {
                "people": {"a": {"feishu_open_id": "ou_a"}},
                "schedules": {"a-primary": SCHEDULE},
            },
        }
    )
    access = settings.gateway.access
    assert access.teams["a"].feishu == ("a", "ou_bo") and access.admin_feishu == ("ou_sam",)
    with pytest.raises(ConfigError) as caught:
        validate_settings(
            {
                "gateway": {"access": {"teams": {"a": {"namespaces": ["a"], "feishu": ["a"]}}}},
                "oncall": {"people": {"a": {}}, "schedules": {"a-primary": SCHEDULE}},
            }
        )
    assert "a has no feishu_open_id" in str(caught.value)


@pytest.mark.parametrize(("access", "path", "words"), BAD)
def test_a_bad_access_section_is_refused_naming_the_field(
    access: dict[str, object], path: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_settings({"gateway": {"access": access}})
    found = {problem.path: str(problem) for problem in caught.value.problems}
    assert path in found, found
    assert words.lower() in found[path].lower(), found
