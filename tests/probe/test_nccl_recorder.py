"""The probe under NCCL, without a GPU: torch's c10d recorders answer with real NCCL dumps.

CI has no GPU and a CPU torch build has no `_dump_nccl_trace_json` at all, which is how the
probe came to read only the generic recorder (gloo's) and see nothing of a real NCCL hang.
Here the two recorders of torch's c10d module are replaced by stand-ins that answer, the way
torch's `FlightRecorder::dump_json` does (entries left out for `includeCollectives=False`,
completed ones for `onlyActive=True`, the key omitted when nothing is left), with what the
real recorders held during the H100 hang in tests/fixtures/nccl: ProcessGroupNCCL's recorder had
the 20 all_reduces, the generic one nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from probe.probe_harness import TOKEN, scrape, value
from tests.support.nccl_artifacts import generic_json_during_hang, nccl_json
from trainsentry.probe.identity import ProbeConfig
from trainsentry.probe.progress import parse_progress
from trainsentry.probe.recorders import PyGroup, Recorders, find_recorders, merge_dumps
from trainsentry.probe.runtime import Probe

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
P = "trainsentry_probe_"


def recorder_standin(doc: dict[str, Any]) -> Callable[..., bytes]:
    """torch's dump_json(includeCollectives, onlyActive) over a recorder holding `doc`."""

    def dump(includeCollectives: bool | None = None, onlyActive: bool | None = None) -> bytes:
        out = {k: v for k, v in doc.items() if k != "entries"}
        if includeCollectives is not False:
            entries = [
                e
                for e in doc.get("entries", [])
                if not (onlyActive and e.get("time_discovered_completed_ns"))
            ]
            if entries:
                out["entries"] = entries
        return json.dumps(out).encode()

    return dump


@pytest.fixture
def nccl_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], Probe]]:
    """A probe (through the real torch module path) in rank r of the real NCCL hang."""
    c10d = torch._C._distributed_c10d
    probes: list[Probe] = []

    def make(rank: int) -> Probe:
        monkeypatch.setattr(
            c10d, "_dump_nccl_trace_json", recorder_standin(nccl_json(rank)), raising=False
        )
        monkeypatch.setattr(
            c10d, "_dump_fr_trace_json", recorder_standin(generic_json_during_hang())
        )
        probe = Probe(
            ProbeConfig(
                rank=rank,
                world_size=4,
                node=f"gpu-{rank:02d}",
                pod=f"hang-w-{rank}",
                bind="127.0.0.1",
                port=0,
                token=TOKEN,
                trainingjob="hang",
            )
        )
        probes.append(probe)
        return probe

    yield make
    for probe in probes:
        probe.stop()


def test_probe_reads_nccls_recorder_and_sees_the_hang(nccl_rank: Callable[[int], Probe]) -> None:
    for rank in range(4):
        probe = nccl_rank(rank)
        probe.server.start()
        assert probe.poll_once() and probe.poll_once()  # the second poll details what is stuck
        status = probe.status()
        assert status["healthy"] is True, status
        assert "nccl" in status["recorders"]
        group = status["process_groups"]["0"]
        assert (group["pg_desc"], group["backend"]) == ("default_pg", "nccl")
        samples = scrape(probe.port)
        labels = {"pg": "0", "pg_desc": "default_pg", "rank": str(rank)}
        if rank == 2:  # the rank that never called all_reduce #20
            assert group["in_flight"] is None
            assert group["last_enqueued"] == 19
            assert value(samples, P + "inflight_seq", **labels) == -1
        else:
            assert group["in_flight"]["op"] == "all_reduce"
            assert group["in_flight"]["seq"] == 20
            assert group["last_enqueued"] == 20 and group["last_completed"] == 19
            assert value(samples, P + "inflight_info", op="all_reduce", **labels) == 1
            assert value(samples, P + "last_enqueued_seq", **labels) == 20
        assert value(samples, P + "process_groups") == 1
        assert value(samples, P + "blind") == 0

        # /dump serves NCCL's recorder, torch's bytes unchanged, saying when it was taken.
        response = httpx.get(
            f"http://127.0.0.1:{probe.port}/dump",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=5,
        )
        assert response.status_code == 200
        assert json.loads(response.content) == nccl_json(rank)
        assert response.headers["X-Trainsentry-Recorders"] == "nccl"
        assert int(response.headers["X-Trainsentry-Captured-At-Ns"]) > 0


