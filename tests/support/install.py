"""A cluster as `helm install` leaves it, for install-level tests and the injected-path
benchmark: the chart's rendered objects, run as real processes on loopback.

- The Kubernetes API: the kmock emulator (`kube_emulator.py`) over real HTTP; the gateway and
  the operator reach it through a kubeconfig, as they would from outside a cluster.
- `start_gateway` / `start_operator`: `python -m trainsentry` with the rendered Deployment's
  args and env (Secrets from the rendered Secrets); the listen address and the mounted files
  moved to loopback and temporary folders.
- The API server's admission (`admit`): the MutatingWebhookConfiguration as the cluster holds
  it (the rendered one, `apply`'d, with the caBundle and path the operator keeps) applied as
  kubernetes.io ("Dynamic Admission Control") describes it: rules, namespaceSelector (the
  namespace's labels as the cluster holds them), timeoutSeconds, failurePolicy, the
  JSONPatch of the answer. The webhook is called over HTTPS at the configured path, checked
  against the configuration's caBundle for `<service>.<namespace>.svc`.
- The cluster network (`resolve`): `<service>.<namespace>.svc:<port>` goes to the Service's
  targetPort on the one local process serving it; a pod's name (the training operator's
  headless Services) to the pod's IP. Each pod gets its own loopback address as its IP.
- The kubelet (`run_pod`): emptyDirs are folders, init containers of the trainsentry image
  run as this checkout's `trainsentry` command, the container's env is resolved (values, the
  downward API, Secrets from the emulator) and its command run in a training image stand-in.
  What a process cannot do as a container does is done openly: paths under a mount point
  are rewritten to the mount's folder, and the caller adds the env a real pod would not need
  (the probe binding its pod's address: pods here share one network namespace).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonpatch

from tests.support.kube_emulator import KubeEmulator
from tests.support.ports import free_port
from trainsentry.operator.spec import LabelSelector

REPO = Path(__file__).resolve().parents[2]
Manifest = dict[str, Any]


def one(objs: Sequence[Manifest], kind: str, suffix: str = "") -> Manifest:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[o['metadata']['name'] for o in found]}"
    return found[0]


async def _created(emu: KubeEmulator, path: str, body: Manifest) -> None:
    async with emu.post(path, json=body) as answer:
        assert answer.status == 201, await answer.text()


def container_of(deployment: Manifest) -> Manifest:
    containers: list[Manifest] = deployment["spec"]["template"]["spec"]["containers"]
    return containers[0]


def kubeconfig(folder: Path, server: str) -> Path:
    path = folder / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": server}}],
                "users": [{"name": "sa", "user": {"token": "emulator"}}],
                "contexts": [
                    {"name": "emulator", "context": {"cluster": "emulator", "user": "sa"}}
                ],
                "current-context": "emulator",
            }
        )
    )
    return path


@dataclass
class Process:
    """A subprocess with its log; `stop()` ends it."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:] if self.log.exists() else ""

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def spawn(name: str, argv: Sequence[str], env: Mapping[str, str], folder: Path) -> Process:
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(argv), env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=folder
        )
    return Process(name, popen, log)


async def until(check: Callable[[], Awaitable[bool] | bool], within: float, what: str,
                *logs: Process) -> None:  # fmt: skip
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        result = check()
        if await result if asyncio.iscoroutine(result) else result:
            return
        await asyncio.sleep(0.1)
    detail = "\n".join(f"--- {p.name}\n{p.output()}" for p in logs)
    raise AssertionError(f"timed out waiting for {what}\n{detail}")


async def http_up(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=1, verify=False) as http:  # an up-check only
            await http.get(url)
        return True
    except httpx.HTTPError:
        return False


