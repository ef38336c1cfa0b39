"""The Kubernetes resources trainsentry touches, typed, and their API paths. Pure.

A `Resource` is one kind of the API (group, version, plural, kind, scope). Its `path` joins
the segments of a URL path; each segment is percent-encoded whole (`quote(seg, safe="")`:
a '/' or '%' in a name becomes `%2F` or `%25`, never a separator or an escape an HTTP
client would decode), and a segment that is empty, '.' or '..' is refused (encoding cannot
make those safe: a client collapses them). `Kube` checks every name by Kubernetes' rules
(names.py) before it builds a path; the escaping here holds even for a caller that did not.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from trainsentry.kube.names import NOT_PATH_SEGMENTS, InvalidName


def segment(value: str, what: str) -> str:
    """Pure: one path segment, percent-encoded whole; InvalidName for '', '.' and '..'."""
    if not isinstance(value, str) or not value or value in NOT_PATH_SEGMENTS:
        raise InvalidName(what, value, ["may not be empty, '.' or '..' in an API path"])
    return quote(value, safe="")


@dataclass(frozen=True)
class Resource:
    """One resource of the Kubernetes API. `group` "" is the core group (`/api/v1`)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """Pure: the API path of one object (with `name`), of its subresource, or of the
        collection (without `name`; for a namespaced resource, `namespace` None is every
        namespace's). Every segment is escaped (module docstring). A cluster-scoped
        resource takes no namespace; a namespaced object needs one; a subresource needs a
        name. Raises InvalidName for an unusable segment, ValueError for a misuse."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if not self.namespaced and namespace is not None:
            raise ValueError(f"{self.plural} is cluster-scoped; it takes no namespace")
        if self.namespaced and namespace is None and name is not None:
            raise ValueError(f"{self.plural} is namespaced; a namespace is required")
        if namespace is not None:
            parts += ["namespaces", segment(namespace, "namespace")]
        parts.append(self.plural)
        if name is not None:
            parts.append(segment(name, f"{self.kind} name"))
        if subresource is not None:
            if name is None:
                raise ValueError("a subresource needs an object name")
            parts.append(segment(subresource, "subresource"))
        return "/".join(parts)


PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
EVENTS = Resource("", "v1", "events", "Event")
PROMETHEUSRULES = Resource("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule")
PODMONITORS = Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
TRAININGJOBS = Resource("trainsentry.io", "v1alpha1", "trainingjobs", "TrainingJob")
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
VOLCANOJOBS = Resource("batch.volcano.sh", "v1alpha1", "jobs", "Job")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
MUTATING_WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)

# The kinds of the operator's children (render.py), by kind.
BY_KIND = {res.kind: res for res in (CONFIGMAPS, PROMETHEUSRULES, PODMONITORS, TRAININGJOBS)}
