"""Issue 44's dead leaf switch, end to end on real parts, in scaled time (the node-death
harness, tests/support/node_death.py, with its real Prometheus, Alertmanager, gateway and
contract servers, its shipped rules, routes and docs/channels.md escalation, and its one
time-scaling helper).

A 12-node x 8-GPU TrainingJob team-a/llama-70b; leaf switch leaf-a under its first 8 nodes
dies at t0 (fabric_death_exporter.py: their 64 HCA ports go Down, the ranks wait in their
collective, NCCL RAS reports the communicator in error a minute later; every node stays
Ready, every GPU healthy); the other 4 nodes are under leaf-b, and so are the 2 nodes of
another team's job, team-b/bert, which trains on untouched. The gateway's `topology:` is
the static one docs/infrastructure.md documents; each job has its own Feishu bot
(docs/channels.md `feishu_bot.jobs`), so what each team is told is counted apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import start_gateway
from tests.support.node_death import (
    JOB,
    NAMESPACE,
    TOKEN,
    Recording,
    Scaled,
    TimedPhoneServer,
    Timeline,
    alertmanager_config,
    feishu_hooks,
    gateway_config,
    job_rule_groups,
    prometheus_config,
    prometheus_query,
    wait_healthy,
    write_rule_files,
)
from tests.support.node_death_exporter import GPUS_PER_NODE, Scenario
from tests.support.paging_config import VOICE_KEY
from tests.support.realservers import (
    REPO_MODULE_ENV,
    http_json,
    logs_on_error,
    repo_module_argv,
    start_alertmanager,
    start_prometheus,
    start_server,
)
from trainsentry.operator.spec import JobIdentity, TrainingJobSpec

NODES = [f"gpu-node-{i:02d}" for i in range(12)]
DEAD_LEAF = NODES[:8]
EXPORTER = "tests.support.fabric_death_exporter"
RAS_ERROR_AFTER = 60.0
LEAF_DEATH = Timeline("dead leaf switch", end=480.0)
RAIL_DEATH = Timeline("dead rail leaf", end=480.0)
HCAS = [f"mlx5_{k}" for k in range(8)]


@dataclass(frozen=True)
class Part:
    """One TrainingJob of the cluster, on its nodes, with its own stand-in exporters."""

    namespace: str
    job: str
    nodes: list[str]
    dead: list[str]  # its nodes under the dead switch
    devices: list[str]  # their HCAs cabled to it
    first: int = 0  # the index of its first node in the cluster


# Another team's job on two more nodes under leaf-b: no node under the dead switch.
OTHER_NODES = [f"gpu-node-{i:02d}" for i in range(12, 14)]
OTHER = Part("team-b", "bert", OTHER_NODES, [], HCAS, first=12)
LEAF_PARTS = [Part(NAMESPACE, JOB, NODES, DEAD_LEAF, HCAS), OTHER]
RAIL_NODES = [f"gpu-node-{i:02d}" for i in range(16)]
RAIL_PARTS = [
    Part(NAMESPACE, JOB, RAIL_NODES[:8], RAIL_NODES[:8], ["mlx5_3"]),
    Part("team-b", "mixtral", RAIL_NODES[8:], RAIL_NODES[8:], ["mlx5_3"], first=8),
]


def topology_section() -> dict[str, Any]:
    """docs/infrastructure.md's static `topology:` for the leaf cluster."""
    return {
        "levels": ["leaf_switch", "rack"],
        "nodes": {
            node: {"leaf_switch": "leaf-a" if node in DEAD_LEAF else "leaf-b", "rack": f"r{i // 4}"}
            for i, node in enumerate([*NODES, *OTHER_NODES])
        },
    }


def job_hook(part: Part) -> str:
    """The Feishu bot of a job's own route (`feishu_bot.jobs`): "job-<namespace>-<job>"."""
    return f"job-{part.namespace}-{part.job}"


def job_routes(
    parts: list[Part], env: dict[str, str], feishu: FeishuContractServer
) -> dict[str, Any]:
    """docs/channels.md's `feishu_bot.jobs`: one signed bot per job (its URL and secret put
    in `env`)."""
    routes = {}
    for index, part in enumerate(parts):
        url, secret = f"FEISHU_BOT_JOB{index}_URL", f"FEISHU_BOT_JOB{index}_SECRET"
        env[url], env[secret] = feishu.hook_url(job_hook(part)), f"{job_hook(part)}-signing-secret"
        routes[f"{part.namespace}/{part.job}"] = {"url_env": url, "secret_env": secret}
    return routes


def rail_topology_section() -> dict[str, Any]:
    """docs/infrastructure.md's rail-optimized `topology:`: HCA k of every node on leaf-k."""
    return {
        "levels": ["leaf_switch", "rack"],
        "nodes": {node: {"rack": f"r{i // 4}"} for i, node in enumerate(RAIL_NODES)},
        "rails": {"leaf_switch": {hca: f"leaf-{k}" for k, hca in enumerate(HCAS)}},
    }


def scenario(factor: float, part: Part) -> dict[str, Any]:
    data = asdict(
        Scenario(
            factor=factor,
            namespace=part.namespace,
            job=part.job,
            nodes=part.nodes,
            dead_node="",  # no node dies
            dead_gpu=-1,
            # the switch dies (the ranks of a job under it wait from here; another trains on)
            xid_at=0.0 if part.dead else None,
            death_at=0.0,
            not_ready_after=0.0,
            ras_dead_after=0.0,
            back_at=None,
            gpu_back_at=None,
        )
    )
    return {
        **data,
        "dead_leaf": part.dead,
        "devices": part.devices,
        "ras_error_after": RAS_ERROR_AFTER,
    }


