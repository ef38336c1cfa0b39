"""Pure parts of the operator: rendering, thresholds, scoping, node claims, status, the CRD."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from operator_harness import CRD_FILE, Validator, probe_ports, trainingjob

from trainsentry import assets
from trainsentry.operator import discovery, nodes, status
from trainsentry.operator.reconcile import (
    Sources,
    child_patch,
    load_sources,
    merge_diff,
    rules_message,
)
from trainsentry.operator.render import (
    apply_thresholds,
    dashboards_ref,
    known_thresholds,
    pin_dashboard,
    render_children,
    scope_expr,
)
from trainsentry.operator.spec import MAX_NAME_LENGTH, JobIdentity, LabelSelector, TrainingJobSpec

JOB = JobIdentity(name="llm", namespace="team-a", uid="0b5e6c1e-1111-4222-8333-944445555666")


def spec(**fields: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"selector": {"matchLabels": {"job": "llm"}}, **fields})


def test_threshold_override_replaces_exactly_the_literal() -> None:
    rule = {
        "alert": "A",
        "expr": 'x > 85 and y{le="85"} < 850 and z > 0.85',
        "annotations": {"thresholds": "t=85"},
    }
    out = apply_thresholds(rule, {"t": 90.5})
    assert out["expr"] == 'x > 90.5 and y{le="85"} < 850 and z > 0.85'
    assert out["annotations"]["thresholds"] == "t=90.5"
    assert rule["expr"].startswith("x > 85")  # input untouched
    assert apply_thresholds(rule, {"other": 1}) == rule
    with pytest.raises(ValueError, match="not in expr"):
        apply_thresholds(
            {"alert": "B", "expr": "x > 1", "annotations": {"thresholds": "t=2"}}, {"t": 3}
        )


def test_threshold_overrides_land_in_their_own_slots() -> None:
    slow_rank = {
        "alert": "TrainingSlowRank",
        "expr": "(ratio < 0.25) and (quantile(0.5, wait) > 0.2)",
        "annotations": {
            "thresholds": "slow_rank_wait_ratio=0.25, slow_rank_peer_wait_fraction=0.2"
        },
    }
    out = apply_thresholds(
        slow_rank, {"slow_rank_wait_ratio": 0.2, "slow_rank_peer_wait_fraction": 0.3}
    )
    assert out["expr"] == "(ratio < 0.2) and (quantile(0.5, wait) > 0.3)"
    assert out["annotations"]["thresholds"] == (
        "slow_rank_wait_ratio=0.2, slow_rank_peer_wait_fraction=0.3"
    )
    # Two thresholds with the same default: the n-th declared takes the n-th literal.
    twins = {"alert": "T", "expr": "a > 5 and b > 5", "annotations": {"thresholds": "a=5, b=5"}}
    assert apply_thresholds(twins, {"b": 7})["expr"] == "a > 5 and b > 7"
    assert apply_thresholds(twins, {"a": 7, "b": 5})["expr"] == "a > 7 and b > 5"
    with pytest.raises(ValueError, match="not in expr"):
        apply_thresholds({**twins, "expr": "a > 5"}, {"b": 7})


def test_scope_by_node_and_pod() -> None:
    node_expr = scope_expr("DCGM_FI_DEV_GPU_TEMP > 85", "node", JOB)
    assert node_expr == (
        "(DCGM_FI_DEV_GPU_TEMP > 85) * on(node) group_left(namespace, "
        'trainingjob) trainsentry:job_node:info{namespace="team-a", '
        'trainingjob="llm"}'
    )
    pod_expr = scope_expr(
        "up * on(namespace, pod) group_left(trainingjob) trainsentry:job_pod:info > 0", "pod", JOB
    )
    assert pod_expr is not None and pod_expr.endswith(
        'trainsentry:job_pod:info{namespace="team-a", trainingjob="llm"} > 0'
    )
    assert scope_expr("up == 0", "cluster", JOB) is None
    assert scope_expr("up == 0", "pod", JOB) is None  # no membership join to narrow


def _promtool(tmp_path: Path, groups: list[dict[str, Any]]) -> None:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_shipped_rules_render_per_job_and_pass_promtool(tmp_path: Path) -> None:
    sources = load_sources(assets.rules_dir(), assets.dashboards_dir())
    if not sources.rule_files:
        pytest.skip("rules/ has no rule files yet")
    thresholds = known_thresholds(sources.rule_files)
    overrides = {name: float(default) * 2 + 1 for name, default in thresholds.items()}
    rendered = render_children(
        JOB, spec(thresholds=overrides), sources.rule_files, sources.dashboards, ["llm-0", "llm-1"]
    )
    assert not rendered.unknown_thresholds and rendered.alert_count > 0
    rule = rendered.manifests[0]
    _promtool(tmp_path, rule["spec"]["groups"])
    text = json.dumps(rule)
    for name, value in overrides.items():
        assert f"{name}={value:g}" in text or f"{name}={int(value)}" in text, name
    validator = Validator()
    for manifest in rendered.manifests:
        validator(manifest)
    assert set(validator.checked) >= {"PrometheusRule", "PodMonitor"}
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert all(r["labels"]["trainingjob"] == "llm" for r in alerts)
    assert all("trainsentry:job_" in r["expr"] for r in alerts)


def test_render_is_deterministic_and_owned(sources: Sources) -> None:
    first = render_children(JOB, spec(), sources.rule_files, sources.dashboards, ["b", "a"])
    second = render_children(JOB, spec(), sources.rule_files, sources.dashboards, ["a", "b"])
    assert first == second
    for manifest in first.manifests:
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
        assert manifest["metadata"]["labels"]["trainsentry.io/trainingjob"] == "llm"
    assert first.skipped_rules == ["ExporterDown"]  # job_scope: cluster


def _alerts(rendered: Any) -> dict[str, dict[str, Any]]:
    groups = rendered.manifests[0]["spec"]["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_untuned_node_rules_are_left_to_the_cluster_wide_rules(sources: Sources) -> None:
    # docs/alerts.md "Job scope": a job's copy of a hardware rule it does not tune is the
    # cluster-wide alert again with a tenant's labels, racing it to the gateway (issue 43:
    # two incidents, two pages). Pod rules are the job's own and are always rendered.
    plain = render_children(JOB, spec(), sources.rule_files, (), ["a"])
    assert set(_alerts(plain)) == {"TrainingPodRestarting", "CollectiveHang"}
    assert plain.alert_count == 2
    assert plain.cluster_wide_rules == ["GPUTemperatureHigh", "GPUXidCritical"]
    assert plain.skipped_rules == ["ExporterDown"]  # not "skipped": left, by design
    groups = [g["name"] for g in plain.manifests[0]["spec"]["groups"]]
    assert "fixture-gpu-team-a-llm" not in groups  # no group left empty
    message = rules_message(plain)
    assert message.startswith("2 alerting rules; 2 untuned node-level rules are not copied")
    assert "cluster-wide rules alert for the job's nodes" in message

    # a threshold the rule declares: that rule (only) is the job's own, with its value
    hot = render_children(
        JOB, spec(thresholds={"gpu_temp_celsius": 90}), sources.rule_files, (), []
    )
    assert set(_alerts(hot)) == {"GPUTemperatureHigh", "TrainingPodRestarting", "CollectiveHang"}
    rule = _alerts(hot)["GPUTemperatureHigh"]
    assert "> 90)" in rule["expr"] and "trainsentry:job_node:info{" in rule["expr"]
    assert hot.cluster_wide_rules == ["GPUXidCritical"]
    # a pod rule's threshold tunes no node rule
    pods = render_children(
        JOB, spec(thresholds={"pod_restarts_10m": 5}), sources.rule_files, (), []
    )
    assert pods.cluster_wide_rules == ["GPUTemperatureHigh", "GPUXidCritical"]
    # a priority override names the rule: copied, with the job's priority
    lower = spec(alerting={"priorityOverrides": {"GPUXidCritical": "P1"}})
    overridden = render_children(JOB, lower, sources.rule_files, (), [])
    assert _alerts(overridden)["GPUXidCritical"]["labels"]["priority"] == "P1"
    assert overridden.cluster_wide_rules == ["GPUTemperatureHigh"]
    assert rules_message(overridden).startswith("3 alerting rules; 1 untuned")


def test_the_shipped_hardware_rules_have_no_untuned_job_copy() -> None:
    shipped = load_sources(assets.rules_dir(), assets.dashboards_dir())
    node_rules = {
        str(r["alert"])
        for f in shipped.rule_files
        for g in f.groups
        for r in g.get("rules") or []
        if "alert" in r and (r.get("annotations") or {}).get("job_scope") == "node"
    }
    assert {"GPUFellOffBus", "IBPhysicalLinkDown", "KubeNodeNotReady"} <= node_rules
    rendered = render_children(JOB, spec(), shipped.rule_files, (), ["a"])
    alerts = _alerts(rendered)
    assert not node_rules & set(alerts)
    assert sorted(rendered.cluster_wide_rules) == sorted(node_rules)
    assert all(r["annotations"]["job_scope"] == "pod" for r in alerts.values())
    assert "TrainingJobHang" in alerts and "NCCLRasCommunicatorErrors" in alerts
    hot = render_children(
        JOB, spec(thresholds={"gpu_temp_celsius": 90}), shipped.rule_files, (), []
    )
    assert set(_alerts(hot)) - set(alerts) == {"GPUTemperatureHigh"}


def _membership(tmp_path: Path, group: dict[str, Any], pods: list[str]) -> set[str]:
    """Which of `pods` (kube_pod_info series in team-a) Prometheus records into
    trainsentry:job_pod:info with the membership `group`: `promtool test rules`, one per pod."""
    (tmp_path / "membership.yaml").write_text(yaml.safe_dump({"groups": [group]}))
    series = [
        {
            "series": f'kube_pod_info{{namespace="team-a", pod="{name}", node="n-{name}"}}',
            "values": "1x5",
        }
        for name in pods
    ]
    found: set[str] = set()
    for name in pods:  # one assertion per candidate pod: in the membership or not
        test = {
            "rule_files": ["membership.yaml"],
            "evaluation_interval": "1m",
            "tests": [
                {
                    "interval": "1m",
                    "input_series": series,
                    "promql_expr_test": [
                        {
                            "expr": f'count(trainsentry:job_pod:info{{pod="{name}"}}) or vector(0)',
                            "eval_time": "2m",
                            "exp_samples": [{"labels": "{}", "value": 1}],
                        }
                    ],
                }
            ],
        }
        path = tmp_path / "membership_test.yaml"
        path.write_text(yaml.safe_dump(test))
        result = subprocess.run(
            ["promtool", "test", "rules", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode == 0:
            found.add(name)
    return found


def test_workload_membership_takes_only_the_jobs_own_pods(tmp_path: Path) -> None:
    # Two PyTorchJobs whose names are prefixes of each other, in one namespace.
    pods = ["llm-master-0", "llm-worker-0", "llm-worker-11", "llm-v2-master-0", "llm-v2-worker-0"]
    for name, own in (("llm", pods[:3]), ("llm-v2", pods[3:])):
        job = JobIdentity(name=name, namespace="team-a", uid=f"uid-{name}")
        workload = TrainingJobSpec.model_validate(
            {"workloadRef": {"kind": "PyTorchJob", "name": name}}
        )
        rendered = render_children(job, workload, (), (), [])  # no pods listed yet: still exact
        group = rendered.manifests[0]["spec"]["groups"][0]
        assert _membership(tmp_path, group, pods) == set(own), name


def test_volcano_membership_lists_the_pods_seen(tmp_path: Path, sources: Sources) -> None:
    # Volcano pods are <job>-<task>-<index> with free task names, so no name pattern is safe.
    workload = TrainingJobSpec.model_validate({"workloadRef": {"kind": "Job", "name": "vc"}})
    own = ["vc-worker-0", "vc-worker-1"]
    rendered = sources.render(JOB, workload, own)
    group = rendered.manifests[0]["spec"]["groups"][0]
    assert _membership(tmp_path, group, [*own, "vc-v2-worker-0"]) == set(own)
    assert rendered.manifests[1]["spec"]["selector"] == {
        "matchLabels": {"volcano.sh/job-name": "vc"}
    }
    grown = sources.render(JOB, workload, [*own, "vc-ps-0"])  # a new pod: rendered again
    assert _membership(tmp_path, grown.manifests[0]["spec"]["groups"][0], ["vc-ps-0"]) == {
        "vc-ps-0"
    }


def test_dashboard_is_pinned_to_the_job(sources: Sources) -> None:
    [board] = sources.dashboards
    pinned = pin_dashboard(board.dashboard, JOB, board.name)
    other = pin_dashboard(
        board.dashboard, JobIdentity(name="x", namespace="team-a", uid="u"), board.name
    )
    assert pinned["uid"] != other["uid"] and len(pinned["uid"]) <= 40
    assert "id" not in pinned and pinned["title"].endswith("team-a/llm")
    values = {v["name"]: v["current"].get("value") for v in pinned["templating"]["list"]}
    assert values == {"namespace": "team-a", "trainingjob": "llm", "node": None}


def test_dashboards_kept_in_the_operators_namespace_are_named_and_labelled_for_the_job(
    sources: Sources,
) -> None:
    next_to_job = render_children(JOB, spec(), (), sources.dashboards, ["a"]).manifests[2]
    moved = render_children(JOB, spec(), (), sources.dashboards, ["a"], "trainsentry").manifests[2]
    assert next_to_job["metadata"]["namespace"] == "team-a"
    assert next_to_job["metadata"]["ownerReferences"] == [JOB.owner_reference()]
    meta = moved["metadata"]
    assert (meta["namespace"], meta["name"]) == ("trainsentry", "team-a.llm-trainsentry-dashboards")
    assert dashboards_ref(JOB, "trainsentry") == (meta["namespace"], meta["name"])
    assert (
        dashboards_ref(JOB)
        == dashboards_ref(JOB, "team-a")
        == ("team-a", "llm-trainsentry-dashboards")
    )
    assert "ownerReferences" not in meta  # an owner must share the namespace
    assert meta["labels"]["trainsentry.io/trainingjob-namespace"] == "team-a"
    assert meta["labels"]["trainsentry.io/trainingjob"] == "llm"
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert moved["data"] == next_to_job["data"]
    # the same job name in another namespace: another ConfigMap
    twin = JobIdentity(name="llm", namespace="team-b", uid="u2")
    assert dashboards_ref(twin, "trainsentry")[1] != meta["name"]
    kubernetes_validate.validate(moved, "1.30", strict=True)


def test_one_scrape_endpoint_per_local_rank(sources: Sources) -> None:
    rendered = render_children(JOB, spec(ranksPerPod=8), sources.rule_files, (), ["a"])
    endpoints = rendered.manifests[1]["spec"]["podMetricsEndpoints"]
    assert probe_ports(rendered.manifests[1]) == list(range(9401, 9409))
    assert all("port" not in e and "portNumber" not in e for e in endpoints)  # undeclared ok
    assert all(
        {"targetLabel": "trainingjob", "replacement": "llm", "action": "replace"}
        in e["relabelings"]
        for e in endpoints
    )
    with pytest.raises(ValueError, match="port"):
        spec(ranksPerPod=8, probe={"port": 65530})


def test_label_selector_string() -> None:
    selector = LabelSelector.model_validate(
        {
            "matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [
                {"key": "r", "operator": "In", "values": ["x", "y"]},
                {"key": "s", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.as_string() == "a=1,b=2,r in (x,y),!s"


def test_spec_requires_exactly_one_pod_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        TrainingJobSpec.model_validate({})
    with pytest.raises(ValueError, match="exactly one"):
        TrainingJobSpec.model_validate(
            {"selector": {}, "workloadRef": {"kind": "Job", "name": "x"}}
        )


# --- node claims ----------------------------------------------------------------------------


def _node(
    annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n",
            "resourceVersion": "7",
            "annotations": annotations or {},
            "labels": labels or {"zone": "a"},
        }
    }


def _apply(node: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    assert patch is not None
    meta = dict(node["metadata"])
    for field in ("annotations", "labels"):
        merged = dict(meta.get(field) or {})
        for key, value in (patch["metadata"].get(field) or {}).items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        meta[field] = merged
    return {"metadata": meta}


def test_claims_share_nodes_and_release_labels_last() -> None:
    a = nodes.Claim("uid-a", "ns/a", ("dcgm", "node"))
    b = nodes.Claim("uid-b", "ns/b", ("infiniband",))
    node = _apply(_node(), nodes.node_patch(_node(), "uid-a", a))
    assert node["metadata"]["labels"] == {
        "zone": "a",
        "trainsentry.io/monitored": "true",
        "trainsentry.io/exporter-dcgm": "true",
        "trainsentry.io/exporter-node": "true",
    }
    assert nodes.node_patch(node, "uid-a", a) is None  # idempotent
    node = _apply(node, nodes.node_patch(node, "uid-b", b))
    assert node["metadata"]["labels"]["trainsentry.io/exporter-infiniband"] == "true"
    patch = nodes.node_patch(node, "uid-a", None)
    assert patch is not None and patch["metadata"]["resourceVersion"] == "7"
    node = _apply(node, patch)
    assert node["metadata"]["labels"] == {
        "zone": "a",
        "trainsentry.io/monitored": "true",
        "trainsentry.io/exporter-infiniband": "true",
    }
    node = _apply(node, nodes.node_patch(node, "uid-b", None))
    assert node["metadata"]["labels"] == {"zone": "a"}
    assert node["metadata"]["annotations"] == {}
    assert nodes.node_patch(node, "uid-b", None) is None


def test_malformed_claim_still_keeps_the_node_monitored() -> None:
    node = _node(annotations={"claims.trainsentry.io/x": "not json"})
    assert nodes.labels_for(nodes.claims_on(node["metadata"]["annotations"])) == {
        "trainsentry.io/monitored": "true"
    }


# --- status ---------------------------------------------------------------------------------


def _pods(*phases: str) -> status.PodSummary:
    return status.PodSummary.of(
        [{"status": {"phase": p}, "spec": {"nodeName": f"n{i}"}} for i, p in enumerate(phases)]
    )


@pytest.mark.parametrize(
    ("phases", "alert", "expected"),
    [
        ((), None, "Pending"),
        (("Pending", "Pending"), None, "Pending"),
        (("Running", "Running"), None, "Monitoring"),
        (("Running", "Pending"), None, "Degraded"),
        (("Running", "Failed"), None, "Degraded"),
        (("Succeeded", "Succeeded"), None, "Completed"),
        (("Running", "Running"), {"name": "Hang", "priority": "P0"}, "Hung"),
        (
            ("Running", "Running"),
            {"name": "Hang", "priority": "P0", "status": "resolved"},
            "Monitoring",
        ),
        (("Running", "Running"), {"name": "GPUHot", "priority": "P1"}, "Degraded"),
        (("Running", "Running"), {"name": "GPUHot", "priority": "P3"}, "Monitoring"),
    ],
)
def test_phase(phases: tuple[str, ...], alert: dict[str, str] | None, expected: str) -> None:
    pods = _pods(*phases)
    ranks = status.ranks(spec(worldSize=2), pods)
    assert status.compute_phase(pods, ranks, alert, frozenset({"Hang"})) == expected


def test_unknown_threshold_does_not_hide_the_phase() -> None:
    # 8 of 16 ranks running, a firing P0, and a typo in thresholds: still Degraded.
    pods = _pods(*["Running"] * 8, *["Pending"] * 8)
    conditions = [
        status.Condition("RulesReady", False, "UnknownThreshold", "gpu_temp_celcius"),
        status.Condition("ScrapeReady", True, "Applied"),
        status.Condition("ExportersReady", True, "NodesLabelled"),
    ]
    alert = {"name": "GPUXidCritical", "priority": "P0", "status": "firing"}
    built = status.build_status(
        {"lastAlert": alert},
        spec=spec(worldSize=16),
        generation=1,
        pods=pods,
        conditions=conditions,
        children=[],
        hang_alerts=frozenset({"Hang"}),
        now="t",
    )
    assert built["phase"] == "Degraded"
    assert built["conditions"][0]["reason"] == "UnknownThreshold"
    healthy = status.build_status(
        {},
        spec=spec(worldSize=2),
        generation=1,
        pods=_pods("Running", "Running"),
        conditions=conditions,
        children=[],
        hang_alerts=frozenset(),
        now="t",
    )
    assert healthy["phase"] == "Monitoring"


def test_conditions_keep_transition_time_until_they_flip() -> None:
    first = status.merge_conditions([], [status.Condition("RulesReady", True, "Applied")], "t1", 1)
    same = status.merge_conditions(
        first, [status.Condition("RulesReady", True, "Applied")], "t2", 2
    )
    flipped = status.merge_conditions(same, [status.Condition("RulesReady", False, "X")], "t3", 2)
    assert [c["lastTransitionTime"] for c in (first[0], same[0], flipped[0])] == ["t1", "t1", "t3"]
    assert same[0]["observedGeneration"] == 2


def test_status_patch_leaves_last_alert_alone() -> None:
    old = {"phase": "Pending", "lastAlert": {"name": "A"}, "nodes": ["n0"]}
    new = {"phase": "Monitoring", "nodes": ["n0"], "ranks": {"expected": 1, "running": 1}}
    assert status.status_patch(old, new) == {
        "phase": "Monitoring",
        "ranks": {"expected": 1, "running": 1},
    }


def test_last_alert_patch_validates() -> None:
    from datetime import UTC, datetime

    with pytest.raises(ValueError):
        status.last_alert_patch("A", "P9", datetime.now(tz=UTC))
    with pytest.raises(ValueError):
        status.last_alert_patch("A", "P1", datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        status.last_alert_patch("A", "P1", datetime.now(tz=UTC), status="maybe")


# --- children diff, discovery ---------------------------------------------------------------


def test_merge_diff_and_child_patch() -> None:
    assert merge_diff({"a": 1, "b": {"c": 1, "d": 2}}, {"b": {"c": 1}}) == {
        "a": None,
        "b": {"d": None},
    }
    existing = {
        "metadata": {"labels": {"x": "1", "mine": "old"}, "ownerReferences": []},
        "data": {"k": "v", "stale": "s"},
    }
    desired = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"labels": {"mine": "new"}, "ownerReferences": [{"uid": "u"}]},
        "data": {"k": "v"},
    }
    assert child_patch(existing, desired) == {
        "data": {"stale": None},
        "metadata": {"labels": {"mine": "new"}, "ownerReferences": [{"uid": "u"}]},
    }
    assert child_patch({**desired, "status": {}}, desired) == {}
    owned = {"trainsentry.io/owned-labels": "mine,release"}
    before = {
        "metadata": {"labels": {"x": "1", "mine": "new", "release": "kps"}, "annotations": owned}
    }
    after = {
        "metadata": {
            "labels": {"mine": "new"},
            "annotations": {"trainsentry.io/owned-labels": "mine"},
        }
    }
    assert child_patch(before, after) == {
        "metadata": {
            "labels": {"release": None},
            "annotations": {"trainsentry.io/owned-labels": "mine"},
        }
    }


def test_discovery_derives_ranks() -> None:
    ptj = {
        "apiVersion": "kubeflow.org/v1",
        "metadata": {"name": "p", "namespace": "n", "uid": "u"},
        "spec": {
            "elasticPolicy": {"nProcPerNode": 8},
            "pytorchReplicaSpecs": {"Master": {}, "Worker": {"replicas": 3}},
        },
    }
    manifest = discovery.trainingjob_for("PyTorchJob", ptj)
    assert manifest["spec"]["worldSize"] == 32 and manifest["spec"]["ranksPerPod"] == 8
    vc = {
        "metadata": {"name": "v", "namespace": "n", "uid": "u"},
        "spec": {"tasks": [{"replicas": 2}, {"replicas": 2}]},
    }
    assert discovery.trainingjob_for("Job", vc)["spec"]["worldSize"] == 4
    Validator()(manifest)


# --- the CRD --------------------------------------------------------------------------------


def _crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return loaded


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_crd_is_a_valid_custom_resource_definition(version: str) -> None:
    kubernetes_validate.validate(_crd(), version, strict=True)
    crd = _crd()
    assert crd["spec"]["names"]["shortNames"] == ["tj"]
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Phase", "Ranks", "Expected", "Last-Alert", "Age"]


def test_crd_bounds_the_name_as_the_operator_does() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["metadata"]["properties"]["name"]["maxLength"] == MAX_NAME_LENGTH
    validate = Validator()
    validate(trainingjob("x" * MAX_NAME_LENGTH))
    with pytest.raises(ValueError, match="too long"):
        validate(trainingjob("x" * (MAX_NAME_LENGTH + 1)))


def _defaults(schema: dict[str, Any], path: str = "") -> dict[str, Any]:
    found = {}
    for name, prop in (schema.get("properties") or {}).items():
        here = f"{path}.{name}" if path else name
        if "default" in prop and prop["default"] != {}:
            found[here] = prop["default"]
        found.update(_defaults(prop, here))
    return found


def test_crd_defaults_match_the_spec_model() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    model = spec().model_dump()
    defaults = _defaults(schema)
    assert len(defaults) >= 10
    for dotted, value in defaults.items():
        current: Any = model
        for part in dotted.split("."):
            current = current[part]
        assert current == value, dotted


def test_a_rules_folder_with_bad_yaml_is_a_clear_load_error(tmp_path: Path) -> None:
    """`trainsentry operator` logs event=load_failed and exits 1 on a ValueError; a broken
    rule file used to escape as yaml's own error, a traceback."""
    (tmp_path / "good.yaml").write_text("groups: []\n")
    (tmp_path / "broken.yaml").write_text("groups: [\n  - name: x\n    rules: {\n")
    with pytest.raises(ValueError, match=r"broken\.yaml: not valid YAML"):
        load_sources(tmp_path, tmp_path)
    (tmp_path / "broken.yaml").unlink()
    (tmp_path / "board.json").write_text('{"panels": [')
    with pytest.raises(ValueError, match=r"board\.json: not valid JSON"):
        load_sources(tmp_path, tmp_path)
