"""The rendered parts fit together and fit the code: config.yaml loads with trainsentry's
own settings loader, Alertmanager reaches the gateway with the token the gateway expects."""

from __future__ import annotations

import base64
import re
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart.chart_helm import REPO, VALUES_SETS, find, one, rendered, template
from tests.support.realservers import start_server
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.config import _ENV_MAP, load_settings, validate_settings


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    containers: list[dict[str, Any]] = spec["template"]["spec"]["containers"]
    return containers[0]


def _secret_value(objs: Any, ref: dict[str, str]) -> str:
    secret = one(objs, "Secret", ref["name"])
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def _env_for(objs: Any, container: dict[str, Any], fake_secret: str = "x") -> dict[str, str]:
    """The container's environment as the pod would see it (Secrets the chart does not create
    replaced by `fake_secret`)."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            found = find(objs, "Secret", ref["name"])
            env[item["name"]] = _secret_value(objs, ref) if found else fake_secret
    for source in container.get("envFrom", []):
        found = find(objs, "Secret", source["secretRef"]["name"])
        for key, value in (found[0]["data"] if found else {}).items():
            env[key] = base64.b64decode(value).decode()
    return env


@pytest.mark.parametrize("values", VALUES_SETS)
@pytest.mark.parametrize("component", ["-gateway", "-report"])
def test_config_and_env_load_with_the_settings_loader(
    values: str, component: str, tmp_path: Path
) -> None:
    objs = rendered(values)
    workloads = find(objs, "Deployment", component) + find(objs, "CronJob", component)
    if not workloads:
        pytest.skip(f"no {component} in {values}")
    container = _container(workloads[0])
    config_map = one(objs, "ConfigMap", "-config")
    env = _env_for(objs, container, fake_secret="postgresql://u:p@db/ts")
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["config"]
    directory, _, file_name = env["TRAINSENTRY_CONFIG"].rpartition("/")
    assert directory == mount
    assert file_name == ("report.yaml" if component == "-report" else "config.yaml")
    document = yaml.safe_load(config_map["data"][file_name])
    # Only the report job's file has a `reports:` section; one loader reads both files.
    reports = document.get("reports")
    assert reports is None or component == "-report"
    config_file = tmp_path / file_name
    config_file.write_text(yaml.safe_dump(document), encoding="utf-8")
    env["TRAINSENTRY_CONFIG"] = str(config_file)

    settings = load_settings(env=env)

    port = _container(one(objs, "Deployment", "-gateway"))["ports"][0]["containerPort"]
    assert settings.gateway.port == port
    assert settings.gateway.webhook_token is not None
    assert settings.gateway.api_token is not None
    assert settings.gateway.db.startswith(("sqlite:////", "postgresql"))
    named = _env_names(settings.channels.model_dump() if settings.channels else {})
    named |= _env_names({k: v.model_dump() for k, v in settings.webhooks.items()})
    if reports is not None:
        named |= _env_names(settings.reports.model_dump())
    # Every secret the settings name by environment variable is in the pod's environment.
    assert named <= set(env), named - set(env)
    if values == "everything-on":
        assert named
        if component == "-report":
            assert reports is not None and reports["timezone"] == "Asia/Shanghai"


def _duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(int(n) * units[u] for n, u in parts)


@pytest.mark.parametrize("values", VALUES_SETS)
def test_stale_expiry_outlasts_every_alertmanager_repeat(values: str) -> None:
    """The gateway expires a firing alert Alertmanager has not repeated for
    stale_after_seconds: that must be longer than any repeat interval of the route."""
    objs = rendered(values)
    config = yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    stale = config["gateway"]["stale_after_seconds"]
    amcs = find(objs, "AlertmanagerConfig")
    source = yaml.safe_load(
        (REPO / "rules" / "alertmanager-inhibit.yaml").read_text(encoding="utf-8")
    )
    if amcs:
        route = amcs[0]["spec"]["route"]
        repeats = [route["repeatInterval"]] + [
            r["repeatInterval"] for r in route.get("routes", []) if "repeatInterval" in r
        ]
    else:
        route = source["route"]
        repeats = [route["repeat_interval"]] + [
            r["repeat_interval"] for r in route.get("routes", []) if "repeat_interval" in r
        ]
    longest = max(_duration_seconds(r) for r in repeats)
    assert stale == max(longest + 1800, 4.5 * 3600)


def test_stale_expiry_can_be_set(tmp_path: Path) -> None:
    objs = template(overrides={"gateway": {"staleAfterSeconds": 7200}}, tmp=tmp_path)
    config = yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    assert config["gateway"]["stale_after_seconds"] == 7200


def test_retention_settings_reach_the_gateway(tmp_path: Path) -> None:
    objs = rendered("everything-on")
    config = yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    assert config["gateway"]["retention"] == {
        "receipts_days": 3,
        "alerts_days": 60,
        "batch_size": 200,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    retention = load_settings(path, env={}).gateway.retention
    assert (retention.receipts_days, retention.alerts_days, retention.batch_size) == (3, 60, 200)
    assert retention.notifications_days == 90  # the default where the values say nothing
    defaults = yaml.safe_load(
        one(rendered("defaults"), "ConfigMap", "-config")["data"]["config.yaml"]
    )
    assert "retention" not in defaults["gateway"]  # the gateway's own defaults apply


ACCESS_VALUES = {
    "console": {"trusted_proxies": ["10.42.7.0/24"]},
    "access": {
        "admin_groups": ["sre"],
        "admin_feishu": ["sam"],
        "teams": {
            "team-a": {"namespaces": ["team-a"], "groups": ["team-a-oncall"], "feishu": ["ann"]},
            "team-b": {"namespaces": ["team-b"], "schedules": ["b-primary"], "feishu": ["ou_b0"]},
        },
    },
}
ONCALL_VALUES = {
    "people": {"ann": {"feishu_open_id": "ou_a1"}, "sam": {"feishu_open_id": "ou_5a"}},
    "schedules": {
        "b-primary": {
            "timezone": "UTC",
            "layers": [
                {"name": "p", "start": "2026-11-16T09:00", "shift": "1w", "members": ["ann"]}
            ],
        }
    },
}


def test_teams_and_the_proxy_reach_the_gateway(tmp_path: Path) -> None:
    """Issue 43: `gateway.access` (who acts on which teams' incidents) and `gateway.console`
    (the trusted proxy) become config.yaml's `gateway.access` and `gateway.console`, which
    the gateway loads as its settings; without them access is not divided."""
    objs = template(overrides={"gateway": ACCESS_VALUES, "oncall": ONCALL_VALUES}, tmp=tmp_path)
    config = yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    assert config["gateway"]["access"] == ACCESS_VALUES["access"]
    assert config["gateway"]["console"] == ACCESS_VALUES["console"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    settings = load_settings(path, env={})
    access = settings.gateway.access
    assert access.divided and access.team_groups("team-b") == ("team-b",)
    assert access.teams["team-a"].feishu == ("ann",) and access.admin_feishu == ("sam",)
    assert settings.gateway.console.trusted_proxies == ["10.42.7.0/24"]
    defaults = yaml.safe_load(
        one(rendered("defaults"), "ConfigMap", "-config")["data"]["config.yaml"]
    )
    assert "access" not in defaults["gateway"] and "console" not in defaults["gateway"]
    assert not validate_settings(defaults).gateway.access.divided


def _env_names(node: Any) -> set[str]:
    names: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith("_env") and isinstance(value, str):
                names.add(value)
            else:
                names |= _env_names(value)
    elif isinstance(node, list):
        for item in node:
            names |= _env_names(item)
    return names


def test_only_known_settings_variables_are_set() -> None:
    # TRAINSENTRY_PROBE_TOKEN: the probes' master token, read by the gateway's diagnosis
    # section (gateway/sections.py) and the operator (operator/operator_command.py)
    known = set(_ENV_MAP) | {"TRAINSENTRY_CONFIG", "TRAINSENTRY_PROBE_TOKEN"}
    for obj in find(rendered("everything-on"), "Deployment") + find(
        rendered("everything-on"), "CronJob"
    ):
        for item in _container(obj).get("env", []):
            if item["name"].startswith("TRAINSENTRY_"):
                assert item["name"] in known, item["name"]


def test_sqlite_lives_on_the_claim_mounted_at_its_path() -> None:
    objs = rendered("defaults")
    gateway = one(objs, "Deployment", "-gateway")
    container = _container(gateway)
    db = {e["name"]: e for e in container["env"]}["TRAINSENTRY_DB"]["value"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert db == f"sqlite:///{mounts['data']}/trainsentry.db"
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    claim = one(objs, "PersistentVolumeClaim")
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # The report job reads the same file and is scheduled next to the gateway.
    report = one(objs, "CronJob")
    pod = report["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["data"] == volumes["data"]
    term = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert (
        term["labelSelector"]["matchLabels"].items()
        <= gateway["spec"]["selector"]["matchLabels"].items()
    )


def test_gateway_probes_use_the_health_endpoints() -> None:
    container = _container(one(rendered("defaults"), "Deployment", "-gateway"))
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["args"][0] == "gateway"


@pytest.mark.parametrize("values", ["defaults", "everything-on"])
def test_alertmanager_reaches_the_gateway_with_its_token(values: str) -> None:
    objs = rendered(values)
    amc = one(objs, "AlertmanagerConfig")
    (receiver,) = amc["spec"]["receivers"]
    assert amc["spec"]["route"]["receiver"] == receiver["name"]
    (webhook,) = receiver["webhookConfigs"]
    service = one(objs, "Service", "-gateway")
    port = service["spec"]["ports"][0]["port"]
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert webhook["url"] == f"http://{name}.{namespace}.svc:{port}/api/v1/alertmanager"
    assert webhook["sendResolved"] is True
    credentials = webhook["httpConfig"]["authorization"]["credentials"]
    gateway_env = {e["name"]: e for e in _container(one(objs, "Deployment", "-gateway"))["env"]}
    assert credentials == gateway_env["TRAINSENTRY_WEBHOOK_TOKEN"]["valueFrom"]["secretKeyRef"]
    token = _secret_value(objs, credentials)
    if values == "everything-on":
        assert token == "given-webhook-token"
    else:
        assert len(token) == 48 and token.isalnum()


def test_generated_tokens_differ() -> None:
    objs = rendered("defaults")
    secret = one(objs, "Secret", "-gateway-auth")
    assert len(set(secret["data"].values())) == 3  # webhook, API and probe tokens


def test_existing_secrets_are_used_and_not_created() -> None:
    objs = rendered("ha-postgres")
    # only the admission webhook's credentials, rendered empty (operator-webhook.yaml)
    assert [s["metadata"]["name"] for s in find(objs, "Secret")] == [
        "ts-trainsentry-operator-webhook-credentials"
    ]
    env = {e["name"]: e for e in _container(one(objs, "Deployment", "-gateway"))["env"]}
    assert env["TRAINSENTRY_DB"]["valueFrom"]["secretKeyRef"] == {
        "name": "trainsentry-db",
        "key": "dsn",
    }
    assert (
        env["TRAINSENTRY_WEBHOOK_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
        == "trainsentry-tokens"
    )


def test_config_change_rolls_the_gateway() -> None:
    def checksum(values: str) -> str:
        gateway = one(rendered(values), "Deployment", "-gateway")
        return str(gateway["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum("defaults") != checksum("everything-on")


def test_config_yaml_is_plain_yaml_without_secrets() -> None:
    config = yaml.safe_load(
        one(rendered("everything-on"), "ConfigMap", "-config")["data"]["config.yaml"]
    )
    assert config["gateway"]["alertmanager_url"] == "http://alertmanager-operated.monitoring:9093"
    assert "webhook_token" not in config["gateway"] and "db" not in config["gateway"]


@pytest.mark.parametrize(
    ("suffix", "job_pattern"),
    [("-dcgm-exporter", ".*dcgm-exporter.*"), ("-node-exporter", ".*node-exporter.*")],
)
def test_exporter_scrapes_give_the_labels_the_rules_expect(suffix: str, job_pattern: str) -> None:
    """docs/alerts.md: series carry `node`; `up` has a job matching the exporter's name."""
    objs = rendered("defaults")
    monitor = one(objs, "ServiceMonitor", suffix)
    service = one(objs, "Service", suffix)
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert re.fullmatch(job_pattern, job)
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint[
        "relabelings"
    ]
    # Where the DaemonSet runs: test_exporter_nodes.py (the operator's per-exporter labels).


def _relabel(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str]:
    """Prometheus' relabeling, for the actions the chart uses (`replace`, the default with
    its default regex `(.*)` and replacement `$1`, and `labeldrop`)."""
    out = dict(labels)
    for config in configs:
        action = config.get("action", "replace")
        if action == "labeldrop":
            out = {k: v for k, v in out.items() if not re.fullmatch(config["regex"], k)}
        elif action == "replace":
            assert set(config) <= {"action", "sourceLabels", "targetLabel"}, config
            value = ";".join(out.get(name, "") for name in config["sourceLabels"])
            out[config["targetLabel"]] = value
            out = {k: v for k, v in out.items() if v}  # an empty label is no label
        else:
            raise AssertionError(f"unexpected action {action}")
    return out


def test_the_chart_gpu_series_carry_no_namespace() -> None:
    """Issue 43 (docs/alerts.md "Trusted evidence"): dcgm-exporter's pod attribution sets the
    workload's `namespace` on a busy GPU's series (kept by `honorLabels`); the chart's alerts
    must carry none to be trusted evidence, and GPUMissing counts per node and namespace.
    The workload's namespace is kept as `exported_namespace`."""
    monitor = one(rendered("defaults"), "ServiceMonitor", "-dcgm-exporter")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    scraped = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "3", "node": "gpu-node-7",
               "namespace": "team-a", "pod": "llama-worker-3", "container": "pytorch"}  # fmt: skip
    kept = _relabel(scraped, endpoint.get("metricRelabelings", []))
    assert "namespace" not in kept and kept["exported_namespace"] == "team-a"
    assert kept["pod"] == "llama-worker-3" and kept["node"] == "gpu-node-7"
    idle = _relabel({"gpu": "0", "node": "gpu-node-7"}, endpoint.get("metricRelabelings", []))
    assert idle == {"gpu": "0", "node": "gpu-node-7"}