def job_rules(directory: Path, scaled: Scaled, parts: list[Part]) -> list[Path]:
    """The shipped cluster rules and the operator's rendering for each job."""
    paths = write_rule_files(directory, scaled)
    for part in parts[1:]:
        identity = JobIdentity(name=part.job, namespace=part.namespace, uid=f"uid-{part.job}")
        target = directory / f"{part.job}-trainsentry.yaml"
        spec = TrainingJobSpec.model_validate(
            {"workloadRef": {"kind": "PyTorchJob", "name": part.job}, "ranksPerPod": GPUS_PER_NODE}
        )
        groups = job_rule_groups(identity, spec)
        target.write_text(yaml.safe_dump({"groups": scaled.rule_groups(groups)}))
        paths.append(target)
    return paths


def scrape_config(
    exporters: list[str], alertmanager: str, scaled: Scaled, parts: list[Part]
) -> dict[str, Any]:
    """One Prometheus scraping every part's exporters (their scrape jobs merged)."""
    merged: dict[str, Any] = {}
    for exporter, part in zip(exporters, parts, strict=True):
        config = prometheus_config(
            exporter, alertmanager, scaled, part.nodes, (part.namespace, part.job), part.first
        )
        if not merged:
            merged = config
            continue
        jobs = {job["job_name"]: job for job in merged["scrape_configs"]}
        for job in config["scrape_configs"]:
            if job["job_name"] in jobs:
                jobs[job["job_name"]]["static_configs"] += job["static_configs"]
            else:
                merged["scrape_configs"].append(job)
    return merged


async def run(
    tmp: Path,
    factor: float,
    timeline: Timeline = LEAF_DEATH,
    parts: list[Part] = LEAF_PARTS,
    topology: dict[str, Any] | None = None,
) -> Recording:
    """Runs the scenario on a fresh stack and records what a person received."""
    scaled = Scaled(factor)
    recording = Recording(timeline, factor)
    nodes = [node for part in parts for node in part.nodes]
    hooks = {job_hook(part): Hook(secret=f"{job_hook(part)}-signing-secret") for part in parts}
    feishu = FeishuContractServer(hooks={**feishu_hooks(), **hooks})
    phones = TimedPhoneServer(gateway_token=VOICE_KEY)
    async with feishu, phones, contextlib.AsyncExitStack() as stack:

        async def started(start: Any, *args: Any, **kwargs: Any) -> Any:
            server = await asyncio.to_thread(start, *args, **kwargs)
            stack.callback(server.stop)
            return server

        exporters = []
        for index, part in enumerate(parts):
            scenario_file = tmp / f"scenario-{index}.json"
            scenario_file.write_text(json.dumps(scenario(factor, part)))
            exporters.append(
                await started(
                    start_server,
                    tmp,
                    f"exporter-{index}",
                    lambda port, _wd, f=scenario_file: repo_module_argv(
                        EXPORTER, "--port", str(port), "--scenario", str(f)
                    ),
                    env=REPO_MODULE_ENV,
                )
            )
        config, env = gateway_config(tmp, feishu, f"{phones.base_url}/voice/call", scaled)
        document = yaml.safe_load(config.read_text())
        document["topology"] = topology or topology_section()
        document["channels"]["feishu_bot"]["jobs"] = job_routes(parts, env, feishu)
        config.write_text(yaml.safe_dump(document))
        gateway = await started(
            start_gateway, tmp, f"sqlite:///{tmp / 'gateway.db'}", config=config, env=env
        )
        alertmanager = await started(
            start_alertmanager, tmp, alertmanager_config(gateway.url, scaled)
        )
        rules = tmp / "rules"
        rules.mkdir()
        prometheus = await started(
            start_prometheus,
            tmp,
            scrape_config([e.address for e in exporters], alertmanager.address, scaled, parts),
            job_rules(rules, scaled, parts),
            extra_args=[f"--rules.alert.resend-delay={scaled.time('1m')}"],
        )
        with logs_on_error(prometheus, alertmanager, gateway, *exporters):
            targets = 2 * len(nodes) + len(parts) + len(nodes) * GPUS_PER_NODE

            await wait_healthy(recording, prometheus.url, scaled, targets, len(nodes), 90)
            t0_wall, t0 = time.time(), time.monotonic()
            for exporter in exporters:
                http_json(f"{exporter.url}/start", {"t0": t0_wall})
            end = t0 + timeline.end / factor
            while (now := time.monotonic()) < end:
                at = (now - t0) * factor
                firing = await asyncio.to_thread(
                    prometheus_query, prometheus.url, 'ALERTS{alertstate="firing"}'
                )
                for result in firing:
                    name = result["metric"]["alertname"]
                    scoped = bool(result["metric"].get("trainingjob"))
                    (recording.fired_job_scoped if scoped else recording.fired).setdefault(name, at)
                    recording.fired.setdefault(name, at)
                await asyncio.sleep(max(0.2, 2.0 / factor))
            items = await asyncio.to_thread(
                http_json, f"{gateway.url}/api/v1/alerts?limit=500", None, TOKEN
            )
            recording.gateway_alerts = items["items"]
        recording.add_deliveries(feishu, phones, t0)
    return recording
