"""Who is sending: the outbox's worker ids (`host:pid:nonce`), and which of them are earlier
runs of this gateway whose leases may be released at start (gateway/stages/outbox.py)."""

from __future__ import annotations

import os
import secrets
import socket


def default_worker_id() -> str:
    """`host:pid:nonce`. The nonce tells runs apart that share host and pid: a restarted
    container keeps its pod's hostname and runs the gateway as PID 1 again."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def earlier_run(worker_id: str) -> bool:
    """True when `worker_id` (`host:pid:nonce`, of this host) is an earlier run: our PID
    (a restarted container), or a PID no process has (a crashed run on a host)."""
    try:
        pid = int(worker_id.split(":")[1])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, someone else's
        return False
    return False
