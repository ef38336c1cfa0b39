"""Diagnose a hang alert: fetch the chosen ranks' Flight Recorder dumps and name the culprit.

Given the job of a hang alert and the probe endpoints of the ranks to read (pod IP:port;
the diagnosis chooses them with `hang_locate.locate`: the stalled group's suspects first,
never every rank of a large job), `enrich_hang` fetches `/dump` from them
concurrently (bounded concurrency, per-request timeout, one overall deadline; each dump
streamed to a file, cut at its cap and byte budgets while it is read), runs the
diagnostics analyzer on whatever answered, and returns a `HangVerdict` whose `summary` is
one sentence for the card, e.g.

    rank 13 (pod llama-w-13, node gpu-07) never entered all_reduce #4812 of pg tp-3;
    15 ranks waiting 312 s

It never raises for network trouble and never takes longer than `deadline_s` (plus the
analysis, which runs in a worker thread): ranks that do not answer in time are listed and
the verdict is built from the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from trainsentry.alerts import JobRef
from trainsentry.gateway.stages.hang.probe_client import probe_client
from trainsentry.gateway.stages.hang.probe_reading import (
    MAX_DUMP_BYTES,
    ByteBudget,
    DumpLimits,
    TooLarge,
    read_capped,
    stream_to_file,
)
from trainsentry.gateway.stages.hang.stacks import checkpointing, fetch_stacks, stack_phrase

log = logging.getLogger("trainsentry.gateway.hang_enrichment")

DEFAULT_TIMEOUT_S = 3.0
DEFAULT_DEADLINE_S = 5.0
DEFAULT_CONCURRENCY = 32


@dataclass(frozen=True)
class RankEndpoint:
    """Where one rank's probe listens; pod/node/rank are hints until the probe answers."""

    address: str  # "10.0.0.13:9401" or a full base URL
    pod: str = ""
    node: str = ""
    rank: int | None = None

    @property
    def base_url(self) -> str:
        address = self.address.rstrip("/")
        return address if "://" in address else f"http://{address}"


@dataclass(frozen=True)
class PodAddress:
    """A running pod of the job as the Kubernetes API (or a demo's static list) gives it."""

    name: str
    ip: str
    node: str = ""


def endpoints_for_pods(
    pods: Sequence[PodAddress], *, base_port: int = 9401, ranks_per_pod: int = 1
) -> list[RankEndpoint]:
    """One endpoint per rank: each pod's ranks listen on base_port + LOCAL_RANK.

    Global ranks are not known from the pod list; each probe says its own in the
    `X-Trainsentry-Rank` header of `/dump`.
    """
    return [
        RankEndpoint(f"{pod.ip}:{base_port + local}", pod=pod.name, node=pod.node)
        for pod in pods
        if pod.ip
        for local in range(max(1, ranks_per_pod))
    ]


@dataclass(frozen=True)
class FetchResult:
    endpoint: RankEndpoint
    rank: int | None
    pod: str
    node: str
    data: bytes = b""
    error: str = ""
    #: When the probe took the dump (its X-Trainsentry-Captured-At-Ns header), else 0.
    captured_ns: int = 0
    #: Where the dump was streamed to (then `data` is empty), and its size in bytes.
    path: Path | None = None
    size: int = 0

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class HangVerdict:
    """What the gateway stores with the alert and shows on the card."""

    job: str
    verdict: str  # hang | checkpoint | mismatch | slow | ok | unknown
    summary: str
    culprit_ranks: tuple[int, ...] = ()
    ranks_answered: int = 0
    ranks_failed: tuple[str, ...] = ()  # "rank 3 (pod x): timeout"
    report: Mapping[str, Any] | None = field(default=None, repr=False)
    elapsed_s: float = 0.0
    #: The culprits' `/stack` answers (rank -> stack), for the full view behind the card.
    stacks: Mapping[int, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    #: What was not read: the ranks whose dumps were not fetched ("" when all were).
    not_read: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "verdict": self.verdict,
            "summary": self.summary,
            "culprit_ranks": list(self.culprit_ranks),
            "ranks_answered": self.ranks_answered,
            "ranks_failed": list(self.ranks_failed),
            "report": dict(self.report) if self.report is not None else None,
            "elapsed_s": round(self.elapsed_s, 3),
            "stacks": {str(rank): dict(stack) for rank, stack in self.stacks.items()},
            "not_read": self.not_read,
        }


