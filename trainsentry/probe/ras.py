"""NCCL RAS client: ask a job's RAS service for its status and parse the reply.

Protocol (NCCL's RAS client socket, `NCCL_RAS_ADDR`, default 127.0.0.1:28028), line based:

    -> CLIENT PROTOCOL 2        <- SERVER PROTOCOL <n>
    -> TIMEOUT <seconds>        <- OK
    -> SET FORMAT json          <- OK            (NCCL >= 2.28.7; older: "ERROR: ...")
    -> VERBOSE STATUS           <- the report, then the server closes the connection

The JSON report lists communicators with their ranks and missing ranks; the text report
has a communicator table and `Errors` / `Warnings` sections (INCOMPLETE, DEAD, ERROR,
TIMEOUT, MISMATCH). Both are parsed once (`ras_report`: the text in one pass, its numbers
read with its structure; the JSON loaded once, counted and structured from that document)
into one `RasStatus`: counts, and `suspects`, the ranks behind, missing or failed per
communicator with the process RAS names for each. NCCL 2.28.7/2.28.9 write JSON without a
comma exactly when a process does not answer; it is repaired, and a JSON reply that still
does not parse is asked for again as text. Network I/O lives in `query`; parsing is pure.
Nothing here raises on a bad server: the result says what went wrong.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trainsentry.probe.ras_report import (
    NOT_ERRORS,
    RasCounts,
    RasReportError,
    load_json,
    report_from_json,
    report_from_text,
)
from trainsentry.probe.ras_verdict import suspects

CLIENT_PROTOCOL = 2
DEFAULT_ADDR = "127.0.0.1:28028"
MAX_REPLY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RasStatus:
    """What one RAS status query found. Counts are -1 when the report did not say."""

    ok: bool
    error: str = ""
    format: str = ""  # "json" | "text" | "" (no report)
    server_protocol: int = -1
    nccl_version: str = ""
    communicators: int = -1
    missing_ranks: int = 0
    unresponsive_processes: int = 0
    dead_processes: int = 0
    incomplete_communicators: int = 0
    mismatch_communicators: int = 0
    error_communicators: int = 0
    timeouts: int = 0
    collected_at: float = 0.0
    query_seconds: float = 0.0
    raw: str = field(default="", repr=False)
    #: Ranks behind, missing ("missing"/"dead") or failed ("error") per communicator, with
    #: the process: {communicator, size, rank, state, op, waiting_in, error, host, pid, gpu}.
    suspects: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""  # what was worked around (a repaired JSON report, a text fallback)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_addr(addr: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `host` -> (host, port)."""
    addr = addr.strip() or DEFAULT_ADDR
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, sep, port = addr.rpartition(":")
        if not sep:
            host, port = addr, ""
    return (host or "127.0.0.1"), int(port) if port.isdigit() else 28028


# ---------------------------------------------------------------- counting (pure)


def counts_from_json(doc: Any) -> RasCounts:
    """The numbers of a parsed `SET FORMAT json` status report (the document `load_json`
    read, so the text is parsed once). Raises ValueError (or TypeError) if it is not one."""
    if not isinstance(doc, Mapping) or "communicators" not in doc:
        raise ValueError("not a RAS JSON status report")
    comms = [c for c in doc.get("communicators") or [] if isinstance(c, Mapping)]
    missing_ranks = 0
    unresponsive: set[tuple[str, int]] = set()
    dead: set[tuple[str, int]] = set()
    incomplete = mismatch = errors = 0
    for comm in comms:
        ranks = [r for r in comm.get("ranks") or [] if isinstance(r, Mapping)]
        missing = [m for m in comm.get("missing_ranks") or [] if isinstance(m, Mapping)]
        comm_incomplete = comm_mismatch = False
        for rank in missing:
            status = rank.get("status") or {}
            who = (str(rank.get("host", "")), int(rank.get("pid", -1)))
            if status.get("considered_dead"):
                dead.add(who)
                comm_incomplete = True
            elif status.get("unresponsive"):
                unresponsive.add(who)
                comm_incomplete = True
            else:
                comm_mismatch = True  # answered, but not as a member of this communicator
            if status.get("considered_dead") or status.get("unresponsive"):
                missing_ranks += 1
        counts = [r.get("collective_counts") or {} for r in ranks]
        if any(c != counts[0] for c in counts[1:]):
            comm_mismatch = True
        for rank in ranks:
            status = rank.get("status") or {}
            if (
                int(status.get("init_state", 0)) not in NOT_ERRORS
                or int(status.get("async_error", 0)) not in NOT_ERRORS
            ):
                errors += 1
                break
        incomplete += comm_incomplete
        mismatch += comm_mismatch
    ras = doc.get("ras") or {}
    return RasCounts(
        nccl_version=str(doc.get("nccl_version", "")),
        timeouts=int(ras.get("timeouts_count", 0)),
        communicators=int(doc.get("communicators_count", len(comms))),
        missing_ranks=missing_ranks,
        unresponsive_processes=len(unresponsive),
        dead_processes=len(dead),
        incomplete_communicators=incomplete,
        mismatch_communicators=mismatch,
        error_communicators=errors,
    )


# ---------------------------------------------------------------- I/O


