"""A TrainingJob's own on-call roster names who the gateway's paid voice provider calls, so
it is held to limits (issue 32 finding 13): phone numbers in E.164 form (ITU-T E.164: `+`,
a country code not starting with 0, at most 15 digits in all; here 8 to 15), open_ids as
Feishu writes them, at most 10 layers and 20 people, and, when the admin sets
`job_alerting.phone_prefixes`, only numbers under those prefixes. A roster over any limit is
AlertingReady=False (InvalidRoster, naming the field) and its pages call the gateway's own
roster. The real gateway, the Kubernetes API as the kmock emulator, Feishu as the contract
server (its urgent_phone calls are the pages)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gateway.stages.test_job_alerting import (
    Running,
    alert,
    cluster,
    condition,
    create,
    events,
    feishu,
    gateway_with,
    tj_path,
    trainingjob,
)
from tests.support.feishu_server import FeishuContractServer
from tests.support.kube_emulator import KubeEmulator

__all__ = ["cluster", "feishu"]  # the fixtures, shared with test_job_alerting

CARL = {"name": "carl", "phone": "+8613800000001", "feishu_open_id": "ou_carl"}


def layers(*people: list[dict[str, str]]) -> str:
    return yaml.safe_dump(
        {"layers": [{"name": f"l{i}", "members": members} for i, members in enumerate(people)]}
    )


def person(n: int, **extra: str) -> dict[str, str]:
    return {"name": f"p{n}", "feishu_open_id": f"ou_p{n}", **extra}


ROSTERS = {
    # name: (roster text, the words the condition's message must hold; "" = Ready)
    "good": (layers([CARL], [person(1, phone="+15550001111")]), ""),
    "nodialprefix": (layers([person(1, phone="13800000001")]), "E.164"),
    "spaces": (layers([person(1, phone="+86 138 0000 0001")]), "E.164"),
    "letters": (layers([person(1, phone="+1800FLOWERS")]), "E.164"),
    "short": (layers([person(1, phone="+1234567")]), "E.164"),
    "long": (layers([person(1, phone="+1234567890123456")]), "E.164"),
    "zero": (layers([person(1, phone="+0123456789")]), "E.164"),
    "everyone": (layers([{"name": "x", "feishu_open_id": "all"}]), "feishu_open_id"),
    "layers": (layers(*([person(n)] for n in range(11))), "at most 10 layers"),
    "people": (
        layers([person(n) for n in range(11)], [person(n) for n in range(11, 21)]),
        "at most 20 people",
    ),
    "abroad": (layers([person(1, phone="+4915112345678")]), "job_alerting.phone_prefixes"),
}


@pytest.fixture
async def gateway(
    cluster: KubeEmulator, feishu: FeishuContractServer, tmp_path: Path
) -> AsyncIterator[Any]:
    prefixes = {"phone_prefixes": ["+86", "+1555"]}
    async with gateway_with(cluster, feishu, tmp_path, job_alerting=prefixes) as (start, _):
        yield start


async def test_a_roster_over_the_limits_is_refused_and_its_pages_call_the_global_roster(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    for name, (text, _) in ROSTERS.items():
        await create(
            cluster,
            "/api/v1/namespaces/team-a/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
             "data": {"roster.yaml": text}},
        )  # fmt: skip
        alerting = {"onCallRosterRef": {"name": name, "key": "roster.yaml"}}
        await create(cluster, tj_path("team-a"), trainingjob("team-a", name, alerting))
    running: Running = await gateway()
    for name, (text, words) in ROSTERS.items():
        ready = condition(cluster, "team-a", name)
        if not words:
            assert (ready["status"], ready["reason"]) == ("True", "Ready"), ready
            continue
        assert (ready["status"], ready["reason"]) == ("False", "InvalidRoster"), (name, ready)
        assert words in ready["message"], (name, ready["message"])
        phones = [m.get("phone", "") for x in yaml.safe_load(text)["layers"] for m in x["members"]]
        assert not [p for p in phones if p and p in ready["message"]]  # the field, not the number
        assert "alerts take the gateway's own route" in ready["message"]
        assert "InvalidRoster" in {e["reason"] for e in events(cluster, "team-a", name)}
    for n, name in enumerate(ROSTERS):
        await running.post(alert(n, "team-a", name, "TrainingJobDown"))
    called = [user for _, users in feishu.urgent_calls for user in users]
    # the good roster's first layer; every refused roster's page: the global roster's gus
    assert sorted(called) == sorted(["ou_carl"] + ["ou_gus"] * (len(ROSTERS) - 1)), called
