"""One job identity (issue 45): `JobRef` is an alert's TrainingJob, and every other form of
a job is one of its two renderings, whichever part writes it: the words people read
(`str(job)`: cards, the console, the payload's `job`, `labels.job_text` from bare labels,
`storm.job_title` from a key, the channels' `payload_contract.job_of`) and the key the
policy's states are keyed by (`job.key`: the storm unit `storm.job_key`)."""

from __future__ import annotations

import pytest

from trainsentry.alerts import JobRef
from trainsentry.gateway.policy.storm import job_key, job_title
from trainsentry.labels import job_text
from trainsentry.notifiers.payload_contract import job_of

LABELS = [
    {"namespace": "ml", "trainingjob": "llama-70b"},
    {"trainingjob": "llama-70b"},  # no namespace
    {"namespace": "ml", "job_name": "bert", "job": "node-exporter"},
    {"namespace": "team/a", "trainingjob": "x/y"},  # labels are anyone's
]


@pytest.mark.parametrize("labels", LABELS)
def test_every_form_of_a_training_job_is_a_rendering_of_its_job_ref(
    labels: dict[str, str],
) -> None:
    job = JobRef.from_labels(labels)
    assert job is not None
    assert job_text(labels) == str(job)
    assert job_key(labels) == job.key
    assert job_title(job.key) == str(job)
    assert job_of({"priority": "P1", "status": "firing", "labels": labels}) == str(job)
    assert job_of({"priority": "P1", "status": "firing", "job": str(job)}) == str(job)


def test_an_alert_of_no_training_job_has_no_job_ref_and_its_own_storm_unit() -> None:
    scrape = {"namespace": "kube-system", "job": "dcgm-exporter"}
    assert JobRef.from_labels(scrape) is None and job_text(scrape) == ""
    assert job_key(scrape) == "job:kube-system/dcgm-exporter"
    assert job_title(job_key(scrape)) == "kube-system/dcgm-exporter"
    assert job_key({}) == "cluster"
