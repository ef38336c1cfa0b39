"""Durable intake of Alertmanager webhooks (v4): validate, store in one transaction, then answer.

`parse_webhook` is pure (bytes → IncomingReceipt or IntakeRejected with a reason).
`IntakeWriter` is the single writer: requests queue up and are committed together (group
commit), each caller's future resolving only after its transaction committed — so a 200 means
the webhook is on disk. When the gateway is idle the same transaction records its alerts, each
change queued in the policy inbox; under load (the journal not empty, or a batch above
`record_at_once_alerts`) it journals them instead and the expander records them right after
(store/journal.py, stages/expansion.py), all but the P0 and P1 alerts, which are recorded
before the answer either way. A webhook without those waits for room while the journal is
full (`Expander.room`). The alert policy runs after the commit (stages/planning/worker.py), so a
slow policy or a storm's backlog never delays the answer to Alertmanager. An unchanged resend
of a group is answered from a read instead, with nothing to commit (store/resends.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from trainsentry.alerts import GO_ZERO_TIME, Alert, AlertChange, AlertStatus, utcnow
from trainsentry.gateway.stages.expansion import Expander
from trainsentry.gateway.stages.resends import Resends
from trainsentry.labels import NODE_LABELS
from trainsentry.store.engine import Connection, Engine
from trainsentry.store.errors import STORE_FAILURES, DriverError, StoreUnavailable
from trainsentry.store.journal import groups_waiting, is_urgent, journal_receipts
from trainsentry.store.resends import (
    ReceiptTouch,
    content_digest,
    resend_probe,
    skippable,
    touch_receipts,
)
from trainsentry.store.writes import IncomingReceipt, ReceiptOutcome, record_receipts
from trainsentry.tasks import OwnedTask

log = logging.getLogger("trainsentry.intake")


# PostgreSQL cannot store NUL in text; such an alert is malformed, not storable. JSON can only
# carry a NUL escaped (the parser refuses raw control characters), so bodies without `\u0000`
# skip the check (`_refuse_nul`); a pattern on every string cost a third of the validation.
NUL_REJECTED = "NUL character not allowed"
SURROGATE_REJECTED = "unpaired UTF-16 surrogate not allowed"
MAX_TRUNCATED = 2**31 - 1
LabelName = Annotated[str, Field(min_length=1, max_length=1024)]


class WebhookAlert(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Literal["firing", "resolved"]
    labels: dict[LabelName, str] = Field(min_length=1)
    annotations: dict[LabelName, str] = Field(default_factory=dict)
    startsAt: AwareDatetime
    endsAt: AwareDatetime | None = None
    generatorURL: str = ""
    fingerprint: Annotated[str, Field(max_length=64, pattern=r"^[0-9A-Za-z_-]*$")] = ""


class WebhookPayload(BaseModel):
    """Alertmanager's webhook body, version 4. Unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal["4"]
    groupKey: str = ""
    # a 32-bit column on PostgreSQL (64-bit on SQLite): the same bound for both
    truncatedAlerts: int = Field(default=0, ge=0, le=MAX_TRUNCATED)
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[LabelName, str] = Field(default_factory=dict)
    commonLabels: dict[LabelName, str] = Field(default_factory=dict)
    commonAnnotations: dict[LabelName, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[WebhookAlert]


class IntakeRejected(ValueError):
    """The body is not a storable webhook; `reason` is safe to return to the sender."""

    def __init__(self, reason: str, details: list[str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.details = details or []


def label_fingerprint(labels: dict[str, str]) -> str:
    """A stable fingerprint for senders that do not provide Alertmanager's."""
    canonical = json.dumps(sorted(labels.items()), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def to_milliseconds(value: datetime) -> datetime:
    """UTC, cut to milliseconds: Alertmanager's API v2 reports times in milliseconds while its
    webhooks carry nanoseconds, and an occurrence must be the same from either source."""
    if value.tzinfo is not UTC:
        offset = value.utcoffset()
        value = value.replace(tzinfo=UTC)
        if offset:
            value -= offset
    extra = value.microsecond % 1000
    return value.replace(microsecond=value.microsecond - extra) if extra else value


_STATUS = {status.value: status for status in AlertStatus}


def _to_alert(item: WebhookAlert) -> Alert:
    ends_at = item.endsAt
    if ends_at is not None and ends_at.year <= GO_ZERO_TIME.year:
        ends_at = None  # Go's zero time: no end time
    return Alert(
        fingerprint=item.fingerprint or label_fingerprint(item.labels),
        status=_STATUS[item.status],
        labels=item.labels,
        annotations=item.annotations,
        starts_at=to_milliseconds(item.startsAt),
        ends_at=to_milliseconds(ends_at) if ends_at else None,
        generator_url=item.generatorURL,
    )


def text_problem(value: str) -> str | None:
    """Pure: why `value` can never be stored as text (PostgreSQL refuses NUL, neither store
    takes an unpaired UTF-16 surrogate), or None when it can."""
    if "\x00" in value:
        return NUL_REJECTED
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return SURROGATE_REJECTED
    return None


def _shown(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _surrogate_at(value: object, where: str) -> str | None:
    """Pure: the path of the first string (key or value) holding an unpaired surrogate."""
    if isinstance(value, str):
        return where if text_problem(value) == SURROGATE_REJECTED else None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{_shown(key)}" if where else _shown(key)
            if text_problem(key) == SURROGATE_REJECTED:
                return path
            if (found := _surrogate_at(item, path)) is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            if (found := _surrogate_at(item, f"{where}.{index}")) is not None:
                return found
    return None


def parse_webhook(
    body: bytes, received_at: datetime | None = None, body_sha256: str | None = None
) -> IncomingReceipt:
    """Validates a webhook body. Raises IntakeRejected with a reason for anything unstorable.
    `body_sha256`: the body's SHA-256 (hex) when the caller has it already."""
    try:
        # pydantic parses and validates the bytes in one pass (no Python dict in between);
        # the JSON parser refuses bad UTF-8 and lone surrogates, and so does the slow path.
        payload = WebhookPayload.model_validate_json(body)
        text = body.decode("utf-8")
    except (ValidationError, UnicodeDecodeError):
        # Only rejected bodies take the slow path, which says precisely what is wrong.
        payload, text = _validate_explaining(body)
    if b"\\u0000" in body:
        _refuse_nul(payload)
    alerts: list[Alert] = []
    for index, item in enumerate(payload.alerts):
        try:
            alerts.append(_to_alert(item))
        except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
            raise IntakeRejected(
                "body is not an Alertmanager webhook v4",
                [f"alerts.{index}: startsAt/endsAt outside the years 1 to 9999 in UTC"],
            ) from None
    return IncomingReceipt(
        body_sha256=body_sha256 or hashlib.sha256(body).hexdigest(),
        body_text=text,
        received_at=received_at or utcnow(),
        receiver=payload.receiver,
        status=payload.status,
        group_key=payload.groupKey,
        truncated_alerts=payload.truncatedAlerts,
        external_url=payload.externalURL,
        alerts=alerts,
        group_labels=dict(payload.groupLabels),
        content_digest=content_digest(alerts) if payload.truncatedAlerts == 0 else "",
        skippable=skippable(alerts, payload.truncatedAlerts),
    )


def _validate_explaining(body: bytes) -> tuple[WebhookPayload, str]:
    """Step-by-step validation that raises IntakeRejected with the first problem found."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IntakeRejected(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IntakeRejected(
            f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise IntakeRejected("invalid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise IntakeRejected("body must be a JSON object (Alertmanager webhook v4)")
    # Escapes are the only way a lone surrogate gets in; they cannot be stored as UTF-8.
    if "\\u" in text and (where := _surrogate_at(data, "")) is not None:
        raise IntakeRejected(
            "body contains unpaired UTF-16 surrogates", [f"{where}: {SURROGATE_REJECTED}"]
        )
    try:
        return WebhookPayload.model_validate(data), text
    except ValidationError as exc:
        details = [
            f"{'.'.join(str(p) for p in err['loc']) or '(body)'}: {err['msg']}"
            for err in exc.errors(include_url=False, include_input=False)[:20]
        ]
        raise IntakeRejected("body is not an Alertmanager webhook v4", details) from None


def _stored_texts(payload: WebhookPayload) -> Iterator[tuple[str, str]]:
    """(where, text) of every free-text field the store keeps (keys and values)."""
    for name in ("groupKey", "receiver", "externalURL"):
        yield name, getattr(payload, name)
    for name in ("groupLabels", "commonLabels", "commonAnnotations"):
        for key, value in getattr(payload, name).items():
            yield f"{name}.{key}", key + value
    for index, alert in enumerate(payload.alerts):
        for name in ("labels", "annotations"):
            for key, value in getattr(alert, name).items():
                yield f"alerts.{index}.{name}.{key}", key + value
        yield f"alerts.{index}.generatorURL", alert.generatorURL


def _refuse_nul(payload: WebhookPayload) -> None:
    """Raises IntakeRejected naming the first stored field that holds a NUL character."""
    for where, text in _stored_texts(payload):
        if "\x00" in text:
            shown = where.replace("\x00", "\\u0000")
            raise IntakeRejected(
                "body is not an Alertmanager webhook v4", [f"{shown}: {NUL_REJECTED}"]
            )


# The policy hook: turns changes into outbox rows inside the caller's transaction.
PlanHook = Callable[[Connection, Sequence[AlertChange], datetime], Awaitable[int]]


@dataclass(slots=True)
class _Pending:
    receipt: IncomingReceipt | None  # None: only write the resends' counts (`flush`)
    future: asyncio.Future[ReceiptOutcome | None]


class IntakeWriter:
    """One writer task; many requests per transaction (group commit).

    An unchanged resend of a group is answered from one read of the store, with nothing to
    commit (`resends`, stages/resends.py); the counts it owes its receipt are written with
    the writer's next transaction, at most `touch_after` seconds later. `node_labels`: the
    policy's, which name the node the store records for each new occurrence. `expander`:
    where journaled webhooks go (none: every webhook is recorded before its answer)."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch_alerts: int = 5000,
        on_commit: Callable[[Sequence[ReceiptOutcome]], None] | None = None,
        touch_after: float = 1.0,
        node_labels: tuple[str, ...] = NODE_LABELS,
        expander: Expander | None = None,
        record_at_once_alerts: int = 200,
    ) -> None:
        self._engine = engine
        self._node_labels = node_labels
        self._expander = expander
        self._record_at_once_alerts = record_at_once_alerts
        self._max_batch_alerts = max_batch_alerts
        self._on_commit = on_commit
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task = OwnedTask("intake-writer", self._run)
        self.resends = Resends(
            engine,
            on_answer=lambda outcome: on_commit([outcome]) if on_commit else None,
            request_flush=self._request_flush,
            touch_after=touch_after,
        )

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        while not self._queue.empty():
            self._queue.get_nowait().future.set_exception(StoreUnavailable("shutting down"))
        if self.resends.owed:
            try:
                await self._transaction([], self.resends.take_touches())
            except Exception as exc:  # only counts are lost; the alerts are stored
                log.warning("intake: resend counts not written at stop error=%r", exc)
        await self.resends.close()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def submit(self, receipt: IncomingReceipt) -> ReceiptOutcome:
        """Returns once the receipt is committed (or is known to be stored already: an
        unchanged resend); raises StoreUnavailable otherwise."""
        probe = resend_probe(receipt)
        if probe is not None:
            outcome = await self.resends.answer(probe, receipt.received_at)
            if outcome is not None:
                return outcome
        expander = self._expander
        if expander is not None and expander.enabled:
            if not any(is_urgent(alert) for alert in receipt.alerts):
                await expander.room()
            expander.webhook_started()
        try:
            future: asyncio.Future[ReceiptOutcome | None] = (
                asyncio.get_running_loop().create_future()
            )
            await self._queue.put(_Pending(receipt, future))
            outcome = await future
        finally:
            if expander is not None and expander.enabled:
                expander.webhook_done()
        assert outcome is not None
        if probe is not None:
            self.resends.remember(probe)
        return outcome

    async def answer_known(self, body_sha256: str, received_at: datetime) -> ReceiptOutcome | None:
        """The answer to the same bytes as a body stored lately, when it is an unchanged
        resend now (no parse needed); None: parse it and `submit` it."""
        return await self.resends.answer_known(body_sha256, received_at)

    async def flush(self) -> None:
        """Writes the counts of resends answered from the store now (tests, the demo)."""
        if self.resends.owed:
            future: asyncio.Future[ReceiptOutcome | None] = (
                asyncio.get_running_loop().create_future()
            )
            await self._queue.put(_Pending(None, future))
            await future

    def _request_flush(self) -> None:
        future: asyncio.Future[ReceiptOutcome | None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(None, future))

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            alerts = _alert_count(batch[0])
            while not self._queue.empty() and alerts < self._max_batch_alerts:
                item = self._queue.get_nowait()
                batch.append(item)
                alerts += _alert_count(item)
            live = [item for item in batch if not item.future.cancelled()]
            if live:
                await self._commit_batch(live)

    async def _commit_batch(self, batch: list[_Pending]) -> None:
        receipts = [item.receipt for item in batch if item.receipt is not None]
        touches = self.resends.take_touches()
        try:
            outcomes = await self._transaction(receipts, touches)
        except Exception as exc:
            self.resends.put_back(touches)
            # Whatever fails, the writer must live on: a dead writer would leave every later
            # webhook waiting for an answer. Unknown errors are bugs, logged with their trace.
            if len(batch) > 1 and not _is_unavailable(exc):
                # One bad receipt must not fail its neighbours: retry them one by one.
                for item in batch:
                    await self._commit_batch([item])
                return
            if isinstance(exc, STORE_FAILURES):
                log.warning("intake store_error=%s receipts=%d", type(exc).__name__, len(batch))
                reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            else:
                log.exception("intake failed receipts=%d", len(batch))
                reason = "internal error, see the gateway log"
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(StoreUnavailable(reason))
            return
        if self._expander is not None and any(outcome.queued for outcome in outcomes):
            self._expander.journaled(receipts, outcomes)
        if self._on_commit is not None and outcomes:
            self._on_commit(outcomes)
        answers = iter(outcomes)
        for item in batch:
            outcome = next(answers) if item.receipt is not None else None
            if not item.future.done():
                item.future.set_result(outcome)

    async def _transaction(
        self, receipts: list[IncomingReceipt], touches: dict[int, ReceiptTouch]
    ) -> list[ReceiptOutcome]:
        for attempt in range(3):
            try:
                async with self._engine.begin() as conn:
                    outcomes = await self._store(conn, receipts) if receipts else []
                    if touches:
                        await touch_receipts(conn, touches)
                    return outcomes
            except DriverError as exc:
                if attempt < 2 and _is_retryable_conflict(exc):
                    await asyncio.sleep(0.01 * (attempt + 1))
                    continue
                raise
        raise AssertionError("unreachable")

    async def _store(
        self, conn: Connection, receipts: list[IncomingReceipt]
    ) -> list[ReceiptOutcome]:
        """Records the receipts' alerts now when the gateway is idle (no journal backlog, a
        small batch, or the journal off) and nothing of their groups is journaled (a group's
        webhooks never overtake each other); else journals all but their urgent alerts."""
        expander = self._expander
        if expander is None:
            return await record_receipts(conn, receipts, self._node_labels)
        at_once = not expander.journaling and (
            not expander.enabled
            or sum(len(receipt.alerts) for receipt in receipts) <= self._record_at_once_alerts
        )
        if at_once and not await groups_waiting(conn, [r.group_key for r in receipts]):
            return await record_receipts(conn, receipts, self._node_labels)
        return await journal_receipts(conn, receipts, self._node_labels)


def _alert_count(item: _Pending) -> int:
    return len(item.receipt.alerts) if item.receipt is not None else 0


def _is_retryable_conflict(exc: DriverError) -> bool:
    # PostgreSQL replicas can deadlock or conflict on the same occurrences; retrying is right.
    # Not SQLite's "database is locked": it comes after waiting the whole busy timeout (10 s),
    # and waiting it twice more would only keep Alertmanager waiting for its 503.
    text = str(exc.orig).lower() if exc.orig is not None else str(exc).lower()
    return "deadlock" in text or "could not serialize" in text


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, DriverError) and exc.connection_invalidated:
        return True
    text = str(exc).lower()
    return any(
        marker in text
        for marker in ("connection", "could not connect", "database is locked", "disk i/o")
    )
