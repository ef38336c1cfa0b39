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
from operator_harness import NS, TJ, OperatorThread, delete, patch, post, trainingjob
from pod_templates import pytorchjob_pod

from tests.support.eventually import eventually
from tests.support.install import admission_review
from tests.support.kube_emulator import KubeEmulator
from tests.support.ports import free_port
from tests.support.tls import self_signed
from trainsentry.logs import quiet_url_loggers
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


async def test_events_never_echo_the_pods_own_text(
    cluster: KubeEmulator, sources: Sources, tmp_path: Path
) -> None:
    """Issue 43 finding 7: a pod's annotation (or label) text became a Warning Event on
    the job ("rotate your creds at http://evil.example/19"), read as the operator's words.
    The Events say fixed text and the job's name only; the log keeps the detail, quoted."""
    operator, hook = start(cluster, sources, tmp_path)
    await operator.start(cluster)
    try:
        await until_served(hook)
        spec = {"workloadRef": {"kind": "PyTorchJob", "name": "asks"}}
        await post(cluster, TJ_PATH, trainingjob("asks", spec))
        lure = "rotate your creds at http://evil.example/19"
        for index in range(3):
            pod = pytorchjob_pod("asks", NS, "worker", index, workers=3)
            pod["metadata"]["annotations"] = {"trainsentry.io/container": f"{lure} #{index}"}
            response = await hook.review(pod)
            assert response["allowed"] is True and "patch" not in response, response
        # A pod labelled for another job (the label value is the pod's text) is instrumented
        # around its label; the Event says which setting was kept, not its value.
        pod = pytorchjob_pod("asks", NS, "master", 0, workers=3)
        pod["metadata"]["labels"]["trainsentry.io/trainingjob"] = "evil.example"
        patched(pod, await hook.review(pod))

        def told() -> list[dict[str, Any]]:
            return [
                e
                for e in cluster.live("v1/events")
                if e.get("reason") in ("PodNotInstrumented", "PodSettingsKept")
            ]

        await eventually(lambda: len(told()) == 2)
        for event in told():
            assert "evil" not in event["message"], event["message"]
        warning = next(e for e in told() if e["reason"] == "PodNotInstrumented")
        assert "trainsentry.io/container annotation names a container" in warning["message"]
    finally:
        await operator.stop()


