"""What a job's hang triggers say, kept in memory for its diagnosis (no store, no I/O).

Every waiting rank's probe posts a trigger per stalled group (`probe/trigger.py`): the group
and sequence number it waits in, since when, the group's member ranks (once per group), and
where the rank's probe listens. Put together, these locate the stalled group and the ranks
that never arrived without a single dump (`locate.py` asks those ranks' `/status`):

- the **oldest stall** (the earliest `since` of a collective key) is the root of a cascade:
  every later wait is a consequence of it;
- its **members** minus the ranks waiting in it are the suspects;
- a rank's **address** is known exactly from its own trigger (the sender's host and the
  probe's port), and inferred for a rank that never posted from a peer on the same host
  (ranks of one pod are `offset + LOCAL_RANK`, each listening on `base port + LOCAL_RANK`).

Invariants:
- Bounded whatever the probes send: at most `MAX_KEYS` keys and `MAX_WAITERS` waiting ranks
  noted per job; a member list longer than `MAX_MEMBERS` is not kept.
- `JobEvidence.snapshot()` is an immutable copy: the diagnosis reads it while triggers keep
  arriving. It is rebuilt only when a trigger changed something, and then only the keys
  that changed (a diagnosis polls it while a 16,384-rank job's triggers arrive).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_KEYS = 4096
MAX_WAITERS = 65_536
MAX_MEMBERS = 65_536
RANKS_PATTERN = r"^[0-9,:\-]*$"
_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_P2P_OPS = ("send", "recv")
_PLAIN_URL = re.compile(r"https?://([A-Za-z0-9._-]+):([0-9]{1,5})(?:/|\Z)")


def parse_ranks(text: str) -> tuple[int, ...]:
    """Pure: the ranks of a compact list ("0-7,16,32-160:16" = 0..7, 16, 32, 48, .., 160), in
    the order given, duplicates dropped; () when malformed or longer than MAX_MEMBERS.

    The probe writes it (`probe.trigger.compact_ranks`); it is attacker-controlled text."""
    ranks: dict[int, None] = {}
    for item in filter(None, text.split(",")):
        match = _ITEM.match(item)
        if match is None:
            return ()
        start = int(match.group(1))
        stop = int(match.group(2)) if match.group(2) is not None else start
        step = int(match.group(3)) if match.group(3) is not None else 1
        if stop < start or step < 1 or (stop - start) // step + 1 + len(ranks) > MAX_MEMBERS:
            return ()
        ranks.update(dict.fromkeys(range(start, stop + 1, step)))
    return tuple(ranks)


@dataclass(frozen=True, slots=True)
class Waiter:
    """A rank that said it waits in a collective, and where its probe listens."""

    rank: int
    host: str
    port: int = 0
    local_rank: int = -1
    pod: str = ""
    node: str = ""


@dataclass(frozen=True, slots=True)
class StalledKey:
    """One (group, sequence number) some ranks wait in, as their triggers tell it."""

    pg: str
    seq: int
    pg_desc: str
    op: str
    #: When the first of its ranks began waiting (unix seconds).
    since: float
    members: tuple[int, ...]
    waiting: Mapping[int, Waiter]

    @property
    def p2p(self) -> bool:
        return self.op.startswith(_P2P_OPS)


@dataclass(frozen=True, slots=True)
class HangEvidence:
    """An immutable view of a job's triggers (`JobEvidence.snapshot`)."""

    keys: tuple[StalledKey, ...]
    #: Every rank that posted, by rank (the first trigger of each).
    waiters: Mapping[int, Waiter]
    #: Unix seconds of the job's first trigger.
    first_at: float
    world_size: int = 0

    def oldest(self) -> StalledKey | None:
        """Pure: the collective stall that began first (p2p keys only when there is no
        collective one): the root of the cascade the other waits follow from."""
        collectives = [k for k in self.keys if not k.p2p] or list(self.keys)
        return min(collectives, key=lambda k: (k.since, k.pg, k.seq), default=None)


@dataclass
class _Key:
    pg_desc: str
    op: str
    since: float
    members: tuple[int, ...] = ()
    waiting: dict[int, Waiter] = field(default_factory=dict)