class _Conn:
    """A line-oriented view of a socket with one overall deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._buffer = b""
        self.closed = False

    def _recv(self) -> bytes:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("RAS query timed out")
        self._sock.settimeout(remaining)
        chunk = self._sock.recv(65536)
        if not chunk:
            self.closed = True
        return chunk

    def send_line(self, line: str) -> None:
        self._sock.sendall(line.encode("ascii") + b"\n")

    def read_line(self) -> str | None:
        while b"\n" not in self._buffer:
            chunk = self._recv()
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace").rstrip("\r")

    def read_to_eof(self) -> str:
        data = [self._buffer]
        size = len(self._buffer)
        self._buffer = b""
        while not self.closed and size < MAX_REPLY_BYTES:
            chunk = self._recv()
            data.append(chunk)
            size += len(chunk)
        return b"".join(data).decode("utf-8", "replace")


def query(
    addr: str = DEFAULT_ADDR,
    *,
    timeout: float = 10.0,
    collective_timeout: float | None = 5.0,
    prefer_json: bool = True,
    verbose: bool = True,
) -> RasStatus:
    """Connect, handshake, and fetch one status report. Never raises for server trouble.

    `timeout` bounds the whole exchange; `collective_timeout` is sent as `TIMEOUT` (how
    long the local NCCL process waits for its peers) and must be below `timeout`. A JSON
    report that does not parse even repaired is fetched again as text, within `timeout`.
    """
    started = time.monotonic()
    status = _query_once(addr, timeout, collective_timeout, prefer_json, verbose)
    if status.format != "json" or not status.error.startswith("unparseable json"):
        return status
    left = timeout - (time.monotonic() - started)
    if left <= 0.1:
        return status
    text = _query_once(addr, left, collective_timeout, False, verbose)
    spent = time.monotonic() - started
    if text.ok:
        return replace(text, note=f"{status.error}; the text report was used", query_seconds=spent)
    return replace(text, error=f"{status.error}; text fallback: {text.error}", query_seconds=spent)


def _query_once(
    addr: str,
    timeout: float,
    collective_timeout: float | None,
    prefer_json: bool,
    verbose: bool,
) -> RasStatus:
    started = time.monotonic()
    deadline = started + timeout
    host, port = parse_addr(addr)
    server_protocol = -1
    fmt = "text"

    def failed(error: str, raw: str = "") -> RasStatus:
        return RasStatus(
            ok=False,
            error=error,
            server_protocol=server_protocol,
            collected_at=time.time(),
            query_seconds=time.monotonic() - started,
            raw=raw,
        )

    try:
        sock = socket.create_connection((host, port), timeout=max(0.1, timeout))
    except OSError as exc:
        return failed(f"cannot connect to {host}:{port}: {exc.strerror or exc}")
    try:
        conn = _Conn(sock, deadline)
        conn.send_line(f"CLIENT PROTOCOL {CLIENT_PROTOCOL}")
        hello = conn.read_line()
        if hello is None:
            return failed("server closed the connection during the handshake")
        if not hello.upper().startswith("SERVER PROTOCOL"):
            return failed(f"unexpected handshake reply: {hello[:200]!r}")
        version = hello.split()[-1]
        server_protocol = int(version) if version.isdigit() else -1
        if collective_timeout is not None:
            conn.send_line(f"TIMEOUT {max(0, int(collective_timeout))}")
            reply = conn.read_line()
            if reply is None:
                return failed("server closed the connection after TIMEOUT")
            # An old server may not know TIMEOUT: carry on with its default.
        if prefer_json and server_protocol >= CLIENT_PROTOCOL:
            conn.send_line("SET FORMAT json")
            reply = conn.read_line()
            if reply is None:
                return failed("server closed the connection after SET FORMAT")
            if reply.strip().upper() == "OK":
                fmt = "json"
        conn.send_line("VERBOSE STATUS" if verbose else "STATUS")
        raw = conn.read_to_eof()
    except TimeoutError as exc:
        return failed(str(exc) or "RAS query timed out")
    except (ConnectionResetError, BrokenPipeError):
        return failed("server closed the connection early (reset)")
    except OSError as exc:
        return failed(f"RAS connection error: {exc.strerror or exc}")
    finally:
        sock.close()
    return status_from_report(
        raw, fmt, server_protocol=server_protocol, query_seconds=time.monotonic() - started
    )


def status_from_report(
    raw: str, fmt: str, *, server_protocol: int = -1, query_seconds: float = 0.0
) -> RasStatus:
    """A RasStatus from a report body in the given format (pure apart from the clock)."""
    if not raw.strip():
        return RasStatus(
            ok=False,
            error="server closed the connection without a report",
            format=fmt,
            server_protocol=server_protocol,
            collected_at=time.time(),
            query_seconds=query_seconds,
        )
    try:  # parsed once: the counts come from the same pass (text) or document (JSON)
        if fmt == "json":
            doc, repaired = load_json(raw)
            counts = counts_from_json(doc)
            report = report_from_json(doc, repaired)
        else:
            report = report_from_text(raw)
            counts = report.counts
    except (ValueError, TypeError, RasReportError) as exc:
        return RasStatus(
            ok=False,
            error=f"unparseable {fmt} report: {exc}",
            format=fmt,
            server_protocol=server_protocol,
            collected_at=time.time(),
            query_seconds=query_seconds,
            raw=raw,
        )
    complete = fmt == "json" or "Warnings" in raw or "No communicator data" in raw
    return RasStatus(
        ok=complete,
        error="" if complete else "report ended early (connection closed mid-report)",
        format=fmt,
        server_protocol=server_protocol,
        nccl_version=counts.nccl_version,
        communicators=counts.communicators,
        missing_ranks=counts.missing_ranks,
        unresponsive_processes=counts.unresponsive_processes,
        dead_processes=counts.dead_processes,
        incomplete_communicators=counts.incomplete_communicators,
        mismatch_communicators=counts.mismatch_communicators,
        error_communicators=counts.error_communicators,
        timeouts=counts.timeouts,
        collected_at=time.time(),
        query_seconds=query_seconds,
        raw=raw,
        suspects=suspects(report),
        note="; ".join(report.notes),
    )
