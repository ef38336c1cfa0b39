"""The words of an infrastructure incident's cards (pure): what its card leads with, what
happened to each job it hit, what probably broke, and counts that say what they count
(infra.py builds the payloads from these).

Invariant: the lead names the element first ("leaf-a down: 64 ports on 8 nodes"), never
one node's port; a job's consequence is named by what happened to the job, strongest kept.
"""

from __future__ import annotations

from collections.abc import Mapping

# What a job's consequence alert says happened to it, weakest first (a later one in this
# order replaces an earlier one); any other consequence is named by its alertname.
CONSEQUENCES = (
    ("TrainingRankGone", "lost ranks"),
    ("TrainingProbeDown", "lost ranks"),
    ("NCCLRasMissingRanks", "NCCL misses ranks"),
    ("NCCLRasCommunicatorErrors", "NCCL communicators in error"),
    ("NCCLRasDeadProcesses", "NCCL processes dead"),
    ("TrainingRankStalledBehindPeers", "stalled in a collective"),
    ("TrainingJobHang", "hung in a collective"),
)
# The alert that only says where a job runs (rules/training.yaml: its pods are on a node
# with a P0 hardware alert): it names the job hit, yet nothing has happened to the job yet.
PLACEMENT = "TrainingJobOnFaultyNode"
# What probably broke, by the component most of the incident's hardware alerts are about.
CAUSES = {
    "fabric": "the switch or its cabling (network links of several nodes failed together)",
    "node": "shared power (PDU) or cooling (several nodes failed together)",
    "gpu": "shared power or cooling (GPUs of several nodes failed together)",
}
_RANK = {name: i for i, (name, _) in enumerate(CONSEQUENCES)}
_WORDS = dict(CONSEQUENCES)


def counted(count: int, noun: str) -> str:
    """Pure: "1 node", "8 nodes"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def likely_cause(level: str, element: str, components: Mapping[str, int]) -> str:
    """Pure: words for what probably broke at `element`, from the components seen (alerts
    counted per `component`): "leaf_switch leaf-a: the switch or its cabling (...)"."""
    top = max(components.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))[0]
    return f"{level} {element}: {CAUSES.get(top, 'something the nodes share')}"


def consequence_words(alertname: str) -> str:
    """Pure: what a job's consequence alert says happened to the job ("hung in a
    collective"); an alert not known here is named by its alertname."""
    return _WORDS.get(alertname, alertname)


def stronger(alertname: str, than: str) -> bool:
    """Pure: whether `alertname` says at least as much as `than` of what happened to a job."""
    return _RANK.get(alertname, -1) >= _RANK.get(than, -1)


def lead_line(
    element: str,
    nodes: int,
    ports: int,
    consequences: Mapping[str, str] | None = None,
) -> str:
    """Pure: what the incident's card leads with: the element and what it took down
    ("leaf-a down: 64 ports on 8 nodes"), then each job hit and what happened to it
    ("; team-a/llama-70b hung in a collective")."""
    if ports:
        head = f"{element} down: {counted(ports, 'port')} on {counted(nodes, 'node')}"
    else:
        head = f"{element}: hardware faults on {counted(nodes, 'node')}"
    jobs = sorted((consequences or {}).items())
    told = [f"{job} {consequence_words(name)}" for job, name in jobs]
    return "; ".join([head, *told])