def _post(url: str, body: bytes, token: str | None) -> int:
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.e2e
@pytest.mark.parametrize("values", ["defaults", "everything-on"])
def test_real_gateway_runs_with_the_rendered_config_and_token(values: str, tmp_path: Path) -> None:
    """The gateway process, started with the rendered config.yaml, environment and command
    line, becomes ready and takes Alertmanager's webhook with the token the chart wired."""
    objs = rendered(values)
    container = _container(one(objs, "Deployment", "-gateway"))
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        one(objs, "ConfigMap", "-config")["data"]["config.yaml"], encoding="utf-8"
    )
    env = _env_for(objs, container)
    env["TRAINSENTRY_CONFIG"] = str(config_file)
    # Loopback and a local SQLite file instead of the pod's address and volume.
    env["TRAINSENTRY_DB"] = f"sqlite:///{tmp_path / 'gateway.db'}"
    amc = one(objs, "AlertmanagerConfig")
    token = _secret_value(
        objs,
        amc["spec"]["receivers"][0]["webhookConfigs"][0]["httpConfig"]["authorization"][
            "credentials"
        ],
    )

    def argv(port: int, _workdir: Path) -> list[str]:
        # start_server builds the command line before it starts the process with `env`.
        env["TRAINSENTRY_LISTEN"] = f"127.0.0.1:{port}"
        return [sys.executable, "-m", "trainsentry", *container["args"]]

    trigger_port = _free_port()  # the trigger port the config names, on loopback
    assert "trigger_listen: 0.0.0.0:9096" in config_file.read_text()
    env["TRAINSENTRY_TRIGGER_LISTEN"] = f"127.0.0.1:{trigger_port}"

    probe_paths = {
        container["readinessProbe"]["httpGet"]["path"],
        container["livenessProbe"]["httpGet"]["path"],
    }
    with start_server(
        tmp_path,
        "gateway",
        argv,
        ready_path=container["readinessProbe"]["httpGet"]["path"],
        env=env,
    ) as gateway:
        url = f"{gateway.url}/api/v1/alertmanager"
        body = encode(make_body([make_alert(1)]))
        assert _post(url, body, None) == 401
        assert _post(url, body, "wrong") == 401
        assert 200 <= _post(url, body, token) < 300
        for path in [*probe_paths, "/metrics"]:
            with urllib.request.urlopen(f"{gateway.url}{path}", timeout=10) as response:
                assert response.status == 200, path
        # the trigger port answers a trigger without a token as the gateway's port does
        trigger = b'{"namespace": "team-a"}'
        here = _post(f"{gateway.url}/api/v1/hang-triggers", trigger, None)
        there = _post(f"http://127.0.0.1:{trigger_port}/api/v1/hang-triggers", trigger, None)
        assert here == there == 401


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_the_probes_are_pointed_at_the_trigger_port(tmp_path: Path) -> None:
    """gateway.triggerPort (9096): the gateway listens there (`trigger_listen`), its container
    and Service name the port, the operator gives the probes the Service's trigger port as
    TRAINSENTRY_GATEWAY_URL; 0: none of that, the probes post to the gateway's port."""
    for values, expected in (({}, 9096), ({"gateway": {"triggerPort": 0}}, None)):
        folder = tmp_path / str(expected)
        folder.mkdir()
        objs = template("defaults", values, folder)
        config = yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"])
        gateway = _container(one(objs, "Deployment", "-gateway"))
        ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
        service = one(objs, "Service", "-gateway")
        served = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
        operator = _container(one(objs, "Deployment", "-operator"))
        (url,) = [a.split("=", 1)[1] for a in operator["args"] if a.startswith("--gateway-url=")]
        name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
        if expected is None:
            assert "trigger_listen" not in config["gateway"]
            assert set(ports) == {"http"} and set(served) == {"http"}
            assert url == f"http://{name}.{namespace}.svc:{served['http'][0]}"
            continue
        assert config["gateway"]["trigger_listen"] == f"0.0.0.0:{expected}"
        assert ports == {"http": 9095, "triggers": expected}
        assert served["triggers"] == (9096, "triggers") and served["http"] == (9095, "http")
        assert url == f"http://{name}.{namespace}.svc:9096"


