"""A local NCCL RAS server for tests, speaking the RAS client protocol over real TCP.

Modes: a current server (protocol 2, text or JSON replies), an old one (protocol 1, no
`SET FORMAT`), and servers that close early (during the handshake or mid-report).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass, field
from types import TracebackType

TEXT_REPORT = """NCCL version 2.27.3+cuda12.9 compiled with CUDA 12.9
CUDA runtime version 12090, driver version 12090

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      4          8            1         32       32

Communicators... (0.02s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4         8        32        32   RUNNING  INCOMPLETE
    1         4         1         8         8        32   RUNNING      OK
    2         8         4         1         4        32   RUNNING  MISMATCH

Errors
======

INCOMPLETE
  Missing communicator data from 1 job process
  Process 4242 on node 10.0.0.7 managing GPU 5

DEAD
  2 job processes are considered dead (unreachable via the RAS network)
  Process 4243 on node 10.0.0.8 managing GPU 1
  Process 4244 on node 10.0.0.8 managing GPU 2

#0-0 (0123456789abcdef) INCOMPLETE
  Missing communicator data from 3 ranks
  Rank 13 -- GPU 5 managed by process 4242 on node 10.0.0.7

#0-0 (0123456789abcdef) ERROR
  Asynchronous error on 1 rank

Warnings
========

TIMEOUT
  Encountered 2 communication timeouts while gathering communicator data

#2-3 (00000000deadbeef) MISMATCH
  Communicator ranks have different AllReduce operation counts
  3 ranks have launched up to operation 4812
  Rank 2 has launched up to operation 4811 -- GPU 2 managed by process 77 on node 10.0.0.1

"""


def _rank(
    rank: int, host: str, pid: int, allreduce: int, async_error: int = 0
) -> dict[str, object]:
    return {
        "rank": rank,
        "host": host,
        "pid": pid,
        "cuda_dev": rank % 8,
        "nvml_dev": rank % 8,
        "status": {
            "init_state": 0,
            "async_error": async_error,
            "finalize_called": False,
            "destroy_flag": False,
            "abort_flag": False,
        },
        "collective_counts": {"Broadcast": 1, "AllReduce": allreduce, "AllGather": 0},
    }


def _missing(rank: int, host: str, pid: int, unresponsive: bool, dead: bool) -> dict[str, object]:
    return {
        "rank": rank,
        "host": host,
        "pid": pid,
        "cuda_dev": rank,
        "nvml_dev": rank,
        "status": {"unresponsive": unresponsive, "considered_dead": dead},
    }


JSON_REPORT = json.dumps(
    {
        "nccl_version": "2.28.7",
        "cuda_runtime_version": 12090,
        "cuda_driver_version": 12090,
        "timestamp": "2026-11-22 02:00:00",
        "communicators_count": 3,
        "communicators": [
            {  # healthy
                "hash": "0x1",
                "secondary_hash": "0x2:0x3",
                "size": 2,
                "ranks_count": 2,
                "missing_ranks_count": 0,
                "ranks": [_rank(0, "10.0.0.1", 11, 10), _rank(1, "10.0.0.1", 12, 10)],
                "missing_ranks": [],
            },
            {  # one dead rank, one unresponsive rank
                "hash": "0x4",
                "secondary_hash": "0x5:0x6",
                "size": 4,
                "ranks_count": 2,
                "missing_ranks_count": 2,
                "ranks": [_rank(0, "10.0.0.1", 11, 7), _rank(1, "10.0.0.1", 12, 7)],
                "missing_ranks": [
                    _missing(2, "10.0.0.2", 21, unresponsive=True, dead=True),
                    _missing(3, "10.0.0.2", 22, unresponsive=True, dead=False),
                ],
            },
            {  # op counts differ, and an async error
                "hash": "0x7",
                "secondary_hash": "0x8:0x9",
                "size": 2,
                "ranks_count": 2,
                "missing_ranks_count": 0,
                "ranks": [_rank(0, "10.0.0.1", 11, 4812), _rank(1, "10.0.0.3", 31, 4811, 6)],
                "missing_ranks": [],
            },
        ],
        "ras": {"collection_time_sec": 0.012, "timeouts_count": 1},
    },
    indent=2,
)


@dataclass
class FakeRasServer:
    """Serves one RAS client connection at a time on 127.0.0.1 until stopped."""

    protocol: int = 2
    supports_json: bool = True
    close_after_handshake: bool = False
    truncate_report: bool = False
    silent: bool = False  # accept, then never answer (client must time out)
    json_report: str = JSON_REPORT  # what VERBOSE STATUS answers after SET FORMAT json
    commands: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self._sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                self._session(conn)

    def _session(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        reader = conn.makefile("rb")
        fmt = "text"
        while not self._stop.is_set():
            raw = reader.readline()
            if not raw:
                return
            cmd = raw.decode().strip()
            self.commands.append(cmd)
            if self.silent:
                self._stop.wait(10)
                return
            upper = cmd.upper()
            if upper.startswith("CLIENT PROTOCOL "):
                conn.sendall(f"SERVER PROTOCOL {self.protocol}\n".encode())
                if self.close_after_handshake:
                    return
            elif upper.startswith("TIMEOUT "):
                conn.sendall(b"OK\n")
            elif upper.startswith("SET FORMAT ") and self.supports_json:
                fmt = cmd.split()[-1].lower()
                conn.sendall(b"OK\n")
            elif upper in {"STATUS", "VERBOSE STATUS"}:
                report = self.json_report if fmt == "json" else TEXT_REPORT
                if self.truncate_report:
                    report = report[: len(report) // 3]
                conn.sendall(report.encode())
                return  # the server closes the connection after the report
            else:
                conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeRasServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
