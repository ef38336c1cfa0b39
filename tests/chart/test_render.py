"""helm lint and helm template for each values set; every object valid for its schema."""

from __future__ import annotations

from collections import Counter
from typing import Any

import kubernetes_validate
import pytest

from chart.chart_helm import (
    KUBE_VERSIONS,
    VALUES_SETS,
    crd_schemas,
    crd_validator,
    find,
    is_builtin,
    lint,
    one,
    rendered,
    template,
)


@pytest.mark.parametrize("values", VALUES_SETS)
def test_helm_lint_strict_passes(values: str) -> None:
    out = lint(values)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUES_SETS)
def test_builtin_objects_pass_strict_kubernetes_schemas(values: str, kube_version: str) -> None:
    builtins = [o for o in rendered(values) if is_builtin(o)]
    assert len(builtins) >= 10
    errors = []
    for obj in builtins:
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_strict_validation_catches_a_misspelled_field() -> None:
    """The validator this suite relies on does reject what the API server would."""
    deployment = one(rendered("defaults"), "Deployment", "-gateway")
    broken: dict[str, Any] = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)


@pytest.mark.parametrize("values", VALUES_SETS)
def test_custom_resources_match_their_crd_schemas(values: str) -> None:
    schemas = crd_schemas()
    custom = [o for o in rendered(values) if not is_builtin(o)]
    errors = []
    for obj in custom:
        key = (obj["apiVersion"], obj["kind"])
        assert key in schemas, f"no CRD schema for {key}"
        validator = crd_validator(schemas[key])
        errors += [
            f"{obj['kind']}/{obj['metadata']['name']} at {list(e.absolute_path)}: {e.message}"
            for e in validator.iter_errors(obj)
        ]
    assert not errors, "\n".join(errors)


def test_crd_validation_catches_a_misspelled_field() -> None:
    amc = one(rendered("defaults"), "AlertmanagerConfig")
    validator = crd_validator(crd_schemas()[(amc["apiVersion"], amc["kind"])])
    assert not list(validator.iter_errors(amc))
    route = {**amc["spec"]["route"], "groupby": ["x"]}
    broken = {**amc, "spec": {**amc["spec"], "route": route}}
    assert list(validator.iter_errors(broken))


def kinds(values: str) -> Counter[str]:
    return Counter(o["kind"] for o in rendered(values))


def test_defaults_render_the_whole_install() -> None:
    objs = rendered("defaults")
    assert kinds("defaults") >= Counter(
        {
            "Deployment": 2,
            "DaemonSet": 2,
            "CronJob": 1,
            "AlertmanagerConfig": 1,
            "ServiceMonitor": 2,
            "ClusterRole": 1,
            "ClusterRoleBinding": 1,
            "PersistentVolumeClaim": 1,
            "PodDisruptionBudget": 2,
        }
    )
    assert one(objs, "Deployment", "-operator")["spec"]["replicas"] == 1
    gateway = one(objs, "Deployment", "-gateway")
    assert gateway["spec"]["replicas"] == 1
    assert gateway["spec"]["strategy"]["type"] == "Recreate"
    assert not find(objs, "ServiceMonitor", "-gateway")  # off by default
    assert not find(objs, "ClusterKopfPeering")
    crd_names = {o["metadata"]["name"] for o in objs if o["kind"] == "CustomResourceDefinition"}
    assert "clusterkopfpeerings.kopf.dev" in crd_names


def test_ha_runs_two_peered_operators_and_postgres_gateways() -> None:
    objs = rendered("ha-postgres")
    operator = one(objs, "Deployment", "-operator")
    assert operator["spec"]["replicas"] == 2
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    peering = one(objs, "ClusterKopfPeering")
    assert f"--peering={peering['metadata']['name']}" in args
    gateway = one(objs, "Deployment", "-gateway")
    assert gateway["spec"]["replicas"] == 3
    assert gateway["spec"]["strategy"]["type"] == "RollingUpdate"
    assert not find(objs, "PersistentVolumeClaim")
    pod = gateway["spec"]["template"]["spec"]
    assert "podAntiAffinity" in pod["affinity"]
    assert all(v["name"] != "data" for v in pod["volumes"])


def test_exporters_off_renders_no_daemonset_and_no_host_access() -> None:
    objs = rendered("exporters-off")
    assert not find(objs, "DaemonSet")
    assert not find(objs, "CronJob")
    assert not find(objs, "NetworkPolicy")
    assert not [o for o in objs if "exporter" in o["metadata"]["name"]]


def test_everything_on_renders_every_optional_part() -> None:
    objs = rendered("everything-on")
    assert len(find(objs, "ServiceMonitor")) == 3
    assert one(objs, "CronJob")["spec"]["timeZone"] == "Asia/Shanghai"
    images = {c["image"] for _, c in _containers(objs) if "trainsentry" in c["image"]}
    assert images == {
        "registry.example.com/trainsentry@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    }
    dcgm = one(objs, "DaemonSet", "-dcgm-exporter")["spec"]["template"]["spec"]
    assert dcgm["runtimeClassName"] == "nvidia"
    assert dcgm["containers"][0]["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    for obj in objs:
        if obj["kind"] != "CustomResourceDefinition":
            assert obj["metadata"]["labels"]["team"] == "ml-infra", obj["metadata"]["name"]


def _containers(objs: Any) -> list[tuple[str, dict[str, Any]]]:
    from chart.chart_helm import pod_specs

    return [(name, c) for name, pod in pod_specs(objs) for c in pod["containers"]]


def test_renders_for_each_kubernetes_version() -> None:
    """kubeVersion in Chart.yaml admits both versions we validate against."""
    for version in KUBE_VERSIONS:
        assert template("defaults", kube_version=version)


def test_notes_example_is_a_valid_training_job() -> None:
    import textwrap

    import yaml

    from chart.chart_helm import CHART

    notes = (CHART / "templates" / "NOTES.txt").read_text(encoding="utf-8")
    block = notes.split("<<'YAML'\n", 1)[1].split("YAML\n", 1)[0]
    job = yaml.safe_load(textwrap.dedent(block))
    validator = crd_validator(crd_schemas()[(job["apiVersion"], job["kind"])])
    assert not [e.message for e in validator.iter_errors(job)]
    assert "{{" not in block  # plain YAML the admin can paste


def test_every_value_is_documented() -> None:
    """Each value in values.yaml has a `# --` comment on itself or on an enclosing key."""
    import re

    from chart.chart_helm import CHART

    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented)
    undocumented, documented_above = [], False
    for line in (CHART / "values.yaml").read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            documented_above = documented_above or stripped.startswith("# --")
            continue
        match = re.match(r"^(\s*)([A-Za-z_][\w./-]*):(.*)$", line)
        if not stripped or not match:
            documented_above = False
            continue
        indent, key, rest = len(match[1]), match[2], match[3].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if rest and not documented_above and not any(doc for _, _, doc in stack):
            undocumented.append(".".join([k for _, k, _ in stack] + [key]))
        stack.append((indent, key, documented_above))
        documented_above = False
    assert not undocumented