class JobEvidence:
    """The triggers of one job's hang, noted as they arrive (see the module invariants)."""

    def __init__(self, first_at: float) -> None:
        self.first_at = first_at
        self.world_size = 0
        self._keys: dict[tuple[str, int], _Key] = {}
        self._waiters: dict[int, Waiter] = {}
        self._noted = 0
        self._frozen: dict[tuple[str, int], StalledKey] = {}  # each unchanged key's copy
        self._snapshot: HangEvidence | None = None

    def note(
        self,
        *,
        pg: str,
        seq: int,
        pg_desc: str,
        op: str,
        since: float,
        members: str,
        waiter: Waiter,
        world_size: int,
    ) -> None:
        """One trigger's content (validated by the caller); beyond the bounds, dropped."""
        if self._noted >= MAX_WAITERS:
            return
        self._noted += 1
        self._snapshot = None
        self.world_size = max(self.world_size, world_size)
        key = self._keys.get((pg, seq))
        if key is None:
            if len(self._keys) >= MAX_KEYS:
                return
            key = self._keys[pg, seq] = _Key(pg_desc, op, since)
        self._frozen.pop((pg, seq), None)
        key.since = min(key.since, since)
        if members and not key.members:
            key.members = parse_ranks(members)
        key.waiting.setdefault(waiter.rank, waiter)
        self._waiters.setdefault(waiter.rank, waiter)

    def ended(self, pg: str, seq: int) -> None:
        """The group moved past `seq`: that key is no stall any more."""
        self._keys.pop((pg, seq), None)
        self._frozen.pop((pg, seq), None)
        self._snapshot = None

    def snapshot(self) -> HangEvidence:
        if self._snapshot is None:
            keys = tuple(
                self._frozen.get(at) or self._freeze(at, k) for at, k in self._keys.items()
            )
            self._snapshot = HangEvidence(keys, dict(self._waiters), self.first_at, self.world_size)
        return self._snapshot

    def _freeze(self, at: tuple[str, int], key: _Key) -> StalledKey:
        frozen = StalledKey(*at, key.pg_desc, key.op, key.since, key.members, dict(key.waiting))
        self._frozen[at] = frozen
        return frozen


def host_port(base_url: str) -> tuple[str, int]:
    """Pure: (host, port) of an endpoint's base URL ("" / 0 when it has none, 0 when the
    port is malformed), as `urlsplit` reads them. The usual `http://10.0.0.7:9401` is read
    without it (a job's 16,384 endpoints in milliseconds, not half a second)."""
    plain = _PLAIN_URL.match(base_url)
    if plain is not None and 0 < int(plain.group(2)) <= 65535:
        return plain.group(1).lower(), int(plain.group(2))
    split = urlsplit(base_url)
    try:
        return split.hostname or "", split.port or 0
    except ValueError:
        return split.hostname or "", 0


def host_of(base_url: str) -> str:
    """Pure: the host of an endpoint's base URL ("" when it has none)."""
    return host_port(base_url)[0]


def port_of(base_url: str) -> int:
    """Pure: the port of an endpoint's base URL (0 when it has none or it is malformed)."""
    return host_port(base_url)[1]


def rank_addresses(
    endpoints: Sequence[tuple[str, int]], waiters: Mapping[int, Waiter], ranks: Sequence[int]
) -> dict[int, int]:
    """Pure: for each rank of `ranks` whose endpoint can be told, the index of that endpoint
    in `endpoints` ((host, port) pairs, as the job's resolver lists them).

    Exact for a rank that posted (its host and port); inferred for one that did not from a
    rank that did on the same host, when that host's posting ranks agree on one
    `rank - LOCAL_RANK` offset and one `port - LOCAL_RANK` base (a pod's ranks): the rank
    is then `offset + l` listening on `base + l`. Nothing is guessed otherwise.
    """
    index = {address: i for i, address in enumerate(endpoints)}
    layout: dict[str, set[tuple[int, int]]] = {}
    for waiter in waiters.values():
        if waiter.local_rank >= 0 and waiter.port > 0:
            seen = layout.setdefault(waiter.host, set())
            seen.add((waiter.rank - waiter.local_rank, waiter.port - waiter.local_rank))
    by_offset: dict[int, tuple[str, int]] = {}
    for host, pairs in layout.items():
        if len(pairs) == 1:
            (offset, base) = next(iter(pairs))
            by_offset.setdefault(offset, (host, base))
    offsets = sorted(by_offset)
    found: dict[int, int] = {}
    for rank in ranks:
        posted = waiters.get(rank)
        if posted is not None and (posted.host, posted.port) in index:
            found[rank] = index[posted.host, posted.port]
            continue
        below = bisect.bisect_right(offsets, rank) - 1  # the pod whose ranks start below
        if below >= 0:
            host, base = by_offset[offsets[below]]
            address = (host, base + rank - offsets[below])
            if address in index:
                found[rank] = index[address]
    return found
