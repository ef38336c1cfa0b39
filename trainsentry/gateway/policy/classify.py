"""P0–P3 classification of one alert, with the reason for every step (pure).

Order: a valid `priority` label sets the base; otherwise the first matching alertname rule;
otherwise the `severity` map; otherwise the policy default. Hardware meaning (XID code,
hardware rules) then raises the base, never lowers it, and a blast radius across nodes of
one job raises the result by `raise_by` levels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainsentry.alerts import Alert, Priority, parse_priority
from trainsentry.gateway.policy.rules import (
    AlertnameRule,
    BlastRadiusPolicy,
    ClassificationPolicy,
    Policy,
)
from trainsentry.userregex import full_match


@dataclass(frozen=True, slots=True)
class Step:
    """One rule that set or raised the priority."""

    rule_id: str
    priority: Priority
    reason: str


@dataclass(frozen=True, slots=True)
class Classification:
    priority: Priority
    rule_id: str  # the rule that decided the final priority
    reason: str  # human words for the whole chain, shown on the notification
    steps: tuple[Step, ...] = ()

    @property
    def rule_ids(self) -> tuple[str, ...]:
        return tuple(step.rule_id for step in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "priority": self.priority.value,
            "rule_id": self.rule_id,
            "reason": self.reason,
            "steps": [
                {"rule_id": s.rule_id, "priority": s.priority.value, "reason": s.reason}
                for s in self.steps
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Classification:
        steps = tuple(
            Step(rule_id=s["rule_id"], priority=Priority(s["priority"]), reason=s["reason"])
            for s in data.get("steps", ())
        )
        return cls(
            priority=Priority(data["priority"]),
            rule_id=data["rule_id"],
            reason=data["reason"],
            steps=steps,
        )


def _rule_matches(rule: AlertnameRule, labels: Mapping[str, str]) -> bool:
    if not full_match(rule.alertname, labels.get("alertname", "")):
        return False
    return all(full_match(pattern, labels.get(name, "")) for name, pattern in rule.labels.items())


# XID codes are small (NVIDIA's table ends in the hundreds); longer digit runs are no code.
MAX_XID_DIGITS = 6


def xid_code(alert: Alert, label_names: tuple[str, ...]) -> int | None:
    """Pure: the XID code an alert carries in one of `label_names` (labels first, then
    annotations); None when none holds a code of at most MAX_XID_DIGITS digits."""
    for source in (alert.labels, alert.annotations):
        for name in label_names:
            raw = source.get(name, "").strip()
            # DCGM reports the code as a float sample value ("79" or "79.0").
            if raw.endswith(".0"):
                raw = raw[:-2]
            # isdigit() alone admits digits int() refuses (superscripts such as "²"); a label is
            # attacker-sized, and int() refuses (or takes quadratic time on) long digit runs.
            if raw.isascii() and raw.isdigit() and len(raw) <= MAX_XID_DIGITS:
                return int(raw)
    return None


def sentence(text: str) -> str:
    """Pure: `text` as a sentence, for a person: a capital first letter and a full stop
    ("its priority label is P2; ... raises P2 to P1" -> "Its priority label is P2; ...
    raises P2 to P1.")."""
    text = text.strip()
    if not text:
        return text
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def _base(alert: Alert, policy: Policy) -> Step:
    rules = policy.classification
    label = alert.labels.get("priority")
    if label is not None:
        parsed = parse_priority(label)
        if parsed is not None:
            return Step("label:priority", parsed, f"its priority label is {parsed.value}")
    for rule in rules.alertname_rules:
        if _rule_matches(rule, alert.labels):
            reason = rule.reason or f"its alertname matches {rule.alertname!r}"
            return Step(f"alertname:{rule.id}", rule.priority, reason)
    severity = alert.labels.get("severity", "").strip().lower()
    if severity in rules.severity:
        mapped = rules.severity[severity]
        why = f"its severity {severity} maps to {mapped.value}"
        return Step(f"severity:{severity}", mapped, why)
    note = f" (priority label {label!r} is not P0..P3)" if label is not None else ""
    return Step("default", rules.default_priority, f"the policy's default{note}")


def _hardware(alert: Alert, policy: Policy) -> list[Step]:
    rules = policy.classification
    found: list[Step] = []
    code = xid_code(alert, rules.xid_labels)
    if code is not None and code in rules.xid:
        entry = rules.xid[code]
        found.append(Step(f"xid:{code}", entry.priority, f"XID {code}: {entry.name}"))
    for rule in rules.hardware_rules:
        if _rule_matches(rule, alert.labels):
            found.append(Step(f"hardware:{rule.id}", rule.priority, rule.reason or rule.id))
    return found


def _read_labels(rules: ClassificationPolicy) -> tuple[str, ...]:
    """Pure: the label names classification reads (the XID names also among annotations)."""
    names = {"priority", "alertname", "severity", *rules.xid_labels}
    for rule in (*rules.alertname_rules, *rules.hardware_rules):
        names.update(rule.labels)
    return tuple(sorted(names))


# The classification rules and blast radius last classified by, the label names they read,
# and what they made of what those labels held: a storm's alerts differ in their node and
# GPU, which classification never reads. Policies are frozen; bounded (cleared when full).
_Memo = tuple[ClassificationPolicy, BlastRadiusPolicy, tuple[str, ...], dict[Any, Any]]
_MEMO: list[_Memo] = []
_MEMO_MAX = 4096


def classify(alert: Alert, policy: Policy, *, distinct_nodes_in_window: int) -> Classification:
    """The priority of `alert` and why. `distinct_nodes_in_window`: how many distinct nodes of
    the alert's job had the same alertname within `policy.blast_radius.window` (the gateway
    counts them, this one included). Memoised by what it reads (`_read_labels`, the XID
    annotations, the count where it raises), which changes no answer."""
    rules, blast = policy.classification, policy.blast_radius
    if not _MEMO or _MEMO[0][0] is not rules or _MEMO[0][1] is not blast:
        _MEMO[:] = [(rules, blast, _read_labels(rules), {})]
    _, _, names, memo = _MEMO[0]
    labels, annotations = alert.labels, alert.annotations
    raises = blast.enabled and distinct_nodes_in_window >= blast.nodes
    key = (
        tuple(map(labels.get, names)),
        tuple(map(annotations.get, rules.xid_labels)),
        distinct_nodes_in_window if raises else 0,
    )
    found = memo.get(key)
    if found is None:
        found = _classify(alert, policy, distinct_nodes_in_window)
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[key] = found
    return found


def _classify(alert: Alert, policy: Policy, distinct_nodes_in_window: int) -> Classification:
    """`classify`, worked out."""
    base = _base(alert, policy)
    steps = [base]
    decided = base
    for step in _hardware(alert, policy):
        if step.priority.level < decided.priority.level:
            steps.append(step)
            decided = step
    blast = policy.blast_radius
    if blast.enabled and distinct_nodes_in_window >= blast.nodes:
        raised = decided.priority.raised(blast.raise_by)
        if raised != decided.priority:
            decided = Step(
                "blast-radius",
                raised,
                f"{alert.name or 'alert'} on {distinct_nodes_in_window} nodes of the job within "
                f"{blast.window:g} s ({blast.nodes} or more) raises {decided.priority.value} "
                f"to {raised.value}",
            )
            steps.append(decided)
    return Classification(
        priority=decided.priority,
        rule_id=decided.rule_id,
        reason=sentence("; ".join(step.reason for step in steps)),
        steps=tuple(steps),
    )
