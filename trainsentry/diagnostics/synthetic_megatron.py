"""Synthetic Flight Recorder dumps of a Megatron-style job that hung, at any scale.

The layout is Megatron-LM's default rank order (`trainsentry.diagnostics.topology`):
TP 8 within a node, PP 16 stages, DP = world / 128, `rank = tp + TP * (dp + DP * stage)`.
Groups are made as Megatron makes them, with `new_group` in one global order on every rank
(the data-parallel groups, then the tensor-parallel ones, then the pipeline ones), so a
group's name is a global counter and its `pg_id` the rank's own creation order (0 world,
1 its DP group, 2 its TP group, 3 its PP group).

Each training step, per rank: a GPipe schedule of `MICROBATCHES` microbatches (forward:
recv from the previous stage, two TP all_reduces, send to the next; backward the other
way), then the DP gradient all_reduce. Every op blocks its rank until all its participants
issued it (a p2p op: its peer's matching op). In step `T`, the culprit never issues its DP
gradient all_reduce; the job is simulated op by op until nothing can move, so every other
rank ends blocked where a real job would: its DP peers in that all_reduce, its TP peers in
the next step's TP all_reduce, pipeline stages in sends and recvs, the other replicas in
the next step's DP all_reduce.

Dumps are what the probe serves: `_dump_nccl_trace_json()`'s JSON (keys sorted, as torch's
JSON writer orders them; `pg_status` values as strings, keyed by `pg_id`), each rank's last
`entries` entries of its ring buffer, one stack frame each (~650 bytes an entry).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

TP = 8
PP = 16
MICROBATCHES = 4
_BASE_NS = 1_790_000_000_000_000_000
_OP_NS = 1_000_000  # 1 ms between a rank's ops
_STEP_NS = 200_000_000
_TAIL_NS = 30_000_000_000  # the dump is taken 30 s after the last op anyone issued


@dataclass(frozen=True)
class Layout:
    """Where ranks sit and what their groups are called (pure arithmetic)."""

    world: int

    def __post_init__(self) -> None:
        if self.world % (TP * PP):
            raise ValueError(f"world {self.world} is not a multiple of TP*PP = {TP * PP}")

    @property
    def dp(self) -> int:
        return self.world // (TP * PP)

    def place(self, rank: int) -> tuple[int, int, int]:
        """(tp rank, dp rank, stage)."""
        return rank % TP, (rank // TP) % self.dp, rank // (TP * self.dp)

    def rank_of(self, tp: int, dp: int, stage: int) -> int:
        return tp + TP * (dp + self.dp * stage)

    def dp_group(self, rank: int) -> tuple[str, list[int]]:
        tp, _, stage = self.place(rank)
        ranks = [self.rank_of(tp, d, stage) for d in range(self.dp)]
        return str(1 + stage * TP + tp), ranks

    def tp_group(self, rank: int) -> tuple[str, list[int]]:
        base = rank - rank % TP
        return str(1 + TP * PP + rank // TP), list(range(base, base + TP))

    def pp_group(self, rank: int) -> tuple[str, list[int]]:
        tp, dp, _ = self.place(rank)
        ranks = [self.rank_of(tp, dp, s) for s in range(PP)]
        return str(1 + TP * PP + self.world // TP + dp * TP + tp), ranks


def default_culprit(world: int) -> int:
    """A rank in a middle stage, neither first nor last of its TP group or replica."""
    layout = Layout(world)
    return layout.rank_of(5, min(3, layout.dp - 1), PP // 2 - 3)


# An op: (kind, group kind, peer stage or -1). kind: "ar" collective all_reduce,
# "send" / "recv" p2p on the PP group.
_Op = tuple[str, str, int]


def step_program(stage: int) -> list[_Op]:
    """Pure: one training step of a rank in `stage`."""
    ops: list[_Op] = []
    for _ in range(MICROBATCHES):
        if stage > 0:
            ops.append(("recv", "pp", stage - 1))
        ops += [("ar", "tp", -1), ("ar", "tp", -1)]
        if stage < PP - 1:
            ops.append(("send", "pp", stage + 1))
    for _ in range(MICROBATCHES):
        if stage < PP - 1:
            ops.append(("recv", "pp", stage + 1))
        ops += [("ar", "tp", -1), ("ar", "tp", -1)]
        if stage > 0:
            ops.append(("send", "pp", stage - 1))
    ops.append(("ar", "dp", -1))
    return ops


def _simulate(layout: Layout, culprit: int, step: int) -> dict[int, tuple[int, int]]:
    """Pure: per rank, (ops completed, op it is blocked in or -1) over steps `step` and
    `step + 1` (counted from the start of `step`); the culprit stops before its DP
    all_reduce of `step`.

    An op completes when every participant has issued it: a collective's group, a p2p op's
    peer issuing the matching op (same microbatch order on both sides)."""
    del step
    programs = {s: step_program(s) * 2 for s in range(PP)}
    culprit_stop = {culprit: len(step_program(layout.place(culprit)[2])) - 1}
    pc = dict.fromkeys(range(layout.world), 0)
    # Issued-but-incomplete ops: key -> ranks that issued it.
    waiting: dict[tuple[object, ...], set[int]] = {}
    counters: dict[tuple[int, str, int], int] = {}  # (rank, kind, peer) -> count issued

    def key_of(rank: int) -> tuple[tuple[object, ...], int] | None:
        tp, dp, stage = layout.place(rank)
        prog = programs[stage]
        i = pc[rank]
        if i >= len(prog) or i == culprit_stop.get(rank, -1):
            return None
        kind, group, peer = prog[i]
        n = counters.get((rank, f"{kind}{group}", peer), 0)
        if kind == "ar":
            name, ranks = layout.dp_group(rank) if group == "dp" else layout.tp_group(rank)
            return ("ar", name, n), len(ranks)
        lo, hi = (stage, peer) if kind == "send" else (peer, stage)
        direction = "fwd" if lo < hi else "bwd"
        return ("p2p", dp, tp, min(lo, hi), direction, n), 2

    todo = list(range(layout.world))
    while todo:
        rank = todo.pop()
        found = key_of(rank)
        if found is None:
            continue
        key, size = found
        stage = layout.place(rank)[2]
        kind, group, peer = programs[stage][pc[rank]]
        issued = waiting.setdefault(key, set())
        if rank in issued:
            continue
        issued.add(rank)
        counters[(rank, f"{kind}{group}", peer)] = (
            counters.get((rank, f"{kind}{group}", peer), 0) + 1
        )
        if len(issued) == size:
            del waiting[key]
            for member in issued:
                pc[member] += 1
                todo.append(member)
    blocked: dict[int, int] = {}
    for ranks in waiting.values():
        for rank in ranks:
            blocked[rank] = pc[rank]
    return {r: (pc[r], blocked.get(r, -1)) for r in range(layout.world)}


_ENTRY = (
    '{"collective_seq_id": %d, "frames": [{"filename": "megatron/core/%s", "line": %d, '
    '"name": "%s"}], "input_dtypes": ["BFloat16"], "input_sizes": [[%d]], "is_p2p": %s, '
    '"op_id": %d, "output_dtypes": ["BFloat16"], "output_sizes": [[%d]], "p2p_seq_id": %d, '
    '"pg_id": %d, "process_group": ["%s", "%s"], "profiling_name": "nccl:%s", '
    '"record_id": %d, "retired": %s, "state": "%s", "thread_id": "140435672064320", '
    '"thread_name": "python3", "time_created_ns": %d, "time_discovered_completed_ns": %d, '
    '"time_discovered_started_ns": 0, "timeout_ms": 600000}'
)
_DESCS = {
    "dp": ("DATA_PARALLEL_GROUP", 1, "distributed/param_and_grad_buffer.py", "start_grad_sync"),
    "tp": ("TENSOR_MODEL_PARALLEL_GROUP", 2, "tensor_parallel/mappings.py", "_reduce"),
    "pp": ("PIPELINE_MODEL_PARALLEL_GROUP", 3, "pipeline_parallel/p2p_communication.py", "_p2p"),
}
_NUMEL = {"dp": 8_388_608, "tp": 4_194_304, "pp": 4_194_304}


def _dump_text(
    layout: Layout, rank: int, entries: int, hang_step: int, state: tuple[int, int]
) -> str:
    """Pure: one rank's dump as JSON text."""
    _tp, _dp, stage = layout.place(rank)
    names = {
        "dp": layout.dp_group(rank),
        "tp": layout.tp_group(rank),
        "pp": layout.pp_group(rank),
    }
    program = step_program(stage)
    done, blocked_at = state
    # Ops this rank issued: steps 1..hang_step-1 in full, then `done` ops (+ the blocked one).
    issued = (hang_step - 1) * len(program) + done + (1 if blocked_at >= 0 else 0)
    pending = issued - 1 if blocked_at >= 0 else -1
    first = max(0, issued - entries)
    seq = {"dp": 0, "tp": 0, "pp": 0}
    # Counters up to `first` without writing entries: per step each group's counts are fixed.
    per_step = {g: sum(1 for _, grp, _ in program if grp == g) for g in seq}
    full_steps, offset = divmod(first, len(program))
    for g in seq:
        seq[g] = full_steps * per_step[g]
    for _kind, grp, _ in program[:offset]:
        seq[grp] += 1
    jitter = (rank * 7919) % 50_000
    out = []
    for index in range(first, issued):
        step, i = divmod(index, len(program))
        kind, grp, peer = program[i]
        seq[grp] += 1
        name, _ = names[grp]
        desc, pg_id, path, func = _DESCS[grp]
        created = _BASE_NS + step * _STEP_NS + i * _OP_NS + jitter
        hung = index == pending
        if kind == "ar":
            op, coll, p2p, is_p2p = "all_reduce", seq[grp], 0, "false"
        else:
            arrow = "->" if kind == "send" else "<-"
            op, coll, p2p, is_p2p = f"{kind} {stage}{arrow}{peer}", 0, seq[grp], "true"
        out.append(
            _ENTRY
            % (
                coll,
                path,
                100 + i,
                func,
                _NUMEL[grp],
                is_p2p,
                coll or p2p,
                _NUMEL[grp],
                p2p,
                pg_id,
                name,
                desc,
                op,
                index,
                "false" if hung else "true",
                "scheduled" if hung else "completed",
                created,
                0 if hung else created + 400_000,
            )
        )
    return (
        '{"comm_lib_version": "2.27.5", "entries": ['
        + ", ".join(out)
        + "], "
        + _dump_rest(layout, names, seq, pending, program)[1:]
    )


