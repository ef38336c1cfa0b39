"""The README's "Install on a cluster" section, followed on the rendered chart: every command
it gives is run as far as a machine without a cluster can (`helm install` as `helm template`
with the same arguments and the README's own values file), and every image, Secret, key,
Service, port, Deployment, label, CRD, file and short name it names is checked to exist in
what the chart renders or in the repository."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from chart.chart_helm import CHART, REPO, Manifest, helm
from trainsentry.operator.spec import JOB_LABEL

README = REPO / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    assert "\n## Install on a cluster\n" in text, "the README lost its install section"
    return text.split("\n## Install on a cluster\n", 1)[1].split("\n## ", 1)[0]


def _commands() -> list[list[str]]:
    """Each shell command of the section's bash blocks, continuation lines joined, split as
    the shell would (placeholders in <> kept as words)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", _section(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" | ", 1)[0].strip()  # `... | base64 -d`: the kubectl part
            if line and not line.startswith("#"):
                commands.append(shlex.split(line))
    return commands


def _named(program: str, *words: str) -> list[list[str]]:
    return [c for c in _commands() if c[: 1 + len(words)] == [program, *words]]


def _option(command: list[str], name: str) -> list[str]:
    """Every value of `--name V` / `--name=V` in a command."""
    found = []
    for i, word in enumerate(command):
        if word == name and i + 1 < len(command):
            found.append(command[i + 1])
        elif word.startswith(name + "="):
            found.append(word.split("=", 1)[1])
    return found


def _values_file(tmp: Path) -> Path:
    match = re.search(r"<!-- install-values -->\n```yaml\n(.*?)```", _section(), re.S)
    assert match, "the install section lost its values file"
    text = match.group(1)
    name = text.splitlines()[0].lstrip("# ").strip()
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[Manifest]]:
    """The README's `helm install` and what it renders: the same release, chart, namespace,
    --set and -f arguments, as `helm template` (with the CRDs)."""
    [command] = _named("helm", "install")
    tmp = tmp_path_factory.mktemp("readme")
    values = _values_file(tmp)
    args = command[2:]
    assert args[1] == "charts/trainsentry" and (REPO / args[1]).resolve() == CHART.resolve()
    args[1] = str(CHART)
    for i, word in enumerate(args):
        if word == "-f":
            assert args[i + 1] == values.name, f"-f {args[i + 1]}: not the README's values file"
            args[i + 1] = str(values)
    out = helm("template", *args, "--include-crds")
    return command, [doc for doc in yaml.safe_load_all(out) if doc]


def _one(objs: list[Manifest], kind: str, name: str) -> Manifest:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"the chart renders no {kind} {name}"
    return found[0]