def test_channels_example_of_docs_channels_md_installs(tmp_path: Path) -> None:
    """The `channels:` example in docs/channels.md (with the `oncall:` escalation its phone
    calls need), given as chart values, renders into a config.yaml the settings accept, with
    every named secret in the environment."""
    text = (REPO / "docs" / "channels.md").read_text(encoding="utf-8")
    match = re.search(r"```yaml\n(channels:\n.*?)```", text, re.S)
    assert match, "docs/channels.md has no `channels:` example"
    documented = yaml.safe_load(match.group(1))
    example, oncall = documented["channels"], documented["oncall"]
    secrets = {name: f"value-of-{name}" for name in _env_names(example)}
    values = {"channels": {"config": example, "secretEnv": secrets}, "oncall": oncall}
    objs = template(overrides=values, tmp=tmp_path)
    container = _container(one(objs, "Deployment", "-gateway"))
    env = _env_for(objs, container)
    config = yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    assert (config["channels"], config["oncall"]) == (example, oncall)
    settings = validate_settings(config)  # the gateway loads it
    assert settings.oncall.escalation is not None
    assert {name: env[name] for name in secrets} == secrets


def test_report_is_suspended_until_it_has_a_way_to_send() -> None:
    assert one(rendered("defaults"), "CronJob")["spec"]["suspend"] is True
    assert one(rendered("everything-on"), "CronJob")["spec"]["suspend"] is False