def _dump_rest(
    layout: Layout,
    names: dict[str, tuple[str, list[int]]],
    seq: dict[str, int],
    pending: int,
    program: list[_Op],
) -> str:
    """Pure: the keys after `entries` (`pg_config`, `pg_status`, ...) as one JSON object."""
    status = {}
    for grp, (_, pg_id, _, _) in sorted(_DESCS.items(), key=lambda x: x[1][1]):
        # pg_status counts a group's works by its own counter (p2p ones for the PP group).
        last = seq[grp]
        completed = last - (1 if pending >= 0 and program[pending % len(program)][1] == grp else 0)
        status[str(pg_id)] = {
            "last_completed_collective": str(completed),
            "last_enqueued_collective": str(last),
            "last_started_collective": "-1",
        }
    status["0"] = {
        "last_completed_collective": "0",
        "last_enqueued_collective": "0",
        "last_started_collective": "-1",
    }
    config = {"0": {"desc": "default_pg", "name": "0", "ranks": _world_text(layout.world)}}
    for grp, (name, ranks) in names.items():
        config[name] = {"desc": _DESCS[grp][0], "name": name, "ranks": str(ranks)}
    return json.dumps(
        {
            "nccl_comm_state": {},
            "pg_config": dict(sorted(config.items())),
            "pg_status": dict(sorted(status.items())),
            "version": "2.10",
        },
        sort_keys=False,
    )


