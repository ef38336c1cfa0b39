"""`trainsentry operator`: run the TrainingJob operator (kopf)."""

from __future__ import annotations

import argparse
import logging

HELP = "run the TrainingJob operator"
DESCRIPTION = """\
Run the TrainingJob operator: for every TrainingJob it renders a PrometheusRule, a
PodMonitor and a dashboard ConfigMap, labels the job's nodes for the shared exporters and
keeps the job's status; opted-in PyTorchJobs / Volcano Jobs get a TrainingJob.

Connects in-cluster when run in a pod (service account) unless --kubeconfig or --context
is given, else with the kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config) and its
--context (default: the current-context); the watches and the writes use the same one.

Exit codes:
  0  stopped cleanly (SIGINT/SIGTERM)
  1  failed (cannot connect, cannot load rules, operator crashed)
  2  usage error
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    import kopf

    from trainsentry import assets
    from trainsentry.logs import quiet_url_loggers
    from trainsentry.operator.handlers import OperatorOptions, build_registry
    from trainsentry.operator.login import load_api_config, login_handler
    from trainsentry.operator.reconcile import load_sources
    from trainsentry.operator.status import JobAlertingScope

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
        sources = load_sources(
            Path(args.rules_dir or assets.rules_dir()),
            Path(args.dashboards_dir or assets.dashboards_dir()),
            args.dashboards_namespace or None,
            None
            if args.job_alerting is None
            else JobAlertingScope(
                args.job_alerting == "on", frozenset(args.job_alerting_namespace)
            ),
        )
    except (OSError, ValueError) as exc:
        log.error("event=load_failed error=%r", str(exc))
        return 1

    async def main() -> None:
        # kopf and our own client connect with the same kubeconfig and context.
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

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the exit code and one log line are the interface
        log.error("event=operator_failed error=%r", str(exc))
        return 1
    return 0