# ---------------------------------------------------------------- fetching (I/O)


async def _fetch_one(
    client: httpx.AsyncClient,
    endpoint: RankEndpoint,
    token: str,
    limit: asyncio.Semaphore,
    into: Path | None,
    cap: int,
    budgets: Sequence[ByteBudget],
) -> FetchResult:
    """One rank's dump, streamed (`probe_http`): to a file in `into`, else into memory; cut
    at `cap` bytes and at the budgets while it is read."""
    async with limit:
        try:
            async with client.stream(
                "GET", endpoint.base_url + "/dump", headers={"Authorization": f"Bearer {token}"}
            ) as response:
                if response.status_code != 200:
                    return _failed(endpoint, f"HTTP {response.status_code}")
                header_rank = response.headers.get("X-Trainsentry-Rank", "")
                if header_rank.isdigit():  # said before the body: failures name the rank
                    endpoint = dataclasses.replace(endpoint, rank=int(header_rank))
                data, path, size = b"", None, 0
                if into is None:
                    data = await read_capped(response, cap)
                    size = len(data)
                else:
                    path = into / f"fetched-{id(endpoint)}-{len(os.listdir(into))}.json"
                    size = await stream_to_file(response, path, cap, budgets)
                headers = response.headers
        except TooLarge as exc:
            return _failed(endpoint, str(exc))
        except httpx.TimeoutException:
            return _failed(endpoint, "timeout")
        except httpx.HTTPError as exc:
            return _failed(endpoint, type(exc).__name__)
    return FetchResult(
        endpoint=endpoint,
        rank=int(header_rank) if header_rank.isdigit() else endpoint.rank,
        pod=headers.get("X-Trainsentry-Pod") or endpoint.pod,
        node=headers.get("X-Trainsentry-Node") or endpoint.node,
        data=data,
        captured_ns=_captured_ns(headers.get("X-Trainsentry-Captured-At-Ns", "")),
        path=path,
        size=size,
    )


def _captured_ns(header: str) -> int:
    """Pure: the capture time a probe sent (ns since the epoch), 0 when absent or absurd."""
    value = int(header) if header.isdigit() else 0
    return value if 10**18 <= value < 10**20 else 0


def _failed(endpoint: RankEndpoint, error: str) -> FetchResult:
    return FetchResult(endpoint, endpoint.rank, endpoint.pod, endpoint.node, error=error)


