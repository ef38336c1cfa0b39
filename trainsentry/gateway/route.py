"""Who hears about what: priority × job/namespace/labels → channel names (pure)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache

from trainsentry.alerts import JobRef, Priority
from trainsentry.gateway.policy import Policy
from trainsentry.gateway.policy import Route as RouteRule


@dataclass(frozen=True, slots=True)
class RouteDecision:
    channels: tuple[str, ...]  # in route order, no duplicates
    route_id: str  # the route that matched, or "default:P1"
    unconfigured: tuple[str, ...] = ()  # routed but not configured in this gateway (dropped)


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _matches(rule: RouteRule, priority: Priority, labels: Mapping[str, str]) -> bool:
    if rule.priorities and priority not in rule.priorities:
        return False
    if rule.namespaces and labels.get("namespace", "") not in rule.namespaces:
        return False
    if rule.jobs:
        job = JobRef.from_labels(labels)
        if job is None or job.name not in rule.jobs:
            return False
    return all(
        _compiled(pattern).fullmatch(labels.get(name, "")) for name, pattern in rule.labels.items()
    )


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

    `configured`: channel names this gateway has notifiers for (None: all). Routed channels
    outside it are reported in `unconfigured`, not returned. `policy.routing.always` channels
    (console) are added when configured. `paging=False` drops the paging channels (phone):
    resolves, recurrences, flapping notices and storm summaries never ring a phone.
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
    return RouteDecision(
        channels=tuple(name for name in wanted if name in configured),
        route_id=route_id,
        unconfigured=tuple(
            name for name in wanted if name not in configured and name not in always
        ),
    )
