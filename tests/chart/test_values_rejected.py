"""Invalid values make helm lint and helm template fail, saying what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chart.chart_helm import CHART, NAMESPACE, RELEASE, HelmFailed, helm, lint, template

# (case, values overriding the defaults, words the error must contain). Words, not whole
# sentences: helm 3 (gojsonschema) and helm 4 word schema errors differently.
REJECTED: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("wrong type", {"gateway": {"replicas": "two"}}, ("replicas", "integer")),
    ("wrong type nested", {"exporters": {"dcgm": {"enabled": "yes"}}}, ("enabled", "boolean")),
    ("unknown top-level key", {"gatway": {"replicas": 1}}, ("gatway",)),
    ("unknown nested key", {"gateway": {"replica": 2}}, ("replica",)),
    ("bad enum", {"gateway": {"database": {"type": "mysql"}}}, ("database", "type")),
    ("unknown channel", {"channels": {"config": {"slack": {}}}}, ("slack",)),
    (
        "bad duration",
        {"alertmanager": {"config": {"route": {"groupWait": "soon"}}}},
        ("groupWait",),
    ),
    ("resources without limits", {"gateway": {"resources": {"limits": None}}}, ("limits",)),
    (
        "memory limit removed",
        {"operator": {"resources": {"limits": {"memory": None}}}},
        ("memory",),
    ),
    ("bad digest", {"image": {"digest": "latest"}}, ("digest",)),
    (
        "phone prefix not +digits",
        {"gateway": {"jobAlerting": {"phonePrefixes": ["0086"]}}},
        ("phonePrefixes",),
    ),
    (
        "retention below what the weekly report reads",
        {"gateway": {"retention": {"alerts_days": 7}}},
        ("alerts_days",),
    ),
    (
        "a team without namespaces",
        {"gateway": {"access": {"teams": {"team-a": {"groups": ["a"]}}}}},
        ("namespaces",),
    ),
    (
        "a namespace that is no DNS label",
        {"gateway": {"access": {"teams": {"team-a": {"namespaces": ["Team_A"]}}}}},
        ("namespaces",),
    ),
    ("unknown access key", {"gateway": {"access": {"admins": ["sre"]}}}, ("admins",)),
    ("unknown console key", {"gateway": {"console": {"proxies": ["10.0.0.1"]}}}, ("proxies",)),
    ("trigger port out of range", {"gateway": {"triggerPort": 70000}}, ("triggerPort",)),
]


@pytest.mark.parametrize(
    ("values", "message"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED]
)
def test_helm_lint_and_template_refuse(
    values: dict[str, Any], message: tuple[str, ...], tmp_path: Path
) -> None:
    with pytest.raises(HelmFailed) as linted:
        lint(overrides=values, tmp=tmp_path)
    linted_text = linted.value.stdout + linted.value.stderr
    assert [word for word in message if word not in linted_text] == [], linted_text
    with pytest.raises(HelmFailed) as templated:
        template(overrides=values, tmp=tmp_path)
    assert [word for word in message if word not in templated.value.stderr] == []


def test_replicas_with_sqlite_is_one_sentence_not_the_schemas_if_then(tmp_path: Path) -> None:
    """`--set gateway.replicas=2` without PostgreSQL: the error says PostgreSQL is needed
    and why. Before: the schema's `Must validate "then" as "if" was valid` (its if/then
    refused first, in words that name neither replicas nor PostgreSQL)."""
    with pytest.raises(HelmFailed) as failed:
        template(overrides={"gateway": {"replicas": 2}}, tmp=tmp_path)
    assert "Must validate" not in failed.value.stderr
    [line] = [x for x in failed.value.stderr.splitlines() if "replicas" in x]
    assert "gateway.replicas > 1 needs gateway.database.type=postgresql" in line


def test_template_guard_refuses_sqlite_replicas_even_without_the_schema() -> None:
    """The template's own check backs the schema (e.g. for --skip-schema-validation)."""
    with pytest.raises(HelmFailed) as failed:
        helm(
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--skip-schema-validation",
            "--set",
            "gateway.replicas=3",
        )
    assert "gateway.replicas > 1 needs gateway.database.type=postgresql" in failed.value.stderr


