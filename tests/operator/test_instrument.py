"""The webhook's pure core (`operator/instrument.py`): which pods a TrainingJob instruments and
the JSONPatch they get, applied with the jsonpatch library (RFC 6902) and the result validated
against the real Pod schema; the label-selector semantics it matches by."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pod_templates import pytorchjob_pod

from trainsentry.operator.instrument import (
    INIT_CONTAINER,
    InstrumentSettings,
    plan,
    token_secret,
)
from trainsentry.operator.spec import JobIdentity, LabelSelector
from trainsentry.probe.inject import BOOTSTRAP_PATH
from trainsentry.probe.token import job_token

NS = "team-a"
SETTINGS = InstrumentSettings(
    image="ghcr.io/trainsentry/trainsentry:0.1.0",
    gateway_url="http://ts-gateway.trainsentry.svc:9095",
)
WORKLOAD_JOB = {"workloadRef": {"kind": "PyTorchJob", "name": "llama"}, "ranksPerPod": 1}


def tj(name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainsentry.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", **meta},
        "spec": spec,
    }


def applied(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    patched: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(pod), ops)
    return patched


def env_of(pod: dict[str, Any], container: int = 0) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in pod["spec"]["containers"][container]["env"]
    }


def test_a_pytorchjob_pod_gets_the_probe_its_settings_token_and_dump_volume() -> None:
    pod = pytorchjob_pod("llama", NS, "worker", 2, workers=3)
    result = plan(pod, NS, [tj("llama", WORKLOAD_JOB)], SETTINGS)
    assert result.job == "llama" and result.kept == [], result
    patched = applied(pod, result.ops)
    for version in ("1.30.0", "1.37.0"):
        kubernetes_validate.validate(patched, version, strict=True)
    env = env_of(patched)
    assert env["TRAINSENTRY_PROBE"] == "1"
    assert env["TRAINSENTRY_JOB"] == "llama" and env["TRAINSENTRY_NAMESPACE"] == NS
    assert env["TRAINSENTRY_GATEWAY_URL"] == "http://ts-gateway.trainsentry.svc:9095"
    assert env["TRAINSENTRY_PROBE_PORT"] == "9401"
    assert env["PYTHONPATH"] == BOOTSTRAP_PATH
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["TRAINSENTRY_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["TRAINSENTRY_PROBE_TOKEN"] == {
        "secretKeyRef": {"name": "llama-trainsentry-probe-token", "key": "token", "optional": True}
    }
    assert env["RANK"] == "3" and env["MASTER_ADDR"] == "llama-master-0"  # the operator's own
    (init,) = patched["spec"]["initContainers"]
    assert init["name"] == INIT_CONTAINER and init["image"] == SETTINGS.image
    assert init["args"] == ["probe", "install", "/trainsentry-probe"]
    assert init["securityContext"]["runAsNonRoot"] is True
    volumes = {v["name"]: v for v in patched["spec"]["volumes"]}
    assert set(volumes) == {"trainsentry-probe", "trainsentry-fr"}
    assert all("emptyDir" in v for v in volumes.values())
    mounts = {m["mountPath"]: m for m in patched["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/trainsentry-probe"]["readOnly"] is True
    assert mounts["/var/run/trainsentry"]["name"] == "trainsentry-fr"
    ports = patched["spec"]["containers"][0]["ports"]
    assert {"name": "ts-probe-0", "containerPort": 9401, "protocol": "TCP"} in ports
    assert patched["metadata"]["labels"]["trainsentry.io/trainingjob"] == "llama"
    # what was there stays, in place
    assert patched["spec"]["containers"][0]["ports"][0]["name"] == "pytorchjob-port"
    assert patched["metadata"]["labels"]["training.kubeflow.org/replica-index"] == "2"


def test_a_selector_job_with_ranks_per_pod_and_its_own_port() -> None:
    spec = {"selector": {"matchLabels": {"app": "bert"}}, "ranksPerPod": 4, "probe": {"port": 9500}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "bert-", "namespace": NS, "labels": {"app": "bert"}},
        "spec": {"containers": [{"name": "side", "image": "envoy"}, {"name": "pytorch",
                                                                     "image": "t"}]},
    }  # fmt: skip
    result = plan(pod, NS, [tj("bert", spec)], SETTINGS)
    patched = applied(pod, result.ops)
    kubernetes_validate.validate(patched, "1.30.0", strict=True)
    assert "env" not in patched["spec"]["containers"][0]  # the sidecar is left alone
    assert env_of(patched, 1)["TRAINSENTRY_PROBE_PORT"] == "9500"
    assert [p["containerPort"] for p in patched["spec"]["containers"][1]["ports"]] == [
        9500,
        9501,
        9502,
        9503,
    ]


@pytest.mark.parametrize(
    ("pod_change", "jobs", "reason"),
    [
        ({}, [], "no TrainingJob in namespace team-a"),
        ({}, [tj("other", {"selector": {"matchLabels": {"app": "x"}}})],
         "no TrainingJob selects the pod (jobs here: other)"),
        ({}, [tj("llama", {**WORKLOAD_JOB, "instrument": False})],
         "TrainingJob llama has spec.instrument: false"),
        ({"annotations": {"trainsentry.io/instrument": "false"}}, [tj("llama", WORKLOAD_JOB)],
         "the pod opts out"),
        ({"annotations": {"trainsentry.io/container": "trainer"}}, [tj("llama", WORKLOAD_JOB)],
         "trainsentry.io/container names 'trainer', which the pod does not have"),
        ({}, [tj("llama", {"selector": {"matchLabels": 3}})],
         "no TrainingJob selects the pod (jobs here: llama) (llama unreadable)"),
        ({}, [tj("llama", WORKLOAD_JOB, deletionTimestamp="2026-01-01T00:00:00Z")],
         "no TrainingJob selects the pod"),
    ],
)  # fmt: skip
def test_a_pod_that_cannot_or_should_not_be_instrumented_is_left_unchanged(
    pod_change: dict[str, Any], jobs: list[dict[str, Any]], reason: str
) -> None:
    pod = pytorchjob_pod("llama", NS, "master", 0, workers=1)
    pod["metadata"].update(pod_change)
    result = plan(pod, NS, jobs, SETTINGS)
    assert result.ops == [] and reason in result.reason, result.reason


def test_the_pods_own_settings_are_kept() -> None:
    own = [
        {"name": "TRAINSENTRY_GATEWAY_URL", "value": "http://elsewhere:9095"},
        {"name": "POD_NAME", "value": "fixed"},
        {"name": "PYTHONPATH", "value": "/workspace/src"},
    ]
    pod = pytorchjob_pod("llama", NS, "worker", 0, workers=1, extra_env=own)
    pod["metadata"]["labels"]["trainsentry.io/trainingjob"] = "llama-old"
    pod["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/var/run/trainsentry"}
    ]
    pod["spec"]["containers"][0]["ports"].append({"name": "metrics", "containerPort": 9401})
    result = plan(pod, NS, [tj("llama", WORKLOAD_JOB)], SETTINGS)
    patched = applied(pod, result.ops)
    kubernetes_validate.validate(patched, "1.30.0", strict=True)
    env = env_of(patched)
    assert env["TRAINSENTRY_GATEWAY_URL"] == "http://elsewhere:9095"
    assert env["POD_NAME"] == "fixed"
    assert env["PYTHONPATH"] == f"{BOOTSTRAP_PATH}:/workspace/src"
    assert patched["metadata"]["labels"]["trainsentry.io/trainingjob"] == "llama-old"
    assert [v["name"] for v in patched["spec"]["volumes"]] == ["scratch", "trainsentry-probe"]
    assert sum(p["containerPort"] == 9401 for p in patched["spec"]["containers"][0]["ports"]) == 1
    assert set(result.kept) >= {
        "env TRAINSENTRY_GATEWAY_URL",
        "env POD_NAME",
        "label trainsentry.io/trainingjob (naming another job)",
        "mount at /var/run/trainsentry",
        "port 9401",
    }, result.kept
    # an instrumented pod fed again (a copied spec) is not instrumented twice
    again = plan(patched, NS, [tj("llama", WORKLOAD_JOB)], SETTINGS)
    assert again.ops == [] and again.reason == "the pod is instrumented already"


def test_a_pythonpath_from_a_reference_is_kept_and_said() -> None:
    ref = {"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "p"}}}
    pod = pytorchjob_pod("llama", NS, "worker", 0, workers=1, extra_env=[ref])
    result = plan(pod, NS, [tj("llama", WORKLOAD_JOB)], SETTINGS)
    assert env_of(applied(pod, result.ops))["PYTHONPATH"] == ref["valueFrom"]
    assert "env PYTHONPATH (set from a reference: no start-up hook)" in result.kept


def test_two_jobs_selecting_a_pod_the_first_by_name_wins_and_it_is_said() -> None:
    pod = pytorchjob_pod("llama", NS, "worker", 0, workers=1)
    jobs = [tj("zeta", WORKLOAD_JOB), tj("alpha", WORKLOAD_JOB)]
    result = plan(pod, NS, jobs, SETTINGS)
    assert result.job == "alpha" and "also selected by zeta" in result.reason
    assert env_of(applied(pod, result.ops))["TRAINSENTRY_JOB"] == "alpha"


def test_no_gateway_and_no_token_secrets_leave_those_variables_out() -> None:
    pod = pytorchjob_pod("llama", NS, "worker", 0, workers=1)
    bare = InstrumentSettings(image="i", gateway_url="", token_secrets=False)
    env = env_of(applied(pod, plan(pod, NS, [tj("llama", WORKLOAD_JOB)], bare).ops))
    assert "TRAINSENTRY_GATEWAY_URL" not in env and "TRAINSENTRY_PROBE_TOKEN" not in env


def test_a_pod_without_labels_env_or_volumes_gets_each_list_created() -> None:
    pod = {"metadata": {"namespace": NS}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    job = tj("all", {"selector": {}})  # an empty selector selects every pod
    patched = applied(pod, plan(pod, NS, [job], SETTINGS).ops)
    assert patched["metadata"]["labels"] == {"trainsentry.io/trainingjob": "all"}
    assert env_of(patched)["TRAINSENTRY_JOB"] == "all"


def test_the_token_secret_is_the_jobs_derived_token_owned_by_the_job() -> None:
    import base64

    job = JobIdentity(name="llama", namespace=NS, uid="u-1")
    secret = token_secret(job, job_token("master", NS, "llama"))
    kubernetes_validate.validate(secret, "1.30.0", strict=True)
    assert secret["metadata"]["name"] == "llama-trainsentry-probe-token"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token == job_token("master", NS, "llama") and "master" not in token


# ---------------------------------------------------------------- selector semantics

# Kubernetes "Labels and Selectors": equality- and set-based requirements are ANDed; `notin`
# also selects objects without the key; `exists`/`!` look at the key only.
SELECTOR_CASES = [
    ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "1"}, True),
    ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
    ({"matchLabels": {"app": "a"}}, {}, False),
    ({"matchExpressions": [{"key": "env", "operator": "In", "values": ["p", "q"]}]},
     {"env": "q"}, True),
    ({"matchExpressions": [{"key": "env", "operator": "In", "values": ["p"]}]}, {}, False),
    ({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["p"]}]}, {}, True),
    ({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["p"]}]},
     {"env": "p"}, False),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": ""}, False),
    ({"matchLabels": {"app": "a"},
      "matchExpressions": [{"key": "tier", "operator": "In", "values": ["w"]}]},
     {"app": "a", "tier": "m"}, False),
    ({}, {"anything": "1"}, True),
]  # fmt: skip


@pytest.mark.parametrize(("selector", "labels", "selected"), SELECTOR_CASES)
def test_label_selector_semantics(
    selector: dict[str, Any], labels: dict[str, str], selected: bool
) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is selected


async def test_the_emulator_lists_pods_by_the_same_selectors() -> None:
    """One meaning of a selector: the reconcile lists pods with `as_string()` and the
    webhook matches them with `matches()`; the emulator's list (the API's semantics) agrees."""
    import kmock
    from operator_harness import declare_cluster

    from tests.support.kube_emulator import KubeEmulator

    async with KubeEmulator() as emu, kmock.Server(emu):
        declare_cluster(emu)
        for index, (_, labels, _) in enumerate(SELECTOR_CASES):
            body = {"metadata": {"name": f"p{index}", "namespace": NS, "labels": labels}}
            async with emu.post(f"/api/v1/namespaces/{NS}/pods", json=body) as answer:
                assert answer.status == 201
        for selector, _, _ in SELECTOR_CASES:
            parsed = LabelSelector.model_validate(selector)
            query = {"labelSelector": parsed.as_string()}
            async with emu.get(f"/api/v1/namespaces/{NS}/pods", params=query) as answer:
                listed = {item["metadata"]["name"] for item in (await answer.json())["items"]}
            expected = {
                f"p{i}" for i, (_, labels, _) in enumerate(SELECTOR_CASES) if parsed.matches(labels)
            }
            assert listed == expected, selector


# ---------------------------------------------------------------- never overwritten

ENV_NAMES = st.sampled_from(
    ["TRAINSENTRY_PROBE", "TRAINSENTRY_JOB", "POD_IP", "PYTHONPATH", "RANK", "HOME", "X"]
)


@settings(max_examples=150, deadline=None)
@given(
    env=st.lists(
        st.tuples(ENV_NAMES, st.text(alphabet="abc/:", max_size=8)),
        max_size=6,
        unique_by=lambda e: e[0],
    ),
    volumes=st.lists(st.sampled_from(["trainsentry-fr", "data", "shm"]), unique=True),
    labelled=st.booleans(),
)
def test_what_the_pod_sets_is_never_removed_or_changed(
    env: list[tuple[str, str]], volumes: list[str], labelled: bool
) -> None:
    pod = pytorchjob_pod("llama", NS, "worker", 0, workers=1)
    container = pod["spec"]["containers"][0]
    container["env"] = [{"name": name, "value": value} for name, value in env]
    pod["spec"]["volumes"] = [{"name": name, "emptyDir": {}} for name in volumes]
    if labelled:
        pod["metadata"]["labels"]["trainsentry.io/trainingjob"] = "someone"
    before = copy.deepcopy(pod)
    patched = applied(pod, plan(pod, NS, [tj("llama", WORKLOAD_JOB)], SETTINGS).ops)
    after_env = {e["name"]: e.get("value") for e in patched["spec"]["containers"][0]["env"]}
    for name, value in env:
        if name == "PYTHONPATH":  # kept behind the hook's folder, or as it is
            assert after_env[name] in (value, f"{BOOTSTRAP_PATH}:{value}", BOOTSTRAP_PATH * (
                not value))  # fmt: skip
        else:
            assert after_env[name] == value, name
    assert patched["spec"]["volumes"][: len(volumes)] == before["spec"]["volumes"]
    for key, value in before["metadata"]["labels"].items():
        assert patched["metadata"]["labels"][key] == value
    assert (
        patched["spec"]["containers"][0]["ports"][0] == before["spec"]["containers"][0]["ports"][0]
    )
