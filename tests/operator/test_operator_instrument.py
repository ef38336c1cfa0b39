"""The admission webhook in the running operator (kopf's WebhookServer over real HTTPS) on the
Kubernetes emulator: admission.k8s.io/v1 AdmissionReviews in (`install.admission_review`,
the shape kubernetes.io documents), JSONPatches out; the job's probe token Secret kept next
to it (owned by it, gone with it, rewritten after a restart, never read); pods it cannot
judge admitted unchanged with a log line or an Event."""

from __future__ import annotations

import base64
import json
import logging
import ssl
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
from operator_harness import NS, TJ, OperatorThread, delete, post, trainingjob
from pod_templates import pytorchjob_pod

from tests.support.eventually import eventually
from tests.support.install import admission_review
from tests.support.kube_emulator import KubeEmulator
from tests.support.ports import free_port
from tests.support.tls import self_signed
from trainsentry.operator.handlers import WEBHOOK_ID, WebhookServing
from trainsentry.operator.instrument import InstrumentSettings
from trainsentry.operator.reconcile import Sources
from trainsentry.probe.token import job_token

MASTER = "master-probe-token"
SECRETS = "v1/secrets"
TJ_PATH = f"/apis/{TJ.replace('/trainingjobs', '')}/namespaces/{NS}/trainingjobs"
SETTINGS = InstrumentSettings(image="ts:1", gateway_url="http://ts-gateway.trainsentry.svc:9095")


