"""One warning per problem per job, also when reconciles queue up behind each other."""

from __future__ import annotations

from trainsentry.operator.handlers import WarnedOnce


def test_a_queued_reconcile_does_not_warn_again_and_a_returning_problem_does() -> None:
    given: list[tuple[str, str, str]] = []

    def emit(kind: str, reason: str, message: str) -> None:
        given.append((kind, reason, message))

    warned = WarnedOnce()

    def reconcile(uid: str, *problems: str) -> None:
        seen: set[tuple[str, str]] = set()
        emit_once = warned.emitter(uid, emit, seen)
        for problem in problems:
            emit_once("Warning", "UnknownThreshold", problem)
        emit_once("Normal", "PhaseChanged", "Pending -> Monitoring")
        warned.keep_only(uid, seen)

    reconcile("a", "typo")  # the update handler
    reconcile("a", "typo")  # the resync that waited for it, with the older status
    reconcile("b", "typo")  # another job has its own warnings
    assert [g for g in given if g[0] == "Warning"] == [
        ("Warning", "UnknownThreshold", "typo"),
        ("Warning", "UnknownThreshold", "typo"),
    ]
    reconcile("a")  # fixed
    reconcile("a", "typo")  # and back: worth a warning again
    assert sum(g[0] == "Warning" for g in given) == 3
    assert sum(g[0] == "Normal" for g in given) == 5, "other events are never held back"
    warned.forget("a")
    reconcile("a", "typo")
    assert sum(g[0] == "Warning" for g in given) == 4
