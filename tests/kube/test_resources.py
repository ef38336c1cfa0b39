"""API paths (trainsentry/kube/resources.py): every segment percent-encoded, the segments
no encoding makes safe refused, the typed resources as the API names them."""

from __future__ import annotations

import re

import pytest
import yarl

from trainsentry.kube.names import InvalidName
from trainsentry.kube.resources import (
    BY_KIND,
    CONFIGMAPS,
    NODES,
    PODS,
    SECRETS,
    TRAININGJOBS,
    Resource,
)
from trainsentry.operator import spec


def test_paths_of_objects_collections_and_subresources() -> None:
    assert SECRETS.path("team-a", "bot") == "/api/v1/namespaces/team-a/secrets/bot"
    assert SECRETS.path("team-a") == "/api/v1/namespaces/team-a/secrets"
    assert PODS.path(None) == "/api/v1/pods"  # every namespace's
    assert NODES.path(None, "gpu-1.example.com") == "/api/v1/nodes/gpu-1.example.com"
    assert TRAININGJOBS.path("ml", "big", "status") == (
        "/apis/trainsentry.io/v1alpha1/namespaces/ml/trainingjobs/big/status"
    )


@pytest.mark.parametrize(
    ("name", "segment"),
    [
        ("../../team-b/secrets/bot", "..%2F..%2Fteam-b%2Fsecrets%2Fbot"),
        ("%2e%2e/%2e%2e/team-b/secrets/bot", "%252e%252e%2F%252e%252e%2Fteam-b%2Fsecrets%2Fbot"),
        ("a b?c#d", "a%20b%3Fc%23d"),
        ("bøt", "b%C3%B8t"),
        ("...", "..."),  # three dots are a name to a URL, not a dot segment
    ],
)
def test_every_segment_is_escaped_whole(name: str, segment: str) -> None:
    """Defence in depth: even a name the client's check would refuse stays one segment,
    and an HTTP client (yarl, under aiohttp) keeps it one: no '/', no decoded escape."""
    path = CONFIGMAPS.path("team-a", name)
    assert path == f"/api/v1/namespaces/team-a/configmaps/{segment}"
    url = yarl.URL("http://127.0.0.1" + path)
    assert url.raw_path == path
    assert url.raw_parts[-1] == segment and url.parts[-1] == name
    escaped_namespace = CONFIGMAPS.path("../kube-system", "x")
    assert escaped_namespace == "/api/v1/namespaces/..%2Fkube-system/configmaps/x"


@pytest.mark.parametrize("bad", ["", ".", ".."])
def test_segments_no_escape_makes_safe_are_refused(bad: str) -> None:
    with pytest.raises(InvalidName, match=re.escape("may not be empty, '.' or '..'")):
        SECRETS.path("team-a", bad)
    with pytest.raises(InvalidName):
        SECRETS.path(bad, "bot")
    with pytest.raises(InvalidName):
        TRAININGJOBS.path("ml", "big", bad)


def test_scope_misuse_is_an_error() -> None:
    with pytest.raises(ValueError, match="cluster-scoped"):
        NODES.path("team-a", "gpu-1")
    with pytest.raises(ValueError, match="namespace is required"):
        SECRETS.path(None, "bot")
    with pytest.raises(ValueError, match="subresource needs an object name"):
        TRAININGJOBS.path("ml", None, "status")


def test_the_typed_resources() -> None:
    assert SECRETS.api_version == "v1" and SECRETS.kind == "Secret"
    assert TRAININGJOBS.api_version == spec.API_VERSION
    assert (TRAININGJOBS.group, TRAININGJOBS.version, TRAININGJOBS.plural, TRAININGJOBS.kind) == (
        spec.GROUP,
        spec.VERSION,
        spec.PLURAL,
        spec.KIND,
    )
    assert set(BY_KIND) == {"ConfigMap", "PrometheusRule", "PodMonitor", "TrainingJob"}
    assert all(res.kind == kind for kind, res in BY_KIND.items())
    assert Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob").api_version == (
        "kubeflow.org/v1"
    )
