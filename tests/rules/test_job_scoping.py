"""The per-job rendering contract of docs/alerts.md, proven on promtool.

Renders rules/gpu.yaml and rules/kubernetes.yaml for TrainingJob ns1/tj with one threshold
overridden, then checks with promtool that alerts only cover the job's nodes/pods, carry
`namespace`/`trainingjob`, and use the overridden threshold; node rules the job does not
tune are not rendered at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rules.jobscope import render_for_job
from tests.support.promtool import promtool
from trainsentry.assets import rules_dir

RUNBOOK = "https://github.com/trainsentry/trainsentry/blob/main/docs/alerts.md#"


def _render(tmp_path: Path, name: str, **kwargs: Any) -> Path:
    document = yaml.safe_load((rules_dir() / name).read_text())
    rendered = render_for_job(document, "ns1", "tj", **kwargs)
    path = tmp_path / f"tj-{name}"
    path.write_text(yaml.safe_dump(rendered, sort_keys=False))
    return path


def _series(name: str, values: str = "1x15", **labels: str) -> dict[str, str]:
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def _names(path: Path) -> set[str]:
    document = yaml.safe_load(path.read_text())
    return {r["alert"] for g in document["groups"] for r in g["rules"]}


def test_rendered_rules_are_valid_and_drop_cluster_scope(tmp_path: Path) -> None:
    files = ("gpu.yaml", "fabric.yaml", "node.yaml", "kubernetes.yaml")
    paths = [_render(tmp_path, n) for n in files]
    result = promtool("check", "rules", *map(str, paths))
    assert result.returncode == 0, result.stdout + result.stderr
    gpu, fabric, node, kube = map(_names, paths)
    # job_scope: node rules the job does not tune are not copied (docs/alerts.md "Job
    # scope": the cluster-wide alert covers the job's nodes; a copy would race it)
    assert gpu == fabric == node == set()
    assert "KubeNodeNotReady" not in kube  # kubernetes.yaml's node rules too
    assert {"KubeJobPodPending", "KubeJobPodCrashLooping"} <= kube  # job_scope: pod
    # a rule the job tunes (a threshold it declares, or its priority) is the job's own
    tuned = _render(
        tmp_path,
        "gpu.yaml",
        thresholds={"gpu_temp_celsius": "90"},
        priorities={"GPUFellOffBus": "P1"},
    )
    assert _names(tuned) == {"GPUTemperatureHigh", "GPUFellOffBus"}
    assert "DCGMExporterAbsent" not in _names(tuned)  # job_scope: cluster


def test_job_scoped_alerts_cover_only_the_job_and_use_overrides(tmp_path: Path) -> None:
    gpu = _render(tmp_path, "gpu.yaml", thresholds={"gpu_temp_celsius": "90"}, for_override="0s")
    kube = _render(tmp_path, "kubernetes.yaml")
    temp_annotations = {
        "summary": "GPU temperature high on n1 GPU 1",
        "description": "GPU 1 (GPU-1) on node n1 is at 91 °C.",
        "why": "Hot GPUs throttle clocks and slow every rank that waits on them; "
        "check cooling and airflow.",
        "runbook_url": RUNBOOK + "gputemperaturehigh",
        "job_scope": "node",
        "thresholds": "gpu_temp_celsius=90",
    }
    pending_annotations = {
        "summary": "Pod ns1/tj-0 of job tj pending too long",
        "description": "Pod ns1/tj-0 (TrainingJob tj) has been Pending for 10 minutes.",
        "why": "A gang-scheduled job cannot start until every rank is placed; "
        "check quota, GPU capacity and node selectors.",
        "runbook_url": RUNBOOK + "kubejobpodpending",
        "job_scope": "pod",
    }
    tests = {
        "rule_files": [str(gpu), str(kube)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # the membership the operator records: tj runs on n1, job "other" on n2
                    _series(
                        "trainsentry:job_node:info", node="n1", namespace="ns1", trainingjob="tj"
                    ),
                    _series(
                        "trainsentry:job_node:info", node="n2", namespace="ns1", trainingjob="other"
                    ),
                    _series(
                        "trainsentry:job_pod:info", namespace="ns1", pod="tj-0", trainingjob="tj"
                    ),
                    _series(
                        "trainsentry:job_pod:info",
                        namespace="ns1",
                        pod="other-0",
                        trainingjob="other",
                    ),
                    # 88 is above the default 85 but below tj's override 90
                    _series("DCGM_FI_DEV_GPU_TEMP", "88x15", node="n1", gpu="0", UUID="GPU-0"),
                    _series("DCGM_FI_DEV_GPU_TEMP", "91x15", node="n1", gpu="1", UUID="GPU-1"),
                    _series("DCGM_FI_DEV_GPU_TEMP", "91x15", node="n2", gpu="0", UUID="GPU-8"),
                    _series("DCGM_FI_DEV_GPU_TEMP", "91x15", node="n3", gpu="0", UUID="GPU-9"),
                    _series("kube_pod_status_phase", namespace="ns1", pod="tj-0", phase="Pending"),
                    _series(
                        "kube_pod_status_phase", namespace="ns1", pod="other-0", phase="Pending"
                    ),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "2m",
                        "alertname": "GPUTemperatureHigh",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "alertname": "GPUTemperatureHigh",
                                    "priority": "P2",
                                    "component": "gpu",
                                    "node": "n1",
                                    "gpu": "1",
                                    "UUID": "GPU-1",
                                    "namespace": "ns1",
                                    "trainingjob": "tj",
                                },
                                "exp_annotations": temp_annotations,
                            }
                        ],
                    },
                    {
                        "eval_time": "10m",
                        "alertname": "KubeJobPodPending",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "alertname": "KubeJobPodPending",
                                    "priority": "P2",
                                    "component": "kubernetes",
                                    "namespace": "ns1",
                                    "pod": "tj-0",
                                    "phase": "Pending",
                                    "trainingjob": "tj",
                                },
                                "exp_annotations": pending_annotations,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "tj_test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False, allow_unicode=True))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