class Hook:
    """The operator's webhook endpoint, called as the API server calls it (HTTPS, the CA)."""

    def __init__(self, port: int, cafile: Path) -> None:
        self.url = f"https://127.0.0.1:{port}/{WEBHOOK_ID}"
        self.context = ssl.create_default_context(cafile=str(cafile))

    async def review(self, pod: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
        review = admission_review(pod, namespace)
        async with httpx.AsyncClient(verify=self.context, timeout=10) as http:
            answer = await http.post(self.url, json=review)
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
        assert body["response"]["uid"] == review["request"]["uid"]
        response: dict[str, Any] = body["response"]
        return response

    async def post_raw(self, data: bytes) -> int:
        async with httpx.AsyncClient(verify=self.context, timeout=10) as http:
            return (await http.post(self.url, content=data)).status_code


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    return result


def start(cluster: KubeEmulator, sources: Sources, tmp_path: Path) -> tuple[OperatorThread, Hook]:
    cert, key = self_signed(tmp_path / "tls")
    port = free_port()
    serving = WebhookServing(SETTINGS, port=port, certfile=str(cert), keyfile=str(key))
    operator = OperatorThread(
        str(cluster.url).rstrip("/"), sources, probe_token=MASTER, webhook=serving
    )
    return operator, Hook(port, cert)


async def until_served(hook: Hook) -> None:
    async def up() -> bool:
        try:
            return await hook.post_raw(b"{}") == 400
        except httpx.HTTPError:
            return False

    for _ in range(100):
        if await up():
            return
        import asyncio

        await asyncio.sleep(0.1)
    raise AssertionError("the webhook did not come up")


def secret_token(cluster: KubeEmulator, job: str) -> str | None:
    secret = cluster.get_live(SECRETS, NS, f"{job}-trainsentry-probe-token")
    return None if secret is None else base64.b64decode(secret["data"]["token"]).decode()


async def test_a_selected_pod_is_instrumented_and_its_job_holds_its_own_token(
    cluster: KubeEmulator, sources: Sources, tmp_path: Path
) -> None:
    operator, hook = start(cluster, sources, tmp_path)
    await operator.start(cluster)
    try:
        await until_served(hook)
        spec = {"workloadRef": {"kind": "PyTorchJob", "name": "llama"}}
        await post(cluster, TJ_PATH, trainingjob("llama", spec))
        await eventually(lambda: secret_token(cluster, "llama") is not None)
        assert secret_token(cluster, "llama") == job_token(MASTER, NS, "llama")
        secret = cluster.get_live(SECRETS, NS, "llama-trainsentry-probe-token")
        assert secret is not None
        owner = secret["metadata"]["ownerReferences"][0]
        job = cluster.get_live(TJ, NS, "llama")
        assert job is not None and owner["uid"] == job["metadata"]["uid"]

        pod = pytorchjob_pod("llama", NS, "worker", 1, workers=3)
        result = patched(pod, await hook.review(pod))
        env = {e["name"]: e for e in result["spec"]["containers"][0]["env"]}
        assert env["TRAINSENTRY_JOB"]["value"] == "llama"
        assert env["TRAINSENTRY_PROBE_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == (
            "llama-trainsentry-probe-token"
        )
        assert result["metadata"]["labels"]["trainsentry.io/trainingjob"] == "llama"

        def told() -> bool:
            return any(e.get("reason") == "PodsInstrumented" for e in cluster.live("v1/events"))

        await eventually(told)
    finally:
        await operator.stop()

    # A new operator process (a restart) finds the Secret there and rewrites it (409, then a
    # merge patch: the operator never reads Secrets); deleting the job takes it away.
    cluster.get_live(SECRETS, NS, "llama-trainsentry-probe-token")["data"]["token"] = "c3RhbGU="
    second, _ = start(cluster, sources, tmp_path / "second")
    await second.start(cluster)
    try:
        await eventually(lambda: secret_token(cluster, "llama") == job_token(MASTER, NS, "llama"))
        await delete(cluster, f"{TJ_PATH}/llama")
        await eventually(
            lambda: cluster.get_live(SECRETS, NS, "llama-trainsentry-probe-token") is None
        )
    finally:
        await second.stop()
    reads = {c for c in cluster.recorded_calls() if c.resource == "secrets"}
    assert {c.verb for c in reads} == {"create", "patch"}, reads


async def test_pods_it_cannot_instrument_are_admitted_unchanged_with_a_reason(
    cluster: KubeEmulator, sources: Sources, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trainsentry.operator.admission")
    operator, hook = start(cluster, sources, tmp_path)
    await operator.start(cluster)
    try:
        await until_served(hook)
        nothing = {"selector": {"matchLabels": {"app": "nothing-has-this"}}}
        await post(cluster, TJ_PATH, trainingjob("empty", nothing))
        off = {"workloadRef": {"kind": "PyTorchJob", "name": "off"}, "instrument": False}
        await post(cluster, TJ_PATH, trainingjob("off", off))
        asks = {"workloadRef": {"kind": "PyTorchJob", "name": "asks"}}
        await post(cluster, TJ_PATH, trainingjob("asks", asks))
        cases = [
            (pytorchjob_pod("llama", NS, "master", 0, workers=1), NS, "no TrainingJob selects"),
            (pytorchjob_pod("llama", "team-z", "master", 0, workers=1), "team-z",
             "no TrainingJob in namespace team-z"),
            (pytorchjob_pod("off", NS, "master", 0, workers=1), NS, "spec.instrument: false"),
        ]  # fmt: skip
        for pod, namespace, reason in cases:
            response = await hook.review(pod, namespace)
            assert response["allowed"] is True and "patch" not in response, response
            assert any(reason in r.getMessage() for r in caplog.records), reason
        # A pod that already sets the variables: instrumented around them, and the job says so.
        own = [{"name": "TRAINSENTRY_GATEWAY_URL", "value": "http://mine:9095"}]
        pod = pytorchjob_pod("asks", NS, "master", 0, workers=1, extra_env=own)
        result = patched(pod, await hook.review(pod))
        env = {e["name"]: e.get("value") for e in result["spec"]["containers"][0]["env"]}
        assert env["TRAINSENTRY_GATEWAY_URL"] == "http://mine:9095"

        def kept() -> bool:
            return any(
                e.get("reason") == "PodSettingsKept"
                and "env TRAINSENTRY_GATEWAY_URL" in e.get("message", "")
                for e in cluster.live("v1/events")
            )

        await eventually(kept)
        # The API failing: admitted unchanged within the budget, saying why.
        cluster.inject_fault("list", "trainingjobs", 503, times=50)
        response = await hook.review(pytorchjob_pod("asks", NS, "worker", 1, workers=1))
        assert response["allowed"] is True and "patch" not in response, response
        assert any(
            "cannot read the TrainingJobs of team-a" in r.getMessage() for r in caplog.records
        )
        cluster.faults.clear()
        # Not an AdmissionReview at all: a 4xx to the API server, which admits the pod
        # (failurePolicy: Ignore); never a crash of the operator.
        assert await hook.post_raw(b"not json") == 400
        assert await hook.post_raw(b'{"request": {"uid": "x"}}') == 400
        assert (await hook.review(pytorchjob_pod("asks", NS, "worker", 0, workers=1)))["allowed"]
    finally:
        await operator.stop()
