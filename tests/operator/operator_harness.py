"""Test scaffolding for the operator: a KubeEmulator with our resources declared, strict schema
validation of everything written, and the real operator (kopf) in its own thread and loop.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kopf
import kubernetes_validate
import yaml
from kubernetes_asyncio.client import Configuration
from referencing import Registry, Resource

from tests.support.eventually import eventually
from tests.support.kube_emulator import ApiCall, KubeEmulator
from trainsentry.kube.client import RetryPolicy
from trainsentry.operator.handlers import OperatorOptions, WebhookServing, build_registry
from trainsentry.operator.reconcile import Sources

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "charts/trainsentry/crds/trainingjobs.yaml"
SCHEMAS = ROOT / "tests/data/crds"
NS = "team-a"
TJ = "trainsentry.io/v1alpha1/trainingjobs"
RULES = "monitoring.coreos.com/v1/prometheusrules"
MONITORS = "monitoring.coreos.com/v1/podmonitors"
MWC = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
KUBE_VERSIONS = ("1.30.0", "1.37.0")
# Calls the operator made, across every test that used the `cluster` fixture (filled by
# conftest.py, checked by test_zz_api_calls.py).
OPERATOR_CALLS: set[ApiCall] = set()
TESTS_RECORDED: set[str] = set()


def declare_cluster(emu: KubeEmulator, workloads: bool = True) -> None:
    emu.declare(
        "v1/namespaces", "Namespace", namespaced=False, verbs=["create", "list", "watch", "patch"]
    )
    emu.declare(MWC, "MutatingWebhookConfiguration", namespaced=False)
    emu.declare("v1/pods", "Pod")
    emu.declare("v1/nodes", "Node", namespaced=False)
    emu.declare("v1/configmaps", "ConfigMap")
    emu.declare("v1/secrets", "Secret")
    emu.declare("v1/events", "Event")
    emu.declare(RULES, "PrometheusRule")
    emu.declare(MONITORS, "PodMonitor")
    emu.declare(TJ, "TrainingJob", status=True)
    if workloads:
        emu.declare("kubeflow.org/v1/pytorchjobs", "PyTorchJob")
        emu.declare("batch.volcano.sh/v1alpha1/jobs", "Job")


# --- validation -----------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """OpenAPI structural schemas prune unknown fields; we reject them (catches typos)."""
    if isinstance(schema, dict):
        result = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in result
            and "additionalProperties" not in result
            and not result.get("x-kubernetes-preserve-unknown-fields")
        ):
            result["additionalProperties"] = False
        pattern = result.get("pattern")
        if isinstance(pattern, str) and "(?i)" in pattern:  # Go allows inline flags mid-regex
            result["pattern"] = "(?i)" + pattern.replace("(?i)", "")
        return result
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def trainingjob_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@functools.cache
def _custom_schemas() -> dict[str, jsonschema.Draft202012Validator]:
    schemas = {}
    for path in SCHEMAS.glob("*.schema.json"):
        data = json.loads(path.read_text())
        schemas[data["kind"]] = _strict(data["openAPIV3Schema"])
    schemas["TrainingJob"] = _strict(trainingjob_schema())
    # The CRD may bound metadata.name; the rest of ObjectMeta is the API server's, not closed.
    schemas["TrainingJob"]["properties"]["metadata"].pop("additionalProperties", None)
    validators = {}
    for kind, schema in schemas.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        validators[kind] = jsonschema.Draft202012Validator(schema)
    return validators


@functools.cache
def _status_schemas() -> dict[str, jsonschema.Draft202012Validator]:
    """kind -> the validator of its `status` alone: for the status subresource the API
    server checks only the status schema (apiextensions-apiserver's status strategy)."""
    found = {}
    for kind, validator in _custom_schemas().items():
        status = validator.schema.get("properties", {}).get("status")
        if status is not None:
            found[kind] = jsonschema.Draft202012Validator(status)
    return found


@functools.cache
def _builtin_validator(kind: str, api_version: str, version: str) -> Any:
    """kubernetes_validate's strict schema for a built-in kind, built once (its `validate()`
    re-reads the multi-megabyte definitions on every call, too slow for every write)."""
    utils = kubernetes_validate.utils
    wanted = utils.major_minor(version)
    schema_version = [v for v in utils.all_versions() if utils.major_minor(v) <= wanted][-1]
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_dir = f"kubernetes-json-schema/v{schema_version}-local-strict"
    schema = utils.schema_contents(f"{schema_dir}/{kind.lower()}-{group_version}.json", version)
    definitions = utils.schema_contents(f"{schema_dir}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ Registry()
    registry = Resource.from_contents(schema) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def check_labels(obj: dict[str, Any]) -> None:
    """The API server's label rules, which no OpenAPI schema carries: a value of at most 63
    characters, a key `[prefix/]name` with a name of at most 63 and a prefix of at most 253."""
    for key, value in ((obj.get("metadata") or {}).get("labels") or {}).items():
        prefix, _, name = str(key).rpartition("/")
        if len(name) > 63 or not LABEL_NAME.fullmatch(name) or len(prefix) > 253:
            raise ValueError(f"metadata.labels: invalid key {key!r}")
        if len(value) > 63 or (value and not LABEL_NAME.fullmatch(value)):
            raise ValueError(f"metadata.labels[{key}]: invalid value {value!r}: at most 63")


def _is_third_party(obj: dict[str, Any]) -> bool:
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


class Validator:
    """Strict validation of every object written; also collects rule groups for promtool."""

    def __init__(self) -> None:
        self.schemas = _custom_schemas()
        self.status_schemas = _status_schemas()
        self.checked: dict[str, int] = {}
        self.rule_groups: list[dict[str, Any]] = []

    def __call__(self, raw: dict[str, Any]) -> None:
        obj = copy.deepcopy(raw)
        kind = str(obj.get("kind", ""))
        schema = self.schemas.get(kind)
        try:
            check_labels(obj)
            if schema is not None:
                schema.validate(obj)
            elif _is_third_party(obj):
                return  # workloads the tests create (PyTorchJob, Volcano Job): no schema here
            else:
                for version in KUBE_VERSIONS:
                    _builtin_validator(kind, str(obj["apiVersion"]), version).validate(obj)
        except jsonschema.ValidationError as exc:
            raise ValueError(
                f"{kind} {obj.get('metadata', {}).get('name')}: {str(exc).splitlines()[0]}"
            ) from exc
        self.checked[kind] = self.checked.get(kind, 0) + 1
        if kind == "PrometheusRule":
            self.rule_groups.append(obj["spec"])

    def validate_status(self, raw: dict[str, Any]) -> None:
        """A write through the status subresource: the status alone is checked, as the API
        server does (an object stored before a stricter schema keeps taking status writes)."""
        kind = str(raw.get("kind", ""))
        schema = self.status_schemas.get(kind)
        if schema is None:
            self(raw)
            return
        try:
            schema.validate(copy.deepcopy(raw.get("status") or {}))
        except jsonschema.ValidationError as exc:
            raise ValueError(
                f"{kind} {raw.get('metadata', {}).get('name')} status: {str(exc).splitlines()[0]}"
            ) from exc
        self.checked[kind] = self.checked.get(kind, 0) + 1

    def promtool_check(self, tmp: Path) -> None:
        """Runs `promtool check rules` on every PrometheusRule spec written."""
        if not self.rule_groups:
            return
        paths = []
        for index, spec in enumerate(self.rule_groups):
            path = tmp / f"rules-{index}.yaml"
            path.write_text(yaml.safe_dump(spec))
            paths.append(str(path))
        result = subprocess.run(
            ["promtool", "check", "rules", *paths],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


# --- running the operator -------------------------------------------------------------------


class OperatorThread:
    """The real operator (kopf + our handlers) in its own thread and event loop."""

    def __init__(
        self,
        url: str,
        sources: Sources,
        resync: float = 0.5,
        discovery: bool = True,
        peering: str | None = None,
        namespaces: list[str] | None = None,
        probe_token: str | None = None,
        webhook: WebhookServing | None = None,
        label_namespaces: bool = False,
    ) -> None:
        self.url = url
        self.peering = peering
        self.namespaces = namespaces or []
        self.stop_flag = threading.Event()
        options = OperatorOptions(
            resync_seconds=resync,
            retry_delay=0.2,
            discovery=discovery,
            api_config=Configuration(host=url),
            login=self._login,
            retry=RetryPolicy(attempts=6, base_delay=0.02, max_delay=0.2),
            scan_cluster=not namespaces,
            probe_token=probe_token,
            webhook=webhook,
            label_namespaces=label_namespaces,
        )
        self.registry = build_registry(sources, options)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _login(self, **_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=self.url)

    def _run(self) -> None:
        coro = kopf.operator(
            registry=self.registry,
            clusterwide=not self.namespaces,
            namespaces=self.namespaces,
            standalone=self.peering is None,
            peering_name=self.peering,
            stop_flag=self.stop_flag,
            memo=kopf.Memo(),
        )
        asyncio.run(coro)

    async def start(self, emu: KubeEmulator) -> None:
        before = sum(1 for call in emu.calls if call.verb == "watch")
        self.thread.start()
        await eventually(lambda: sum(1 for c in emu.calls if c.verb == "watch") > before)

    async def stop(self) -> None:
        self.stop_flag.set()
        await asyncio.to_thread(self.thread.join, 15)
        assert not self.thread.is_alive(), "operator did not stop"


def trainingjob(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "trainsentry.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec
        if spec is not None
        else {"selector": {"matchLabels": {"job": name}}, "worldSize": 2},
    }


def pod(
    name: str, job: str, node: str, phase: str = "Running", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {"job": job}},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "trainer", "image": "trainer:1", "ports": [{"containerPort": 9401}]}
            ],
        },
        "status": {"phase": phase},
    }


def probe_ports(monitor: dict[str, Any]) -> list[int]:
    """The port each endpoint of a rendered PodMonitor scrapes (its `__address__` rewrite)."""
    ports = []
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        rewrites = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "__address__"]
        ports.append(int(rewrites[0]["replacement"].rpartition(":")[2]))
    return ports


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "a"}}}


async def post(emu: KubeEmulator, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with emu.post(path, json=body) as resp:
        data: dict[str, Any] = await resp.json()
        assert resp.status == 201, data
        return data


async def patch(emu: KubeEmulator, path: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with emu.patch(path, json=body, headers=headers) as resp:
        data: dict[str, Any] = await resp.json()
        assert resp.status == 200, data
        return data


async def delete(emu: KubeEmulator, path: str) -> None:
    async with emu.delete(path) as resp:
        assert resp.status == 200, await resp.text()


Check = Callable[[], Any]
