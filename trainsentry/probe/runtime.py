"""The probe inside one training rank: a poll thread, an optional RAS thread, the server.

Every call into torch is lazy and guarded: if the Flight Recorder cannot be read the probe
reports itself unhealthy and keeps serving; nothing here raises into the training script.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import threading
import time
from typing import Any

from trainsentry.probe import ras as ras_client
from trainsentry.probe.identity import DEFAULT_FR_BUFFER, ProbeConfig
from trainsentry.probe.metrics import ProbeMetrics
from trainsentry.probe.progress import ProgressTracker, merge, parse_dump
from trainsentry.probe.server import Endpoints, ProbeServer

log = logging.getLogger("trainsentry.probe")


def enable_flight_recorder(env: dict[str, str] | Any = None) -> None:
    """Ask for a Flight Recorder buffer unless the user chose a size.

    torch reads TORCH_FR_BUFFER_SIZE when a process group is created, so this only helps
    when the probe starts before `init_process_group` (the launcher hook does).
    """
    env = os.environ if env is None else env
    if "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        env["TORCH_FR_BUFFER_SIZE"] = DEFAULT_FR_BUFFER


def read_flight_recorder(*, collectives: bool = True, only_active: bool = False) -> bytes:
    """The raw JSON dump from torch (raises if torch or the Flight Recorder is missing).

    With `collectives=False` only `pg_status` comes back (microseconds); a full dump
    serialises the whole ring buffer while holding the GIL (~50 ms for 2000 entries).
    """
    c10d = importlib.import_module("torch._C._distributed_c10d")
    data: bytes = c10d._dump_fr_trace_json(includeCollectives=collectives, onlyActive=only_active)
    return data


def read_pg_descs() -> dict[str, str]:
    """Process-group name -> description (`new_group(group_desc=...)`), from torch."""
    try:
        world = importlib.import_module("torch.distributed.distributed_c10d")._world
        return {
            str(name): str(getattr(pg, "group_desc", "") or "")
            for pg, name in dict(world.pg_names).items()
        }
    except Exception:
        return {}


def _nccl_in_use() -> bool:
    try:
        import torch
        import torch.distributed as dist

        return bool(
            torch.cuda.is_available()
            and dist.is_available()
            and dist.is_initialized()
            and "nccl" in str(dist.get_backend()).lower()
        )
    except Exception:
        return False


class Probe:
    """One rank's probe. `start()` / `stop()`; `poll_once()` is the unit of work."""

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self.metrics = ProbeMetrics(config.labels, config.world_size)
        self.tracker = ProgressTracker(started_s=time.monotonic())
        self._stop = threading.Event()
        self._step = 0
        self._lock = threading.Lock()
        self._last_reports: dict[str, Any] = {}
        self._last_error = ""
        self._ras_snapshot: dict[str, Any] | None = None
        self._descs: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self.server = ProbeServer(
            Endpoints(
                registry=self.metrics.registry,
                status=self.status,
                dump=read_flight_recorder,
                ras=self.ras_snapshot,
                token=config.token,
                identity_headers={
                    "X-Trainsentry-Rank": str(config.rank),
                    "X-Trainsentry-Local-Rank": str(config.local_rank),
                    "X-Trainsentry-Node": config.node,
                    "X-Trainsentry-Pod": config.pod,
                },
            ),
            config.bind,
            config.port,
        )

    @property
    def port(self) -> int:
        return self.server.port

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.server.start()
        self._spawn("trainsentry-probe-poll", self._poll_loop)
        log.info(
            "event=probe_started rank=%d local_rank=%d port=%d interval_s=%s",
            self.config.rank,
            self.config.local_rank,
            self.port,
            self.config.interval_s,
        )

    def _spawn(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.server.stop()

    # ---------------------------------------------------------------- work

    def step(self, value: int | None = None) -> None:
        with self._lock:
            self._step = self._step + 1 if value is None else int(value)
            step = self._step
        self.metrics.record_step(step)

    def poll_once(self) -> bool:
        """Read the Flight Recorder once and update the metrics. False if it failed."""
        try:
            now_ns = time.time_ns()
            status = json.loads(read_flight_recorder(collectives=False))
            unknown = {str(name) for name in status.get("pg_status") or {}} - set(self._descs)
            if unknown:
                self._descs.update(read_pg_descs())
            snapshot = parse_dump(status, now_ns, self._descs)
            full_dumps = self.config.full_dumps
            detail = list(snapshot.groups) if full_dumps else self.tracker.stuck(snapshot)
            if detail:
                full = json.loads(read_flight_recorder(only_active=not full_dumps))
                snapshot = merge(snapshot, parse_dump(full, now_ns, self._descs), detail)
            reports = self.tracker.update(snapshot, time.monotonic())
            self.metrics.apply_progress(reports, snapshot.entries)
        except Exception as exc:
            self.metrics.poll_failed()
            message = f"{type(exc).__name__}: {exc}"
            if message != self._last_error:  # log each distinct failure once
                log.warning("event=probe_poll_failed error=%r", message)
            self._last_error = message
            return False
        self._last_error = ""
        with self._lock:
            self._last_reports = {
                name: {
                    "pg_desc": r.progress.desc,
                    "last_enqueued": r.progress.last_enqueued,
                    "last_completed": r.progress.last_completed,
                    "seconds_since_last_completion": round(r.seconds_since_completion, 3),
                    "in_flight": None
                    if r.progress.in_flight is None
                    else {
                        "op": r.progress.in_flight.op,
                        "seq": r.progress.in_flight.seq,
                        "age_seconds": round(r.progress.in_flight.age_seconds, 3),
                    },
                }
                for name, r in reports.items()
            }
        return True

    def _poll_loop(self) -> None:
        ras_started = False
        while not self._stop.is_set():
            self.poll_once()
            wants_ras = self.config.rank == 0 and self.config.ras != "0"
            if wants_ras and not ras_started and self.config.ras_enabled(_nccl_in_use()):
                ras_started = True
                self._spawn("trainsentry-probe-ras", self._ras_loop)
            self._stop.wait(self.config.interval_s)

    def query_ras(self) -> ras_client.RasStatus:
        status = ras_client.query(
            self.config.ras_addr,
            timeout=max(2.0, min(30.0, self.config.ras_interval_s)),
            collective_timeout=max(1.0, min(10.0, self.config.ras_interval_s / 3)),
        )
        self.metrics.apply_ras(status)
        with self._lock:
            self._ras_snapshot = status.to_dict()
        if not status.ok:
            log.info("event=ras_query_failed error=%r", status.error)
        return status

    def _ras_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.query_ras()
            except Exception as exc:
                log.warning("event=ras_loop_error error=%r", exc)
            self._stop.wait(self.config.ras_interval_s)

    # ---------------------------------------------------------------- views

    def status(self) -> dict[str, Any]:
        c = self.config
        with self._lock:
            return {
                "rank": c.rank,
                "local_rank": c.local_rank,
                "world_size": c.world_size,
                "node": c.node,
                "pod": c.pod,
                "trainingjob": c.trainingjob,
                "namespace": c.namespace,
                "step": self._step,
                "healthy": not self._last_error,
                "error": self._last_error,
                "process_groups": dict(self._last_reports),
            }

    def ras_snapshot(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self._ras_snapshot is None else dict(self._ras_snapshot)
