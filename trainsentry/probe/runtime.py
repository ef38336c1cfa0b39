"""The probe inside one training rank: a poll thread, an optional RAS thread, the server.

Every call into torch is lazy and guarded: if the Flight Recorder cannot be read the probe
reports itself unhealthy and keeps serving; nothing here raises into the training script.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import tempfile
import threading
import time
from typing import Any

from trainsentry.probe import ras as ras_client
from trainsentry.probe.identity import DEFAULT_DUMP_DIR, ProbeConfig, torch_settings
from trainsentry.probe.metrics import ProbeMetrics
from trainsentry.probe.progress import FrSnapshot, PgReport, ProgressTracker, merge
from trainsentry.probe.recorders import PyGroup, Recorder, Recorders, find_recorders
from trainsentry.probe.server import Endpoints, ProbeServer
from trainsentry.probe.stacks import current_phase, thread_stacks
from trainsentry.probe.stall import Stall, StallDetector, StallPolicy
from trainsentry.probe.token import accepted_tokens
from trainsentry.probe.trigger import TriggerClient, compact_ranks, source_address, spread_s

log = logging.getLogger("trainsentry.probe")


def prepare_torch_environment(env: Any = None) -> dict[str, str]:
    """Set the torch variables a hang diagnosis needs (`identity.torch_settings`); returns them.

    The watchdog's dump folder (TRAINSENTRY_FR_DUMP_DIR, default /var/run/trainsentry/fr) is
    created; if it cannot be (read-only root file system, no volume), the system's temporary
    folder is used instead, so torch never fails to write a dump for want of a folder.
    """
    env = os.environ if env is None else env
    folder = env.get("TRAINSENTRY_FR_DUMP_DIR") or DEFAULT_DUMP_DIR
    try:
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise PermissionError(folder)
    except OSError:
        folder = os.path.join(tempfile.gettempdir(), "trainsentry-fr")
        with contextlib.suppress(OSError):
            os.makedirs(folder, exist_ok=True)
    settings = torch_settings(env, folder)
    env.update(settings)
    return settings


def import_from_thread(name: str) -> Any:
    """`importlib.import_module(name)` for a thread of the probe: the top-level package
    first. Python takes a dotted module's import locks child first (torch._C._distributed_c10d,
    torch._C, then torch) while the training script's `import torch` takes them parent first
    (torch, then torch._C, whose initialisation imports torch's modules): both at once
    invert the order, and Python breaks the cycle by failing the script's import
    (_DeadlockError, or an ImportError of a partly initialised module; seen: a rank of a
    gloo job that never started). Taking the package first waits for the script's import to
    end, then finds the rest loaded."""
    importlib.import_module(name.partition(".")[0])
    return importlib.import_module(name)


def dump_generic_recorder(*, collectives: bool = True, only_active: bool = False) -> bytes:
    """The generic recorder's raw JSON dump (the one gloo writes to; raises without torch).

    Kept for tools that want exactly that recorder; the probe reads every recorder through
    `recorders.Recorders`.
    """
    c10d = import_from_thread("torch._C._distributed_c10d")
    data: bytes = c10d._dump_fr_trace_json(includeCollectives=collectives, onlyActive=only_active)
    return data


def torch_recorders() -> list[Recorder]:
    """The recorders of the torch in this process (imports torch)."""
    return find_recorders(import_from_thread("torch._C._distributed_c10d"))


def torch_groups() -> list[PyGroup]:
    """The process groups torch.distributed knows in this process (empty before init)."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return []
    world = importlib.import_module("torch.distributed.distributed_c10d")._world
    groups = []
    for pg, name in list(dict(world.pg_names).items()):
        uid = None
        with contextlib.suppress(Exception):  # no CUDA backend on this group or build
            uid = getattr(pg._get_backend(torch.device("cuda")), "uid", None)
        seq = 0
        with contextlib.suppress(Exception):
            seq = int(pg._get_sequence_number_for_group())
        ranks = tuple(sorted(dict(world.pg_group_ranks.get(pg) or {})))
        groups.append(
            PyGroup(
                name=str(name),
                desc=str(getattr(pg, "group_desc", "") or ""),
                ranks=ranks,
                nccl_uid=uid if isinstance(uid, int) else None,
                seq=seq,
            )
        )
    return groups


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
    """One rank's probe. `start()` / `stop()`; `poll_once()` is the unit of work.

    `recorders` is built from this process's torch on the first poll unless given (tests
    pass recorders whose JSON comes from real dumps).
    """

    def __init__(self, config: ProbeConfig, recorders: Recorders | None = None) -> None:
        self.config = config
        self.metrics = ProbeMetrics(config.labels, config.world_size)
        self.tracker = ProgressTracker(started_s=time.monotonic())
        self.detector = StallDetector(
            StallPolicy(
                floor_s=config.stall_floor_s,
                factor=config.stall_factor,
                startup_s=config.stall_startup_s,
            )
        )
        self.trigger = (
            TriggerClient(
                config.gateway_url,
                config.token,
                jitter_s=spread_s(config.world_size),
                source=source_address(config.bind),
            )
            if config.gateway_url
            else None
        )
        self._stalls: dict[str, Stall] = {}
        self._told_members: set[str] = set()  # groups whose member ranks a trigger carried
        self.recorders = recorders
        self._stop = threading.Event()
        self._step = 0
        self._lock = threading.Lock()
        self._last_reports: dict[str, Any] = {}
        self._last_error = ""
        self._blind = ""
        self._captured_at = 0.0
        self._ras_snapshot: dict[str, Any] | None = None
        self._threads: list[threading.Thread] = []
        self.server = ProbeServer(
            Endpoints(
                registry=self.metrics.registry,
                status=self.status,
                dump=self.dump,
                ras=self.ras_snapshot,
                stack=self.stack,
                tokens=accepted_tokens(config.token, config.namespace, config.trainingjob),
                identity_headers={
                    "X-Trainsentry-Rank": str(config.rank),
                    "X-Trainsentry-Local-Rank": str(config.local_rank),
                    "X-Trainsentry-Node": config.node,
                    "X-Trainsentry-Pod": config.pod,
                },
                watchdog_prefix=config.dump_prefix,
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
        if self.trigger is not None:
            self.trigger.stop()
        self.server.stop()

    # ---------------------------------------------------------------- work

    def step(self, value: int | None = None) -> None:
        with self._lock:
            self._step = self._step + 1 if value is None else int(value)
            step = self._step
        self.metrics.record_step(step)

    def _recorders(self) -> Recorders:
        if self.recorders is None:
            self.recorders = Recorders(torch_recorders(), torch_groups)
        return self.recorders

    def poll_once(self) -> bool:
        """Read every Flight Recorder once and update the metrics. False if it failed."""
        try:
            now_ns = time.time_ns()
            recorders = self._recorders()
            snapshot = recorders.snapshot(now_ns)
            full_dumps = self.config.full_dumps
            detail = list(snapshot.groups) if full_dumps else self.tracker.stuck(snapshot)
            if detail:
                full = recorders.detail(detail, now_ns, only_active=not full_dumps)
                snapshot = merge(snapshot, full, detail)
            reports = self.tracker.update(snapshot, time.monotonic())
            stalls = self.detector.observe(reports)
            blind = self._blindness(recorders, snapshot)
            self.metrics.apply_progress(reports, snapshot.entries)
            self.metrics.apply_visibility(len(snapshot.groups), bool(blind))
        except Exception as exc:
            self.metrics.poll_failed()
            message = f"{type(exc).__name__}: {exc}"
            if message != self._last_error:  # log each distinct failure once
                log.warning("event=probe_poll_failed error=%r", message)
            self._last_error = message
            return False
        if blind and blind != self._blind:
            log.warning("event=probe_blind error=%r", blind)
        self._last_error, self._blind = "", blind
        thresholds = self.detector.thresholds()
        self.metrics.apply_thresholds(reports, thresholds)
        with self._lock:
            self._captured_at = now_ns / 1e9
            self._last_reports = {
                name: group_status(r, thresholds.get(name)) for name, r in reports.items()
            }
            ended = []
            for name in list(self._stalls):  # a stall ends when the group moves on
                flight = reports[name].progress.in_flight if name in reports else None
                if flight is None or flight.seq != self._stalls[name].seq:
                    ended.append(self._stalls.pop(name))
            self._stalls.update({s.pg: s for s in stalls})
        for stall in ended:
            self._report_stall_end(stall)
        for stall in stalls:
            self._report_stall(stall)
        return True

    def _report_stall_end(self, stall: Stall) -> None:
        """The group moved past a stalled collective: the gateway resolves its alert."""
        log.info("event=collective_stall_ended pg=%s seq=%d", stall.pg, stall.seq)
        if self.trigger is not None:
            self.trigger.submit({**self.trigger_body(stall), "resolved": True})

    def _report_stall(self, stall: Stall) -> None:
        """Log a new stall and post it to the gateway (never blocks: `trigger.py`)."""
        log.warning(
            "event=collective_stalled pg=%s pg_desc=%s seq=%d op=%s waited_s=%.1f threshold_s=%.1f",
            stall.pg,
            stall.pg_desc,
            stall.seq,
            stall.op,
            stall.waited_s,
            stall.threshold_s,
        )
        self.metrics.record_stall()
        if self.trigger is not None:
            self.trigger.submit(self.trigger_body(stall))

    def trigger_body(self, stall: Stall) -> dict[str, Any]:
        """What the gateway is told about one stall: who waits, where, since when, where
        this rank's probe listens, and (with this rank's first trigger of the group) the
        group's member ranks (`trigger.compact_ranks`)."""
        c = self.config
        body = {
            "namespace": c.namespace,
            "trainingjob": c.trainingjob,
            "rank": c.rank,
            "local_rank": c.local_rank,
            "port": self.port,
            "pod": c.pod,
            "node": c.node,
            "world_size": c.world_size,
            "since": round(time.time() - stall.waited_s, 3),
            **stall.to_dict(),
        }
        if stall.pg not in self._told_members and self.recorders is not None:
            members = compact_ranks(self.recorders.members(stall.pg))
            if members:
                body["group_ranks"] = members
                self._told_members.add(stall.pg)
        return body

    def _blindness(self, recorders: Recorders, snapshot: FrSnapshot) -> str:
        """Why the probe cannot see this rank's collectives, or "" when it can (or none ran).

        Asked of torch only while no recorder shows a group: torch.distributed's own
        sequence numbers say whether collectives were issued that no recorder recorded.
        """
        if snapshot.groups:
            return ""
        issued = recorders.issued_collectives()
        if issued <= 0:
            return ""
        return (
            f"torch.distributed issued {issued} collective(s) but no Flight Recorder shows a "
            f"process group (read: {', '.join(recorders.names) or 'none'}); the recorder is "
            "off when TORCH_FR_BUFFER_SIZE is unset or 0 at init_process_group (start the "
            "probe before it, or through trainsentry.probe.launch)"
        )

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

    def dump(self) -> tuple[bytes, dict[str, str]]:
        """`/dump`: the full Flight Recorder dump and headers saying when and from where."""
        captured = time.time_ns()
        data, used = self._recorders().dump()
        return data, {
            "X-Trainsentry-Recorders": ",".join(used),
            "X-Trainsentry-Captured-At-Ns": str(captured),
        }

    def status(self) -> dict[str, Any]:
        c = self.config
        with self._lock:
            error = self._last_error or self._blind
            return {
                "rank": c.rank,
                "local_rank": c.local_rank,
                "world_size": c.world_size,
                "node": c.node,
                "pod": c.pod,
                "trainingjob": c.trainingjob,
                "namespace": c.namespace,
                "pid": os.getpid(),
                "host_ips": list(c.host_ips),
                "step": self._step,
                "healthy": not error,
                "error": error,
                "recorders": [] if self.recorders is None else self.recorders.names,
                "captured_at": round(self._captured_at, 3),
                "process_groups": dict(self._last_reports),
                "stalls": [s.to_dict() for s in self._stalls.values()],
                "phase": current_phase(),
            }

    def stack(self) -> dict[str, Any]:
        """`/stack`: every thread's stack (main first) and the marked phase, taken now."""
        return {
            "rank": self.config.rank,
            "pod": self.config.pod,
            "node": self.config.node,
            "pid": os.getpid(),
            "captured_at": round(time.time(), 3),
            "phase": current_phase(),
            "threads": thread_stacks(),
        }

    def ras_snapshot(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self._ras_snapshot is None else dict(self._ras_snapshot)


def group_status(report: PgReport, stall_threshold_s: float | None = None) -> dict[str, Any]:
    """Pure: one process group's entry in `/status`."""
    p = report.progress
    flight = p.in_flight
    return {
        "pg_desc": p.desc,
        "backend": p.backend,
        "last_enqueued": p.last_enqueued,
        "last_started": p.last_started,
        "last_completed": p.last_completed,
        "seconds_since_last_completion": round(report.seconds_since_completion, 3),
        "stall_threshold_seconds": None
        if stall_threshold_s is None
        else round(stall_threshold_s, 3),
        "in_flight": None
        if flight is None
        else {
            "op": flight.op,
            "seq": flight.seq,
            "state": flight.state,
            "age_seconds": round(flight.age_seconds, 3),
        },
    }
