"""Issue 37's node death, end to end on real parts, in scaled time.

An 8-node x 8-GPU TrainingJob team-a/llama-70b; GPU 3 of gpu-node-05 falls off the bus (XID
79), 20 s later the node dies (its scrapes time out), Kubernetes marks it NotReady after its
grace period, NCCL RAS declares its processes dead, the survivors wait in their collective.
Scenario 2: the node comes back without the GPU, then the GPU returns.

Real parts: Prometheus with the shipped rules (cluster-wide `rules/*.yaml` and the
operator's own job-scoped rendering for the job: its pod rules; it tunes no hardware rule,
so it has no copy of one), Alertmanager with the shipped routes and
inhibitions (`rules/alertmanager-inhibit.yaml`, the source the chart's AlertmanagerConfig
is made from), the gateway process with docs/channels.md's example Feishu bot groups and
escalation (its documented HTTP voice gateway as the phone provider), the Feishu and phone
contract servers, and stand-in exporters (node_death_exporter.py) that serve the real metric
names and labels.

Time: every duration is divided by one factor (`scale`, default 10, or the environment's
TRAINSENTRY_NODE_DEATH_SCALE; 1 = real time). `Scaled` is the ONE place that rewrites the
shipped objects: the rules' `for:`, `keep_firing_for:` and PromQL range/subquery windows,
Prometheus' scrape and evaluation intervals, scrape timeout and alert resend delay (the
defaults of kube-prometheus-stack and Prometheus, and the TrainingJob's probe interval),
Alertmanager's group_wait/group_interval/repeat_interval, the gateway policy's windows and
the escalation's ack timeout. The stand-ins report durations (a collective's wait) in
scenario seconds, so thresholds on those values stay as shipped. Rate limits of the Feishu
contract server are not scaled (they are the provider's, in real seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import start_gateway
from tests.support.node_death_exporter import GPUS_PER_NODE, Scenario
from tests.support.paging_config import VOICE_KEY, write_paging_config
from tests.support.phone_server import PhoneContractServer
from tests.support.realservers import (
    REPO_MODULE_ENV,
    http_json,
    logs_on_error,
    repo_module_argv,
    start_alertmanager,
    start_prometheus,
    start_server,
    wait_for,
)
from trainsentry.assets import data_file, rules_dir
from trainsentry.operator.reconcile import load_sources
from trainsentry.operator.render import render_children
from trainsentry.operator.spec import JobIdentity, TrainingJobSpec

SCALE_ENV = "TRAINSENTRY_NODE_DEATH_SCALE"
DEFAULT_SCALE = 10.0
NAMESPACE, JOB = "team-a", "llama-70b"
NODES = [f"gpu-node-{i:02d}" for i in range(8)]
DEAD_NODE, DEAD_GPU = "gpu-node-05", 3
DEAD_RANKS = range(
    NODES.index(DEAD_NODE) * GPUS_PER_NODE, (NODES.index(DEAD_NODE) + 1) * GPUS_PER_NODE
)
TOKEN = "node-death-token"
DOCS = Path(__file__).resolve().parents[2] / "docs"
EXPORTER = "tests.support.node_death_exporter"
IDENTITY = JobIdentity(name=JOB, namespace=NAMESPACE, uid="37373737-1111-4222-8333-944445555666")
SPEC = TrainingJobSpec.model_validate(
    {"workloadRef": {"kind": "PyTorchJob", "name": JOB}, "ranksPerPod": GPUS_PER_NODE}
)
# Prometheus as kube-prometheus-stack runs it (scrape and evaluation every 30 s, 10 s scrape
# timeout) and Prometheus' own alert resend delay (1 m).
PROMETHEUS_TIMINGS = {
    "scrape_interval": "30s",
    "evaluation_interval": "30s",
    "scrape_timeout": "10s",
}
RESEND_DELAY = "1m"
CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "trainsentry" / "values.yaml"


def exporter_interval() -> str:
    """The scrape interval of the chart's exporter ServiceMonitors (dcgm, node)."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    return str(values["exporters"]["serviceMonitor"]["interval"])


