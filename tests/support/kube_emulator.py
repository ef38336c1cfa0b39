"""A Kubernetes API emulator for operator tests: kmock's KubernetesEmulator, extended.

kmock 0.8 stores objects and serves list/watch/get/create/patch/delete over real HTTP, but
it lacks much of what a real API server does. This module is the ONE place where we add it;
`tests/operator/test_kube_emulator.py` tests every extension on its own.

Added on top of kmock:
- metadata: `uid`, a cluster-wide increasing `resourceVersion`, `generation` (bumped when
  anything outside metadata/status changes), `creationTimestamp`; `generateName`.
- 201 on create; 409 AlreadyExists; 404 for unknown resources and objects; 405 for PUT;
  `apiVersion`/`kind` filled in on create when the client left them out (kopf's Events).
- label selectors (`?labelSelector=`) on list and watch: `k=v`, `k==v`, `k!=v`, `k in (..)`,
  `k notin (..)`, `k`, `!k`. A watch filters by the object's current labels; unlike a real
  server it sends no DELETED when an object stops matching (the operator's watches use no
  selector, only its lists do).
- watch: subscribes before the snapshot (no lost events) and honours `?resourceVersion=`.
- status subresource separation: for resources declared with `subresources=['status']`,
  create and main-endpoint patches ignore `status`; `/status` patches change only `status`.
- optimistic locking: a merge patch carrying `metadata.resourceVersion` that is not current
  gets 409 Conflict; a JSON patch whose `test` op fails gets 422 (kopf relies on that).
- finalizers + `deletionTimestamp` (from kmock) and background garbage collection by
  ownerReferences: a dependent is deleted when none of its owners (by uid) exists any more.
- fault injection: `inject_fault("create", "prometheusrules", 500, times=2)` answers the next
  two matching calls with that status, without touching state.
- a `validator` hook: every object about to be stored by a create or patch is passed to it;
  a ValueError answers 422 (the operator tests plug in strict schema validation). A write
  through the status subresource goes to the validator's `validate_status` when it has
  one: the API server checks only the status schema there, so an object stored before a
  stricter schema still takes status writes.
- call recording: every resource call is kept in `calls` as `ApiCall(verb, group, resource,
  subresource)`, where verb is the RBAC verb (get, list, watch, create, patch, delete), with
  its User-Agent in `agents` and its namespace (None: cluster-scoped or all namespaces) in
  `namespaces`; `recorded_calls(exclude_agent="kmock/")` leaves out the
  tests' own requests.
- an index of object keys per resource, so lists stay linear in large runs (kmock scans
  every stored object on every request).

Not emulated (the operator does not use them): field selectors, paging, server-side apply,
strategic merge (treated as a JSON merge patch), PUT, admission, RBAC, schema validation.
"""

from __future__ import annotations

import copy
import datetime
import functools
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
from kmock._internal import parsing, rendering

_HISTORY_LIMIT = 8  # versions kept per object; bounds memory in long runs (the benchmark)


_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock's path parser, also knowing the core resource `namespaces` (kmock reads
    `/api/v1/namespaces[/<name>]` as a namespace prefix with no resource)."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and (
        len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))
    ):
        name = parts[3] if len(parts) > 3 else None
        return parsing.ParsedPath("", "v1", "namespaces", None, name, (parts[4:] or [None])[0])
    return _kmock_parse_path(path)


parsing.parse_path = _parse_path


@dataclass(frozen=True, order=True)
class ApiCall:
    """One API call as RBAC sees it."""

    verb: str
    group: str
    resource: str
    subresource: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "verb": self.verb,
            "group": self.group,
            "resource": self.resource,
            "subresource": self.subresource,
        }


@dataclass(frozen=True)
class Sent:
    """One HTTP request as it arrived: its method, its path and query exactly as sent
    (percent-escapes kept), and its User-Agent."""

    method: str
    raw_path: str
    agent: str


@dataclass
class Fault:
    verb: str
    resource: str
    status: int
    times: int
    subresource: str | None = None  # None: any (main or sub-resource)


# --- label selectors (pure) ---------------------------------------------------------------

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    """Splits on commas that are not inside parentheses."""
    parts: list[str] = []
    depth, current = 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


@functools.lru_cache(maxsize=4096)
def _terms(selector: str) -> tuple[str, ...]:
    return tuple(_split_selector(selector))


