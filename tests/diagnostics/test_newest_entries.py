"""Large dumps: only their newest entries are read, and the report says so.

On the real H100 hang (`tests/fixtures/nccl/hang/json`, `_dump_nccl_trace_json()` as the probe
serves it: ranks 0, 1, 3 wait in all_reduce #20, rank 2 never entered it), read with a
window far smaller than each dump: the verdict is the one the whole dumps give, the entries
read are exactly the newest ones, and the ranks read in part are counted and noted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.nccl_artifacts import nccl_dir
from trainsentry.diagnostics import analyze
from trainsentry.diagnostics.readers.fr_newest import read_newest

HANG_JSON = nccl_dir() / "hang" / "json"


def _real_dumps(tmp_path: Path) -> Path:
    for path in HANG_JSON.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def test_newest_entries_are_the_dumps_last_ones(tmp_path: Path) -> None:
    path = _real_dumps(tmp_path) / "nccl_trace_rank_0.json"
    whole = json.loads(path.read_bytes())
    found = read_newest(str(path), 2048)
    assert found is not None
    newest, skipped = found
    kept = newest["entries"]
    assert 0 < len(kept) < len(whole["entries"]) and skipped > 0
    assert kept == whole["entries"][-len(kept) :]
    assert {k: v for k, v in newest.items() if k != "entries"} == {
        k: v for k, v in whole.items() if k != "entries"
    }
    assert read_newest(str(path), 2**20) is None  # small enough to read whole


def test_a_hang_read_from_the_newest_entries_is_the_same_verdict(tmp_path: Path) -> None:
    folder = _real_dumps(tmp_path)
    whole = analyze([folder], newest_bytes=0).to_dict()
    part = analyze([folder], newest_bytes=2048).to_dict()
    for key in ("verdict", "culprit_ranks", "root_cause_ranks", "victim_ranks"):
        assert part[key] == whole[key]
    assert part["culprit_ranks"] == [2] and part["hang"]["seq"] == 20
    assert whole["ranks_partly_read"] == 0 and part["ranks_partly_read"] == 4
    assert any("4 of 4 dumps read in part" in n for n in part["notes"])


def test_not_json_in_torchs_layout_is_read_whole(tmp_path: Path) -> None:
    path = _real_dumps(tmp_path) / "nccl_trace_rank_0.json"
    dump = json.loads(path.read_bytes())
    # Entries last (the order Python's json.dumps keeps for a dict built that way): the
    # tail holds no keys after the entries, which is still one valid layout...
    path.write_text(
        json.dumps({k: v for k, v in dump.items() if k != "entries"} | {"entries": dump["entries"]})
    )
    found = read_newest(str(path), 2048)
    assert found is not None and found[0]["pg_config"] == dump["pg_config"]
    # ...while a file cut short is not: the caller reads it whole (and reports it corrupt).
    path.write_bytes(path.read_bytes()[:-10])
    assert read_newest(str(path), 2048) is None


def test_megatron_hang_named_from_the_newest_entries(tmp_path: Path) -> None:
    """256 ranks of a hung Megatron-style job (TP 8, PP 16, DP 2; the culprit never issues
    its DP gradient all_reduce): read whole and from ~40 newest entries per rank, the
    verdict names the culprit, and only it."""
    from trainsentry.diagnostics import synthetic_megatron

    world, culprit = 256, synthetic_megatron.default_culprit(256)
    synthetic_megatron.write_dumps(str(tmp_path), world, entries=200, culprit=culprit)
    whole = analyze([tmp_path], newest_bytes=0).to_dict()
    part = analyze([tmp_path], newest_bytes=24 * 1024).to_dict()
    assert whole["culprit_ranks"] == part["culprit_ranks"] == [culprit]
    assert part["ranks_partly_read"] == world and whole["ranks_partly_read"] == 0
    assert part["unread_suspect_ranks"] == [] and part["ranks_without_input"] == []


def test_group_lists_are_one_object_across_dumps() -> None:
    """Each worker process sends its own copy of the world's rank list back; joined, every
    dump holds the same object (one world list in memory, not one per dump)."""
    from trainsentry.diagnostics.model import Trace
    from trainsentry.diagnostics.readers.flight_recorder import (
        SignatureCache,
        join_dumps,
        parse_rank_dump,
    )
    from trainsentry.diagnostics.synthetic import make_dump

    trace = Trace(format="fr")
    cache = SignatureCache(trace.signatures)
    dumps = [parse_rank_dump(make_dump(r, 8, 6), r, f"rank_{r}", cache) for r in range(8)]
    for d in dumps:  # as unpickled from different workers: equal, distinct objects
        d.pg_ranks = {name: tuple(list(ranks)) for name, ranks in d.pg_ranks.items()}
    assert dumps[0].pg_ranks["0"] is not dumps[1].pg_ranks["0"]
    trace = join_dumps(dumps, trace)
    assert all(d.pg_ranks["0"] is dumps[0].pg_ranks["0"] for d in dumps)
    assert trace.world_size == 8
