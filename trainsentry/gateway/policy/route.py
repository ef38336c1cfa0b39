"""Who hears about what: priority × job/namespace/labels → channel names (pure)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from trainsentry.alerts import JobRef, Priority
from trainsentry.gateway.policy.rules import JobRoutingPolicy, Policy
from trainsentry.gateway.policy.rules import Route as RouteRule
from trainsentry.labels import JOB_NAME_LABELS, NAMESPACE_LABEL
from trainsentry.notifiers.payload_contract import JobRoutePayload
from trainsentry.userregex import full_match


@dataclass(frozen=True, slots=True)
class RouteDecision:
    channels: tuple[str, ...]  # in route order, no duplicates
    route_id: str  # the route that matched, or "default:P1"
    unconfigured: tuple[str, ...] = ()  # routed but not configured in this gateway (dropped)


# A route may name a kind of channel instead of one channel: the shipped policy routes to
# `feishu` and `sheet`, whichever Feishu channels this gateway runs (docs/policy.md).
CHANNEL_KINDS: Mapping[str, tuple[str, ...]] = {
    "feishu": ("feishu", "feishu_bot", "feishu_app"),
    "sheet": ("sheet", "feishu_sheet"),
}
# Channels that archive every change of every alert (policy_plan.archive_draft).
ARCHIVE_CHANNELS = frozenset(CHANNEL_KINDS["sheet"])


def expand(name: str, configured: Collection[str]) -> tuple[str, ...]:
    """The configured channels a routed name stands for (none: it is not configured)."""
    return tuple(member for member in CHANNEL_KINDS.get(name, (name,)) if member in configured)


def unconfigured_names(policy: Policy, configured: Collection[str]) -> list[str]:
    """Channel names the routing uses that stand for no configured channel (`always` and
    archive names excepted: those are optional), for a warning at start."""
    routing = policy.routing
    named = [name for rule in routing.routes for name in rule.channels]
    named += [name for names in routing.defaults.values() for name in names]
    optional = set(routing.always) | ARCHIVE_CHANNELS
    return sorted({n for n in named if n not in optional and not expand(n, configured)})


def _matches(rule: RouteRule, priority: Priority, labels: Mapping[str, str]) -> bool:
    if rule.priorities and priority not in rule.priorities:
        return False
    if rule.namespaces and labels.get("namespace", "") not in rule.namespaces:
        return False
    if rule.jobs:
        job = JobRef.from_labels(labels)
        if job is None or job.name not in rule.jobs:
            return False
    return all(full_match(pattern, labels.get(name, "")) for name, pattern in rule.labels.items())


def _unique(names: Collection[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def route(
    priority: Priority,
    labels: Mapping[str, str],
    policy: Policy,
    *,
    configured: Collection[str] | None = None,
    paging: bool = True,
) -> RouteDecision:
    """The channels for a notification of `priority` about an alert (or job) with `labels`.

    `configured`: channel names this gateway has notifiers for (None: all, names unexpanded).
    A routed kind (`feishu`) becomes its configured channels (`feishu_bot`, `feishu_app`);
    routed names standing for none are reported in `unconfigured`, not returned, except
    archive names: the gateway's archive takes every change by itself
    (stages/planning/plan.py), so a route naming it needs nothing more.
    `policy.routing.always` channels (console) are added when configured. `paging=False`
    drops the paging channels (phone): resolves, recurrences, flapping notices and storm
    summaries never ring a phone.
    """
    routing = policy.routing
    chosen: tuple[str, ...] | None = None
    route_id = f"default:{priority.value}"
    for rule in routing.routes:
        if _matches(rule, priority, labels):
            chosen, route_id = rule.channels, f"route:{rule.id}"
            break
    if chosen is None:
        chosen = routing.defaults[priority]
    names = [*chosen, *routing.always]
    if not paging:
        names = [name for name in names if name not in routing.paging_channels]
    wanted = _unique(names)
    if configured is None:
        return RouteDecision(channels=wanted, route_id=route_id)
    always = set(routing.always)
    channels: list[str] = []
    unconfigured: list[str] = []
    for name in wanted:
        members = expand(name, configured)
        if members:
            channels.extend(members)
        elif name not in always and name not in ARCHIVE_CHANNELS:
            unconfigured.append(name)
    return RouteDecision(
        channels=_unique(channels), route_id=route_id, unconfigured=tuple(unconfigured)
    )


def escalation_for(route_id: str, priority: Priority, policy: Policy) -> str:
    """Pure: the escalation policy (an `oncall.escalation_policies` name) a page of the route
    `route_id` with `priority` follows: the route's own, else `routing.escalation` for the
    priority, else "" (the default `oncall.escalation` layers). A route a TrainingJob's own
    settings changed (`route:ID+job`, apply_job_route) is still route ID."""
    routing = policy.routing
    if route_id.startswith("route:"):
        wanted = route_id.removeprefix("route:").removesuffix(JOB_ROUTE_SUFFIX)
        for rule in routing.routes:
            if rule.id == wanted and rule.escalation:
                return rule.escalation
    return routing.escalation.get(priority, "")


def escalation_names(policy: Policy) -> dict[str, str]:
    """Pure: where the policy names an escalation policy (field -> name), to check them."""
    routing = policy.routing
    found = {
        f"routing.routes[{i}].escalation": rule.escalation
        for i, rule in enumerate(routing.routes)
        if rule.escalation
    }
    found.update(
        {f"routing.escalation.{p.value}": name for p, name in routing.escalation.items() if name}
    )
    return found


# --- a TrainingJob's own route (spec.alerting) ------------------------------------------------

# The channel that delivers a job's Feishu cards to its own chat or bot (or, with mentions of
# its owners, to the gateway's Feishu channels it replaced);
# gateway/stages/services/job_alerting.py.
JOB_CHANNEL = "feishu_job"
# Ends the route id of a decision a job's own route changed (`route:ml+job`).
JOB_ROUTE_SUFFIX = "+job"


@dataclass(frozen=True, slots=True)
class JobRoute:
    """What the routing needs to know of one TrainingJob's `spec.alerting`, as the gateway
    last read and checked it: whether its own Feishu destination (chat or bot) is usable,
    its owners, and whether its on-call roster is usable. Only ever looked up by the job of
    the alert being routed, so a job's settings never touch another job's alerts."""

    feishu: bool = False
    owners: tuple[str, ...] = ()
    roster: bool = False


def apply_job_route(
    decision: RouteDecision,
    priority: Priority,
    job: JobRef,
    job_route: JobRoute,
    rules: JobRoutingPolicy,
    *,
    paging_channels: Collection[str] = ("phone",),
) -> tuple[RouteDecision, JobRoutePayload | None]:
    """Pure: the policy's decision for an alert of `job`, changed as the job's own route asks,
    within the admin's bounds (`rules`, the policy's `routing.jobs`); and what the
    notification's payload says about it (`job_route`; None when nothing changed).

    - Only priorities in `rules.allow` change; the others keep the policy's route.
    - The job's Feishu destination (or its owners to mention) replaces the Feishu channels
      (`feishu_bot`, `feishu_app`) of the decision by JOB_CHANNEL, except those that
      `rules.force` keeps for this priority. The replaced ones are the fallback: the job
      channel sends there when the job's own route fails. Where the decision has no Feishu
      channel (e.g. P3 to the archive only), no card is added.
    - With a usable roster, the pages of the decision (a paging channel) follow it.
    `decision.channels` must be configured channel names (`route(configured=...)`).
    """
    if priority not in rules.allow:
        return decision, None
    feishu = frozenset(CHANNEL_KINDS["feishu"])
    present = [name for name in decision.channels if name in feishu]
    mention = job_route.owners if priority in rules.mention else ()
    extra: JobRoutePayload = {}
    channels = list(decision.channels)
    if present and (job_route.feishu or mention):
        forced = {m for name in rules.force.get(priority, ()) for m in expand(name, feishu)}
        replaced = [name for name in present if name not in forced]
        if job_route.feishu or replaced:
            at = channels.index(present[0])
            channels = [name for name in channels if name not in replaced]
            channels.insert(min(at, len(channels)), JOB_CHANNEL)
            extra = {"fallback": replaced, "owners": list(mention)}
    if job_route.roster and any(name in paging_channels for name in channels):
        extra["roster"] = True
    if not extra:
        return decision, None
    extra["job"] = str(job)
    route_id = f"{decision.route_id}{JOB_ROUTE_SUFFIX}"
    return replace(decision, channels=_unique(channels), route_id=route_id), extra


def routed(
    priority: Priority,
    labels: Mapping[str, str],
    policy: Policy,
    *,
    configured: Collection[str] | None,
    job_routes: Mapping[JobRef, JobRoute],
    paging: bool = True,
) -> tuple[RouteDecision, JobRoutePayload | None]:
    """Pure: the route of a notification of `priority` about an alert (or job) with
    `labels`: the policy's (`route`), changed as the TrainingJob its labels name asks
    (`apply_job_route`) when `job_routes` holds that job's route; and the payload's
    `job_route` (None when no job route changed it)."""
    decision = route(priority, labels, policy, configured=configured, paging=paging)
    job = JobRef.from_labels(labels) if job_routes else None
    if job is None or (job_route := job_routes.get(job)) is None:
        return decision, None
    return apply_job_route(
        decision,
        priority,
        job,
        job_route,
        policy.routing.jobs,
        paging_channels=policy.routing.paging_channels,
    )


# The labels that say whose an alert is: its namespace and its TrainingJob.
JOB_IDENTITY = frozenset({NAMESPACE_LABEL, *JOB_NAME_LABELS})


def routed_apart(
    labels: Mapping[str, str],
    policy: Policy,
    *,
    configured: Collection[str] | None,
    job_routes: Mapping[JobRef, JobRoute],
) -> bool:
    """Pure: whether the job (or namespace) an alert's `labels` name has a route of its own:
    at some priority, the alert is told elsewhere than the same alert of no namespace and no
    job would be: other channels, another route (so perhaps another escalation policy), or
    its job's own chat, owners or on-call roster (`routed`). A route that matches on what
    the alert is (its `component`, its alertname) makes no job apart; one that matches its
    `namespaces`, `jobs` or a `namespace` label, or a job's spec.alerting, does
    (incident.py: such a job's alerts get an incident of their own inside a cluster-wide
    failure)."""
    anonymous = {name: value for name, value in labels.items() if name not in JOB_IDENTITY}
    if len(anonymous) == len(labels):
        return False
    for priority in Priority:
        mine, mine_extra = routed(
            priority, labels, policy, configured=configured, job_routes=job_routes
        )
        theirs, _ = routed(
            priority, anonymous, policy, configured=configured, job_routes=job_routes
        )
        if mine_extra is not None or (mine.channels, mine.route_id) != (
            theirs.channels,
            theirs.route_id,
        ):
            return True
    return False
