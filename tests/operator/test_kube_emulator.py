"""Tests of the extensions in tests/support/kube_emulator.py, over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from tests.support.eventually import eventually
from tests.support.kube_emulator import ApiCall, KubeEmulator, label_selector_matches

TJ = "/apis/trainsentry.io/v1alpha1/namespaces/ns1/trainingjobs"
CM = "/api/v1/namespaces/ns1/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def emu() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator, kmock.Server(emulator):
        emulator.declare("v1/configmaps", "ConfigMap")
        emulator.declare("v1/nodes", "Node", namespaced=False)
        emulator.declare("trainsentry.io/v1alpha1/trainingjobs", "TrainingJob", status=True)
        yield emulator


async def call(
    emu: KubeEmulator, method: str, url: str, body: Any = None, **kwargs: Any
) -> tuple[int, Any]:
    headers = (
        MERGE
        if method == "PATCH" and isinstance(body, dict)
        else {"Content-Type": "application/json-patch+json"}
        if method == "PATCH"
        else {}
    )
    async with emu.request(method, url, json=body, headers=headers, **kwargs) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a!=1", {"a": "1"}, False),
        ("a in (1, 2),b", {"a": "2", "b": "x"}, True),
        ("a in (1,2)", {"a": "3"}, False),
        ("a notin (1,2)", {"a": "3"}, True),
        ("a notin (1,2)", {"a": "1"}, False),
        ("!a", {"a": "1"}, False),
        ("!a", {"b": "1"}, True),
        ("", {"x": "y"}, True),
    ],
)
def test_label_selector_matches(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert label_selector_matches(selector, labels) is expected


async def test_create_assigns_metadata_and_generate_name(emu: KubeEmulator) -> None:
    status, obj = await call(emu, "POST", CM, {"metadata": {"generateName": "cm-"}, "data": {}})
    assert status == 201
    meta = obj["metadata"]
    assert meta["name"].startswith("cm-") and len(meta["name"]) == 8
    assert meta["uid"] and int(meta["resourceVersion"]) > 0 and meta["generation"] == 1
    status, again = await call(emu, "POST", CM, {"metadata": {"name": meta["name"]}})
    assert status == 409 and again["reason"] == "AlreadyExists"


async def test_list_and_watch_honour_label_selectors(emu: KubeEmulator) -> None:
    for name, labels in [("a", {"app": "x"}), ("b", {"app": "y"}), ("c", {})]:
        await call(emu, "POST", CM, {"metadata": {"name": name, "labels": labels}})
    _, listed = await call(emu, "GET", CM, params={"labelSelector": "app=x"})
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a"]
    _, listed = await call(emu, "GET", CM, params={"labelSelector": "app"})
    assert sorted(item["metadata"]["name"] for item in listed["items"]) == ["a", "b"]

    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        params = {"watch": "true", "labelSelector": "app=y", "resourceVersion": "0"}
        async with emu.get(CM, params=params) as resp:
            async for line in resp.content:
                if line.strip():
                    event = json.loads(line)
                    seen.append((event["type"], event["object"]["metadata"]["name"]))

    task = asyncio.create_task(watch())
    await eventually(lambda: seen == [("ADDED", "b")])
    await call(emu, "POST", CM, {"metadata": {"name": "d", "labels": {"app": "y"}}})
    await call(emu, "POST", CM, {"metadata": {"name": "e", "labels": {"app": "x"}}})
    await call(emu, "DELETE", f"{CM}/b")
    await eventually(lambda: seen == [("ADDED", "b"), ("ADDED", "d"), ("DELETED", "b")])
    task.cancel()


async def test_watch_honours_resource_version(emu: KubeEmulator) -> None:
    _, first = await call(emu, "POST", CM, {"metadata": {"name": "old"}})
    await call(emu, "POST", CM, {"metadata": {"name": "new"}})
    seen: list[str] = []

    async def watch() -> None:
        params = {"watch": "true", "resourceVersion": first["metadata"]["resourceVersion"]}
        async with emu.get(CM, params=params) as resp:
            async for line in resp.content:
                if line.strip():
                    seen.append(json.loads(line)["object"]["metadata"]["name"])

    task = asyncio.create_task(watch())
    await eventually(lambda: seen == ["new"])
    task.cancel()


async def test_status_subresource_is_separate(emu: KubeEmulator) -> None:
    status, tj = await call(
        emu,
        "POST",
        TJ,
        {"metadata": {"name": "j"}, "spec": {"worldSize": 2}, "status": {"phase": "Bogus"}},
    )
    assert status == 201 and "status" not in tj
    _, tj = await call(
        emu, "PATCH", f"{TJ}/j", {"spec": {"worldSize": 4}, "status": {"phase": "Ignored"}}
    )
    assert tj["spec"]["worldSize"] == 4 and "status" not in tj
    assert tj["metadata"]["generation"] == 2
    _, tj = await call(
        emu,
        "PATCH",
        f"{TJ}/j/status",
        {"spec": {"worldSize": 9}, "status": {"phase": "Monitoring"}},
    )
    assert tj["spec"]["worldSize"] == 4 and tj["status"] == {"phase": "Monitoring"}
    assert tj["metadata"]["generation"] == 2  # status changes do not bump the generation
    _, tj = await call(emu, "PATCH", f"{TJ}/j", {"metadata": {"labels": {"x": "y"}}})
    assert tj["metadata"]["generation"] == 2 and tj["status"] == {"phase": "Monitoring"}


async def test_optimistic_locking(emu: KubeEmulator) -> None:
    _, node = await call(emu, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    rv = node["metadata"]["resourceVersion"]
    status, node = await call(
        emu,
        "PATCH",
        "/api/v1/nodes/n1",
        {"metadata": {"resourceVersion": rv, "labels": {"a": "1"}}},
    )
    assert status == 200 and node["metadata"]["labels"] == {"a": "1"}
    status, err = await call(
        emu,
        "PATCH",
        "/api/v1/nodes/n1",
        {"metadata": {"resourceVersion": rv, "labels": {"a": "2"}}},
    )
    assert status == 409 and err["reason"] == "Conflict"
    status, _ = await call(
        emu,
        "PATCH",
        "/api/v1/nodes/n1",
        [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}],
    )
    assert status == 422
    assert emu.get_live("v1/nodes", None, "n1")["metadata"]["labels"] == {"a": "1"}


async def test_merge_patch_removes_nulls(emu: KubeEmulator) -> None:
    await call(emu, "POST", CM, {"metadata": {"name": "m", "labels": {"a": "1", "b": "2"}}})
    _, obj = await call(emu, "PATCH", f"{CM}/m", {"metadata": {"labels": {"a": None}}})
    assert obj["metadata"]["labels"] == {"b": "2"}


async def test_owner_reference_garbage_collection(emu: KubeEmulator) -> None:
    _, owner = await call(emu, "POST", TJ, {"metadata": {"name": "j", "finalizers": ["x/y"]}})
    ref = {
        "apiVersion": "trainsentry.io/v1alpha1",
        "kind": "TrainingJob",
        "name": "j",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    child_body = {"metadata": {"name": "child", "ownerReferences": [ref]}}
    _, child = await call(emu, "POST", CM, child_body)
    grandchild_ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "child",
        "uid": child["metadata"]["uid"],
    }
    await call(
        emu, "POST", CM, {"metadata": {"name": "grandchild", "ownerReferences": [grandchild_ref]}}
    )
    await call(emu, "POST", CM, {"metadata": {"name": "unrelated"}})
    status, marked = await call(emu, "DELETE", f"{TJ}/j")
    assert status == 200 and marked["metadata"]["deletionTimestamp"]
    assert emu.get_live("v1/configmaps", "ns1", "child") is not None  # owner still finalizing
    await call(emu, "PATCH", f"{TJ}/j", {"metadata": {"finalizers": None}})
    assert emu.get_live("trainsentry.io/v1alpha1/trainingjobs", "ns1", "j") is None
    assert emu.get_live("v1/configmaps", "ns1", "child") is None
    assert emu.get_live("v1/configmaps", "ns1", "grandchild") is None
    assert emu.get_live("v1/configmaps", "ns1", "unrelated") is not None


async def test_injected_faults_and_call_recording(emu: KubeEmulator) -> None:
    emu.inject_fault("create", "configmaps", 500, times=2)
    statuses = [(await call(emu, "POST", CM, {"metadata": {"name": "f"}}))[0] for _ in range(3)]
    assert statuses == [500, 500, 201]
    emu.inject_fault("patch", "trainingjobs", 429, subresource="status")
    await call(emu, "POST", TJ, {"metadata": {"name": "j"}})
    assert (await call(emu, "PATCH", f"{TJ}/j", {"spec": {"a": 1}}))[0] == 200
    assert (await call(emu, "PATCH", f"{TJ}/j/status", {"status": {"a": 1}}))[0] == 429
    assert (await call(emu, "PATCH", f"{TJ}/j/status", {"status": {"a": 1}}))[0] == 200
    await call(emu, "GET", "/api/v1/nodes")
    assert emu.recorded_calls() == {
        ApiCall("create", "", "configmaps"),
        ApiCall("create", "trainsentry.io", "trainingjobs"),
        ApiCall("patch", "trainsentry.io", "trainingjobs"),
        ApiCall("patch", "trainsentry.io", "trainingjobs", "status"),
        ApiCall("list", "", "nodes"),
    }


async def test_unknown_resources_and_objects_are_404(emu: KubeEmulator) -> None:
    assert (await call(emu, "GET", "/apis/kubeflow.org/v1/namespaces/ns1/pytorchjobs"))[0] == 404
    assert (await call(emu, "GET", f"{CM}/missing"))[0] == 404
    assert (await call(emu, "DELETE", f"{CM}/missing"))[0] == 404


async def test_validator_hook_rejects_with_422(emu: KubeEmulator) -> None:
    seen: list[str] = []

    def validator(raw: dict[str, Any]) -> None:
        seen.append(f"{raw['apiVersion']}/{raw['kind']}")
        if "bad" in raw.get("data", {}):
            raise ValueError("bad data")

    emu.validator = validator
    status, _ = await call(emu, "POST", CM, {"metadata": {"name": "ok"}, "data": {}})
    assert status == 201 and seen == ["v1/ConfigMap"]  # kind/apiVersion filled in, as a server
    status, err = await call(emu, "POST", CM, {"metadata": {"name": "no"}, "data": {"bad": "1"}})
    assert status == 422 and "bad data" in err["message"]
    status, _ = await call(emu, "PATCH", f"{CM}/ok", {"data": {"bad": "1"}})
    assert status == 422
    assert emu.get_live("v1/configmaps", "ns1", "ok")["data"] == {}
    assert emu.get_live("v1/configmaps", "ns1", "no") is None


async def test_calls_can_be_told_apart_by_user_agent(emu: KubeEmulator) -> None:
    await call(emu, "GET", CM)  # the tests' own client: kmock/...
    async with emu.get("/api/v1/nodes", headers={"User-Agent": "operator/1"}):
        pass
    assert emu.recorded_calls() == {ApiCall("list", "", "configmaps"), ApiCall("list", "", "nodes")}
    assert emu.recorded_calls(exclude_agent="kmock/") == {ApiCall("list", "", "nodes")}
    assert emu.agents[1] == "operator/1"


async def test_every_request_is_logged_with_its_path_as_sent(emu: KubeEmulator) -> None:
    """The request log keeps the path exactly as it arrived: escapes are not decoded, and
    requests no resource route knows (discovery, unknown paths) are logged too."""
    await call(emu, "GET", CM)
    async with emu.get(f"{CM}/a%2Fb", headers={"User-Agent": "gateway/1"}):
        pass
    async with emu.get("/api", headers={"User-Agent": "gateway/1"}):
        pass
    assert [(s.method, s.raw_path) for s in emu.requests] == [
        ("GET", CM),
        ("GET", f"{CM}/a%2Fb"),
        ("GET", "/api"),
    ]
    assert emu.sent_paths(exclude_agent="kmock/") == [f"{CM}/a%2Fb", "/api"]


async def test_a_status_write_is_checked_by_the_validators_status_check(emu: KubeEmulator) -> None:
    """As the API server: the status subresource checks the status schema only, so an object
    stored before a stricter schema still takes status writes; the main endpoint checks all."""
    seen: list[str] = []

    class Checks:
        def __call__(self, raw: dict[str, Any]) -> None:
            seen.append("object")
            if raw.get("spec", {}).get("bad"):
                raise ValueError("bad spec")

        def validate_status(self, raw: dict[str, Any]) -> None:
            seen.append("status")
            if raw.get("status", {}).get("bad"):
                raise ValueError("bad status")

    emu.validator = None
    await call(emu, "POST", TJ, {"metadata": {"name": "old"}, "spec": {"bad": True}})
    emu.validator = Checks()
    assert (await call(emu, "PATCH", f"{TJ}/old/status", {"status": {"a": 1}}))[0] == 200
    assert (await call(emu, "PATCH", f"{TJ}/old/status", {"status": {"bad": 1}}))[0] == 422
    assert (await call(emu, "PATCH", f"{TJ}/old", {"metadata": {"labels": {"a": "b"}}}))[0] == 422
    assert seen == ["status", "status", "object"]