# The gateway policy's windows (trainsentry/data/policy.yaml; seconds).
POLICY_WINDOWS = {
    "blast_radius": ("window",),
    "dedup": ("recurrence_window", "flap_window", "flap_hold"),
    "storm": ("window", "summary_interval", "calm_after"),
    "grouping": ("follow_up_interval",),
    "infrastructure": ("window", "hold"),
    "correlation": ("window", "confirm_resolved"),
}


def scale_from_env() -> float:
    return float(os.environ.get(SCALE_ENV) or DEFAULT_SCALE)


# --- time scaling: the one helper ------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_RANGE = re.compile(r"\[([0-9a-z]+)(?::([0-9a-z]*))?\]")


def seconds(duration: str) -> float:
    """Prometheus/Alertmanager duration text ("1h30m", "30s", "0s") in seconds."""
    parts = _PART.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a duration: {duration!r}")
    return sum(int(n) * _UNITS[u] for n, u in parts)


def duration(value: float) -> str:
    """Seconds as the shortest exact duration text (whole seconds, else milliseconds)."""
    millis = round(value * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


@dataclass(frozen=True)
class Scaled:
    """Divides every duration of the shipped objects by `factor` (1: as shipped)."""

    factor: float

    def time(self, value: str) -> str:
        return duration(seconds(value) / self.factor)

    def expr(self, expr: str) -> str:
        """PromQL with every range `[10m]` and subquery `[6h:1m]` window scaled."""

        def one(match: re.Match[str]) -> str:
            window, step = match.group(1), match.group(2)
            scaled = self.time(window)
            if step is None:
                return f"[{scaled}]"
            return f"[{scaled}:{self.time(step) if step else ''}]"

        return _RANGE.sub(one, expr)

    def rule_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        result = copy.deepcopy(groups)
        for group in result:
            if "interval" in group:
                group["interval"] = self.time(group["interval"])
            for rule in group["rules"]:
                rule["expr"] = self.expr(str(rule["expr"]))
                for key in ("for", "keep_firing_for"):
                    if key in rule:
                        rule[key] = self.time(str(rule[key]))
        return result

    def alertmanager(self, config: Mapping[str, Any]) -> dict[str, Any]:
        result = copy.deepcopy(dict(config))
        for route in [result["route"], *result["route"].get("routes", [])]:
            for key in ("group_wait", "group_interval", "repeat_interval"):
                if key in route:
                    route[key] = self.time(route[key])
        return result

    def policy(self) -> dict[str, Any]:
        shipped = yaml.safe_load(data_file("policy.yaml").read_text())
        return {
            section: {key: float(shipped[section][key]) / self.factor for key in keys}
            for section, keys in POLICY_WINDOWS.items()
        }

    def escalation(self, escalation: Mapping[str, Any]) -> dict[str, Any]:
        result = copy.deepcopy(dict(escalation))
        result["ack_timeout_min"] = float(result.get("ack_timeout_min", 5.0)) / self.factor
        return result


# --- the shipped objects -----------------------------------------------------------------------


def cluster_rule_files() -> list[Path]:
    """The rule files the chart installs cluster-wide (rules/*.yaml with groups)."""
    return sorted(
        p for p in rules_dir().glob("*.yaml") if "groups" in yaml.safe_load(p.read_text())
    )


def job_rule_groups(
    identity: JobIdentity = IDENTITY, spec: TrainingJobSpec = SPEC
) -> list[dict[str, Any]]:
    """The operator's PrometheusRule for a job (team-a/llama-70b): its `spec.groups`."""
    sources = load_sources(rules_dir(), Path("/nonexistent"))
    rendered = render_children(identity, spec, sources.rule_files, (), [])
    rule = next(m for m in rendered.manifests if m["kind"] == "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def node_scoped_alerts() -> frozenset[str]:
    """The shipped `job_scope: node` (hardware and node) rules: the operator copies none
    the job does not tune (docs/alerts.md "Job scope")."""
    return frozenset(
        str(rule["alert"])
        for path in cluster_rule_files()
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule and rule.get("annotations", {}).get("job_scope") == "node"
    )


def loaded_alerts(prometheus_url: str) -> dict[str, list[str]]:
    """The alerting rules Prometheus loaded, by rule group name (`/api/v1/rules`)."""
    answer = http_json(f"{prometheus_url}/api/v1/rules?type=alert")
    assert answer["status"] == "success", answer
    return {
        group["name"]: [rule["name"] for rule in group["rules"]]
        for group in answer["data"]["groups"]
    }


def write_rule_files(directory: Path, scaled: Scaled) -> list[Path]:
    paths = []
    for path in cluster_rule_files():
        document = yaml.safe_load(path.read_text())
        target = directory / f"cluster-{path.name}"
        target.write_text(yaml.safe_dump({"groups": scaled.rule_groups(document["groups"])}))
        paths.append(target)
    target = directory / f"{JOB}-trainsentry.yaml"
    target.write_text(yaml.safe_dump({"groups": scaled.rule_groups(job_rule_groups())}))
    return [*paths, target]


def alertmanager_config(gateway_url: str, scaled: Scaled) -> dict[str, Any]:
    """rules/alertmanager-inhibit.yaml (route, receiver, inhibit rules), the receiver pointed
    at the test gateway with the webhook token the chart's AlertmanagerConfig sends."""
    config: dict[str, Any] = yaml.safe_load((rules_dir() / "alertmanager-inhibit.yaml").read_text())
    webhook = config["receivers"][0]["webhook_configs"][0]
    webhook["url"] = f"{gateway_url}/api/v1/alertmanager"
    webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials": TOKEN}}
    return scaled.alertmanager(config)


def docs_channels_example() -> dict[str, Any]:
    """The `channels:`/`oncall:` example of docs/channels.md ("Settings")."""
    text = (DOCS / "channels.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S):
        if block.startswith("channels:") and "oncall:" in block:
            found: dict[str, Any] = yaml.safe_load(block)
            return found
    raise AssertionError("docs/channels.md has no channels/oncall example")


def prometheus_config(
    exporter: str,
    alertmanager: str,
    scaled: Scaled,
    nodes: list[str] = NODES,
    job: tuple[str, str] = (NAMESPACE, JOB),
    first: int = 0,
) -> dict[str, Any]:
    """Prometheus scraping one stand-in exporter: the nodes' dcgm and node exporters,
    kube-state-metrics, and the ranks of `job` (namespace, name) on them; `first`: the
    index of the first node (their addresses)."""
    namespace, name = job

    def per_node(kind: str, port: int) -> list[dict[str, Any]]:  # the chart's ServiceMonitors
        return [
            {
                "targets": [exporter],
                "labels": {
                    "node": node,
                    "instance": f"10.0.{i}.1:{port}",
                    "__metrics_path__": f"/{kind}/{node}/metrics",
                },
            }
            for i, node in enumerate(nodes, start=first)
        ]

    probes = [
        {
            "targets": [exporter],
            "labels": {  # what the operator's PodMonitor gives a rank's target
                "namespace": namespace,
                "pod": f"{name}-worker-{i}",
                "node": node,
                "trainingjob": name,
                "instance": f"10.1.{i + first}.7:{SPEC.probe.port + local_rank}",
                "__metrics_path__": f"/probe/{node}/{local_rank}/metrics",
            },
        }
        for i, node in enumerate(nodes)
        for local_rank in range(GPUS_PER_NODE)
    ]
    probe_interval = scaled.time(SPEC.probe.interval)
    exporters = {"scrape_interval": scaled.time(exporter_interval())}
    return {
        "global": {key: scaled.time(value) for key, value in PROMETHEUS_TIMINGS.items()},
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": "dcgm-exporter", "static_configs": per_node("dcgm", 9400), **exporters},
            {"job_name": "node-exporter", "static_configs": per_node("node", 9110), **exporters},
            {
                "job_name": "kube-state-metrics",
                "honor_labels": True,
                "metrics_path": "/ksm/metrics",
                "static_configs": [
                    {"targets": [exporter], "labels": {"instance": f"10.2.0.{1 + first}:8080"}}
                ],
            },
            {
                "job_name": f"podMonitor/{namespace}/{name}-trainsentry-probe",
                "honor_labels": True,
                "scrape_interval": probe_interval,
                "scrape_timeout": probe_interval
                if seconds(probe_interval) < seconds(scaled.time("10s"))
                else scaled.time("10s"),
                "static_configs": probes,
            },
        ],
    }


def gateway_config(
    tmp: Path, feishu: FeishuContractServer, voice_url: str, scaled: Scaled
) -> tuple[Path, dict[str, str]]:
    example = docs_channels_example()
    groups = example["channels"]["feishu_bot"]["groups"]
    env: dict[str, str] = {}
    for name, group in groups.items():
        env[group["url_env"]] = feishu.hook_url(name)
        if "secret_env" in group:
            env[group["secret_env"]] = f"{name}-signing-secret"
    return write_paging_config(
        tmp,
        token=TOKEN,
        policy=scaled.policy(),
        groups=groups,
        voice_url=voice_url,
        escalation=scaled.escalation(example["oncall"]["escalation"]),
        env=env,
    )


def feishu_hooks() -> dict[str, Hook]:
    groups = docs_channels_example()["channels"]["feishu_bot"]["groups"]
    return {
        name: Hook(secret=f"{name}-signing-secret" if "secret_env" in group else None)
        for name, group in groups.items()
    }


# --- the scenarios ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """Scenario seconds after the XID (t0)."""

    name: str
    end: float  # the recording ends here
    death_at: float = 20.0
    not_ready_after: float = 40.0  # kube-controller-manager's node-monitor-grace-period
    ras_dead_after: float = 30.0
    back_at: float | None = None
    gpu_back_at: float | None = None
    restart_at: float | None = None  # the job's pods restarted (its ranks answer again)

    def scenario(self, factor: float) -> Scenario:
        return Scenario(
            factor=factor,
            namespace=NAMESPACE,
            job=JOB,
            nodes=NODES,
            dead_node=DEAD_NODE,
            dead_gpu=DEAD_GPU,
            xid_at=0.0,
            death_at=self.death_at,
            not_ready_after=self.not_ready_after,
            ras_dead_after=self.ras_dead_after,
            back_at=self.back_at,
            gpu_back_at=self.gpu_back_at,
            restart_at=self.restart_at,
        )


NODE_DEATH = Timeline("node death", end=480.0)
# The GPU alert ends keep_firing_for (15 m) after its expression last matched (the death),
# and the gateway confirms a hardware fault's resolution `correlation.confirm_resolved`
# (5 m) later, so the second scenario runs past both.
# The node is back at 240 s without its GPU; the GPU is back at 420 s, and the job's
# controller restarts the pods a minute later: the job runs again and every alert resolves.
COMES_BACK = Timeline(
    "node comes back", end=1500.0, back_at=240.0, gpu_back_at=420.0, restart_at=480.0
)


@dataclass
class Message:
    at: float  # scenario seconds after the XID
    channel: str  # "feishu:<group>" or "phone"
    title: str
    text: str  # everything it said, for searching

    def line(self) -> str:
        return f"{self.at:7.1f} s  {self.channel:<16} {self.title}"


@dataclass
class Recording:
    timeline: Timeline
    factor: float
    messages: list[Message] = field(default_factory=list)
    fired: dict[str, float] = field(default_factory=dict)  # alertname -> first firing (s)
    fired_job_scoped: dict[str, float] = field(default_factory=dict)
    gpu_alert_firing: list[tuple[float, bool]] = field(default_factory=list)  # GPUFellOffBus
    before_start: set[str] = field(default_factory=set)  # firing before the XID
    death_at: float | None = None  # when the node died (the exporter's say)
    gateway_alerts: list[dict[str, Any]] = field(default_factory=list)
    call_keys: list[str] = field(default_factory=list)
    # the alerting rules Prometheus loaded, by rule group (the operator's groups end in
    # `-<namespace>-<job>`)
    rule_groups: dict[str, list[str]] = field(default_factory=dict)

    def job_rules(self, namespace: str, job: str) -> set[str]:
        """The alerts of the operator's PrometheusRule for the job, as Prometheus loaded it."""
        suffix = f"-{namespace}-{job}"
        return {n for g, names in self.rule_groups.items() if g.endswith(suffix) for n in names}

    def channels(self) -> dict[str, int]:
        """Messages per channel ("feishu:<group or job bot>", "phone")."""
        counts: dict[str, int] = {}
        for message in self.messages:
            counts[message.channel] = counts.get(message.channel, 0) + 1
        return dict(sorted(counts.items()))

    def feishu(self) -> list[Message]:
        return [m for m in self.messages if m.channel.startswith("feishu")]

    def calls(self) -> list[Message]:
        return [m for m in self.messages if m.channel == "phone"]

    def within(self, seconds: float) -> Recording:
        kept = copy.copy(self)
        kept.messages = [m for m in self.messages if m.at <= seconds]
        return kept

    def report(self) -> str:
        lines = [
            f"== {self.timeline.name} (x{self.factor:g}): {len(self.feishu())} Feishu "
            f"messages, {len(self.calls())} phone calls in {self.timeline.end:g} s; the node "
            f"died at {self.death_at} s ==",
            "-- per channel: " + ", ".join(f"{c} {n}" for c, n in self.channels().items()),
            *(m.line() for m in sorted(self.messages, key=lambda m: m.at)),
            "-- first firing in Prometheus (s): "
            + ", ".join(f"{n} {t:.0f}" for n, t in sorted(self.fired.items(), key=lambda i: i[1])),
        ]
        return "\n".join(lines)

    def as_json(self) -> str:
        return json.dumps({**asdict(self), "before_start": sorted(self.before_start)}, indent=1)

    def add_deliveries(
        self, feishu: FeishuContractServer, phones: TimedPhoneServer, t0: float
    ) -> None:
        """What the people received, as messages at scenario time (seconds since `t0`, the
        monotonic start, × the factor), in time order: every Feishu message each hook
        accepted and every call, with the calls' idempotency keys."""
        for hook, accepted in feishu.accepted.items():
            for arrived, body in accepted:
                title, text = _card_text(body)
                at = (arrived - t0) * self.factor
                self.messages.append(Message(at, f"feishu:{hook}", title, text))
        arrivals = getattr(phones, "arrivals", [])
        for arrived, (headers, body) in zip(arrivals, phones.gateway_calls, strict=True):
            text = json.loads(body["TtsParam"])["text"]
            self.messages.append(Message((arrived - t0) * self.factor, "phone", text[:120], text))
            self.call_keys.append(headers.get("Idempotency-Key", ""))
        self.messages.sort(key=lambda m: m.at)


class TimedPhoneServer(PhoneContractServer):
    """The phone contract server, noting when each voice-gateway call arrived."""

    arrivals: list[float]

    async def gateway(self, request: web.Request) -> web.Response:
        if not hasattr(self, "arrivals"):
            self.arrivals = []
        before = len(self.gateway_calls)
        response = await super().gateway(request)
        if len(self.gateway_calls) > before:
            self.arrivals.append(time.monotonic())
        return response


def _card_text(body: dict[str, Any]) -> tuple[str, str]:
    if body.get("msg_type") == "interactive":
        card = body["card"]
        return str(card.get("header", {}).get("title", {}).get("content", "")), json.dumps(
            card, ensure_ascii=False
        )
    content = json.dumps(body.get("content", {}), ensure_ascii=False)
    return content[:120], content


def prometheus_query(prometheus_url: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = http_json(url)
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


async def wait_healthy(
    recording: Recording,
    prometheus_url: str,
    scaled: Scaled,
    targets: int,
    nodes: int,
    timeout_s: float,
) -> None:
    """Waits until Prometheus has `targets` targets up and the job membership of `nodes`
    nodes, notes the alerts it loaded, lets it evaluate a healthy cluster a few times
    (GPUMissing needs its usual count), and notes what fires before the scenario starts."""

    def ready() -> bool:
        up = prometheus_query(prometheus_url, "up == 1")
        members = prometheus_query(prometheus_url, "trainsentry:job_node:info")
        return len(up) == targets and len(members) == nodes

    await asyncio.to_thread(wait_for, ready, timeout_s, f"{targets} targets up and membership")
    recording.rule_groups = await asyncio.to_thread(loaded_alerts, prometheus_url)
    await asyncio.sleep(4 * seconds(scaled.time("30s")))
    recording.before_start = {
        r["metric"]["alertname"]
        for r in prometheus_query(prometheus_url, 'ALERTS{alertstate="firing"}')
    }


async def run(timeline: Timeline, tmp: Path, factor: float) -> Recording:
    """Runs one scenario on a fresh stack and records what a person received."""
    scaled = Scaled(factor)
    recording = Recording(timeline, factor)
    scenario_file = tmp / "scenario.json"
    scenario_file.write_text(json.dumps(asdict(timeline.scenario(factor))))
    feishu = FeishuContractServer(hooks=feishu_hooks())
    phones = TimedPhoneServer(gateway_token=VOICE_KEY)
    async with feishu, phones, contextlib.AsyncExitStack() as stack:

        async def started(start: Any, *args: Any, **kwargs: Any) -> Any:
            server = await asyncio.to_thread(start, *args, **kwargs)
            stack.callback(server.stop)
            return server

        exporter = await started(
            start_server,
            tmp,
            "exporter",
            lambda port, _wd: repo_module_argv(
                EXPORTER, "--port", str(port), "--scenario", str(scenario_file)
            ),
            env=REPO_MODULE_ENV,
        )
        config, env = gateway_config(tmp, feishu, f"{phones.base_url}/voice/call", scaled)
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
            prometheus_config(exporter.address, alertmanager.address, scaled),
            write_rule_files(rules, scaled),
            extra_args=[f"--rules.alert.resend-delay={scaled.time(RESEND_DELAY)}"],
        )
        with logs_on_error(prometheus, alertmanager, gateway, exporter):
            targets = 2 * len(NODES) + 1 + len(NODES) * GPUS_PER_NODE

            await wait_healthy(recording, prometheus.url, scaled, targets, len(NODES), 60)
            t0_wall, t0 = time.time(), time.monotonic()
            http_json(f"{exporter.url}/start", {"t0": t0_wall})
            end = t0 + timeline.end / factor
            while (now := time.monotonic()) < end:
                at = (now - t0) * factor
                firing = await asyncio.to_thread(
                    prometheus_query, prometheus.url, 'ALERTS{alertstate="firing"}'
                )
                for result in firing:
                    name = result["metric"]["alertname"]
                    target = (
                        recording.fired_job_scoped
                        if result["metric"].get("trainingjob")
                        else recording.fired
                    )
                    target.setdefault(name, at)
                    if result["metric"].get("trainingjob"):
                        recording.fired.setdefault(name, at)
                gpu = any(
                    r["metric"]["alertname"] == "GPUFellOffBus"
                    and r["metric"].get("node") == DEAD_NODE
                    for r in firing
                )
                recording.gpu_alert_firing.append((at, gpu))
                await asyncio.sleep(max(0.2, 2.0 / factor))
            recording.death_at = http_json(f"{exporter.url}/state")["death_at"]
            items = await asyncio.to_thread(
                http_json, f"{gateway.url}/api/v1/alerts?limit=500", None, TOKEN
            )
            recording.gateway_alerts = items["items"]
        recording.add_deliveries(feishu, phones, t0)
    return recording