async def fetch_dumps(
    endpoints: Sequence[RankEndpoint],
    token: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    deadline_s: float = DEFAULT_DEADLINE_S,
    concurrency: int = DEFAULT_CONCURRENCY,
    transport: httpx.AsyncBaseTransport | None = None,
    into: Path | None = None,
    max_bytes: int = MAX_DUMP_BYTES,
    budgets: Sequence[ByteBudget] = (),
) -> list[FetchResult]:
    """One result per endpoint, asked in their order (the suspects first); whatever has not
    answered by the deadline fails. With `into`, each dump is streamed to a file there and
    its bytes stay taken from `budgets` (`release` gives them back)."""
    limit = asyncio.Semaphore(max(1, concurrency))
    async with probe_client(timeout_s, transport) as client:
        tasks = [
            asyncio.ensure_future(_fetch_one(client, e, token, limit, into, max_bytes, budgets))
            for e in endpoints
        ]
        if not tasks:
            return []
        _done, pending = await asyncio.wait(tasks, timeout=deadline_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    results: list[FetchResult] = []
    for endpoint, task in zip(endpoints, tasks, strict=True):
        if task.cancelled():
            results.append(_failed(endpoint, "deadline"))
        elif task.exception() is not None:
            results.append(_failed(endpoint, type(task.exception()).__name__))
        else:
            results.append(task.result())
    return results


def release(results: Sequence[FetchResult], budgets: Sequence[ByteBudget]) -> None:
    """Gives the fetched dumps' bytes back to `budgets` (their files are being dropped)."""
    held = sum(r.size for r in results if r.path is not None)
    for budget in budgets:
        budget.give(held)


# ---------------------------------------------------------------- analysis (pure)


def with_stacks(
    verdict: HangVerdict,
    stacks: Mapping[int, Mapping[str, Any]],
    identities: Mapping[int, tuple[str, str]],
) -> HangVerdict:
    """Pure: the verdict with what the culprits are doing.

    Every culprit saving a checkpoint turns a `hang` into `checkpoint` (healthy: its peers
    wait in a barrier; the gateway does not page); otherwise the summary gains, per culprit
    (at most three), the frame it is in.
    """
    if verdict.verdict != "hang" or not stacks:
        return dataclasses.replace(verdict, stacks=dict(stacks))
    culprits = [r for r in verdict.culprit_ranks if r in stacks]
    saving = {r: checkpointing(stacks[r]) for r in culprits}
    if culprits and len(culprits) == len(verdict.culprit_ranks) and all(saving.values()):
        return dataclasses.replace(
            verdict,
            verdict="checkpoint",
            summary=saving_summary(saving, identities),
            stacks=dict(stacks),
        )
    phrases = [(r, stack_phrase(stacks[r])) for r in culprits[:3]]
    told = "; ".join(f"rank {r} is in {p}" for r, p in phrases if p)
    head, tail = verdict.summary, ""
    if head.endswith(" did not answer)"):  # keep "(k of n ranks did not answer)" last
        head, _, rest = head.rpartition(" (")
        tail = f" ({rest}"
    summary = f"{head}; {told}{tail}" if told else verdict.summary
    return dataclasses.replace(verdict, summary=summary, stacks=dict(stacks))


def saving_summary(saving: Mapping[int, str], identities: Mapping[int, tuple[str, str]]) -> str:
    """Pure: a `checkpoint` verdict's summary (`saving`: rank -> how it says it saves)."""
    how = [f"{_who(r, identities)} is saving a checkpoint ({h})" for r, h in saving.items()]
    return f"{', '.join(how[:3])}; its peers wait for it: not a hang"


def _who(rank: int, identities: Mapping[int, tuple[str, str]]) -> str:
    pod, node = identities.get(rank, ("", ""))
    parts = [f"pod {pod}" if pod else "", f"node {node}" if node else ""]
    detail = ", ".join(p for p in parts if p)
    return f"rank {rank} ({detail})" if detail else f"rank {rank}"


def ranks_phrase(ranks: Sequence[int], identities: Mapping[int, tuple[str, str]]) -> str:
    """Pure: the first three ranks with their pod and node, and how many more."""
    shown = [_who(r, identities) for r in ranks[:3]]
    more = f" and {len(ranks) - 3} more" if len(ranks) > 3 else ""
    return ", ".join(shown) + more


def summarize(report: Mapping[str, Any], identities: Mapping[int, tuple[str, str]]) -> str:
    """One sentence for the card from an analyzer report (`Report.to_dict()`)."""
    verdict = report.get("verdict", "ok")
    hang = report.get("hang")
    if verdict == "hang" and hang:
        # The root causes (a cascade's skipper, a send/recv's silent peer, a GPU that never
        # started the collective), else the primary hang's missing ranks.
        from trainsentry.diagnostics.report import culprit_ranks as analyzer_culprits

        blamed = report.get("culprit_ranks", None)
        missing = [int(r) for r in (analyzer_culprits(dict(report)) if blamed is None else blamed)]
        not_started = {int(r) for r in report.get("not_started_ranks") or []}
        no_dump = [int(r) for r in hang.get("ranks_without_dump") or []]
        pg = hang.get("description") or hang.get("communicator")
        # The analyzer describes the op with its shapes ("all_reduce 4x16 Float"): keep the name.
        op = str(hang.get("op") or "a collective").split(" ")[0]
        where = f"{op} #{hang.get('seq')} of pg {pg}"
        # A rank that never started the collective also "arrived" (it enqueued it): not waiting.
        waiting = int(hang.get("arrived_count") or 0) - len(not_started & set(missing))
        waited = hang.get("waited_s")
        p2p = [
            f"rank {w.get('rank')} waits in {w.get('op')} "
            f"{'to' if w.get('op') == 'send' else 'from'} {w.get('peer')}"
            for w in report.get("p2p_waits") or []
            if int(w.get("peer", -1)) in missing
        ]
        tail = f"; {waiting} rank{'s' if waiting != 1 else ''} waiting"
        if waited is not None:
            tail += f" {round(float(waited))} s"
        if missing and not_started.issuperset(missing):
            sentence = (
                f"{ranks_phrase(missing, identities)} never started {where} "
                f"(every rank enqueued it; the GPU is stuck in earlier work){tail}"
            )
        elif missing and p2p:
            sentence = (
                f"{ranks_phrase(missing, identities)} never posted its side of a send/recv: "
                + ", ".join(p2p[:3])
                + tail
            )
        elif missing:
            sentence = f"{ranks_phrase(missing, identities)} never entered {where}{tail}"
        elif no_dump:
            sentence = (
                f"{where} is stuck; {ranks_phrase(no_dump, identities)} did not answer "
                f"for a dump{tail}"
            )
        elif hang.get("timing_recorded") is False:
            sentence = (
                f"{where} is stuck{tail}; every rank entered it and the dumps do not say "
                "which one never started it (set TORCH_NCCL_ENABLE_TIMING=1)"
            )
        else:
            sentence = f"{where} is stuck{tail}"
        return sentence
    if verdict == "mismatch" and report.get("mismatches"):
        m = next(x for x in report["mismatches"] if x.get("kind") != "state")
        culprits = [int(r) for r in m.get("culprit_ranks") or []]
        return (
            f"{ranks_phrase(culprits, identities)} called {m.get('found')} where peers "
            f"called {m.get('expected')} at #{m.get('seq')} of pg {m.get('communicator')} "
            f"({m.get('kind')} mismatch)"
        )
    if verdict == "slow" and report.get("slow_ranks"):
        slow = report["slow_ranks"]
        ranks = [int(s["rank"]) for s in slow]
        return (
            f"no hang in the dumps; {ranks_phrase(ranks, identities)} "
            f"{'is' if len(ranks) == 1 else 'are'} persistently last to arrive "
            f"(lag {slow[0].get('lag_ms', 0):.0f} ms)"
        )
    return f"no hang visible in the Flight Recorder dumps of {report.get('ranks', 0)} ranks"


def diagnose(job: str, results: Sequence[FetchResult], total_ranks: int = 0) -> HangVerdict:
    """Run the analyzer on the dumps that arrived (blocking: call it off the event loop).

    The dumps go through `trainsentry.diagnostics.analyze`, the analyzer's public entry
    point, as one `rank_<n>.json` file per rank in a private temporary directory; each
    file's mtime is the time its probe took the dump (`X-Trainsentry-Captured-At-Ns`, else
    now): the analyzer measures waits against it, never against its own clock.

    The verdict names only ranks whose dump was read (`read_only`); of a job of
    `total_ranks` ranks it says how many were not fetched (`not_read`).
    """
    from trainsentry.diagnostics import AnalyzeError, analyze

    identities, failed, usable = _sort_results(results)
    not_read = _not_read(total_ranks, len(results))
    if not usable:
        return HangVerdict(
            job=job,
            verdict="unknown",
            summary=f"no rank answered with a Flight Recorder dump ({len(failed)} tried)",
            ranks_failed=tuple(failed),
            not_read=not_read,
        )
    with tempfile.TemporaryDirectory(prefix="trainsentry-hang-") as tmp:
        _place(Path(tmp), usable)
        try:
            # Written here, each with its probe's capture time as mtime: files in place.
            report = analyze([tmp], format="fr", in_place=True).to_dict()
        except AnalyzeError as exc:
            return HangVerdict(
                job=job,
                verdict="unknown",
                summary=f"the dumps could not be analysed: {exc}",
                ranks_answered=len(usable),
                ranks_failed=tuple(failed),
                not_read=not_read,
            )
    unreadable = set()
    for entry in report.get("errors") or []:
        name = Path(str(entry.get("path", ""))).name
        failed.append(f"{name}: {entry.get('error')}")
        unreadable.add(name.removeprefix("rank_").removesuffix(".json"))
    read = {rank for rank in usable if str(rank) not in unreadable}
    tried = {r.rank for r in results if r.rank is not None}
    report = read_only(report, tried, read)
    summary = summarize(report, identities)
    if failed:
        summary += f" ({len(failed)} of {len(results)} ranks did not answer)"
    if not_read:
        summary += f" ({not_read})"
    return HangVerdict(
        job=job,
        verdict=str(report["verdict"]),
        summary=summary,
        culprit_ranks=culprit_ranks(report),
        ranks_answered=len(read),
        ranks_failed=tuple(failed),
        report=report,
        not_read=not_read,
    )


def _sort_results(
    results: Sequence[FetchResult],
) -> tuple[dict[int, tuple[str, str]], list[str], dict[int, FetchResult]]:
    """Pure: (rank -> (pod, node), what failed, the usable dump of each rank)."""
    identities: dict[int, tuple[str, str]] = {}
    failed: list[str] = []
    usable: dict[int, FetchResult] = {}
    for result in results:
        label = result.endpoint.address
        if result.rank is not None:
            identities[result.rank] = (result.pod, result.node)
            label = _who(result.rank, identities)
        if not result.ok:
            failed.append(f"{label}: {result.error}")
        elif result.rank is None:
            failed.append(f"{label}: rank unknown")
        elif result.rank in usable:
            failed.append(f"{label}: rank {result.rank} answered twice")
        else:
            usable[result.rank] = result
    return identities, failed, usable


def _place(folder: Path, usable: Mapping[int, FetchResult]) -> None:
    """Each rank's dump as `rank_<n>.json` in `folder` (a streamed one moved, not copied),
    its mtime the probe's capture time: waits are measured against the dump's own time."""
    for rank, result in usable.items():
        path = folder / f"rank_{rank}.json"
        if result.path is not None:
            shutil.move(result.path, path)
        else:
            path.write_bytes(result.data)
        if result.captured_ns:
            os.utime(path, ns=(result.captured_ns, result.captured_ns))


def _not_read(total_ranks: int, fetched: int) -> str:
    """Pure: what the verdict says of the ranks whose dumps were not fetched ("" if none)."""
    left, what = total_ranks - fetched, f"dumps asked of {fetched} of {total_ranks} ranks"
    return (
        f"{what}, the stalled group's and the suspects'; the other {left} not fetched"
        if left > 0
        else ""
    )


def read_only(
    report: Mapping[str, Any], tried: Collection[int], read: Collection[int]
) -> dict[str, Any]:
    """Pure: the analyzer's report as far as the dumps read support it: its culprits only
    among the ranks whose dump was read, and "without a dump" only the ranks asked for one
    (a rank never asked was not fetched, which says nothing about it)."""
    from trainsentry.diagnostics.report import culprit_ranks as analyzer_culprits

    out = dict(report)
    blamed = report.get("culprit_ranks") or analyzer_culprits(dict(report))
    out["culprit_ranks"] = [int(r) for r in blamed if int(r) in read]
    hang = report.get("hang")
    if isinstance(hang, Mapping):
        without = [int(r) for r in hang.get("ranks_without_dump") or [] if int(r) in tried]
        out["hang"] = {**hang, "ranks_without_dump": without}
    return out


def culprit_ranks(report: Mapping[str, Any]) -> tuple[int, ...]:
    """The ranks blamed (`report["culprit_ranks"]`, else `diagnostics.report.culprit_ranks`);
    for a hang it blames nobody for, the ranks asked for a dump that gave none."""
    from trainsentry.diagnostics.report import culprit_ranks as analyzer_culprits

    blamed = report.get("culprit_ranks", None)
    if blamed is None:
        blamed = analyzer_culprits(dict(report))
    if not blamed and report.get("verdict") == "hang":
        blamed = (report.get("hang") or {}).get("ranks_without_dump") or []
    return tuple(int(r) for r in blamed)


# ---------------------------------------------------------------- entry point


async def enrich_hang(
    job: JobRef | str,
    endpoints: Sequence[RankEndpoint],
    token: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    deadline_s: float = DEFAULT_DEADLINE_S,
    concurrency: int = DEFAULT_CONCURRENCY,
    transport: httpx.AsyncBaseTransport | None = None,
    limits: DumpLimits | None = None,
) -> HangVerdict:
    """Fetch the given ranks' dumps (in the order given, streamed to files within `limits`)
    and diagnose. Never raises for remote trouble."""
    started = time.monotonic()
    job_name = str(job)
    limits = limits or DumpLimits()
    with tempfile.TemporaryDirectory(prefix="trainsentry-fetch-") as folder:
        results = await fetch_dumps(
            endpoints,
            token,
            timeout_s=timeout_s,
            deadline_s=deadline_s,
            concurrency=concurrency,
            transport=transport,
            into=Path(folder),
            max_bytes=limits.max_bytes,
            budgets=limits.budgets,
        )
        try:
            verdict = await asyncio.to_thread(diagnose, job_name, results, limits.total_ranks)
        except Exception as exc:  # the analyzer failing must not lose the page
            log.warning("event=hang_diagnosis_failed job=%s error=%r", job_name, exc)
            verdict = HangVerdict(
                job=job_name,
                verdict="unknown",
                summary=f"diagnosis failed: {type(exc).__name__}",
                ranks_answered=sum(r.ok for r in results),
                ranks_failed=tuple(f"{r.endpoint.address}: {r.error}" for r in results if not r.ok),
            )
        finally:
            release(results, limits.budgets)
    if verdict.verdict == "hang" and verdict.culprit_ranks:
        verdict = await _add_stacks(
            verdict, results, token, timeout_s, deadline_s, started, transport
        )
    elapsed = time.monotonic() - started
    log.info(
        "event=hang_diagnosed job=%s verdict=%s answered=%d failed=%d elapsed_s=%.3f",
        job_name,
        verdict.verdict,
        verdict.ranks_answered,
        len(verdict.ranks_failed),
        elapsed,
    )
    return dataclasses.replace(verdict, elapsed_s=elapsed)


async def _add_stacks(
    verdict: HangVerdict,
    results: Sequence[FetchResult],
    token: str,
    timeout_s: float,
    deadline_s: float,
    started: float,
    transport: httpx.AsyncBaseTransport | None,
) -> HangVerdict:
    """Ask the culprits what they are doing (`/stack`) within what is left of the deadline
    (at least 1 s); a culprit that does not answer is simply not described."""
    endpoints = {r.rank: r.endpoint for r in results if r.rank in verdict.culprit_ranks}
    identities = {r.rank: (r.pod, r.node) for r in results if r.rank is not None}
    left = max(1.0, deadline_s - (time.monotonic() - started))
    stacks = await fetch_stacks(
        {r: e for r, e in endpoints.items() if r is not None},
        token,
        timeout_s=min(timeout_s, left),
        deadline_s=left,
        transport=transport,
    )
    return with_stacks(verdict, stacks, identities)
