"""`Kube`: generic, typed, retrying access to the Kubernetes API with plain-dict objects.

One generic client instead of the per-kind generated APIs: the operator and the gateway
touch built-ins and custom resources alike, always as plain dicts, and every call goes
through one policy:
- names first: every namespace is checked as a DNS-1123 label and every object name as a
  DNS-1123 subdomain (names.py) BEFORE any request; a bad one raises `InvalidName` (a
  ValueError, never a KubeError: it is the caller's input, not the API's answer);
- paths from `Resource.path`, every segment percent-encoded (resources.py);
- retries with exponential backoff and jitter on 429, 5xx and lost connections
  (`RetryPolicy`); any other failure, or the last retry's, is a `KubeError` with the HTTP
  status (0: no answer); JSON merge patches (RFC 7386).

`LazyApiClient` opens the underlying ApiClient at first use; `default_api_client` is the
in-cluster service account, else the local kubeconfig.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from trainsentry.kube.names import InvalidName, check_name, check_namespace, label_problems
from trainsentry.kube.resources import Resource

log = logging.getLogger(__name__)

RETRYABLE = frozenset({429, 500, 502, 503, 504})
T = TypeVar("T")

# An object's `status.conditions` (the list a merge patch replaces whole).
Conditions = list[dict[str, Any]]


async def default_api_client() -> Any:
    """An ApiClient for the pod's service account when running in a cluster, else for the
    local kubeconfig."""
    from kubernetes_asyncio import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config()
    return client.ApiClient()


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


def object_path(
    res: Resource, namespace: str | None, name: str | None = None, subresource: str | None = None
) -> str:
    """Pure: `res.path(...)` after checking the namespace (a DNS-1123 label), the name (a
    DNS-1123 subdomain) and the subresource (a label); InvalidName names the one at fault."""
    if namespace is not None:
        check_namespace(namespace)
    if name is not None:
        check_name(name, f"{res.kind} name")
    if subresource is not None and (problems := label_problems(subresource)):
        raise InvalidName("subresource", subresource, problems)
    return res.path(namespace, name, subresource)


class Kube:
    """Generic, retrying access to the Kubernetes API with plain-dict objects (module
    docstring). `timeout_s` bounds each HTTP request (None: the client's default)."""

    def __init__(
        self, api: ApiClient, policy: RetryPolicy | None = None, *, timeout_s: float | None = None
    ) -> None:
        self.api = api
        self.policy = policy or RetryPolicy()
        self.timeout_s = timeout_s

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        extra: dict[str, Any] = {}
        if self.timeout_s is not None:
            extra["_request_timeout"] = self.timeout_s

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
                **extra,
            )

        return await with_retries(once, self.policy, f"{method} {path}")

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none (404)."""
        path = object_path(res, namespace, name)
        try:
            result: dict[str, Any] = await self._call("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list_page(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        limit: int | None = None,
        token: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a list: (at most `limit` objects, the `continue` token of the next
        page or None after the last). `token` is the previous page's."""
        query = [("labelSelector", label_selector)] if label_selector else []
        if limit is not None:
            query.append(("limit", str(int(limit))))
        if token:
            query.append(("continue", token))
        result = await self._call("GET", object_path(res, namespace), query=query)
        items: list[dict[str, Any]] = result.get("items") or []
        next_token = (result.get("metadata") or {}).get("continue") or None
        return items, (str(next_token) if next_token else None)

    async def list(
        self, res: Resource, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object of `res` in `namespace` (None: every namespace, or cluster-scoped)
        matching `label_selector`, in one request."""
        items, _ = await self.list_page(res, namespace, label_selector=label_selector)
        return items

    async def create(
        self, res: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Creates `body` (its name, if any, checked like every other) and answers it."""
        name = (body.get("metadata") or {}).get("name")
        if name is not None:
            check_name(name, f"{res.kind} name")
        result: dict[str, Any] = await self._call("POST", object_path(res, namespace), body=body)
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
            object_path(res, namespace, name, subresource),
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
        """Deletes the object; False when there was none (404)."""
        try:
            await self._call("DELETE", object_path(res, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