RELEASE_NS = "trainsentry"
CREDENTIALS = "ts-operator-webhook-credentials"
CONFIGURATION = "ts-instrument"
HOOK_NAME = "instrument-pods.trainsentry.io"
SERVICE_NAMES = ("ts-operator-webhook.trainsentry.svc", "ts-operator-webhook.trainsentry")
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def chart_configuration() -> dict[str, Any]:
    """The MutatingWebhookConfiguration as the chart renders it: no caBundle, no path."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION},
        "webhooks": [
            {
                "name": HOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "NoneOnDryRun",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 5,
                "clientConfig": {
                    "service": {"name": "ts-operator-webhook", "namespace": RELEASE_NS,
                                "port": 443},
                },
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}],
            }
        ],
    }  # fmt: skip


async def seed_chart_objects(cluster: KubeEmulator) -> None:
    empty = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": CREDENTIALS, "namespace": RELEASE_NS}}  # fmt: skip
    await post(cluster, f"/api/v1/namespaces/{RELEASE_NS}/secrets", empty)
    await post(cluster, MWC_PATH, chart_configuration())


def credentialed(cluster: KubeEmulator, sources: Sources, folder: Path) -> tuple[
    OperatorThread, int
]:  # fmt: skip
    from trainsentry.operator.webhook_credentials import WebhookCredentials

    credentials = WebhookCredentials(
        namespace=RELEASE_NS, secret=CREDENTIALS, configuration=CONFIGURATION,
        webhook=HOOK_NAME, webhook_id=WEBHOOK_ID, names=SERVICE_NAMES, folder=folder,
    )  # fmt: skip
    port = free_port()
    serving = WebhookServing(SETTINGS, port=port, credentials=credentials, check_s=0.5)
    operator = OperatorThread(
        str(cluster.url).rstrip("/"), sources, probe_token=MASTER, webhook=serving
    )
    return operator, port


def as_configured(cluster: KubeEmulator) -> tuple[str, str] | None:
    """(caBundle PEM, path) the operator put into the configuration, or None yet."""
    config = cluster.get_live("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                              None, CONFIGURATION)  # fmt: skip
    client = (config or {}).get("webhooks", [{}])[0].get("clientConfig", {})
    if "caBundle" not in client or "path" not in client.get("service", {}):
        return None
    return base64.b64decode(client["caBundle"]).decode(), client["service"]["path"]


async def post_review(port: int, path: str, bundle: str, review: dict[str, Any]) -> httpx.Response:
    """POSTs as the API server does: to the Service's path, trusting only the caBundle (the
    certificate names the Service; the loopback address is not checked)."""
    context = ssl.create_default_context(cadata=bundle)
    context.check_hostname = False
    async with httpx.AsyncClient(verify=context, timeout=10) as http:
        return await http.post(f"https://127.0.0.1:{port}{path}", json=review)


async def test_only_the_api_server_is_answered_and_the_certificate_is_kept(
    cluster: KubeEmulator, sources: Sources, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 43 findings 7 and 10: a forged AdmissionReview from any pod got the patch back
    and wrote Events and the job's Secret; the certificate was the chart's, new at every
    `helm template`. Now the operator keeps the certificate and a path token in the Secret
    the chart creates empty and puts caBundle and path into the configuration; a call to
    any other path is refused (403) before anything is read or written."""
    caplog.set_level(logging.DEBUG)
    quiet_url_loggers()  # as `trainsentry operator` does
    await seed_chart_objects(cluster)
    operator, port = credentialed(cluster, sources, tmp_path / "one")
    await operator.start(cluster)
    try:
        await eventually(lambda: as_configured(cluster) is not None)
        configured = as_configured(cluster)
        assert configured is not None
        bundle, path = configured
        token = path.removeprefix(f"/{WEBHOOK_ID}/")
        assert path.startswith(f"/{WEBHOOK_ID}/") and len(token) >= 40

        async def served() -> bool:
            try:
                await post_review(port, path, bundle, {})
                return True
            except httpx.HTTPError:
                return False

        await eventually(served)
        spec = {"workloadRef": {"kind": "PyTorchJob", "name": "llama"}}
        await post(cluster, TJ_PATH, trainingjob("llama", spec))
        await eventually(lambda: secret_token(cluster, "llama") is not None)

        def writes() -> int:  # Secret writes, and the webhook's Events (not kopf's own)
            secrets = sum(c.verb in ("create", "patch") and c.resource == "secrets"
                          for c in cluster.calls)  # fmt: skip
            events = cluster.live("v1/events", NS)
            return secrets + sum(str(e.get("reason")).startswith("Pod") for e in events)

        before = writes()
        for index in range(20):
            pod = pytorchjob_pod("llama", NS, "worker", index, workers=20)
            pod["metadata"]["annotations"] = {"trainsentry.io/container": f"evil {index}"}
            for forged in (f"/{WEBHOOK_ID}", f"/{WEBHOOK_ID}/{'x' * len(token)}", "/"):
                answer = await post_review(port, forged, bundle, admission_review(pod, NS))
                assert answer.status_code == 403, (forged, answer.text)
                assert "patch" not in answer.text
        assert writes() == before
        # A `helm upgrade` from a chart that rendered caBundle and path removes them: the
        # operator's next check puts the same ones back.
        await patch(cluster, f"{MWC_PATH}/{CONFIGURATION}", {"webhooks": chart_configuration()[
            "webhooks"]})  # fmt: skip
        assert as_configured(cluster) is None
        await eventually(lambda: as_configured(cluster) == (bundle, path))
        # The API server's call (the configured path) is answered as before.
        pod = pytorchjob_pod("llama", NS, "worker", 0, workers=1)
        answer = await post_review(port, path, bundle, admission_review(pod, NS))
        assert answer.status_code == 200 and answer.json()["response"]["patchType"] == "JSONPatch"
    finally:
        await operator.stop()

    # A restart (or a second replica) serves the same certificate and path: both come from
    # the Secret, and the configuration is not rewritten.
    second, port = credentialed(cluster, sources, tmp_path / "two")
    await second.start(cluster)
    try:
        assert as_configured(cluster) == (bundle, path)

        async def same() -> bool:
            try:
                return (await post_review(port, path, bundle, {})).status_code == 400
            except httpx.HTTPError:
                return False

        await eventually(same)
    finally:
        await second.stop()
    secret_verbs = {c.verb for c in cluster.recorded_calls("kmock/") if c.resource == "secrets"}
    assert secret_verbs == {"get", "create", "patch"}  # get: the credentials Secret only
    assert f"/api/v1/namespaces/{RELEASE_NS}/secrets/{CREDENTIALS}" in [
        p for p in cluster.sent_paths("kmock/") if "/secrets/" in p
    ]
    assert not [
        p
        for p in cluster.sent_paths("kmock/")
        if f"/namespaces/{NS}/secrets/" in p and p.endswith("-token") is False
    ]
    assert not [r for r in caplog.records if token in r.getMessage()], "the token was logged"