# Contradictions the templates refuse: (case, values, message). `helm lint` reports a
# template's `fail` only as [INFO]; `helm template` and `helm install` stop on it.
CONTRADICTIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "replicas > 1 with SQLite",
        {"gateway": {"replicas": 2}},
        "gateway.replicas > 1 needs gateway.database.type=postgresql: one SQLite file",
    ),
    (
        "postgresql without a URL",
        {"gateway": {"database": {"type": "postgresql"}}},
        "needs gateway.database.postgresql.existingSecret",
    ),
    (
        "postgresql URL twice",
        {
            "gateway": {
                "database": {
                    "type": "postgresql",
                    "postgresql": {"existingSecret": "db", "url": "postgresql://h/db"},
                }
            }
        },
        "existingSecret or .url, not both",
    ),
    (
        "channel secrets twice",
        {"channels": {"existingSecret": "ch", "secretEnv": {"A": "b"}}},
        "channels.existingSecret or channels.secretEnv, not both",
    ),
    (
        "tokens twice",
        {"gateway": {"auth": {"existingSecret": "t", "webhookToken": "x"}}},
        "leave gateway.auth.webhookToken/apiToken/probeToken empty",
    ),
    (
        "probe token twice",
        {"gateway": {"auth": {"existingSecret": "t", "probeToken": "x"}}},
        "leave gateway.auth.webhookToken/apiToken/probeToken empty",
    ),
    (
        "the probes' token where it used to be",
        {"channels": {"secretEnv": {"TRAINSENTRY_PROBE_TOKEN": "t"}}},
        "the probes' token is gateway.auth's probe-token now",
    ),
    (
        "the probes' token under its own variable where it used to be",
        {
            "gateway": {"diagnosis": {"probe_token_env": "PROBE_TOKEN"}},
            "channels": {"secretEnv": {"PROBE_TOKEN": "t"}},
        },
        "remove PROBE_TOKEN from channels.secretEnv",
    ),
]


@pytest.mark.parametrize(
    ("values", "message"), [c[1:] for c in CONTRADICTIONS], ids=[c[0] for c in CONTRADICTIONS]
)
def test_contradicting_values_are_refused(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(HelmFailed) as failed:
        template(overrides=values, tmp=tmp_path)
    assert message in failed.value.stderr


def test_replicas_above_one_with_postgresql_are_accepted(tmp_path: Path) -> None:
    values = {
        "gateway": {
            "replicas": 2,
            "database": {"type": "postgresql", "postgresql": {"existingSecret": "db"}},
        }
    }
    objs = template(overrides=values, tmp=tmp_path)
    gateway = [
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-gateway")
    ]
    assert gateway[0]["spec"]["replicas"] == 2


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"gateway": {"diagnosis": {"kubernetes": True}}, "channels": {"existingSecret": "ch"}},
        {"gateway": {"diagnosis": {"enabled": False}}},
        {"gateway": {"diagnosis": {"probe_token_env": "PROBE_TOKEN"}}},
        {"gateway": {"auth": {"probeToken": "given"}}},
    ],
    ids=["defaults", "channels in an existing Secret", "diagnosis off", "own token variable",
         "given token"],
)  # fmt: skip
def test_diagnosis_takes_the_probes_token_from_the_auth_secret(
    values: dict[str, Any], tmp_path: Path
) -> None:
    """The probes' master token is gateway.auth's `probe-token` (generated unless given);
    the gateway reads it under diagnosis.probe_token_env, the operator as
    TRAINSENTRY_PROBE_TOKEN."""
    objs = template(overrides=values, tmp=tmp_path)
    gateway = next(
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-gateway")
    )
    name = values.get("gateway", {}).get("diagnosis", {}).get("probe_token_env")
    env = {e["name"]: e for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env[name or "TRAINSENTRY_PROBE_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "ts-trainsentry-gateway-auth", "key": "probe-token"}
    auth = next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == ref["name"])
    given = values.get("gateway", {}).get("auth", {}).get("probeToken")
    if given:
        import base64

        assert base64.b64decode(auth["data"]["probe-token"]).decode() == given


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gateway": {"triggerPort": 9095}}, "gateway.triggerPort must differ from gateway.port"),
        (
            {"gateway": {"service": {"triggerPort": 9095}}},
            "gateway.service.triggerPort must differ from gateway.service.port",
        ),
    ],
)
def test_the_trigger_port_is_not_the_gateways_own(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(HelmFailed) as failed:
        template(overrides=values, tmp=tmp_path)
    assert message in failed.value.stderr
