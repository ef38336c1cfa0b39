"""Runs the real helm on the chart and reads what it renders (helpers for tests/chart)."""

from __future__ import annotations

import functools
import gzip
import json
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
# TRAINSENTRY_CHART_DIR: test a copy of the chart (e.g. while rules/ is being rewritten).
CHART = Path(os.environ.get("TRAINSENTRY_CHART_DIR") or REPO / "charts" / "trainsentry")
VALUES_DIR = Path(__file__).resolve().parent / "values"
VENDORED_CRDS = Path(__file__).resolve().parent / "crds"
RELEASE = "ts"
NAMESPACE = "trainsentry"
KUBE_VERSIONS = ("1.30.0", "1.37.0")
# The values sets the issue asks for; each is a file in tests/chart/values/.
VALUES_SETS = ("defaults", "ha-postgres", "exporters-off", "everything-on", "operator-namespaces")

Manifest = dict[str, Any]


class HelmFailed(RuntimeError):
    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"helm {' '.join(args)} exited {returncode}:\n{stderr}{stdout}")
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


@functools.cache
def helm_binary() -> str:
    """$HELM_BIN, else the path scripts/get-helm.sh prints (it fetches helm once)."""
    if os.environ.get("HELM_BIN"):
        return os.environ["HELM_BIN"]
    out = subprocess.run(
        [str(REPO / "scripts" / "get-helm.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


@functools.cache
def _helm_home() -> Path:
    import atexit
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="trainsentry-helm-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def helm(*args: str) -> str:
    """Runs helm with a private home (no user repos/plugins); returns stdout or raises."""
    home = _helm_home()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-kubeconfig"),
    }
    proc = subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, env=env, timeout=120
    )
    if proc.returncode != 0:
        raise HelmFailed(args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def values_file(name: str) -> Path:
    return VALUES_DIR / f"{name}.yaml"


def _values_args(
    values: str | None, overrides: Mapping[str, Any] | None, tmp: Path | None
) -> list[str]:
    args: list[str] = []
    if values and values != "defaults":
        args += ["-f", str(values_file(values))]
    if overrides is not None:
        assert tmp is not None
        extra = tmp / "override-values.yaml"
        extra.write_text(yaml.safe_dump(dict(overrides)), encoding="utf-8")
        args += ["-f", str(extra)]
    return args


def template(
    values: str | None = "defaults",
    overrides: Mapping[str, Any] | None = None,
    tmp: Path | None = None,
    kube_version: str = KUBE_VERSIONS[0],
) -> list[Manifest]:
    """`helm template` of the chart (with its CRDs) as a list of objects."""
    out = helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--include-crds",
        "--kube-version",
        kube_version,
        *_values_args(values, overrides, tmp),
    )
    return [doc for doc in yaml.safe_load_all(out) if doc]


@functools.cache
def rendered(values: str) -> tuple[Manifest, ...]:
    """Cached render of one of VALUES_SETS (treat the result as read-only)."""
    return tuple(template(values))


def lint(
    values: str | None = "defaults",
    overrides: Mapping[str, Any] | None = None,
    tmp: Path | None = None,
) -> str:
    return helm("lint", "--strict", str(CHART), *_values_args(values, overrides, tmp))


def find(objs: Sequence[Manifest], kind: str, name_suffix: str = "") -> list[Manifest]:
    return [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]


def one(objs: Sequence[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    found = find(objs, kind, name_suffix)
    assert len(found) == 1, (
        f"expected one {kind} *{name_suffix}, got {[o['metadata']['name'] for o in found]}"
    )
    return found[0]


def pod_specs(objs: Sequence[Manifest]) -> Iterator[tuple[str, Manifest]]:
    """(kind/name, pod spec) of every workload."""
    for obj in objs:
        kind, spec = obj["kind"], obj.get("spec", {})
        if kind in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield f"{kind}/{obj['metadata']['name']}", spec["template"]["spec"]
        elif kind == "CronJob":
            yield (
                f"{kind}/{obj['metadata']['name']}",
                spec["jobTemplate"]["spec"]["template"]["spec"],
            )


def is_builtin(obj: Manifest) -> bool:
    group = obj["apiVersion"].rpartition("/")[0]
    return group == "" or group.endswith(".k8s.io") or group in ("apps", "batch", "policy")


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema: our CRDs and the vendored prometheus-operator ones."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not crd:
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    for path in sorted(VENDORED_CRDS.glob("*.json.gz")):
        crd = json.loads(gzip.decompress(path.read_bytes()))
        for version, schema in crd["versions"].items():
            schemas[(f"{crd['group']}/{version}", crd["kind"])] = schema
    return schemas


def crd_validator(schema: dict[str, Any]) -> Any:
    """A JSON Schema validator for objects of a CRD: unknown fields refused (as the API
    server's strict field validation does), apiVersion/kind/metadata always allowed."""
    import jsonschema

    root = structural(schema)
    root["properties"] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        **root.get("properties", {}),
    }
    return jsonschema.Draft7Validator(root)


def structural(schema: Any) -> Any:
    """A CRD schema as JSON Schema that refuses unknown fields (plain JSON Schema would let
    misspelled fields through)."""
    if isinstance(schema, list):
        return [structural(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: structural(value) for key, value in schema.items()}
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out