def test_the_image_built_and_pushed_is_the_one_installed(
    install: tuple[list[str], list[Manifest]],
) -> None:
    [build] = _named("docker", "build")
    [push] = _named("docker", "push")
    [tag] = _option(build, "-t")
    assert push[2] == tag
    dockerfile = _option(build, "-f") or ["Dockerfile"]
    assert (REPO / dockerfile[0]).is_file()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert tag.rsplit(":", 1)[1] == chart["appVersion"], "the README's tag is not appVersion"
    _command, objs = install
    images = {
        c["image"]
        for o in objs
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {tag}, images


def test_the_feishu_secret_holds_every_variable_the_values_name(
    install: tuple[list[str], list[Manifest]],
) -> None:
    [create] = _named("kubectl", "create", "secret")
    secret, namespace = create[4], _option(create, "-n")[0]
    keys = {v.split("=", 1)[0] for v in _option(create, "--from-literal")}
    command, objs = install
    assert namespace == _option(command, "--namespace")[0]
    assert ["kubectl", "create", "namespace", namespace] in _commands()
    gateway = _one(objs, "Deployment", "trainsentry-gateway")
    [container] = [c for c in gateway["spec"]["template"]["spec"]["containers"]]
    assert {"secretRef": {"name": secret}} in container.get("envFrom", [])
    config = yaml.safe_load(_one(objs, "ConfigMap", "trainsentry-config")["data"]["config.yaml"])
    named = set(re.findall(r"'?(\w+_env)'?: '?([A-Z][A-Z0-9_]*)", yaml.safe_dump(config)))
    wanted = {variable for key, variable in named if key != "probe_token_env"}
    assert wanted and wanted <= keys, f"the Secret lacks {sorted(wanted - keys)}"
    assert config["channels"]["feishu_bot"]["groups"]


def test_the_prometheus_operator_objects_carry_the_labels_and_crds_listed(
    install: tuple[list[str], list[Manifest]],
) -> None:
    _command, objs = install
    [crds] = [c for c in _named("kubectl", "get", "crd")]
    listed = {name.split(".", 1)[0] for name in crds[3:]}
    plural = {
        "AlertmanagerConfig": "alertmanagerconfigs",
        "ServiceMonitor": "servicemonitors",
        "PrometheusRule": "prometheusrules",
        "PodMonitor": "podmonitors",  # the operator's, per TrainingJob
    }
    rendered = {o["kind"] for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")}
    assert {plural[kind] for kind in rendered} | {"podmonitors"} == listed
    for obj in objs:
        if obj["kind"] in ("AlertmanagerConfig", "ServiceMonitor", "PrometheusRule"):
            labels = obj["metadata"].get("labels", {})
            assert labels.get("release") == "kube-prometheus-stack", obj["metadata"]["name"]


def test_the_deployments_service_port_and_token_named_exist(
    install: tuple[list[str], list[Manifest]],
) -> None:
    command, objs = install
    namespace = _option(command, "--namespace")[0]
    [rollout] = _named("kubectl", "-n", namespace, "rollout", "status")
    for target in rollout[5:]:
        kind, name = target.split("/")
        assert kind == "deployment"
        _one(objs, "Deployment", name)
    [forward] = _named("kubectl", "-n", namespace, "port-forward")
    service_name = forward[4].split("/")[1]
    local, remote = map(int, forward[5].split(":"))
    service = _one(objs, "Service", service_name)
    assert remote in {p["port"] for p in service["spec"]["ports"]}
    [get_secret] = _named("kubectl", "-n", namespace, "get", "secret")
    key = re.fullmatch(r"\{\.data\.([\w.-]+)\}", _option(get_secret, "-o")[0].split("=", 1)[1])
    assert key, get_secret
    secret = _one(objs, "Secret", get_secret[5])
    assert key.group(1).replace("\\.", ".") in secret["data"]
    assert f"http://127.0.0.1:{local}/ui/" in _section()


def test_the_first_trainingjob_validates_and_the_checks_name_it(
    install: tuple[list[str], list[Manifest]],
) -> None:
    _command, objs = install
    [apply] = _named("kubectl", "apply")
    path = REPO / _option(apply, "-f")[0]
    job: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    crd = _one(objs, "CustomResourceDefinition", "trainingjobs.trainsentry.io")
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == job["apiVersion"].split("/")[1]]
    jsonschema.validate(job, version["schema"]["openAPIV3Schema"])
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    [get_tj] = _named("kubectl", "-n", namespace, "get", "tj")
    assert "tj" in crd["spec"]["names"]["shortNames"] and get_tj[5] == name
    [children] = _named("kubectl", "-n", namespace, "get", "prometheusrules,podmonitors")
    assert _option(children, "-l") == [f"{JOB_LABEL}={name}"]
    rules_labels = job["spec"]["prometheus"]["ruleLabels"]
    assert rules_labels == {"release": "kube-prometheus-stack"}


def test_the_test_alert_is_one_the_charts_route_takes(
    install: tuple[list[str], list[Manifest]],
) -> None:
    _command, objs = install
    match = re.search(r"amtool\s+alert add (\w+) priority=(P\d)", _section().replace("\n", " "))
    assert match, "the install section lost its test alert"
    route = next(o for o in objs if o["kind"] == "AlertmanagerConfig")["spec"]["route"]
    [matcher] = route["matchers"]
    assert matcher["name"] == "priority" and re.fullmatch(matcher["value"], match.group(2))
    wait = route["groupWait"].removesuffix("s")
    assert f"{wait} s group wait" in _section().replace("\n", " ")
