"""The outbox's give-up and back-off rules (gateway/policy/outbox_retry.py), on explicit times."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from trainsentry.alerts import Priority
from trainsentry.gateway.policy.outbox_retry import (
    DeliveryRules,
    after_failure,
    after_rate_limit,
)

T0 = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
RULES = DeliveryRules()


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def failing_run(priority: Priority, jitter: float) -> tuple[list[float], float]:
    """Fails every try from T0 on; returns the waits between tries and when it died."""
    since = None
    now = T0
    waits = []
    for _ in range(10_000):
        verdict = after_failure(priority, since, now, RULES, jitter)
        if verdict.dead:
            return waits, (now - T0).total_seconds()
        assert verdict.retry_at is not None
        waits.append((verdict.retry_at - now).total_seconds())
        since, now = verdict.failing_since, verdict.retry_at
    raise AssertionError("never gave up")


@pytest.mark.parametrize(
    ("priority", "give_up"),
    [(Priority.P0, 3600), (Priority.P1, 3600), (Priority.P2, 1800), (Priority.P3, 1800)],
)
@pytest.mark.parametrize("jitter", [0.0, 0.5, 0.999])
def test_a_failing_notification_gives_up_at_its_priority_s_time_not_after_8_tries(
    priority: Priority, give_up: float, jitter: float
) -> None:
    waits, died_at = failing_run(priority, jitter)
    # Dead at the give-up moment exactly: the last try is placed there.
    assert died_at == give_up
    # It was alive at 100 s (the old 8 tries with a 1 s doubling were dead by then)
    assert sum(waits[:8]) < 200 and len(waits) > 8
    # the back-off starts at 1 s or less and never waits more than 5 min
    assert 0.5 <= waits[0] <= 1.0
    assert max(waits) <= 300.0
    # and it reaches 5 min on the way (the docs' "doubling to 5 min")
    assert max(waits) >= 150.0


def test_the_back_off_roughly_doubles() -> None:
    waits, _ = failing_run(Priority.P0, 0.999)
    growing = waits[1:9]
    assert all(1.9 <= later / earlier <= 2.1 for earlier, later in itertools.pairwise(growing))


def test_give_up_times_are_configurable() -> None:
    rules = DeliveryRules(give_up_after=dict.fromkeys(Priority, 10.0))
    assert not after_failure(Priority.P0, T0, at(9.9), rules, 0.5).dead
    assert after_failure(Priority.P0, T0, at(10.0), rules, 0.5).dead


def test_a_rate_limit_is_never_a_failure() -> None:
    # Rate limited for a whole day: never dead, each wait what the provider asked.
    for hour in range(24):
        verdict = after_rate_limit(None, at(hour * 3600), 1.0, RULES)
        assert not verdict.dead and verdict.failing_since is None
        assert verdict.retry_at == at(hour * 3600 + 1.0)
    # It ends a failing streak (the provider answers), after waiting half its back-off.
    verdict = after_rate_limit(T0, at(3000), 1.0, RULES)
    assert not verdict.dead and verdict.failing_since is None
    assert verdict.retry_at == at(3000 + 150)
    # So a failure after an hour of rate limiting starts a new streak, not a dead row.
    after = after_failure(Priority.P0, verdict.failing_since, at(3700), RULES, 0.5)
    assert not after.dead and after.failing_since == at(3700)


def test_a_rate_limit_wait_is_bounded() -> None:
    assert after_rate_limit(None, T0, 10_000.0, RULES).retry_at == at(300)
    assert after_rate_limit(None, T0, None, RULES).retry_at == at(RULES.rate_limit_delay)