@dataclass
class Cluster:
    """The rendered install around one emulator; see the module docstring."""

    objs: list[Manifest]
    emu: KubeEmulator
    folder: Path
    namespace: str  # the release namespace
    image: str  # the chart's image: its init containers run as this checkout's CLI
    # (service name, namespace, container port) -> the local port of the process serving it
    served: dict[tuple[str, str, int], int] = field(default_factory=dict)
    pod_ips: dict[str, str] = field(default_factory=dict)  # pod name -> IP
    processes: list[Process] = field(default_factory=list)
    _next_ip: int = 10

    @property
    def api(self) -> str:
        return str(self.emu.url).rstrip("/")

    async def apply(self, namespaces: Sequence[str]) -> None:
        """What `helm install` writes that the operator reads (the webhook's credentials
        Secret and configuration), and the namespaces `namespaces` (the release's first)."""
        for name in namespaces:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            await _created(self.emu, "/api/v1/namespaces", body)
        for obj in self.objs:
            if obj["kind"] == "MutatingWebhookConfiguration":
                path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
                await _created(self.emu, path, obj)
            elif obj["kind"] == "Secret" and obj["metadata"]["name"].endswith("-credentials"):
                await _created(self.emu, f"/api/v1/namespaces/{self.namespace}/secrets", obj)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    # ------------------------------------------------------------------ network

    def _service(self, name: str, namespace: str) -> Manifest | None:
        for obj in self.objs:
            meta = obj["metadata"]
            if obj["kind"] == "Service" and meta["name"] == name and meta["namespace"] == namespace:
                return obj
        return None

    def _target_port(self, service: Manifest, port: int) -> int:
        """The container port behind `service:port` (a named targetPort looked up in the
        Deployment the Service selects)."""
        entry = next(p for p in service["spec"]["ports"] if p["port"] == port)
        target = entry.get("targetPort", port)
        if isinstance(target, int):
            return target
        selector = LabelSelector(matchLabels=service["spec"]["selector"])
        for obj in self.objs:
            if obj["kind"] != "Deployment":
                continue
            template = obj["spec"]["template"]
            if selector.matches(template["metadata"]["labels"]):
                for c in template["spec"]["containers"]:
                    for p in c.get("ports", []):
                        if p.get("name") == target:
                            return int(p["containerPort"])
        raise AssertionError(f"no container port {target} behind {service['metadata']['name']}")

    def serve(self, service_suffix: str, container_port: int, local_port: int) -> None:
        service = one(self.objs, "Service", service_suffix)
        key = (service["metadata"]["name"], service["metadata"]["namespace"], container_port)
        self.served[key] = local_port

    def resolve(self, host: str, port: int, from_namespace: str) -> tuple[str, int]:
        """Where a connection to host:port from a pod of `from_namespace` lands."""
        if host in self.pod_ips:
            return self.pod_ips[host], port
        parts = host.removesuffix(".cluster.local").removesuffix(".svc").split(".")
        name, namespace = parts[0], parts[1] if len(parts) > 1 else from_namespace
        service = self._service(name, namespace)
        if service is None:
            raise AssertionError(f"no Service {name} in {namespace} (from {host})")
        target = self._target_port(service, port)
        if (name, namespace, target) not in self.served:
            raise LookupError(f"nothing serves {host}:{port} (no endpoints)")
        return "127.0.0.1", self.served[(name, namespace, target)]

    def resolve_url(self, url: str, from_namespace: str) -> str:
        found = re.fullmatch(r"(https?)://([^:/]+):(\d+)(.*)", url)
        assert found, url
        scheme, host, port, rest = found.groups()
        ip, local = self.resolve(host, int(port), from_namespace)
        return f"{scheme}://{ip}:{local}{rest}"

    def pod_ip(self, pod_name: str) -> str:
        if pod_name not in self.pod_ips:
            self.pod_ips[pod_name] = f"127.0.0.{self._next_ip}"
            self._next_ip += 1
        return self.pod_ips[pod_name]

    # ------------------------------------------------------------------ our components

    def _secret(self, name: str, key: str) -> str | None:
        for obj in self.objs:
            if obj["kind"] == "Secret" and obj["metadata"]["name"] == name:
                value = (obj.get("data") or {}).get(key)
                return None if value is None else base64.b64decode(value).decode()
        return None

    def component_env(self, deployment: Manifest) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
        container = container_of(deployment)
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif "secretKeyRef" in item["valueFrom"]:
                ref = item["valueFrom"]["secretKeyRef"]
                value = self._secret(ref["name"], ref["key"])
                assert value is not None, f"the chart renders no Secret {ref}"
                env[item["name"]] = value
            elif "fieldRef" in item["valueFrom"]:
                env[item["name"]] = f"{deployment['metadata']['name']}-0"
        for source in container.get("envFrom", []):
            secret = next(o for o in self.objs if o["kind"] == "Secret"
                          and o["metadata"]["name"] == source["secretRef"]["name"])  # fmt: skip
            for key, value in secret["data"].items():
                env[key] = base64.b64decode(value).decode()
        env["KUBECONFIG"] = str(kubeconfig(self.folder, self.api))
        env["HOME"] = str(self.folder)
        return env

    def start_gateway(self, env_extra: Mapping[str, str] | None = None) -> Process:
        deployment = one(self.objs, "Deployment", "-gateway")
        container = container_of(deployment)
        folder = self.folder / "gateway"
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "config.yaml"
        config.write_text(one(self.objs, "ConfigMap", "-config")["data"]["config.yaml"])
        env = self.component_env(deployment)
        port = free_port()
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        # the chart's trigger port (gateway.triggerPort) on a free local port too, as the
        # Service's `triggers` port leads there (the probes post their triggers to it)
        trigger_port = free_port() if "triggers" in ports else None
        env.update(
            TRAINSENTRY_CONFIG=str(config),
            TRAINSENTRY_DB=f"sqlite:///{folder / 'gateway.db'}",
            TRAINSENTRY_LISTEN=f"127.0.0.1:{port}",
            **({"TRAINSENTRY_TRIGGER_LISTEN": f"127.0.0.1:{trigger_port}"} if trigger_port else {}),
            **(env_extra or {}),
        )
        process = spawn("gateway", [sys.executable, "-m", "trainsentry", *container["args"]],
                        env, folder)  # fmt: skip
        self.processes.append(process)
        self.serve("-gateway", ports["http"], port)
        if trigger_port is not None:
            self.serve("-gateway", ports["triggers"], trigger_port)
        return process

    def start_operator(self) -> Process:
        deployment = one(self.objs, "Deployment", "-operator")
        container = container_of(deployment)
        folder = self.folder / "operator"
        mounts = self._mount_secrets(deployment, folder)
        args = [_remap(a, mounts) for a in container["args"]]
        env = self.component_env(deployment)
        process = spawn("operator", [sys.executable, "-m", "trainsentry", *args], env, folder)
        self.processes.append(process)
        webhook = next(p for p in container["ports"] if p["name"] == "webhook")["containerPort"]
        self.serve("-operator-webhook", webhook, webhook)  # the operator listens on it here
        return process

    def _mount_secrets(self, deployment: Manifest, folder: Path) -> dict[str, str]:
        """Writes the rendered Secrets a pod mounts into folders; mountPath -> folder."""
        spec = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = {}
        for mount in container_of(deployment).get("volumeMounts", []):
            volume = volumes[mount["name"]]
            target = folder / "mounts" / mount["name"]
            target.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                secret = one(self.objs, "Secret", volume["secret"]["secretName"])
                for key, value in secret["data"].items():
                    (target / key).write_bytes(base64.b64decode(value))
            mounts[mount["mountPath"]] = str(target)
        return mounts

    # ------------------------------------------------------------------ admission

    async def admit(
        self, pod: Manifest, namespace: str, *, namespace_labels: Mapping[str, str] | None = None
    ) -> tuple[Manifest, list[str]]:
        """The pod as the API server would store it after the mutating webhooks, and what
        happened at each webhook (`patched`, `no change`, `skipped: ...`, `ignored: ...`)."""
        rendered = one(self.objs, "MutatingWebhookConfiguration")
        resource = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
        config = self.emu.get_live(resource, None, rendered["metadata"]["name"]) or rendered
        live = self.emu.get_live("v1/namespaces", None, namespace) or {"metadata": {}}
        labels = {
            "kubernetes.io/metadata.name": namespace,
            **(live["metadata"].get("labels") or {}),
            **(namespace_labels or {}),
        }
        outcomes = []
        for hook in config["webhooks"]:
            applies = any(
                "CREATE" in r["operations"] and "" in r["apiGroups"] and "pods" in r["resources"]
                for r in hook["rules"]
            )
            if not applies:
                outcomes.append("skipped: rules")
                continue
            if not LabelSelector.model_validate(hook.get("namespaceSelector") or {}).matches(
                labels
            ):
                outcomes.append("skipped: namespaceSelector")
                continue
            review = admission_review(pod, namespace)
            try:
                answer = await asyncio.wait_for(
                    self._call_webhook(hook, review, namespace), hook.get("timeoutSeconds", 10)
                )
            except (httpx.HTTPError, TimeoutError, OSError, ValueError, LookupError) as exc:
                if hook.get("failurePolicy", "Fail") != "Ignore":
                    raise
                outcomes.append(f"ignored: {type(exc).__name__}")
                continue
            response = answer["response"]
            assert response["uid"] == review["request"]["uid"]
            if not response["allowed"]:
                raise PermissionError(response.get("status"))
            if response.get("patchType") == "JSONPatch":
                ops = json.loads(base64.b64decode(response["patch"]))
                pod = jsonpatch.apply_patch(pod, ops)
                outcomes.append("patched")
            else:
                outcomes.append("no change")
        return pod, outcomes

    async def _call_webhook(self, hook: Manifest, review: Manifest, namespace: str) -> Any:
        ref = hook["clientConfig"]["service"]
        dns = f"{ref['name']}.{ref['namespace']}.svc"
        ip, port = self.resolve(dns, ref.get("port", 443), namespace)
        if "caBundle" not in hook["clientConfig"]:
            raise ValueError("no caBundle yet: the API server cannot call the webhook")
        context = ssl.create_default_context(
            cadata=base64.b64decode(hook["clientConfig"]["caBundle"]).decode()
        )
        async with httpx.AsyncClient(verify=context, timeout=30) as http:
            answer = await http.post(
                f"https://{ip}:{port}{ref.get('path', '/')}",
                json=review,
                extensions={"sni_hostname": dns},  # the name the certificate must carry
            )
        if answer.status_code != 200:
            raise ValueError(f"webhook answered {answer.status_code}")
        return answer.json()

    # ------------------------------------------------------------------ kubelet

    async def create_pod(self, pod: Manifest, node: str) -> Manifest:
        """Stores the admitted pod in the emulator as scheduled and running (its IP, node)."""
        body = copy.deepcopy(pod)
        body["spec"]["nodeName"] = node
        body["status"] = {"phase": "Running", "podIP": self.pod_ip(body["metadata"]["name"])}
        namespace = body["metadata"]["namespace"]
        async with self.emu.post(f"/api/v1/namespaces/{namespace}/pods", json=body) as answer:
            stored: Manifest = await answer.json()
            assert answer.status == 201, stored
        return stored

    def _secret_in_cluster(self, namespace: str, name: str, key: str) -> str | None:
        secret = self.emu.get_live("v1/secrets", namespace, name)
        value = ((secret or {}).get("data") or {}).get(key)
        return None if value is None else base64.b64decode(value).decode()

    def pod_env(self, pod: Manifest, container: Manifest, mounts: Mapping[str, str]) -> dict[str, str]:  # fmt: skip  # noqa: E501
        """The container's environment as the kubelet builds it."""
        meta, namespace = pod["metadata"], pod["metadata"]["namespace"]
        fields = {
            "metadata.name": meta["name"],
            "metadata.namespace": namespace,
            "status.podIP": pod["status"]["podIP"],
            "spec.nodeName": pod["spec"]["nodeName"],
        }
        env: dict[str, str] = {}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = _remap(str(item["value"]), mounts)
                continue
            source = item["valueFrom"]
            if "fieldRef" in source:
                env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = self._secret_in_cluster(namespace, ref["name"], ref["key"])
                if value is None:
                    assert ref.get("optional"), f"pod {meta['name']} waits for {ref}"
                    continue
                env[item["name"]] = value
        return env

    def run_pod(
        self,
        pod: Manifest,
        argv: Sequence[str],
        *,
        extra_env: Mapping[str, str] | None = None,
        container_name: str | None = None,
    ) -> Process:
        """Runs the pod: its emptyDirs, its init containers, then `argv` as its container
        (the image's command mapped to the training image stand-in by the caller)."""
        name = pod["metadata"]["name"]
        folder = self.folder / "pods" / name
        spec = pod["spec"]
        volumes = {}
        for volume in spec.get("volumes", []):
            assert "emptyDir" in volume, f"only emptyDirs here: {volume}"
            volumes[volume["name"]] = folder / "volumes" / volume["name"]
            volumes[volume["name"]].mkdir(parents=True, exist_ok=True)
        for init in spec.get("initContainers", []):
            assert init["image"] == self.image, f"only the trainsentry image runs here: {init}"
            mounts = {m["mountPath"]: str(volumes[m["name"]]) for m in init["volumeMounts"]}
            argv_init = [sys.executable, "-m", "trainsentry", *[_remap(a, mounts) for a in
                         init.get("args", [])]]  # fmt: skip
            done = subprocess.run(
                argv_init,
                env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)},
                capture_output=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr
        containers = spec["containers"]
        container = next(
            c for c in containers if c["name"] == (container_name or containers[0]["name"])
        )
        mounts = {
            m["mountPath"]: str(volumes[m["name"]]) for m in container.get("volumeMounts", [])
        }
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(folder),
            **self.pod_env(pod, container, mounts),
            **(extra_env or {}),
        }
        for key in ("MASTER_ADDR",):
            if key in env:
                env[key] = self.resolve(env[key], 0, pod["metadata"]["namespace"])[0]
        # no gateway running: the name leads nowhere, as in a cluster
        with contextlib.suppress(LookupError):
            if "TRAINSENTRY_GATEWAY_URL" in env:
                env["TRAINSENTRY_GATEWAY_URL"] = self.resolve_url(
                    env["TRAINSENTRY_GATEWAY_URL"], pod["metadata"]["namespace"]
                )
        process = spawn(name, argv, env, folder)
        self.processes.append(process)
        return process


def _remap(value: str, mounts: Mapping[str, str]) -> str:
    """`value` (a path, a `:` list of paths, or `--flag=path`) with paths under a mount point
    moved to the mount's folder."""

    def one_path(path: str) -> str:
        for mount, folder in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return folder + path[len(mount) :]
        return path

    flag, eq, rest = value.partition("=")
    if eq and flag.startswith("--"):
        return f"{flag}={one_path(rest)}"
    return ":".join(one_path(p) for p in value.split(":"))


def admission_review(pod: Manifest, namespace: str, *, dry_run: bool = False) -> Manifest:
    """An admission.k8s.io/v1 AdmissionReview of a pod CREATE, in the shape kubernetes.io
    documents: uid, kind, resource, requestKind, requestResource, name, namespace,
    operation, userInfo, object, oldObject, dryRun, options."""
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": pod["metadata"].get("name", ""),
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kubeflow:training-operator",
                "uid": "014fbff9a07c",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def fresh_folder(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
