"""The command lines the chart renders are accepted by the real `trainsentry` CLI parser."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chart.chart_helm import one, rendered, template
from trainsentry.cli import COMMANDS, build_parser


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    containers: list[dict[str, Any]] = spec["template"]["spec"]["containers"]
    return containers[0]


def _parse(argv: list[str]) -> Any:
    return build_parser().parse_args(argv)


def test_gateway_arguments_parse() -> None:
    args = _parse(_container(one(rendered("everything-on"), "Deployment", "-gateway"))["args"])
    assert args.command == "gateway"


def test_operator_arguments_parse() -> None:
    container = _container(one(rendered("defaults"), "Deployment", "-operator"))
    assert "command" not in container  # the image's entry point: trainsentry
    args = _parse(container["args"])
    assert args.command == "operator" and args.all_namespaces and args.peering is None
    port = container["ports"][0]["containerPort"]
    assert args.liveness == f"http://0.0.0.0:{port}/healthz"
    assert container["livenessProbe"]["httpGet"]["port"] == "health"


def test_the_operator_is_told_whether_the_gateway_reads_spec_alerting(tmp_path: Path) -> None:
    """So that a job's spec.alerting that nothing reads gets AlertingReady=Unknown."""
    args = _parse(_container(one(rendered("defaults"), "Deployment", "-operator"))["args"])
    assert (args.job_alerting, args.job_alerting_namespace) == ("on", [])  # on by default
    values = {"gateway": {"jobAlerting": {"enabled": False}}}
    off = _parse(
        _container(one(template("defaults", values, tmp_path), "Deployment", "-operator"))["args"]
    )
    assert (off.job_alerting, off.job_alerting_namespace) == ("off", [])
    values = {"gateway": {"jobAlerting": {"enabled": True, "namespaces": ["team-a", "team-b"]}}}
    scoped = _parse(
        _container(one(template("defaults", values, tmp_path), "Deployment", "-operator"))["args"]
    )
    assert (scoped.job_alerting, scoped.job_alerting_namespace) == ("on", ["team-a", "team-b"])


def _run_ha_wrapper(container: dict[str, Any], pod_name: str, tmp_path: Path) -> list[str]:
    """Runs the rendered shell wrapper with a stand-in `trainsentry` that prints its argv."""
    fake = tmp_path / "trainsentry"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n", encoding="utf-8"
    )
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "POD_NAME": pod_name}
    out = subprocess.run(
        [*container["command"], *container["args"]],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    argv: list[str] = json.loads(out.stdout)
    return argv


@pytest.mark.skipif(shutil.which("cksum") is None, reason="needs coreutils cksum")
def test_ha_replicas_get_distinct_priorities_and_peering(tmp_path: Path) -> None:
    objs = rendered("ha-postgres")
    container = _container(one(objs, "Deployment", "-operator"))
    peering = one(objs, "ClusterKopfPeering")["metadata"]["name"]
    priorities = set()
    for pod in ("ts-trainsentry-operator-7d9f-abcde", "ts-trainsentry-operator-7d9f-fghij"):
        args = _parse(_run_ha_wrapper(container, pod, tmp_path))
        assert args.command == "operator" and args.all_namespaces
        assert args.peering == peering
        priorities.add(args.priority)
    assert len(priorities) == 2
    pod_name_env = {e["name"]: e for e in container["env"]}["POD_NAME"]
    assert pod_name_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_report_arguments_parse() -> None:
    if importlib.util.find_spec(COMMANDS["report"]) is None:
        pytest.skip(f"{COMMANDS['report']} is not written yet")
    args = _parse(_container(one(rendered("defaults"), "CronJob", "-report"))["args"])
    assert args.command == "report"
