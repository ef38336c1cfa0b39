"""Free loopback ports for servers a test or benchmark starts.

A port is chosen below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768 and
up by default) where there is room: a port of that range, free when probed, can be taken by
any outgoing connection before the server binds it (a process starts in seconds on a loaded
machine; a torch rank's MASTER_PORT was once taken so). Below the range only a listener can
take it. The choice is random (the system's generator, not `random`'s state, which
Hypothesis seeds alike in every process), so two test processes rarely probe the same port.
"""

from __future__ import annotations

import random
import socket

LOOPBACK = "127.0.0.1"
_FLOOR = 15000  # above the usual fixed ports of local services
_ROOM = 1000  # fewer ports than this below the ephemeral range: use the kernel's choice
_TRIES = 50
_random = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bound(port: int) -> int | None:
    """The port `port` binds to on the loopback (0: the kernel's choice), None if taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return None
        bound: int = sock.getsockname()[1]
        return bound


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (module docstring)."""
    low = _ephemeral_low()
    if low - _FLOOR >= _ROOM:
        for _ in range(_TRIES):
            port = _bound(_random.randrange(_FLOOR, low))
            if port is not None:
                return port
    port = _bound(0)
    assert port is not None
    return port
