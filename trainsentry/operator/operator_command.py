"""`trainsentry operator`: run the TrainingJob operator (kopf)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainsentry.operator.handlers import WebhookServing
    from trainsentry.operator.reconcile import Sources
    from trainsentry.operator.webhook_credentials import WebhookCredentials

HELP = "run the TrainingJob operator"
DESCRIPTION = """\
Run the TrainingJob operator: for every TrainingJob it renders a PrometheusRule, a
PodMonitor and a dashboard ConfigMap, labels the job's nodes for the shared exporters and
keeps the job's status; opted-in PyTorchJobs / Volcano Jobs get a TrainingJob.

The probe token: with TRAINSENTRY_PROBE_TOKEN (the gateway's master probe token) in the
environment, every TrainingJob's namespace gets a Secret <job>-trainsentry-probe-token with
the job's own token (HMAC of the master and the job's name), owned by the job. With
--webhook-port, pods a TrainingJob selects get the probe as they are created.

Connects in-cluster when run in a pod (service account) unless --kubeconfig or --context
is given, else with the kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config) and its
--context (default: the current-context); the watches and the writes use the same one.

Exit codes:
  0  stopped cleanly (SIGINT/SIGTERM)
  1  failed (cannot connect, cannot load rules, operator crashed)
  2  usage error
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`trainsentry operator`'s options.

    One piece: a flat list of argparse definitions, read down like the --help it prints.
    """
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch only this namespace (repeatable; globs like team-* work)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="watch all namespaces (the default when no --namespace is given)",
    )
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: in-cluster, then $KUBECONFIG / ~/.kube/config)",
    )
    parser.add_argument("--context", help="kubeconfig context (default: the current-context)")
    parser.add_argument(
        "--peering",
        metavar="NAME",
        default=None,
        help="enable kopf peering under this name for HA (several replicas, "
        "one active); needs the kopf peering CRDs",
    )
    parser.add_argument(
        "--priority", type=int, default=0, help="peering priority of this replica (higher wins)"
    )
    parser.add_argument(
        "--resync",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="re-reconcile every job this often (default: 60)",
    )
    parser.add_argument(
        "--no-discovery",
        action="store_true",
        help="do not create TrainingJobs for annotated PyTorchJobs/Volcano Jobs",
    )
    parser.add_argument("--rules-dir", help="rule files to render (default: bundled rules/)")
    parser.add_argument("--dashboards-dir", help="dashboards (default: bundled dashboards/)")
    parser.add_argument(
        "--dashboards-namespace",
        metavar="NAMESPACE",
        default=None,
        help="keep every job's dashboard ConfigMap in this namespace (the operator's own, so "
        "that ConfigMap writes need a Role there only) instead of next to the job",
    )
    parser.add_argument(
        "--job-alerting",
        choices=("on", "off"),
        default=None,
        help="whether the gateway reads TrainingJobs' spec.alerting (the chart passes its "
        "gateway.jobAlerting.enabled): with off, a job that sets owners, feishu or "
        "onCallRosterRef gets AlertingReady=Unknown (JobAlertingDisabled) and a Warning "
        "event; unset: the operator says nothing of it",
    )
    parser.add_argument(
        "--job-alerting-namespace",
        action="append",
        default=[],
        metavar="NS",
        help="with --job-alerting on: the gateway reads spec.alerting in this namespace only "
        "(repeatable); a job elsewhere gets AlertingReady=Unknown (JobAlertingNotInNamespace)",
    )
    hook = parser.add_argument_group(
        "admission webhook",
        "instrument the pods of TrainingJobs as they are created (docs/operator.md, "
        '"Instrumenting the job\'s pods"); the chart sets all of these',
    )
    hook.add_argument(
        "--webhook-port",
        type=int,
        metavar="PORT",
        help="serve the mutating admission webhook over HTTPS on this port (unset: no webhook)",
    )
    hook.add_argument(
        "--webhook-credentials",
        metavar="NAMESPACE/NAME",
        help="the Secret in which the operator keeps the webhook's certificate and path token "
        "(the chart creates it empty); with --webhook-configuration, --webhook-service and "
        "--webhook-dir. Else --webhook-cert and --webhook-key, and no path token",
    )
    hook.add_argument(
        "--webhook-configuration",
        metavar="NAME",
        help="the MutatingWebhookConfiguration whose caBundle and path the operator keeps",
    )
    hook.add_argument(
        "--webhook-service",
        metavar="NAME.NAMESPACE",
        help="the webhook's Service: the names its certificate is for",
    )
    hook.add_argument(
        "--webhook-dir", metavar="DIR", help="where the served certificate files are written"
    )
    hook.add_argument(
        "--webhook-certificate-days",
        type=int,
        default=365,
        metavar="DAYS",
        help="validity of each certificate the operator makes (renewed at a third left)",
    )
    hook.add_argument(
        "--webhook-client-ca",
        metavar="FILE",
        help="answer only callers presenting a client certificate this CA (PEM) signed: the "
        "API server, where its AdmissionConfiguration gives it one for this webhook",
    )
    hook.add_argument("--webhook-cert", metavar="FILE", help="its TLS certificate (PEM)")
    hook.add_argument("--webhook-key", metavar="FILE", help="its TLS private key (PEM)")
    hook.add_argument(
        "--probe-image",
        metavar="IMAGE",
        help="the trainsentry image the pods' init container copies the probe from",
    )
    hook.add_argument(
        "--probe-image-pull-policy",
        choices=("Always", "IfNotPresent", "Never"),
        default="IfNotPresent",
    )
    hook.add_argument(
        "--gateway-url",
        metavar="URL",
        default="",
        help="the gateway's address as pods reach it (their TRAINSENTRY_GATEWAY_URL: hang "
        "triggers go there), e.g. http://trainsentry-gateway.trainsentry.svc:9095",
    )
    parser.add_argument(
        "--label-namespaces",
        action="store_true",
        help='label each namespace holding a TrainingJob trainsentry.io/trainingjobs: "true" '
        "(the chart's webhook and NetworkPolicy selectors read it)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


PROBE_TOKEN_ENV = "TRAINSENTRY_PROBE_TOKEN"


def webhook_serving(args: argparse.Namespace, env: Mapping[str, str]) -> WebhookServing | None:
    """The webhook the arguments ask for, or None; ValueError says what is missing."""
    from trainsentry.operator.handlers import WebhookServing
    from trainsentry.operator.instrument import InstrumentSettings

    if args.webhook_port is None:
        return None
    if not 0 < args.webhook_port < 65536:
        raise ValueError(f"--webhook-port {args.webhook_port} is not a port")
    if not args.probe_image:
        raise ValueError("--webhook-port needs --probe-image")
    settings = InstrumentSettings(
        image=args.probe_image,
        gateway_url=args.gateway_url,
        image_pull_policy=args.probe_image_pull_policy,
        token_secrets=bool((env.get(PROBE_TOKEN_ENV) or "").strip()),
    )
    client_ca = args.webhook_client_ca or None
    if args.webhook_credentials:
        credentials = _webhook_credentials(args)
        return WebhookServing(
            settings, port=args.webhook_port, credentials=credentials, client_ca=client_ca
        )
    if not (args.webhook_cert and args.webhook_key):
        raise ValueError(
            "--webhook-port needs --webhook-credentials, or --webhook-cert and --webhook-key"
        )
    return WebhookServing(
        settings,
        port=args.webhook_port,
        certfile=args.webhook_cert,
        keyfile=args.webhook_key,
        client_ca=client_ca,
    )


def _webhook_credentials(args: argparse.Namespace) -> WebhookCredentials:
    """The credentials the operator keeps (`webhook_credentials.py`); ValueError says what
    is missing or malformed."""
    from pathlib import Path

    from trainsentry.operator.handlers import WEBHOOK_ID, WEBHOOK_NAME
    from trainsentry.operator.webhook_credentials import WebhookCredentials

    missing = [
        flag
        for flag, value in (
            ("--webhook-configuration", args.webhook_configuration),
            ("--webhook-service", args.webhook_service),
            ("--webhook-dir", args.webhook_dir),
        )
        if not value
    ]
    if missing:
        raise ValueError(f"--webhook-credentials needs {', '.join(missing)}")
    namespace, _, secret = str(args.webhook_credentials).partition("/")
    service, _, service_namespace = str(args.webhook_service).partition(".")
    if not (namespace and secret and service and service_namespace):
        raise ValueError(
            "--webhook-credentials is NAMESPACE/NAME, --webhook-service NAME.NAMESPACE"
        )
    if not 1 <= args.webhook_certificate_days <= 3650:
        raise ValueError("--webhook-certificate-days is 1 to 3650")
    dns = f"{service}.{service_namespace}.svc"
    return WebhookCredentials(
        namespace=namespace,
        secret=secret,
        configuration=args.webhook_configuration,
        webhook=WEBHOOK_NAME,
        webhook_id=WEBHOOK_ID,
        names=(dns, f"{dns}.cluster.local", f"{service}.{service_namespace}", service),
        folder=Path(args.webhook_dir),
        days=args.webhook_certificate_days,
    )


def _probe_token(env: Mapping[str, str], log: logging.Logger) -> str | None:
    """The gateway's master probe token (PROBE_TOKEN_ENV in `env`), or None, which is
    logged once as a warning: then no job gets a probe token Secret."""
    probe_token = (env.get(PROBE_TOKEN_ENV) or "").strip() or None
    if probe_token is None:
        log.warning(
            "event=no_probe_token detail=%r",
            f"{PROBE_TOKEN_ENV} is not set: no job gets a probe token Secret, and "
            "instrumented pods get no token (their probes serve no dumps)",
        )
    return probe_token


def _load_sources(args: argparse.Namespace) -> Sources:
    """The rule files and dashboards the arguments name (default: the bundled ones), with
    where dashboards go and who reads spec.alerting (None: unset, the operator says nothing
    of it). Raises OSError or ValueError when they cannot be loaded."""
    from pathlib import Path

    from trainsentry import assets
    from trainsentry.operator.reconcile import load_sources
    from trainsentry.operator.status import JobAlertingScope

    return load_sources(
        Path(args.rules_dir or assets.rules_dir()),
        Path(args.dashboards_dir or assets.dashboards_dir()),
        args.dashboards_namespace or None,
        None
        if args.job_alerting is None
        else JobAlertingScope(args.job_alerting == "on", frozenset(args.job_alerting_namespace)),
    )


async def _operate(
    args: argparse.Namespace,
    sources: Sources,
    probe_token: str | None,
    webhook: WebhookServing | None,
) -> None:
    """Runs kopf with our handlers until it stops. kopf and our own client connect with the
    same kubeconfig and context; exact namespaces (no glob) spare the cluster-wide scan."""
    import kopf

    from trainsentry.operator.handlers import OperatorOptions, build_registry
    from trainsentry.operator.login import load_api_config, login_handler

    api_config = await load_api_config(args.kubeconfig, args.context)
    exact = bool(args.namespace) and not any(
        char in name for name in args.namespace for char in "*?[]!"
    )
    options = OperatorOptions(
        resync_seconds=args.resync,
        discovery=not args.no_discovery,
        api_config=api_config,
        login=login_handler(args.kubeconfig, args.context),
        scan_cluster=not exact,
        probe_token=probe_token,
        webhook=webhook,
        label_namespaces=args.label_namespaces,
    )
    registry = build_registry(sources, options)
    await kopf.operator(
        registry=registry,
        namespaces=list(args.namespace),
        clusterwide=not args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness,
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import os

    from trainsentry.logs import quiet_url_loggers

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    quiet_url_loggers()
    log = logging.getLogger("trainsentry.operator")
    if args.job_alerting_namespace and args.job_alerting != "on":
        log.error("event=usage error='--job-alerting-namespace needs --job-alerting on'")
        return 2
    try:
        webhook = webhook_serving(args, os.environ)
    except ValueError as exc:
        log.error("event=usage error=%r", str(exc))
        return 2
    probe_token = _probe_token(os.environ, log)
    try:
        sources = _load_sources(args)
    except (OSError, ValueError) as exc:
        log.error("event=load_failed error=%r", str(exc))
        return 1
    try:
        asyncio.run(_operate(args, sources, probe_token, webhook))
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the exit code and one log line are the interface
        log.error("event=operator_failed error=%r", str(exc))
        return 1
    return 0
