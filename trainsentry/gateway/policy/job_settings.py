"""A TrainingJob's `spec.alerting` as the gateway checked it, and its AlertingReady condition.

Pure: no I/O. The stage that reads the cluster is `gateway/stages/services/job_alerting.py`; the
route the policy derives from these settings is `route.JobRoute`.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainsentry.alerts import JobRef, Priority
from trainsentry.gateway.policy.escalation import Roster
from trainsentry.gateway.policy.route import JobRoute
from trainsentry.notifiers.feishu.job import JobDestination, Problem
from trainsentry.notifiers.feishu.markup import OPEN_ID  # the ids cards mention

CONDITION = "AlertingReady"
CHAT_ID = re.compile(r"oc_[A-Za-z0-9_-]{1,64}")
EMAIL = re.compile(r"[^@\s]{1,64}@[^@\s]{1,190}")
MAX_OWNERS = 20


@dataclass(frozen=True)
class JobSettings:
    """One job's `spec.alerting` as read and checked. `problems` in the order found."""

    job: JobRef
    destination: JobDestination | None = None
    owners: tuple[str, ...] = ()
    roster: Roster | None = None
    problems: tuple[Problem, ...] = ()
    uid: str = ""
    summary: str = ""  # what works, for the condition's message (no secrets)
    # configured oncall.escalation_policies names by priority (empty: none named)
    escalation_policies: Mapping[Priority, str] = field(default_factory=dict)

    def route(self) -> JobRoute:
        return JobRoute(
            feishu=self.destination is not None,
            owners=self.owners,
            roster=self.roster is not None or bool(self.escalation_policies),
        )


# --- pure checks ------------------------------------------------------------------------------


def check_owners(owners: Sequence[str]) -> tuple[tuple[str, ...], list[Problem]]:
    """Pure: the owners that are open_ids or e-mail addresses (at most MAX_OWNERS)."""
    good = [o.strip() for o in owners if OPEN_ID.fullmatch(o.strip()) or EMAIL.fullmatch(o.strip())]
    problems: list[Problem] = []
    if bad := [o for o in owners if o.strip() not in good]:
        shown = ", ".join(repr(o[:64]) for o in bad[:5])
        problems.append(("InvalidOwner", f"owners must be open_ids (ou_...) or e-mails: {shown}"))
    if len(good) > MAX_OWNERS:
        problems.append(("TooManyOwners", f"{len(good)} owners; the first {MAX_OWNERS} are used"))
    return tuple(dict.fromkeys(good[:MAX_OWNERS])), problems


def secret_value(secret: Mapping[str, Any], key: str) -> str | None:
    """Pure: a Secret's value at `key` (base64 in `data`), stripped; None when absent."""
    data = secret.get("data") or {}
    if key not in data:
        return None
    try:
        return base64.b64decode(str(data[key]), validate=True).decode().strip()
    except (ValueError, UnicodeDecodeError):
        return None


def condition_of(settings: JobSettings, sent: Problem | None) -> tuple[bool, str, str]:
    """Pure: (ok, reason, message) of the job's AlertingReady condition."""
    problems = [*settings.problems, *([sent] if sent is not None else [])]
    if not problems:
        return True, "Ready", settings.summary or "alerting settings in use"
    message = "; ".join(words for _, words in problems)
    return False, problems[0][0], (message + "; alerts take the gateway's own route")[:1000]


def with_condition(
    conditions: Sequence[Mapping[str, Any]],
    ok: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Pure: `status.conditions` with AlertingReady set (others kept); lastTransitionTime
    moves only when the status flips."""
    status = "True" if ok else "False"
    before = next((c for c in conditions if c.get("type") == CONDITION), None)
    mine: dict[str, Any] = {"type": CONDITION, "status": status, "reason": reason}
    mine["message"] = message
    if generation is not None:
        mine["observedGeneration"] = generation
    same = before is not None and before.get("status") == status
    mine["lastTransitionTime"] = (
        str(before.get("lastTransitionTime", now)) if same and before else now
    )
    return [dict(c) for c in conditions if c.get("type") != CONDITION] + [mine]
