"""A TrainingJob's object references name objects of its own namespace only (issue 32,
finding 1): the CRD's schema refuses a reference name that is no Kubernetes object name
(checked with jsonschema against the CRD's openAPIV3Schema, through the kmock emulator over
HTTP), the spec model refuses the same names, and the operator reports an object stored
before the CRD had the pattern (InvalidSpec naming the field) without following it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from operator_harness import NS, OperatorThread, trainingjob, trainingjob_schema
from pydantic import ValidationError

from tests.support.eventually import eventually
from tests.support.kube_emulator import KubeEmulator
from trainsentry.kube.names import DNS1123_SUBDOMAIN_MAX, DNS1123_SUBDOMAIN_PATTERN
from trainsentry.operator.reconcile import Sources
from trainsentry.operator.spec import INVALID_OBJECT_NAME, TrainingJobSpec

TJ_PATH = f"/apis/trainsentry.io/v1alpha1/namespaces/{NS}/trainingjobs"
SELECTOR = {"selector": {"matchLabels": {"job": "x"}}}

# Each reference of the spec, as the spec with `name` put in it.
REFERENCES = {
    "alerting.feishu.webhookSecretRef.name": lambda name: {
        **SELECTOR,
        "alerting": {"feishu": {"webhookSecretRef": {"name": name, "key": "url"}}},
    },
    "alerting.onCallRosterRef.name": lambda name: {
        **SELECTOR,
        "alerting": {"onCallRosterRef": {"name": name, "key": "roster.yaml"}},
    },
    "workloadRef.name": lambda name: {"workloadRef": {"kind": "PyTorchJob", "name": name}},
}
# The escapes of the finding, and names IsDNS1123Subdomain refuses (Kubernetes'
# validation_test.go: empty, upper case, '_', edge and doubled dots, 254 characters).
BAD_NAMES = [
    "../../team-b/secrets/bot",
    "%2e%2e/%2e%2e/team-b/secrets/bot",
    "../../team-b/configmaps/oncall",
    "..",
    ".",
    "bot/../x",
    "bot%2Fx",
    "",
    "Bot",
    "a_b",
    "a..b",
    ".a",
    "a.",
    "-a",
    "a" * 254,
]
GOOD_NAMES = ["bot", "team-a.bot-1", "0", "a--1--2--b.1", "a" * 253]


def _refs(schema: Any, path: str = "") -> dict[str, Any]:
    """Every `...Ref` object of the schema, by its dotted path."""
    found: dict[str, Any] = {}
    for key, sub in (schema.get("properties") or {}).items():
        where = f"{path}.{key}" if path else key
        if key.endswith("Ref"):
            found[where] = sub
        found.update(_refs(sub, where))
    return found


def test_every_reference_of_the_crd_is_bounded_by_the_name_rule() -> None:
    """One rule: each `*Ref.name` of the CRD carries the pattern of kube/names.py and
    Kubernetes' 253 characters; the table above covers each of them."""
    refs = _refs(trainingjob_schema()["properties"]["spec"])
    assert {f"{where}.name" for where in refs} == set(REFERENCES)
    for where, ref in refs.items():
        name = ref["properties"]["name"]
        assert name["pattern"] == DNS1123_SUBDOMAIN_PATTERN, where
        assert name["maxLength"] == DNS1123_SUBDOMAIN_MAX, where
        assert "name" in ref["required"], where


@pytest.mark.parametrize("field", sorted(REFERENCES))
@pytest.mark.parametrize("name", BAD_NAMES)
async def test_the_crd_refuses_a_reference_that_is_no_object_name(
    cluster: KubeEmulator, field: str, name: str
) -> None:
    body = trainingjob("refs", REFERENCES[field](name))
    async with cluster.post(TJ_PATH, json=body) as answer:
        assert answer.status == 422, await answer.text()
        message = (await answer.json())["message"]
        assert "does not match" in message or "is too long" in message, message
    assert cluster.get_live("trainsentry.io/v1alpha1/trainingjobs", NS, "refs") is None


@pytest.mark.parametrize("field", sorted(REFERENCES))
@pytest.mark.parametrize("name", GOOD_NAMES)
async def test_the_crd_takes_any_object_name(cluster: KubeEmulator, field: str, name: str) -> None:
    async with cluster.post(TJ_PATH, json=trainingjob("refs", REFERENCES[field](name))) as answer:
        assert answer.status == 201, await answer.text()


@pytest.mark.parametrize("field", sorted(REFERENCES))
def test_the_spec_model_checks_the_same_names(field: str) -> None:
    for name in BAD_NAMES:
        with pytest.raises(ValidationError) as caught:
            TrainingJobSpec.model_validate(REFERENCES[field](name))
        [error] = caught.value.errors()
        assert error["type"] == INVALID_OBJECT_NAME, (name, error)
        assert ".".join(map(str, error["loc"])) == field
    for name in GOOD_NAMES:
        TrainingJobSpec.model_validate(REFERENCES[field](name))


@pytest.fixture
async def operator(cluster: KubeEmulator, sources: Sources) -> AsyncIterator[OperatorThread]:
    running = OperatorThread(str(cluster.url).rstrip("/"), sources)
    await running.start(cluster)
    yield running
    await running.stop()


async def test_the_operator_reports_a_stored_reference_that_is_no_name(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    """An object kept from before the CRD had the pattern: reported (InvalidSpec, naming the
    field), never followed: no request of the operator names team-b."""
    spec: dict[str, Any] = REFERENCES["alerting.feishu.webhookSecretRef.name"](
        "../../team-b/secrets/bot"
    )
    validator, cluster.validator = cluster.validator, None
    try:
        async with cluster.post(TJ_PATH, json=trainingjob("old", spec)) as answer:
            assert answer.status == 201, await answer.text()
    finally:
        cluster.validator = validator

    def conditions() -> list[dict[str, Any]]:
        body = cluster.get_live("trainsentry.io/v1alpha1/trainingjobs", NS, "old") or {}
        found: list[dict[str, Any]] = (body.get("status") or {}).get("conditions") or []
        return found

    await eventually(conditions)
    assert {(c["status"], c["reason"]) for c in conditions()} == {("False", "InvalidSpec")}
    assert "alerting.feishu.webhookSecretRef.name" in conditions()[0]["message"]
    assert not [p for p in cluster.sent_paths(exclude_agent="kmock/") if "team-b" in p]