_WORLD_TEXT: dict[int, str] = {}


def _world_text(world: int) -> str:
    found = _WORLD_TEXT.get(world)
    if found is None:
        found = _WORLD_TEXT[world] = str(list(range(world)))
    return found


def hang_step(entries: int) -> int:
    """The step the culprit hangs in: enough history before it to fill every ring buffer."""
    shortest = min(len(step_program(s)) for s in range(PP))
    return entries // shortest + 2


def simulate(world: int, culprit: int) -> dict[int, tuple[int, int]]:
    """Per rank, (ops completed in the last two steps, op index blocked in or -1)."""
    return _simulate(Layout(world), culprit, 0)


def dumps(
    world: int,
    entries: int = 2000,
    culprit: int | None = None,
    ranks: range | None = None,
    states: dict[int, tuple[int, int]] | None = None,
) -> Iterator[tuple[int, str]]:
    """(rank, dump JSON) for `ranks` (default: all) of the hung job."""
    layout = Layout(world)
    culprit = default_culprit(world) if culprit is None else culprit
    states = states if states is not None else simulate(world, culprit)
    step = hang_step(entries)
    for rank in ranks if ranks is not None else range(world):
        yield rank, _dump_text(layout, rank, entries, step, states[rank])


def _write_part(args: tuple[str, int, int, int, int, int]) -> int:
    directory, world, entries, culprit, start, step = args
    from pathlib import Path

    states = simulate(world, culprit)
    written = 0
    for rank, text in dumps(world, entries, culprit, range(start, world, step), states):
        Path(directory, f"nccl_trace_rank_{rank}.json").write_text(text, encoding="ascii")
        written += len(text)
    return written


def write_dumps(
    directory: str, world: int, entries: int = 2000, culprit: int | None = None, workers: int = 1
) -> int:
    """Write every rank's dump as `nccl_trace_rank_<r>.json` into `directory` (made if
    absent), in `workers` processes; returns the bytes written."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    os.makedirs(directory, exist_ok=True)
    culprit = default_culprit(world) if culprit is None else culprit
    parts = [(directory, world, entries, culprit, i, workers) for i in range(workers)]
    if workers == 1:
        return _write_part(parts[0])
    with ProcessPoolExecutor(workers) as pool:
        return sum(pool.map(_write_part, parts))
