"""The HTTP client the hang diagnosis asks the ranks' probes with (`/status`, `/dump`,
`/stack`).

Invariant: one TLS context for all of them, made once per process (`warm_up` makes it off
the event loop). httpx makes one per client otherwise, loading the CA bundle on the event
loop: 0.1–0.7 s measured on a loaded node, at each step of each diagnosis (`/status`, dumps,
stacks), while a 16,384-rank job's triggers wait for that loop.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def probe_tls() -> ssl.SSLContext:
    """The TLS context of the probe clients (for an `https://` endpoint), made once."""
    return httpx.create_ssl_context()


def probe_client(
    timeout_s: float,
    transport: httpx.AsyncBaseTransport | None = None,
    connections: int = 100,
) -> httpx.AsyncClient:
    """A client for one round of probe requests: `timeout_s` per request, no redirects, at
    most `connections` open at once (each probe is another host: none is kept for reuse
    beyond httpx's usual 20)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s),
        transport=transport,
        follow_redirects=False,
        verify=probe_tls(),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=20),
    )
