"""Alert changes planned as production plans them, for the policy's tests (issue 45: the
tests run what production runs, never a path of their own).

The planner's batch (`stages/planning/plan.py`, `PolicyPlan._fold` and `_flush_incidents`)
folds each change into its job's `StormFold` with `decide.fold_into`, then drafts the
batch's incidents with `decide.flush`. `plan_change` is that for one change into a given
fold, its incidents drafted right after it; `decide` opens the fold from the job's stored
storm state and freezes it back after the change: a batch of one. Their results are the
change's `ChangeResult` with the flush's drafts after the change's own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from trainsentry.alerts import AlertChange, JobRef
from trainsentry.gateway.policy.decide import ChangeResult, flush, fold_into
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.incident import IncidentBook
from trainsentry.gateway.policy.infra import InfraFold
from trainsentry.gateway.policy.route import JobRoute
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import StormState
from trainsentry.gateway.policy.storm_fold import StormFold


@dataclass(frozen=True, slots=True, kw_only=True)
class DecideResult(ChangeResult):
    storm_state: StormState  # the job's, after the change


def _fields(result: ChangeResult) -> dict[str, Any]:
    return {f.name: getattr(result, f.name) for f in fields(ChangeResult)}


def plan_change(
    fold: StormFold,
    change: AlertChange,
    *,
    fingerprint_state: FingerprintState | None,
    distinct_nodes_in_window: int,
    policy: Policy,
    now: datetime,
    channels: Collection[str] | None = None,
    job_routes: Mapping[JobRef, JobRoute] | None = None,
    place: Mapping[str, str] | None = None,
    infra: InfraFold | None = None,
    incidents: IncidentBook | None = None,
    updatable: Collection[str] = (),
) -> ChangeResult:
    """`fold_into` the job's `fold` (changed in place), then `flush` of the incidents
    (`incidents`: those known, changed in place; default: none known), the arguments passed
    as the planner passes them (the elements whose incident is open: as `infra` left them)."""
    book = incidents if incidents is not None else IncidentBook(policy)
    result = fold_into(
        fold,
        change,
        fingerprint_state=fingerprint_state,
        distinct_nodes_in_window=distinct_nodes_in_window,
        policy=policy,
        now=now,
        channels=channels,
        job_routes=job_routes,
        place=place,
        infra=infra,
        incidents=book,
        updatable=updatable,
    )
    drafts, unconfigured = flush(
        book,
        policy=policy,
        now=now,
        channels=channels,
        job_routes=job_routes,
        updatable=updatable,
        infra_open={key for key, state in infra.states.items() if state.open} if infra else (),
    )
    planned = _fields(result)
    planned["drafts"] = [*result.drafts, *drafts]
    planned["unconfigured"] = tuple(dict.fromkeys((*result.unconfigured, *unconfigured)))
    return ChangeResult(**planned)


def decide(change: AlertChange, *, storm_state: StormState | None, **given: Any) -> DecideResult:
    """Plans `change` alone, a batch of one: `plan_change` into the job's stored storm state
    (`storm_state`; None: none yet), frozen back after it. `given`: `plan_change`'s."""
    stored = storm_state if storm_state is not None else StormState.new(change.alert.labels)
    fold = StormFold.of(stored)
    result = plan_change(fold, change, **given)
    return DecideResult(storm_state=fold.freeze(), **_fields(result))
