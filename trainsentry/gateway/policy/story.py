"""The story an incident's card tells: its alerts in the order they came, with times and
the job impact (pure), e.g.

    gpu-node-05: GPU 3 fell off the bus (XID 79) 20:37:44 → node NotReady +60 s →
    ml/llama-70b hung: ranks 40–47 on gpu-node-05 gone +337 s

`note` records an alert in the incident's `story` (one step per alertname and node, GPU or
job: the 8 probes of one job on one node are one step that counts them, with their pods and
ranks); `story_line` writes the line. Bounded: at most MAX_STEPS steps and MAX_NAMES pods
or ranks per step are kept; the rest are counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from trainsentry.alerts import Alert
from trainsentry.gateway.policy.correlate import CONSEQUENCE, NODE_DOMAIN
from trainsentry.gateway.policy.infra_words import PLACEMENT
from trainsentry.gateway.policy.storm import job_title

MAX_STEPS = 30
MAX_NAMES = 64
SHOWN_STEPS = 12
PHRASES = {
    "KubeNodeNotReady": "node NotReady",
    "NodeExporterDown": "node_exporter down",
    "DCGMExporterDown": "dcgm-exporter down",
    "NCCLRasDeadProcesses": "NCCL RAS says processes died",
    "NCCLRasMissingRanks": "NCCL RAS misses ranks",
    PLACEMENT: "runs on the node",
}
HANG = "TrainingJobHang"
PROBE_DOWN = "TrainingProbeDown"
RANK_GONE = "TrainingRankGone"
GONE = frozenset({PROBE_DOWN, RANK_GONE})  # a rank's probe went away (rules/training.yaml)


def _job_key(alert: Alert) -> str:
    """Pure: the alert's TrainingJob's `JobRef.key`, "" when none (the step's `job`)."""
    return alert.job.key if alert.job is not None else ""


def _step_key(alert: Alert, rank: int) -> str:
    labels = alert.labels
    if rank == CONSEQUENCE:
        return f"{alert.name}|{_job_key(alert)}|{alert.node}"
    parts = (alert.node, labels.get("gpu", ""), labels.get("device", ""))
    return "|".join((alert.name, *parts, labels.get("port", "")))


def note(story: dict[str, dict[str, Any]], alert: Alert, rank: int, at: datetime) -> None:
    """Pure apart from `story` (changed in place): the alert's step, new or counted."""
    key = _step_key(alert, rank)
    step = story.get(key)
    if step is None:
        if len(story) >= MAX_STEPS:
            return
        labels = alert.labels
        step = story[key] = {
            "at": at.isoformat(),
            "name": alert.name,
            "rank": rank,
            "node": alert.node,
            "gpu": labels.get("gpu", ""),
            "xid": labels.get("xid", ""),
            "job": _job_key(alert),
            "count": 0,
            "pods": [],
            "ranks": [],
        }
    step["count"] += 1
    for field, label in (("pods", "pod"), ("ranks", "rank")):
        value = alert.labels.get(label, "")
        if value and value not in step[field] and len(step[field]) < MAX_NAMES:
            step[field].append(value)


def ranks_text(ranks: Sequence[str]) -> str:
    """Pure: "40–47" for consecutive ranks, "3, 9, 12" otherwise."""
    if not ranks or not all(r.isdigit() for r in ranks):
        return ", ".join(ranks)
    numbers = sorted({int(r) for r in ranks})
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _who(steps: Sequence[Mapping[str, Any]]) -> str:
    """The ranks (else pods) of the probe steps, and their nodes."""
    ranks = [r for s in steps for r in s["ranks"]]
    pods = list(dict.fromkeys(p for s in steps for p in s["pods"]))
    nodes = sorted({s["node"] for s in steps if s["node"]})
    where = f" on {', '.join(nodes)}" if nodes else ""
    if ranks:
        return f"ranks {ranks_text(ranks)} (pods {_some(pods)}){where}"
    return f"pods {_some(pods)}{where}"


def _some(names: Sequence[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def phrase(step: Mapping[str, Any], story: Mapping[str, Mapping[str, Any]]) -> str:
    """Pure: what one step says."""
    name, job = step["name"], job_title(step["job"]) if step["job"] else ""
    gpu, xid = step["gpu"], step["xid"]
    if name == "GPUFellOffBus":
        text = f"GPU {gpu} fell off the bus" if gpu else "a GPU fell off the bus"
        return text + (f" (XID {xid})" if xid else "")
    if name in PHRASES:
        text = PHRASES[name]
        return f"{job}: {text}" if job and step["rank"] == CONSEQUENCE else text
    if name in GONE:
        count = step["count"]
        where = f" on {step['node']}" if step["node"] else ""
        if name == RANK_GONE:
            return f"{count} rank{'s' if count != 1 else ''} of {job}{where} gone"
        return f"{count} probe{'s' if count != 1 else ''} of {job}{where} down"
    if name == HANG:
        gone = [s for s in story.values() if s["name"] in GONE and s["job"] == step["job"]]
        return f"{job} hung" + (f": {_who(gone)} gone" if gone else "")
    text = f"GPU {gpu} {name}" if gpu else name
    text += f" (XID {xid})" if xid else ""
    return f"{text} of {job}" if job and step["rank"] == CONSEQUENCE else text


def culprits(story: Mapping[str, Mapping[str, Any]]) -> str:
    """Pure: for each hung job of the story, the ranks whose probes went away, with their
    pods and nodes ("" when no job hung or none went away): a hang card's culprits."""
    found = []
    for job in sorted({s["job"] for s in story.values() if s["name"] == HANG}):
        gone = [s for s in story.values() if s["name"] in GONE and s["job"] == job]
        if gone:
            found.append(f"{job_title(job)}: {_who(gone)} gone")
    return "; ".join(found)


def story_line(domain: str, story: Mapping[str, Mapping[str, Any]]) -> str:
    """Pure: the steps in the order they came: the first with its time (UTC), the others
    with their delay after it; prefixed with the node of a node's incident."""
    steps = sorted(story.values(), key=lambda s: (s["at"], s["name"]))
    if not steps:
        return ""
    first = datetime.fromisoformat(steps[0]["at"])
    parts = []
    for index, step in enumerate(steps[:SHOWN_STEPS]):
        when = datetime.fromisoformat(step["at"])
        stamp = (
            when.strftime("%H:%M:%S") if index == 0 else f"+{int((when - first).total_seconds())} s"
        )
        parts.append(f"{phrase(step, story)} {stamp}")
    if len(steps) > SHOWN_STEPS:
        parts.append(f"and {len(steps) - SHOWN_STEPS} more")
    prefix = f"{domain[len(NODE_DOMAIN) :]}: " if domain.startswith(NODE_DOMAIN) else ""
    return prefix + " → ".join(parts)