async def test_namespaces_holding_trainingjobs_are_labelled_for_the_selectors(
    cluster: KubeEmulator, sources: Sources
) -> None:
    """Issue 43 findings 8 and 10: the webhook was called for every pod creation in the
    cluster and the gateway's NetworkPolicy took any pod labelling itself, from any
    namespace. The chart's selectors now read `trainsentry.io/trainingjobs: "true"`, which
    the operator keeps on exactly the namespaces holding a TrainingJob."""
    from trainsentry.operator.namespace_label import NAMESPACE_LABEL

    for name in (NS, "team-b"):
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await post(cluster, "/api/v1/namespaces", body)

    def labelled() -> set[str]:
        return {
            n["metadata"]["name"]
            for n in cluster.live("v1/namespaces")
            if (n["metadata"].get("labels") or {}).get(NAMESPACE_LABEL) == "true"
        }

    operator = OperatorThread(str(cluster.url).rstrip("/"), sources, label_namespaces=True)
    await operator.start(cluster)
    try:
        assert labelled() == set()
        spec = {"workloadRef": {"kind": "PyTorchJob", "name": "llama"}}
        await post(cluster, TJ_PATH, trainingjob("llama", spec))
        await post(cluster, TJ_PATH, trainingjob("gpt", spec | {"workloadRef": {
            "kind": "PyTorchJob", "name": "gpt"}}))  # fmt: skip
        await eventually(lambda: labelled() == {NS})
        await delete(cluster, f"{TJ_PATH}/llama")
        await eventually(lambda: cluster.get_live(TJ, NS, "llama") is None)
        assert labelled() == {NS}  # gpt is still there
        await delete(cluster, f"{TJ_PATH}/gpt")
        await eventually(lambda: labelled() == set())
    finally:
        await operator.stop()


async def test_with_a_client_ca_a_caller_without_its_certificate_fails_tls(
    cluster: KubeEmulator, sources: Sources, tmp_path: Path
) -> None:
    """operator.webhook.clientCA (where the admin gives the API server a client certificate
    for this webhook in its AdmissionConfiguration): a caller without a certificate that CA
    signed does not get past TLS; the API server's, with one, is answered."""
    cert, key = self_signed(tmp_path / "tls")
    api_cert, api_key = self_signed(tmp_path / "apiserver", ("kube-apiserver",))
    port = free_port()
    serving = WebhookServing(SETTINGS, port=port, certfile=str(cert), keyfile=str(key),
                             client_ca=str(api_cert))  # fmt: skip
    operator = OperatorThread(
        str(cluster.url).rstrip("/"), sources, probe_token=MASTER, webhook=serving
    )
    await operator.start(cluster)
    try:
        spec = {"workloadRef": {"kind": "PyTorchJob", "name": "llama"}}
        await post(cluster, TJ_PATH, trainingjob("llama", spec))
        pod = pytorchjob_pod("llama", NS, "worker", 0, workers=1)
        apiserver = ssl.create_default_context(cafile=str(cert))
        apiserver.load_cert_chain(str(api_cert), str(api_key))

        async def answered() -> bool:
            try:
                async with httpx.AsyncClient(verify=apiserver, timeout=10) as http:
                    answer = await http.post(
                        f"https://127.0.0.1:{port}/{WEBHOOK_ID}", json=admission_review(pod, NS)
                    )
                return "patch" in answer.json()["response"]
            except httpx.HTTPError:
                return False

        await eventually(answered)
        stranger = ssl.create_default_context(cafile=str(cert))
        other_cert, other_key = self_signed(tmp_path / "stranger", ("pod",))
        signed_elsewhere = ssl.create_default_context(cafile=str(cert))
        signed_elsewhere.load_cert_chain(str(other_cert), str(other_key))
        for context in (stranger, signed_elsewhere):
            with pytest.raises(httpx.HTTPError):
                async with httpx.AsyncClient(verify=context, timeout=10) as http:
                    await http.post(f"https://127.0.0.1:{port}/{WEBHOOK_ID}",
                                    json=admission_review(pod, NS))  # fmt: skip
    finally:
        await operator.stop()
