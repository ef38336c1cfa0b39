"""What a card shows of the incident it speaks for (pure): how many alerts, on how many
nodes and GPUs, the first of them named ("and N more"), why it pages on its own during a
storm, and its page. card.py renders these as fields (escaped and clipped there) and a link.

A card about a lone alert shows no more than the alert's own fields: the incident's counts
appear once it holds several alerts or nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainsentry.notifiers.payload_contract import NotificationPayload, alertname


def names_with_more(names: Sequence[str], count: int, more_known: bool = False) -> str:
    """Pure: "a, b, c and 7 more" (`count` in all; `more_known`: some were not counted)."""
    shown = ", ".join(names)
    rest = count - len(names)
    if rest > 0:
        shown += f" and {rest} more"
    if more_known:
        shown += " (and others not counted by name)"
    return shown


def spans_nodes(payload: NotificationPayload) -> bool:
    """Pure: whether the payload's incident is on more than one node."""
    return (payload.get("incident") or {}).get("nodes", 0) > 1


def _spread(payload: NotificationPayload) -> bool:
    info = payload.get("incident") or {}
    return info.get("alerts", 1) > 1 or spans_nodes(payload)


def shared_headline(payload: NotificationPayload) -> str:
    """Pure: the headline of a card whose incident spans several nodes: what its alerts
    share and how many still fire ("NodeFilesystemSpaceLow on 3 mountpoints of 64 nodes:
    142 of 192 alerts firing", "... all 192 alerts resolved"), never one alert's own summary
    (one node's, one mountpoint's, perhaps resolved long ago). "" for a card about one node."""
    if not spans_nodes(payload):
        return ""
    info = payload.get("incident") or {}
    alerts, firing = info.get("alerts", 0), info.get("firing", 0)
    plus = "+" if info.get("untracked") else ""
    state = f"{firing} of {alerts} alerts firing" if firing else f"all {alerts} alerts resolved"
    mounts, kinds = info.get("mountpoints", 0), info.get("alertnames", 0)
    where = f"{mounts} mountpoints of " if mounts > 1 else ""
    what = alertname(payload) or "alert"
    if kinds > 1:  # the card's own alertname is one of several: count the rest
        what += f" and {kinds - 1} other kind{'s' if kinds > 2 else ''} of alert"
    return f"{what} on {where}{info.get('nodes', 0)}{plus} nodes: {state}"


def scope_suffix(payload: NotificationPayload) -> str:
    """Pure: what the title adds: " · 20 nodes" (or " · 3 alerts" on one node)."""
    info = payload.get("incident") or {}
    if not _spread(payload):
        return ""
    nodes = info.get("nodes", 0)
    plus = "+" if info.get("untracked") else ""
    if spans_nodes(payload):
        return f" · {nodes}{plus} nodes"
    return f" · {info.get('alerts', 0)} alerts"


def incident_fields(payload: NotificationPayload) -> list[tuple[str, str]]:
    """Pure: (name, value) fields of the incident: its story, the resolutions not believed
    yet, its jobs, the note, alerts, nodes and GPUs named."""
    info = payload.get("incident")
    if not info:
        return []
    pairs: list[tuple[str, str]] = []
    if info.get("story"):
        pairs.append(("Story", info.get("story", "")))
    if info.get("culprits"):
        pairs.append(("Hang culprits", info.get("culprits", "")))
    if info.get("unknown"):
        pairs.append(("Resolution unknown", info.get("unknown", "")))
    if len(info.get("jobs") or ()) > 1:
        pairs.append(("Jobs", ", ".join(info.get("jobs") or ())))
    if info.get("note"):
        pairs.append(("Pages on its own", info.get("note", "")))
    if info.get("spent"):
        pairs.append(("Spent", info.get("spent", "")))
    if not _spread(payload):
        return pairs
    alerts, firing = info.get("alerts", 0), info.get("firing", 0)
    pairs.append(("Alerts", f"{alerts} ({firing} firing, {alerts - firing} resolved)"))
    untracked = bool(info.get("untracked"))
    if info.get("nodes"):
        names = names_with_more(info.get("node_names", []), info.get("nodes", 0), untracked)
        pairs.append(("Nodes", f"{info.get('nodes', 0)}: {names}"))
    if info.get("gpus"):
        names = names_with_more(info.get("gpu_names", []), info.get("gpus", 0), untracked)
        pairs.append(("GPUs", f"{info.get('gpus', 0)}: {names}"))
    if info.get("ports"):
        names = names_with_more(info.get("port_names", []), info.get("ports", 0), untracked)
        pairs.append(("HCA ports", f"{info.get('ports', 0)}: {names}"))
    return pairs
