"""A small typed shell over kubernetes_asyncio: generic get/list/create/patch/delete by resource,
JSON merge patches, and retries with exponential backoff on 429 and 5xx.

One generic client instead of the per-kind generated APIs: the operator touches built-ins and
custom resources alike, always as plain dicts, and every call goes through one retry policy.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

RETRYABLE = frozenset({429, 500, 502, 503, 504})
T = TypeVar("T")

# An object's `status.conditions` (the list a merge patch replaces whole).
Conditions = list[dict[str, Any]]


class LazyApiClient:
    """A Kubernetes ApiClient opened from `factory` at its first use, not at start (a gateway
    stage whose cluster is unreachable still starts), and closed by `close()`; a use after
    that opens a new one. Invariant: at most one client is open at a time (concurrent first
    uses wait for the same one)."""

    def __init__(self, factory: Callable[[], Awaitable[Any]]) -> None:
        self._factory = factory
        self._api: Any = None
        self._lock = asyncio.Lock()

    async def get(self) -> Any:
        async with self._lock:
            if self._api is None:
                self._api = await self._factory()
            return self._api

    async def close(self) -> None:
        async with self._lock:
            api, self._api = self._api, None
            if api is not None and hasattr(api, "close"):  # tests may hand in a bare stand-in
                await api.close()


def event(
    involved: dict[str, str],
    namespace: str,
    reason: str,
    message: str,
    *,
    warning: bool,
    component: str,
    at: datetime,
) -> dict[str, Any]:
    """Pure: a core/v1 Event about `involved` (its apiVersion, kind, name, uid, and namespace
    for a namespaced object) in `namespace`, first and last seen `at`, counted once; the
    name is generated from the object's (cut to 200 characters), the message cut to 1,000."""
    stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name'][:200]}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1000],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(
        self, namespace: str | None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced:
            if namespace is None:
                raise ValueError(f"{self.plural} is namespaced; a namespace is required")
            base += f"/namespaces/{namespace}"
        parts = [base, self.plural]
        if name is not None:
            parts.append(name)
        if subresource is not None:
            parts.append(subresource)
        return "/".join(parts)


PODS = Resource("", "v1", "pods")
NODES = Resource("", "v1", "nodes", namespaced=False)
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
PROMETHEUSRULES = Resource("monitoring.coreos.com", "v1", "prometheusrules")
PODMONITORS = Resource("monitoring.coreos.com", "v1", "podmonitors")
TRAININGJOBS = Resource("trainsentry.io", "v1alpha1", "trainingjobs")
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs")
VOLCANOJOBS = Resource("batch.volcano.sh", "v1alpha1", "jobs")

BY_KIND = {
    "ConfigMap": CONFIGMAPS,
    "PrometheusRule": PROMETHEUSRULES,
    "PodMonitor": PODMONITORS,
    "TrainingJob": TRAININGJOBS,
}


class KubeError(Exception):
    """An API call failed for good (after retries, or not retryable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 2.0

    def delay(self, attempt: int) -> float:
        ceiling: float = min(self.max_delay, self.base_delay * 2.0**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)


async def with_retries(call: Callable[[], Awaitable[T]], policy: RetryPolicy, what: str) -> T:
    """Runs `call`, retrying API errors in RETRYABLE (and lost connections) with backoff."""
    for attempt in range(policy.attempts):
        try:
            return await call()
        except ApiException as exc:
            status = int(exc.status or 0)
            if status not in RETRYABLE or attempt == policy.attempts - 1:
                raise KubeError(status, f"{what}: {exc.reason}") from exc
            log.info("event=api_retry call=%r status=%s attempt=%d", what, status, attempt + 1)
        except (TimeoutError, OSError) as exc:
            if attempt == policy.attempts - 1:
                raise KubeError(0, f"{what}: {exc!r}") from exc
            log.info("event=api_retry call=%r error=%r attempt=%d", what, exc, attempt + 1)
        await asyncio.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


class Kube:
    """Generic, retrying access to the Kubernetes API with plain-dict objects."""

    def __init__(self, api: ApiClient, policy: RetryPolicy | None = None) -> None:
        self.api = api
        self.policy = policy or RetryPolicy()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        async def once() -> Any:
            return await self.api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                response_types_map={200: "object", 201: "object", 202: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )

        return await with_retries(once, self.policy, f"{method} {path}")

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", res.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list(
        self, res: Resource, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        path = (
            res.path(namespace)
            if namespace or not res.namespaced
            else (Resource(res.group, res.version, res.plural, namespaced=False).path(None))
        )
        result = await self._call("GET", path, query=query)
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    async def create(
        self, res: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", res.path(namespace), body=body)
        return result

    async def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): `None` removes a key, lists are replaced."""
        result: dict[str, Any] = await self._call(
            "PATCH",
            res.path(namespace, name, subresource),
            body=patch,
            content_type="application/merge-patch+json",
        )
        return result

    async def rewrite_conditions(
        self,
        res: Resource,
        namespace: str,
        name: str,
        rewrite: Callable[[Conditions, dict[str, Any]], Conditions],
        attempts: int = 3,
    ) -> None:
        """Read-modify-write of an object's `status.conditions`: `rewrite(conditions,
        metadata)` gives the new list, patched with the resourceVersion read, so another
        writer's conditions are never overwritten (a merge patch replaces the whole list). A
        conflict (409) reads again, up to `attempts` times; a missing object is left alone."""
        for _attempt in range(attempts):
            body = await self.get(res, namespace, name)
            if body is None:
                return
            meta, status = body.get("metadata") or {}, body.get("status") or {}
            patch = {
                "metadata": {"resourceVersion": meta.get("resourceVersion")},
                "status": {"conditions": rewrite(status.get("conditions") or [], meta)},
            }
            try:
                await self.patch(res, namespace, name, patch, "status")
                return
            except KubeError as exc:
                if exc.status != 409:
                    raise

    async def delete(self, res: Resource, namespace: str | None, name: str) -> bool:
        try:
            await self._call("DELETE", res.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
