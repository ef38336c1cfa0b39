"""The probe's Prometheus metrics, on a private registry (never the process-global one)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trainsentry.probe.progress import PgReport
from trainsentry.probe.ras import RasStatus

PREFIX = "trainsentry_probe_"
BASE_LABELS = ("namespace", "trainingjob", "node", "rank", "local_rank")
PG_LABELS = (*BASE_LABELS, "pg", "pg_desc")
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class ProbeMetrics:
    """Holds the metric objects and turns tracker / RAS results into samples."""

    def __init__(self, base: Mapping[str, str], world_size: int) -> None:
        """One piece: the probe's metric families, one definition after another (name, help,
        labels); a list to read down, not steps."""
        self.registry = CollectorRegistry(auto_describe=True)
        self._base = {name: base.get(name, "") for name in BASE_LABELS}
        r = self.registry

        def gauge(name: str, doc: str, labels: tuple[str, ...] = BASE_LABELS) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=r)

        self.info = gauge("info", "Probe identity; value 1.", (*BASE_LABELS, "world_size"))
        self.healthy = gauge("healthy", "1 if the last Flight Recorder read succeeded.")
        self.fr_entries = gauge("flight_recorder_entries", "Entries in the FR ring buffer.")
        self.process_groups = gauge(
            "process_groups", "Process groups the Flight Recorders show (0 before any collective)."
        )
        self.blind = gauge(
            "blind",
            "1 when torch.distributed issued collectives but no Flight Recorder shows a group.",
        )
        self.last_poll = gauge("last_poll_timestamp_seconds", "Unix time of the last poll.")
        self.poll_errors = Counter(
            PREFIX + "poll_errors", "Failed Flight Recorder reads.", BASE_LABELS, registry=r
        )
        self.enqueued = gauge("last_enqueued_seq", "Last enqueued collective seq.", PG_LABELS)
        self.started = gauge("last_started_seq", "Last started collective seq.", PG_LABELS)
        self.completed = gauge("last_completed_seq", "Last completed collective seq.", PG_LABELS)
        self.since_completion = gauge(
            "seconds_since_last_completion",
            "Seconds since this rank last saw a collective of the group complete.",
            PG_LABELS,
        )
        self.inflight_seq = gauge(
            "inflight_seq", "Seq of the oldest in-flight collective (-1: none).", PG_LABELS
        )
        self.inflight_seconds = gauge(
            "inflight_seconds", "Age of the oldest in-flight collective (0: none).", PG_LABELS
        )
        self.inflight_info = gauge(
            "inflight_info", "The in-flight collective's op; value 1.", (*PG_LABELS, "op")
        )
        self.wait_seconds = Counter(
            PREFIX + "collective_wait_seconds",
            "Sampled time this rank spent with a collective in flight.",
            PG_LABELS,
            registry=r,
        )
        self.duration = Histogram(
            PREFIX + "collective_duration_seconds",
            "Collective durations, when the backend records timing (NCCL with timing on).",
            PG_LABELS,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.stall_threshold = gauge(
            "stall_threshold_seconds",
            "In-flight age past which this rank calls a collective of the group stalled "
            "(adaptive: stall.py).",
            PG_LABELS,
        )
        self.stalls = Counter(
            PREFIX + "collective_stalls",
            "Collectives this rank found stalled (each once), posted to the gateway if set.",
            BASE_LABELS,
            registry=r,
        )
        self.step = gauge("step", "The training script's step counter (probe.step()).")
        self.step_time = gauge("last_step_timestamp_seconds", "Unix time of the last step().")
        self.ras_up = gauge("ras_up", "1 if the last NCCL RAS query succeeded (rank 0 only).")
        self.ras_gauges = {
            key: gauge("ras_" + key, doc)
            for key, doc in (
                ("communicators", "Communicators the RAS report lists."),
                ("missing_ranks", "Communicator ranks that did not answer (dead or unresponsive)."),
                ("unresponsive_processes", "Job processes RAS got no data from."),
                ("dead_processes", "Job processes RAS considers dead."),
                ("incomplete_communicators", "Communicators flagged INCOMPLETE."),
                ("mismatch_communicators", "Communicators flagged MISMATCH."),
                ("error_communicators", "Communicators flagged ERROR."),
                ("timeouts", "RAS network timeouts while gathering the last report."),
            )
        }
        self.ras_last_success = gauge(
            "ras_last_success_timestamp_seconds", "Unix time of the last good RAS report."
        )
        self.ras_queries = Counter(
            PREFIX + "ras_queries", "RAS queries by result.", (*BASE_LABELS, "result"), registry=r
        )
        self.ras_suspect = gauge(
            "ras_suspect",
            "1 per communicator rank the last RAS report shows behind, missing, dead or failed, "
            "with the process RAS names for it (host, pid); at most 64.",
            (*BASE_LABELS, "communicator", "comm_rank", "state", "host", "pid"),
        )
        self._suspects: set[tuple[str, ...]] = set()
        self._inflight_ops: dict[str, tuple[str, str]] = {}
        self._wait_exported: dict[str, float] = {}
        self.info.labels(**self._base, world_size=str(world_size)).set(1)
        self.healthy.labels(**self._base).set(0)
        self.poll_errors.labels(**self._base)
        self.stalls.labels(**self._base)

    def _pg(self, report: PgReport) -> dict[str, str]:
        p = report.progress
        return {**self._base, "pg": p.pg, "pg_desc": p.desc}

    def apply_progress(self, reports: Mapping[str, PgReport], entries: int) -> None:
        now = time.time()
        self.healthy.labels(**self._base).set(1)
        self.last_poll.labels(**self._base).set(now)
        if entries >= 0:
            self.fr_entries.labels(**self._base).set(entries)
        for name, report in reports.items():
            labels = self._pg(report)
            p = report.progress
            self.enqueued.labels(**labels).set(p.last_enqueued)
            self.started.labels(**labels).set(p.last_started)
            self.completed.labels(**labels).set(p.last_completed)
            self.since_completion.labels(**labels).set(report.seconds_since_completion)
            delta = report.wait_seconds_total - self._wait_exported.get(name, 0.0)
            if delta > 0:
                self.wait_seconds.labels(**labels).inc(delta)
                self._wait_exported[name] = report.wait_seconds_total
            for seconds in report.new_durations:
                self.duration.labels(**labels).observe(seconds)
            previous = self._inflight_ops.pop(name, None)
            if p.in_flight is None:
                self.inflight_seq.labels(**labels).set(-1)
                self.inflight_seconds.labels(**labels).set(0)
            else:
                self.inflight_seq.labels(**labels).set(p.in_flight.seq)
                self.inflight_seconds.labels(**labels).set(p.in_flight.age_seconds)
                self.inflight_info.labels(**labels, op=p.in_flight.op).set(1)
                self._inflight_ops[name] = (p.desc, p.in_flight.op)
            if previous is not None and previous != self._inflight_ops.get(name):
                old_desc, old_op = previous
                self.inflight_info.remove(*self._base.values(), name, old_desc, old_op)

    def apply_thresholds(
        self, reports: Mapping[str, PgReport], thresholds: Mapping[str, float]
    ) -> None:
        """Each group's current stall threshold (the fallback rules compare against it)."""
        for name, report in reports.items():
            if name in thresholds:
                self.stall_threshold.labels(**self._pg(report)).set(thresholds[name])

    def record_stall(self) -> None:
        self.stalls.labels(**self._base).inc()

    def apply_visibility(self, groups: int, blind: bool) -> None:
        """How many groups the recorders show; blindness makes the probe unhealthy."""
        self.process_groups.labels(**self._base).set(groups)
        self.blind.labels(**self._base).set(1 if blind else 0)
        if blind:
            self.healthy.labels(**self._base).set(0)

    def poll_failed(self) -> None:
        self.healthy.labels(**self._base).set(0)
        self.last_poll.labels(**self._base).set(time.time())
        self.poll_errors.labels(**self._base).inc()

    def record_step(self, step: int) -> None:
        self.step.labels(**self._base).set(step)
        self.step_time.labels(**self._base).set(time.time())

    def apply_ras(self, status: RasStatus) -> None:
        result = "ok" if status.ok else ("absent" if "cannot connect" in status.error else "error")
        self.ras_queries.labels(**self._base, result=result).inc()
        self.ras_up.labels(**self._base).set(1 if status.ok else 0)
        if not status.ok:
            return
        self.ras_last_success.labels(**self._base).set(status.collected_at)
        for key, gauge in self.ras_gauges.items():
            gauge.labels(**self._base).set(float(getattr(status, key)))
        current: set[tuple[str, ...]] = {
            (
                str(s.get("communicator", "")),
                str(s.get("rank", "")),
                str(s.get("state", "")),
                str(s.get("host", "")),
                str(s.get("pid", "")),
            )
            for s in status.suspects[:64]
        }
        for gone in self._suspects - current:  # a suspect of an older report is not one now
            self.ras_suspect.remove(*self._base.values(), *gone)
        for labels in current:
            self.ras_suspect.labels(*self._base.values(), *labels).set(1)
        self._suspects = current
