"""Flight Recorder dumps in torch's NCCL format, for hang classes no real artifact shows yet.

gloo records no send/recv in the Flight Recorder (torch 2.13) and aborts on a size
mismatch, so a batch_isend_irecv ring or a mismatched job that keeps running can only be
dumped by ProcessGroupNCCL. These dumps follow what it writes (torch 2.11, the version of the
real H100 dumps in tests/fixtures/nccl), each entry a copy of a real entry from
`tests/fixtures/nccl/pp/watchdog/fr_nccl_rank_1` with only the recorded values changed:

- a collective bumps `seqCollective_` and records (collective_seq_id, p2p_seq_id, op_id);
- a single send/recv bumps `seqP2P_` (`nccl:send 1->2`, `is_p2p` true, group-local ranks);
- `batch_isend_irecv` (startCoalescing ... endCoalescing) bumps `seqP2P_` once: every op
  is recorded with that `p2p_seq_id`, its own `op_id`, state `scheduled` forever (these works
  are never enqueued: torch's test_c10d_nccl.py `test_batched_send_recv` asserts it), then
  the group's `nccl:coalesced` entry with the same `p2p_seq_id`, empty sizes and the whole
  group's state; that entry is recorded with `is_p2p = isP2POp(OpType::COALESCED)`, false,
  and the current `collective_seq_id` (ProcessGroupNCCL::initWork / endCoalescing);
- `pg_status` counts works by their own sequence number (`isP2P ? seqP2P_ : seqCollective_`),
  so after a send/recv or a batch `last_enqueued_collective` is a p2p number (the real
  pipeline dumps: 36 = the last `p2p_seq_id`, no collective at all).

Times are nanoseconds since the epoch; completion is discovered by the watchdog some time
after the GPU finished (`time_discovered_completed_ns`), as in the real dumps.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.nccl_artifacts import watchdog_dump

MIB = 1 << 20


def _template() -> dict[str, Any]:
    entry = watchdog_dump("pp", 1)["entries"][-1]
    assert entry["profiling_name"] == "nccl:send 1->2" and entry["is_p2p"] is True
    return entry


@dataclass
class NcclRank:
    """One rank's ProcessGroupNCCL counters and Flight Recorder entries (default group)."""

    rank: int
    world: int
    entries: list[dict[str, Any]] = field(default_factory=list)
    seq_collective: int = 0
    seq_p2p: int = 0
    op_id: int = 0
    last_enqueued: int = -1
    last_completed: int = -1
    _template: dict[str, Any] = field(default_factory=_template)

    def _record(
        self,
        name: str,
        created_ns: int,
        done_ns: int | None,
        sizes: list[list[int]],
        is_p2p: bool,
    ) -> dict[str, Any]:
        entry = copy.deepcopy(self._template)
        entry.update(
            record_id=len(self.entries),
            collective_seq_id=self.seq_collective,
            p2p_seq_id=self.seq_p2p,
            op_id=self.op_id,
            profiling_name=name,
            time_created_ns=created_ns,
            input_sizes=sizes,
            input_dtypes=["Float"] * len(sizes),
            output_sizes=sizes,
            output_dtypes=["Float"] * len(sizes),
            state="completed" if done_ns is not None else "scheduled",
            time_discovered_started_ns=None,
            time_discovered_completed_ns=done_ns,
            retired=done_ns is not None,
            is_p2p=is_p2p,
        )
        self.entries.append(entry)
        return entry

    def _enqueued(self, seq: int, done_ns: int | None) -> None:
        self.last_enqueued = seq
        if done_ns is not None:
            self.last_completed = seq

    def all_reduce(self, created_ns: int, done_ns: int | None, numel: int = MIB) -> None:
        self.seq_collective += 1
        self.op_id += 1
        self._record("nccl:all_reduce", created_ns, done_ns, [[numel]], False)
        self._enqueued(self.seq_collective, done_ns)

    def send(self, peer: int, created_ns: int, done_ns: int | None, numel: int = MIB) -> None:
        self.seq_p2p += 1
        self.op_id += 1
        self._record(f"nccl:send {self.rank}->{peer}", created_ns, done_ns, [[numel]], True)
        self._enqueued(self.seq_p2p, done_ns)

    def batch(
        self, ops: list[tuple[str, int]], created_ns: int, done_ns: int | None, numel: int = MIB
    ) -> None:
        """batch_isend_irecv([P2POp(isend|irecv, tensor, peer), ...]); `ops` as (op, peer)."""
        self.seq_p2p += 1
        for i, (op, peer) in enumerate(ops):
            self.op_id += 1
            arrow = "->" if op == "send" else "<-"
            self._record(
                f"nccl:{op} {self.rank}{arrow}{peer}",
                created_ns + i * 20_000,
                None,
                [[numel]],
                True,
            )
        marker = self._record("nccl:coalesced", created_ns + len(ops) * 20_000, done_ns, [], False)
        marker.update(input_dtypes=[], output_dtypes=[])
        self._enqueued(self.seq_p2p, done_ns)

    def dump(self) -> dict[str, Any]:
        return {
            "version": "2.10",
            "pg_config": {
                "0": {
                    "name": "0",
                    "desc": "default_pg",
                    "ranks": str(list(range(self.world))),
                }
            },
            "comm_lib_version": "2.28.9",
            "pg_status": {
                "0": {
                    "last_enqueued_collective": self.last_enqueued,
                    "last_started_collective": -1,
                    "last_completed_collective": self.last_completed,
                }
            },
            "entries": self.entries,
        }


def write_dumps(ranks: list[NcclRank], folder: Path) -> Path:
    """Each rank's dump as the watchdog writes it (`fr_nccl_rank_<r>`, a pickle)."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        (folder / f"fr_nccl_rank_{r.rank}").write_bytes(pickle.dumps(r.dump()))
    return folder