def label_selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """True when `labels` satisfy the Kubernetes label selector string `selector`."""
    for term in _terms(selector):
        set_match = _SET_RE.match(term)
        if set_match:
            key, op, raw_values = set_match.groups()
            values = {value.strip() for value in raw_values.split(",") if value.strip()}
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and key in labels and labels[key] in values:
                return False
        elif "!=" in term:
            key, value = (part.strip() for part in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (part.strip() for part in re.split(r"==?", term, maxsplit=1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _verb(request: rendering.Request) -> str:
    action = request.action
    if action == kmock.action.LIST:
        return "list"
    if action == kmock.action.WATCH:
        return "watch"
    if action == kmock.action.FETCH:
        return "get"
    if action == kmock.action.CREATE:
        return "create"
    if action == kmock.action.UPDATE:
        return "patch"
    if action == kmock.action.DELETE:
        return "delete"
    if request.method == kmock.method.DELETE:
        return "deletecollection"
    return "update" if request.method == kmock.method.PUT else str(request.method).lower()


class KubeEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    """kmock's emulator with the extensions listed in the module docstring."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.rv = 0
        self.calls: list[ApiCall] = []
        self.agents: list[str] = []  # the User-Agent of each call, parallel to `calls`
        self.namespaces: list[str | None] = []  # the namespace of each call (RBAC scope)
        self.requests: list[Sent] = []  # every request, resource call or not
        self.faults: list[Fault] = []
        self.history_limit = _HISTORY_LIMIT
        # Called with every object as it would be stored after a create or patch; a raised
        # ValueError rejects the write with 422 (tests plug schema validation in here).
        self.validator: Callable[[dict[str, Any]], None] | None = None
        self._keys_by_resource: dict[Any, list[tuple[Any, Any, str]]] = {}

    # --- public helpers for tests ---------------------------------------------------------

    def declare(
        self,
        resource: str,
        kind: str,
        *,
        namespaced: bool = True,
        status: bool = False,
        verbs: Iterable[str] = ("create", "get", "list", "watch", "patch", "delete"),
    ) -> None:
        """Declares a resource, e.g. `declare("v1/pods", "Pod")`."""
        self.resources[resource] = dict(
            kind=kind,
            namespaced=namespaced,
            subresources=["status"] if status else [],
            verbs=list(verbs),
        )

    def inject_fault(
        self, verb: str, resource: str, status: int, times: int = 1, subresource: str | None = None
    ) -> None:
        self.faults.append(Fault(verb, resource, status, times, subresource))

    def recorded_calls(self, exclude_agent: str | None = None) -> set[ApiCall]:
        """The distinct calls made, optionally without those of one client (by User-Agent
        prefix; the tests' own kmock client sends `kmock/...`)."""
        return {
            call
            for call, agent in zip(self.calls, self.agents, strict=True)
            if exclude_agent is None or not agent.startswith(exclude_agent)
        }

    def sent_paths(self, exclude_agent: str | None = None) -> list[str]:
        """The raw path of every request, in order, optionally without one client's."""
        return [
            sent.raw_path
            for sent in self.requests
            if exclude_agent is None or not sent.agent.startswith(exclude_agent)
        ]

    def live(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The raw objects of `resource` (e.g. "v1/configmaps") that currently exist."""
        wanted = kmock.resource(resource)
        return [
            obj.raw
            for (res, ns, _), obj in self.objects.items()
            if res == wanted and not obj.deleted and (namespace is None or ns == namespace)
        ]

    def get_live(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        raw: dict[str, Any] = self.objects[key].raw
        return raw

    def _get_resources(self) -> list[Any]:
        # kmock derives resources from every stored object on every request (O(objects));
        # ours are all declared, which keeps large runs (the benchmark) linear.
        return list(self.resources)

    # --- request handling -----------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request  # the request-target as it arrived, escapes kept
        raw_path = raw.raw_path if raw is not None else str(request.url.raw_path_qs)
        agent = str(request.headers.get("User-Agent", ""))
        method = getattr(request.method, "value", request.method)
        self.requests.append(Sent(str(method).upper(), raw_path, agent))
        resource = request.resource
        if resource is None or resource.plural is None:
            return await kmock.KubernetesScaffold._handle(self, request)  # discovery
        verb = _verb(request)
        group = resource.group or ""
        self.calls.append(ApiCall(verb, group, resource.plural, request.subresource or ""))
        self.agents.append(agent)
        self.namespaces.append(request.namespace or None)
        if not any(resource == known for known in self._get_resources()):
            raise kmock.KubernetesResourceNotFoundError()
        self._raise_injected_fault(verb, resource.plural, request.subresource)
        if verb == "watch":
            return await kmock.KubernetesScaffold._handle(self, request)
        async with self._lock:
            status, body = await self._serve(verb, request)
        return aiohttp.web.json_response(body, status=status)

    def _raise_injected_fault(self, verb: str, plural: str, subresource: str | None) -> None:
        for fault in self.faults:
            if fault.times <= 0 or fault.verb != verb or fault.resource != plural:
                continue
            if fault.subresource is not None and fault.subresource != (subresource or ""):
                continue
            fault.times -= 1
            reasons = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError"}
            raise kmock.KubernetesError(
                status=fault.status,
                reason=reasons.get(fault.status, "Injected"),
                message=f"injected fault for {verb} {plural}",
                details={"injected": True},
            )

    async def _serve(self, verb: str, request: rendering.Request) -> tuple[int, Any]:
        if verb == "list":
            return 200, self._list(request)
        if verb == "get":
            return 200, self._existing(request, request.name).raw
        if verb == "create":
            return 201, await self._create(request)
        if verb == "patch":
            return 200, await self._patch(request)
        if verb == "delete":
            return 200, await self._delete(request)
        raise kmock.KubernetesError(status=405, reason="MethodNotAllowed", message=verb)

    def _validate(self, raw: dict[str, Any], subresource: str | None = None) -> None:
        if self.validator is None:
            return
        check = self.validator
        if subresource == "status":
            check = getattr(self.validator, "validate_status", self.validator)
        try:
            check(raw)
        except ValueError as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc

    def _has_status_subresource(self, resource: kmock.resource) -> bool:
        return "status" in (
            self.resources[resource].subresources if resource in self.resources else ()
        )

    def _namespace(self, request: rendering.Request, data: Mapping[str, Any] | None = None) -> Any:
        resource = request.resource
        if resource in self.resources and self.resources[resource].namespaced is False:
            return None
        if request.namespace is not None:
            return request.namespace
        return (data or {}).get("metadata", {}).get("namespace")

    def _existing(self, request: rendering.Request, name: str | None) -> kmock.Object:
        key = (request.resource, self._namespace(request), name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return self.objects[key]

    def _list(self, request: rendering.Request) -> dict[str, Any]:
        selector = request.params.get("labelSelector", "")
        namespace = self._namespace(request)
        items = []
        for key in self._keys(request.resource):
            obj = self.objects[key]
            if obj.deleted or (namespace is not None and key[1] != namespace):
                continue
            raw = obj.raw
            if label_selector_matches(selector, raw.get("metadata", {}).get("labels") or {}):
                items.append(raw)
        # Pagination as the API server does it (`limit`, then the `continue` token given).
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        limit = int(request.params.get("limit") or 0)
        start = int(request.params.get("continue") or 0)
        if limit > 0:
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            items = items[start : start + limit]
        return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items}

    def _keys(self, resource: Any) -> list[tuple[Any, Any, str]]:
        """Object keys of one resource, in creation order (an index; kmock has none)."""
        keys = self._keys_by_resource.get(resource)
        if keys is None:  # objects placed directly into `objects` by a test
            keys = [key for key in self.objects if key[0] == resource]
            self._keys_by_resource[resource] = keys
        return keys

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    async def _emit(self, request_resource: Any, kind: str, raw: dict[str, Any]) -> None:
        await self._buses[request_resource].put({"type": kind, "object": copy.deepcopy(raw)})

    def _store(self, key: tuple[Any, Any, str], raw: dict[str, Any]) -> None:
        obj = self.objects[key]
        obj.history.append(raw)
        if len(obj.history) > self.history_limit:
            del obj.history[: len(obj.history) - self.history_limit]

    async def _create(self, request: rendering.Request) -> dict[str, Any]:
        data = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
        meta = data.setdefault("metadata", {})
        resource = request.resource
        if resource in self.resources:  # the server knows what it stores, as a real one does
            data.setdefault("kind", self.resources[resource].kind)
            data.setdefault("apiVersion", f"{resource.group}/{resource.version}".lstrip("/"))
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise kmock.KubernetesError(status=422, reason="Invalid", message="name is required")
        namespace = self._namespace(request, data)
        if namespace is not None:
            meta["namespace"] = namespace
        key = (request.resource, namespace, meta["name"])
        if key in self.objects and not self.objects[key].deleted:
            raise kmock.KubernetesError(
                status=409, reason="AlreadyExists", message=f"{meta['name']} already exists"
            )
        if self._has_status_subresource(request.resource):
            data.pop("status", None)
        self._validate(data)
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=self._next_rv(),
            generation=1,
            creationTimestamp=_now(),
        )
        if key in self.objects:
            self._store(key, data)
        else:
            self._keys(request.resource)
            self.objects[key] = data
            self._keys_by_resource[request.resource].append(key)
        await self._emit(request.resource, "ADDED", data)
        return data

    async def _patch(self, request: rendering.Request) -> dict[str, Any]:
        obj = self._existing(request, request.name)
        old = copy.deepcopy(obj.raw)
        patch = request.data
        try:
            if isinstance(patch, list):
                new = jsonpatch.apply_patch(old, patch, in_place=False)
            elif isinstance(patch, dict):
                wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
                if wanted_rv is not None and wanted_rv != old["metadata"]["resourceVersion"]:
                    raise kmock.KubernetesError(
                        status=409,
                        reason="Conflict",
                        message="the object has been modified; please apply your changes "
                        "to the latest version and try again",
                    )
                new = _merge_patch(old, patch)
            else:
                raise kmock.KubernetesError(status=400, reason="BadRequest", message="no body")
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
        if self._has_status_subresource(request.resource):
            if request.subresource == "status":
                status = new.get("status")
                new = copy.deepcopy(old)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
            elif "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for immutable in ("uid", "name", "namespace", "creationTimestamp", "generation"):
            if immutable in old["metadata"]:
                meta[immutable] = old["metadata"][immutable]
        if _spec_part(new) != _spec_part(old):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        status_only = (
            request.subresource if self._has_status_subresource(request.resource) else None
        )
        self._validate(new, status_only)
        meta["resourceVersion"] = self._next_rv()
        key = (request.resource, self._namespace(request), request.name)
        self._store(key, new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._remove(key)
        else:
            await self._emit(request.resource, "MODIFIED", new)
        return new

    async def _delete(self, request: rendering.Request) -> dict[str, Any]:
        obj = self._existing(request, request.name)
        key = (request.resource, self._namespace(request), request.name)
        raw = copy.deepcopy(obj.raw)
        meta = raw["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = _now()
                meta["resourceVersion"] = self._next_rv()
                self._store(key, raw)
                await self._emit(request.resource, "MODIFIED", raw)
            return raw
        await self._remove(key)
        return raw

    async def _remove(self, key: tuple[Any, Any, str]) -> None:
        """Deletes the object for good, then collects its orphaned dependents."""
        raw = copy.deepcopy(self.objects[key].raw)
        raw["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key].delete()
        await self._emit(key[0], "DELETED", raw)
        await self._collect_garbage()

    async def _collect_garbage(self) -> None:
        live_uids = {
            obj.raw["metadata"].get("uid") for obj in self.objects.values() if not obj.deleted
        }
        for key, obj in list(self.objects.items()):
            if obj.deleted:
                continue
            owners = obj.raw["metadata"].get("ownerReferences") or []
            if owners and not any(owner.get("uid") in live_uids for owner in owners):
                meta = obj.raw["metadata"]
                if meta.get("finalizers"):
                    if not meta.get("deletionTimestamp"):
                        raw = copy.deepcopy(obj.raw)
                        raw["metadata"]["deletionTimestamp"] = _now()
                        raw["metadata"]["resourceVersion"] = self._next_rv()
                        self._store(key, raw)
                        await self._emit(key[0], "MODIFIED", raw)
                else:
                    await self._remove(key)  # recurses into its own dependents

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        yield b""  # send the headers now
        since = int(request.params.get("resourceVersion") or 0)
        selector = request.params.get("labelSelector", "")
        namespace = self._namespace(request)
        bus = self._buses[request.resource]

        def wanted(raw: Mapping[str, Any]) -> bool:
            meta = raw.get("metadata", {})
            return (
                namespace is None or meta.get("namespace") == namespace
            ) and label_selector_matches(selector, meta.get("labels") or {})

        async with self._lock:
            marker = await bus.mark()
            snapshot = [
                copy.deepcopy(self.objects[key].raw)
                for key in self._keys(request.resource)
                if not self.objects[key].deleted
            ]
        try:
            for raw in snapshot:
                if wanted(raw) and int(raw["metadata"].get("resourceVersion", 0)) > since:
                    yield {"type": "ADDED", "object": raw}
            async for event in bus.stream(since=marker):
                if wanted(event["object"]):
                    yield event
        finally:
            await bus.unmark(marker)


def _spec_part(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in raw.items() if key not in ("metadata", "status")}


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result
