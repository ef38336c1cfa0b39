"""The analyzer's result: one verdict plus the evidence, as data and as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainsentry.diagnostics.hang import CommHang, HangAnalysis
from trainsentry.diagnostics.mismatch import MismatchAnalysis
from trainsentry.diagnostics.model import Gap, InputError, ProcessVerdict
from trainsentry.diagnostics.slow import SlowAnalysis, SlowRank
from trainsentry.diagnostics.topology import Topology

VERDICTS = ("ok", "hang", "mismatch", "slow")
MAX_GAPS_LISTED = 100


def _hang_dict(hang: CommHang, analysis: HangAnalysis | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "communicator": hang.comm,
        "description": hang.desc,
        "op": hang.op,
        "seq": hang.seq,
        "missing_ranks": list(hang.missing_ranks),
        "ranks_without_dump": list(hang.no_dump_ranks),
        "arrived_count": len(hang.arrived_ranks),
        "arrived_ranks": list(hang.arrived_ranks),
        "waited_s": None if hang.waited_s is None else round(hang.waited_s, 3),
        "waited_at_least_s": None
        if hang.waited_at_least_s is None
        else round(hang.waited_at_least_s, 3),
        "membership_known": hang.membership_known,
        "unidentified_members": hang.unidentified,
        "not_started_ranks": list(hang.not_started_ranks),
        "timing_recorded": hang.timing_recorded,
        "rank_space": hang.rank_space,
    }
    if analysis is not None:
        out["root_cause_ranks"] = list(analysis.root_cause_ranks)
        out["victim_ranks"] = list(analysis.victim_ranks)
    return out


def culprit_ranks(report: dict[str, Any]) -> list[int]:
    """Pure: the ranks a reader should name, by verdict (what `Report.culprit_ranks` says).

    hang: the root causes (a rank that never arrived, never started, skipped a collective
    or never posted its side of a send/recv), else the primary hang's missing ranks when
    they are global ranks (NCCL RAS without probe statuses knows communicator ranks only:
    it names processes, in `processes`, and no rank here);
    mismatch: the blocking mismatches' culprits; slow: the slow ranks; ok: none.
    """
    verdict = report.get("verdict")
    if verdict == "hang":
        hang = report.get("hang") or {}
        if report.get("root_cause_ranks"):
            return list(report["root_cause_ranks"])
        if hang.get("rank_space", "global") != "global" or report.get("format") == "ras":
            return []
        unread = set(hang.get("ranks_without_dump") or [])
        return [r for r in hang.get("missing_ranks") or [] if r not in unread]
    if verdict == "mismatch":
        seen: dict[int, None] = {}
        for m in report.get("mismatches") or []:
            if m.get("kind") != "state":
                seen.update(dict.fromkeys(m.get("culprit_ranks") or []))
        return list(seen)
    if verdict == "slow":
        return [int(s["rank"]) for s in report.get("slow_ranks") or []]
    return []


def _process_dict(process: ProcessVerdict) -> dict[str, Any]:
    return {
        "role": process.role,
        "global_rank": process.global_rank,
        "pid": process.pid if process.pid >= 0 else None,
        "node_address": process.node_address or None,
        "gpu": process.gpu or None,
        "pod": process.pod or None,
        "node": process.node or None,
        "description": process.describe(),
        "communicators": [
            {"communicator": p.communicator, "size": p.size, "rank": p.rank, "what": p.what}
            for p in process.places
        ],
        "meaning": process.meaning,
    }


def _slow_dict(slow: SlowRank) -> dict[str, Any]:
    return {
        "rank": slow.rank,
        "p_value": slow.p_value,
        "log10_p_value_bound": round(slow.log10_p_bound, 2),
        "lag_ms": round(slow.lag_ms, 3),
        "mean_lag_ms": round(slow.mean_lag_ms, 3),
        "communicators": list(slow.communicators),
        "communicator_descriptions": list(slow.descriptions),
        "last_count": slow.last_count,
        "ops": slow.ops,
        "victim_of": slow.victim_of,
    }


@dataclass
class Report:
    verdict: str
    format: str
    hang: HangAnalysis
    mismatch: MismatchAnalysis
    slow: SlowAnalysis
    gaps: list[Gap] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    topology: Topology | None = None
    communicators: int = 0
    ranks: int = 0
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: When the dumps were taken (0: unknown), and from what ("option", "sidecar", "mtime",
    #: "entries", "unknown").
    captured_at_ns: int = 0
    captured_from: list[str] = field(default_factory=list)
    #: The last event any dump records (what waits are bounded by when the capture time is
    #: unknown); 0 for formats other than Flight Recorder.
    last_event_ns: int = 0
    #: Ranks the job has that left no input at all (no dump / log).
    ranks_without_input: list[int] = field(default_factory=list)
    #: Ranks whose input was read only in part (a large dump's newest entries).
    partial_ranks: list[int] = field(default_factory=list)

    @property
    def primary_hang(self) -> CommHang | None:
        return self.hang.primary

    @property
    def blocking_mismatches(self) -> list[Any]:
        return [m for m in self.mismatch.mismatches if m.kind != "state"]

    def _verdict_parts(self) -> dict[str, Any]:
        primary = self.primary_hang
        return {
            "format": self.format,
            "root_cause_ranks": list(self.hang.root_cause_ranks),
            "hang": {
                "missing_ranks": list(primary.missing_ranks),
                "ranks_without_dump": list(primary.no_dump_ranks),
                "rank_space": primary.rank_space,
            }
            if primary
            else None,
            "mismatches": [
                {"kind": m.kind, "culprit_ranks": list(m.culprit_ranks)}
                for m in self.mismatch.mismatches
            ],
            "slow_ranks": [{"rank": s.rank} for s in self.slow.slow_ranks],
        }

    @property
    def culprit_ranks(self) -> list[int]:
        return culprit_ranks({**self._verdict_parts(), "verdict": self.verdict})

    def to_dict(self) -> dict[str, Any]:
        primary = self.primary_hang
        failed = {e.path: e.message for e in self.errors}
        return {
            "verdict": self.verdict,
            "format": self.format,
            "topology": (
                {"tp": self.topology.tp, "pp": self.topology.pp, "dp": self.topology.dp}
                if self.topology
                else None
            ),
            "ranks": self.ranks,
            "communicators": self.communicators,
            "culprit_ranks": culprit_ranks({**self._verdict_parts(), "verdict": self.verdict}),
            "root_cause_ranks": list(self.hang.root_cause_ranks),
            "victim_ranks": list(self.hang.victim_ranks),
            "not_started_ranks": list(self.hang.not_started_ranks),
            "skipped_ranks": list(self.hang.skipped_ranks),
            "ranks_without_input": list(self.ranks_without_input),
            "unread_suspect_ranks": list(self.hang.unread_ranks),
            "ranks_partly_read": len(self.partial_ranks),
            "captured_at_ns": self.captured_at_ns or None,
            "captured_from": list(self.captured_from),
            "last_event_ns": self.last_event_ns or None,
            "hang": _hang_dict(primary, self.hang) if primary else None,
            "hangs": [_hang_dict(h) for h in self.hang.hangs],
            "processes": [_process_dict(p) for p in self.hang.processes],
            "p2p_waits": [
                {
                    "rank": w.rank,
                    "peer": w.peer,
                    "communicator": w.comm,
                    "op": w.op,
                    "seq": w.seq,
                    "waited_s": None if w.waited_s is None else round(w.waited_s, 3),
                    "waited_at_least_s": None
                    if w.waited_at_least_s is None
                    else round(w.waited_at_least_s, 3),
                }
                for w in self.hang.p2p_waits
            ],
            "mismatches": [
                {
                    "communicator": m.comm,
                    "seq": m.seq,
                    "kind": m.kind,
                    "culprit_ranks": list(m.culprit_ranks),
                    "expected": m.expected,
                    "found": m.found,
                    "ambiguous": m.ambiguous,
                }
                for m in self.mismatch.mismatches
            ],
            "mismatch_total": self.mismatch.total,
            "slow_ranks": [_slow_dict(s) for s in self.slow.slow_ranks],
            "slow_victims": [_slow_dict(s) for s in self.slow.victims],
            "gaps": [
                {
                    "rank": g.rank,
                    "communicator": g.comm,
                    "after_seq": g.after_seq,
                    "before_seq": g.before_seq,
                    "missing": g.missing,
                }
                for g in self.gaps[:MAX_GAPS_LISTED]
            ],
            "gaps_total": len(self.gaps),
            "inputs": [
                {"path": p, "ok": p not in failed, "error": failed.get(p)} for p in self.inputs
            ],
            "errors": [{"path": e.path, "error": e.message} for e in self.errors],
            "notes": list(self.notes),
            "elapsed_s": round(self.elapsed_s, 3),
        }


def decide_verdict(hang: HangAnalysis, mismatch: MismatchAnalysis, slow: SlowAnalysis) -> str:
    """A mismatch explains a hang, so it wins; then a hang; then slow ranks."""
    if any(m.kind != "state" for m in mismatch.mismatches):
        return "mismatch"
    if hang.hangs:
        return "hang"
    if slow.slow_ranks:
        return "slow"
    return "ok"