def test_a_probe_that_sees_no_group_while_collectives_run_says_it_is_blind() -> None:
    empty = recorder_standin(generic_json_during_hang())

    class C10d:
        _dump_fr_trace_json = staticmethod(empty)

    issued = {"seq": 0}
    recorders = Recorders(
        find_recorders(C10d()), lambda: [PyGroup("0", "default_pg", (0, 1), seq=issued["seq"])]
    )
    probe = Probe(ProbeConfig(bind="127.0.0.1", port=0), recorders)
    try:
        assert probe.poll_once()
        assert probe.status()["healthy"] is True  # initialised, no collective yet: fine
        issued["seq"] = 20
        assert probe.poll_once()
        status = probe.status()
        assert status["healthy"] is False
        assert (
            "issued 20 collective(s) but no Flight Recorder shows a process group"
            in (status["error"])
        )
        text = probe.metrics.registry.get_sample_value(P + "blind", {**probe.config.labels})
        assert text == 1
        assert probe.metrics.registry.get_sample_value(P + "healthy", probe.config.labels) == 0
    finally:
        probe.stop()


GLOO_DUMP = textwrap.dedent(
    """
    import json, os, tempfile, torch, torch.distributed as dist
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100"
    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    cpu = dist.new_group([0], group_desc="cpu-objects")
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(2), group=cpu)
    print(torch._C._distributed_c10d._dump_fr_trace_json().decode())
    """
)


def test_a_job_using_nccl_and_gloo_shows_both_and_dumps_one_valid_document() -> None:
    """The generic recorder of a real gloo process beside NCCL's: "0" is in both."""
    gloo = json.loads(
        subprocess.run(
            [sys.executable, "-c", GLOO_DUMP], capture_output=True, check=True, timeout=120
        ).stdout
    )
    assert {e["process_group"][0] for e in gloo["entries"]} == {"0", "1"}

    class C10d:
        _dump_nccl_trace_json = staticmethod(recorder_standin(nccl_json(0)))
        _dump_fr_trace_json = staticmethod(recorder_standin(gloo))

    recorders = Recorders(find_recorders(C10d()))
    snap = recorders.snapshot(now_ns=2**62)
    assert set(snap.groups) == {"0", "0:generic", "1"}
    assert snap.groups["0"].backend == "nccl" and snap.groups["0"].last_enqueued == 20
    assert snap.groups["0:generic"].last_enqueued == 3
    assert snap.groups["1"].desc == "cpu-objects"

    data, used = recorders.dump()
    assert used == ["nccl", "generic"]
    merged = json.loads(data)
    # pg_status keys (local ids) no longer collide, and each still names its own group.
    again = parse_progress(merged, now_ns=2**62)
    assert again.unmapped == ()
    assert {k: (g.last_enqueued, g.desc) for k, g in again.groups.items()} == {
        "0": (20, "default_pg"),
        "0:generic": (3, "default_pg"),
        "1": (1, "cpu-objects"),
    }
    assert merge_dumps([("nccl", nccl_json(0))])["entries"] == nccl_json(0)["entries"]


def test_groups_created_one_after_another_are_each_named_at_once() -> None:
    """A job creates its groups in quick succession (TP, then DP): each new pg_id gets its
    name from one full dump when it first appears, not 30 s later."""
    calls = {"full": 0}
    docs: list[dict[str, Any]] = []

    def read(includeCollectives: bool | None = None, onlyActive: bool | None = None) -> bytes:
        if includeCollectives is not False:
            calls["full"] += 1
        return recorder_standin(docs[-1])(includeCollectives, onlyActive)

    class C10d:
        _dump_fr_trace_json = staticmethod(read)

    def gloo_entry(pg_id: int, name: str, desc: str, seq: int) -> dict[str, Any]:
        return {
            "pg_id": pg_id,
            "process_group": [name, desc],
            "profiling_name": "gloo:all_reduce",
            "collective_seq_id": seq,
            "is_p2p": False,
            "retired": True,
            "state": "scheduled",
            "time_created_ns": 1,
        }

    def status(n: int) -> dict[str, str]:
        return {"last_enqueued_collective": str(n), "last_completed_collective": str(n)}

    recorders = Recorders(find_recorders(C10d()), clock=lambda: 100.0)
    docs.append({"pg_status": {"1": status(1)}, "entries": [gloo_entry(1, "2", "tp-1", 1)]})
    assert set(recorders.snapshot(0).groups) == {"2"}
    docs.append(
        {
            "pg_status": {"1": status(1), "2": status(1)},
            "entries": [gloo_entry(1, "2", "tp-1", 1), gloo_entry(2, "4", "dp-1", 1)],
        }
    )
    snap = recorders.snapshot(0)
    assert {k: g.desc for k, g in snap.groups.items()} == {"2": "tp-1", "4": "dp-1"}
    assert calls["full"] == 2
    for _ in range(5):  # named ids cost nothing more
        recorders.snapshot(0)
    assert calls["full"] == 2
