"""Hardware faults outlive a dead node's scrape gap (issue 37, item 3: `keep_firing_for`).

A dead node stops answering scrapes; its series go stale at the first failed scrape and an
alert on them would resolve, "fixed", while nothing was fixed. The fault rules keep firing
for KEEP_FIRING_FOR after their expression last matched (Prometheus >= 2.42.0). Proven on
promtool (rules/tests/scrape_gap_test.yaml), for every fault rule by name, and in the
PrometheusRule the operator renders per job, checked against prometheus-operator's CRD.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.support.promtool import promtool
from trainsentry.assets import rules_dir
from trainsentry.operator.reconcile import load_sources
from trainsentry.operator.render import render_children
from trainsentry.operator.spec import JobIdentity, TrainingJobSpec

KEEP_FIRING_FOR = "15m"
# Faults that stay true until someone repairs them: a scrape gap says nothing about them.
# Not GPUMissing: it counts a node's GPUs, so it has no series on a dead node at all, and
# held past the GPU's return it would fire late, once GPUFellOffBus stops inhibiting it
# (tests/e2e/test_node_death.py saw that page 9 minutes after the GPU was back).
FAULT_RULES = {
    "gpu.yaml": {
        "GPUFellOffBus", "GPUXidDoubleBitECC", "GPUXidUncontainedECC", "GPUXidNVLinkError",
        "GPUXidRowRemapFailure", "GPUXidFirmwareFatal", "GPUXidRowRemapPending",
        "GPUXidContainedECC", "GPUXidHighSingleBitECCRate", "GPUXidResetRequired",
        "GPUXidApplicationError", "GPUXidInformational", "GPUXidUnknown",
        "GPUUncorrectableECCErrors", "GPURowRemapFailure", "GPURowRemapPending",
        "GPURetiredPagesPending", "GPURetiredPagesHigh",
    },
    "fabric.yaml": {"IBPhysicalLinkDown", "IBPortNotActive"},
    "node.yaml": {"NodeMemoryUncorrectableErrors"},
}  # fmt: skip
CRD_SCHEMA = Path(__file__).parents[1] / "data" / "crds" / "prometheusrules.schema.json"
JOB = JobIdentity(name="llama-70b", namespace="team-a", uid="0b5e6c1e-1111-4222-8333-944445555666")


def _alerts(name: str) -> dict[str, dict[str, Any]]:
    document = yaml.safe_load((rules_dir() / name).read_text())
    return {r["alert"]: r for g in document["groups"] for r in g["rules"] if "alert" in r}


def test_series_gone_stale_keep_the_fault_alerts_firing_for_15_minutes() -> None:
    result = promtool("test", "rules", "tests/scrape_gap_test.yaml", cwd=rules_dir())
    assert result.returncode == 0, result.stdout + result.stderr


def test_exactly_the_fault_rules_keep_firing() -> None:
    for name, faults in FAULT_RULES.items():
        rules = _alerts(name)
        assert faults <= set(rules), sorted(faults - set(rules))
        keeping = {alert for alert, rule in rules.items() if "keep_firing_for" in rule}
        assert keeping == faults, (name, sorted(keeping ^ faults))
        assert {rules[a]["keep_firing_for"] for a in faults} == {KEEP_FIRING_FOR}
    for name in ("kubernetes.yaml", "training.yaml"):
        assert not [a for a, r in _alerts(name).items() if "keep_firing_for" in r], name


def _strict(schema: Any) -> Any:
    """Structural schemas prune unknown fields; here they are errors (a misspelt
    `keepFiringFor` would otherwise vanish on the API server without a word)."""
    if isinstance(schema, dict):
        result = {key: _strict(value) for key, value in schema.items()}
        if "properties" in result and not result.get("x-kubernetes-preserve-unknown-fields"):
            result.setdefault("additionalProperties", False)
        return result
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def test_the_operators_job_scoped_rules_keep_firing_too_and_fit_the_crd() -> None:
    """A job's copy of a fault rule exists only when the job tunes it (docs/alerts.md "Job
    scope"): here every fault rule's priority is overridden, so each is copied."""
    sources = load_sources(rules_dir(), Path("/nonexistent"))
    wanted = set().union(*FAULT_RULES.values())
    workload = {"workloadRef": {"kind": "PyTorchJob", "name": JOB.name}}
    tuned = {**workload, "alerting": {"priorityOverrides": dict.fromkeys(wanted, "P0")}}
    for spec, copied in ((tuned, wanted), (workload, set())):
        model = TrainingJobSpec.model_validate(spec)
        rendered = render_children(JOB, model, sources.rule_files, (), [])
        rule = next(m for m in rendered.manifests if m["kind"] == "PrometheusRule")
        schema = json.loads(CRD_SCHEMA.read_text())["openAPIV3Schema"]
        jsonschema.Draft202012Validator(_strict(schema)).validate(rule)
        rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
        kept = {a for a, r in rules.items() if r.get("keep_firing_for") == KEEP_FIRING_FOR}
        assert kept == copied
