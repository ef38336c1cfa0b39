#!/usr/bin/env python3
"""More real NCCL cases for trainsentry's diagnosis (issue 35), in the style of shared/nccl/nccl_cases.py
(the same harness: ranks on ONE GPU, one NCCL_HOSTID per rank, socket transport on `lo`, each
started with `TRAINSENTRY_PROBE=1 python -m trainsentry.probe.launch ...`, the probe's /status
polled, NCCL RAS queried 20 s after the fault, torch's watchdog dumps kept).

Cases (what trainsentry's tests now build from torch's and NCCL's formats, to check on a GPU):
  ring        4 ranks, batch_isend_irecv([isend to r+1, irecv from r-1]) + wait every step;
              rank 2 never posts its batch of step 15. Expect: analyze names rank 2 only.
  ring_ar     as ring, with an all_reduce after each batch (the batch's `nccl:coalesced` entry
              shares the all_reduce's collective_seq_id). Expect: rank 2 only.
  mismatch    4 ranks, rank 1 all_reduces 2 x the elements at #12 and the job keeps running;
              witness dumps (in-process, 25 s after #12) carry `captured_at_ns`. Expect: size
              mismatch naming rank 1, no hang, no slow rank. Also shows how NCCL pairs the
              larger all_reduce with the peers' next one (the tests assume: one behind).
  opmismatch  4 ranks, at step 12 rank 0 broadcasts where the others all_reduce. Expect (RAS):
              the one rank 0, not all four.
  groups2     8 ranks, groups A {0-3} and B {4-7} (new_group, no world collective); global
              rank 6 (B's rank 2) stalls at step 15. Expect (RAS + /status): global rank 6.
  tpdp        as in nccl_cases.py (TP=2 x DP=4, rank 5 stalls): one process in RAS.
  crash       as in nccl_cases.py (rank 3 exits at #15): RAS async errors (Remote process
              error on the survivors) and the dead process.

Usage (device machine): PYTHONPATH=<checkout> CASE_CARRY=<checkout> python3 nccl_extra_cases.py OUTDIR [case ...]
Per case, OUTDIR/<case>/ gets what nccl_cases.py writes (truth.json, rank<r>.log, fr_nccl_rank_<r>,
witness_<r>_<tag>.json with `captured_at_ns`, probe_dump_<r>.json, polls.jsonl with /status (pid,
host_ips), ras_text.txt, ras_json.txt, ras_project.json). About 3 minutes for all cases at
once (process-group timeout 60 s).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

TOKEN = "gpu-bars-probe-token"
TIMEOUT_S = int(os.environ.get("CASE_PG_TIMEOUT_S", "60"))
BACKEND = os.environ.get("CASE_BACKEND", "nccl")  # "gloo" only to dry-run this harness on a CPU
MIB = 1 << 20

CASES = {
    # name: world, fault step, what happens
    "ring": dict(
        world=4,
        at=15,
        rank=2,
        kind="stall",
        op="ring",
        note="batch_isend_irecv ring; rank 2 never posts its batch of step 15",
    ),
    "ring_ar": dict(
        world=4,
        at=15,
        rank=2,
        kind="stall",
        op="ring_ar",
        note="ring + all_reduce per step; rank 2 never posts its batch of step 15",
    ),
    "mismatch": dict(
        world=4,
        at=12,
        rank=1,
        kind="size",
        note="rank 1 all_reduces 2x the elements at all_reduce #12; job keeps running",
    ),
    "opmismatch": dict(
        world=4,
        at=12,
        rank=0,
        kind="op",
        note="rank 0 broadcasts where the others all_reduce at step 12",
    ),
    "groups2": dict(
        world=8,
        at=15,
        rank=6,
        kind="stall",
        op="groups2",
        note="groups {0-3} and {4-7}, no world collective; rank 6 stalls at step 15",
    ),
    "tpdp": dict(
        world=8,
        at=15,
        rank=5,
        kind="stall",
        note="TP=2 x DP=4; rank 5 sleeps before the TP all_reduce of step 15 (group tp-2 = ranks 4,5)",
    ),
    "crash": dict(
        world=4, at=15, rank=3, kind="crash", note="rank 3 exits (os._exit) before all_reduce #15"
    ),
}


# ------------------------------------------------------------------ worker (one rank)


def worker(case: str, outdir: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    spec = CASES[case]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpu = BACKEND == "nccl"
    dev = "cuda" if gpu else "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if gpu:
        torch.cuda.set_device(0)
    dist.init_process_group(BACKEND, timeout=timedelta(seconds=TIMEOUT_S))
    c10d = torch._C._distributed_c10d
    reached = threading.Event()

    def dump_both(tag: str) -> None:
        out = {
            "rank": rank,
            "tag": tag,
            "torch": torch.__version__,
            "captured_at_ns": time.time_ns(),
        }
        for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
            fn = getattr(c10d, name, None)
            if fn is None:
                out[name] = {"error": "absent"}
                continue
            try:
                doc = json.loads(fn())
                out[name] = {"entries": len(doc.get("entries") or []), "doc": doc}
            except Exception as exc:  # record, never crash the rank
                out[name] = {"error": repr(exc)}
        with open(f"{outdir}/witness_{rank}_{tag}.json", "w") as f:
            json.dump(out, f, default=str)

    def witness() -> None:
        reached.wait()
        time.sleep(25)
        dump_both("stall+25s")

    if spec["kind"] not in ("healthy", "slow"):
        threading.Thread(target=witness, daemon=True).start()
    if spec["kind"] == "size":  # the job keeps running: a second witness 5 s later
        threading.Thread(
            target=lambda: (reached.wait(), time.sleep(30), dump_both("stall+30s")), daemon=True
        ).start()

    groups = {}
    if case == "tpdp":
        tp = 2
        for i in range(world // tp):
            members = list(range(i * tp, i * tp + tp))
            g = dist.new_group(members, group_desc=f"tp-{i}")
            if rank in members:
                groups["tp"] = g
        for j in range(tp):
            members = list(range(j, world, tp))
            g = dist.new_group(members, group_desc=f"dp-{j}")
            if rank in members:
                groups["dp"] = g

    if case == "groups2":
        for members in ([0, 1, 2, 3], [4, 5, 6, 7]):
            g = dist.new_group(members, group_desc=f"half-{members[0] // 4}")
            if rank in members:
                groups["half"] = g

    try:
        import trainsentry.probe as probe
    except Exception:
        probe = None

    x = torch.ones(MIB, device=dev)
    op = spec.get("op", "tpdp" if case == "tpdp" else "ar")
    for step in range(1, 10_000):
        if step == spec["at"]:
            if rank == 0 or rank == spec["rank"]:
                with open(f"{outdir}/stall_at", "w") as f:
                    f.write(repr(time.time()))
            reached.set()
            if spec["kind"] in ("healthy", "slow"):
                sync()
                dump_both("end")
                break
            if rank == spec["rank"]:
                if spec["kind"] == "stall":
                    time.sleep(10**6)
                if spec["kind"] == "crash":
                    sys.stdout.flush()
                    os._exit(17)
                if spec["kind"] == "compute":
                    torch.cuda._sleep(int(600 * 2.0e9))  # ~10 minutes of GPU clock cycles
        if spec["kind"] == "slow" and rank == spec["rank"]:
            time.sleep(0.04)
        if op == "tpdp":
            dist.all_reduce(x, group=groups["tp"])
            dist.all_reduce(x, group=groups["dp"])
        elif op == "pp":
            if rank > 0:
                dist.recv(x, src=rank - 1)
            if rank < world - 1:
                dist.send(x, dst=rank + 1)
        elif op == "a2a":
            split = [
                [1024 * (1 + (i * 3 + j * 5 + step) % 7) for j in range(world)]
                for i in range(world)
            ]
            inp = torch.ones(sum(split[rank]), device=dev)
            out = torch.empty(sum(split[i][rank] for i in range(world)), device=dev)
            dist.all_to_all_single(
                out,
                inp,
                output_split_sizes=[split[i][rank] for i in range(world)],
                input_split_sizes=split[rank],
            )
        elif op in ("ring", "ring_ar"):
            y = torch.empty_like(x)
            works = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, x, (rank + 1) % world),
                    dist.P2POp(dist.irecv, y, (rank - 1) % world),
                ]
            )
            for w in works:
                w.wait()
            if op == "ring_ar":
                dist.all_reduce(x)
        elif op == "groups2":
            dist.all_reduce(x, group=groups["half"])
        elif spec["kind"] == "op" and step == spec["at"] and rank == spec["rank"]:
            dist.broadcast(x, src=0)
        elif spec["kind"] == "size" and step == spec["at"] and rank == spec["rank"]:
            y = torch.ones(2 * MIB, device=dev)
            dist.all_reduce(y)
        else:
            dist.all_reduce(x)
        x.fill_(1.0)
        sync()
        if probe is not None:
            probe.step()
        time.sleep(0.05)
    dist.destroy_process_group()


# ------------------------------------------------------------------ harness


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def get(url: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:
        return -1, repr(e).encode()


def ras_raw(port: int, fmt_json: bool) -> str:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=15)
        s.settimeout(15)
        f = s.makefile("rwb")

        def line(text: str) -> str:
            f.write(text.encode() + b"\n")
            f.flush()
            return f.readline().decode(errors="replace").rstrip("\n")

        hello = line("CLIENT PROTOCOL 2")
        log = [f"# hello: {hello}", f"# TIMEOUT 5 -> {line('TIMEOUT 5')}"]
        if fmt_json:
            log.append(f"# SET FORMAT json -> {line('SET FORMAT json')}")
        f.write(b"VERBOSE STATUS\n")
        f.flush()
        body = f.read().decode(errors="replace")
        s.close()
        return "\n".join(log) + "\n" + body
    except Exception as e:
        return f"# RAS error: {e!r}\n"


def run_case(case: str, root: str, carry: str) -> dict:
    spec = CASES[case]
    d = os.path.join(root, case)
    os.makedirs(d, exist_ok=True)
    world = spec["world"]
    master, base, ras = free_ports(3)
    base = 20000 + 100 * list(CASES).index(case)  # probe ports: base + LOCAL_RANK
    with open(f"{d}/truth.json", "w") as f:
        json.dump({"case": case, **spec, "pg_timeout_s": TIMEOUT_S}, f)
    procs = []
    for r in range(world):
        env = dict(os.environ)
        env.update(
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master),
            NCCL_HOSTID=f"{case}-host{r}",
            NCCL_SOCKET_IFNAME="lo",
            NCCL_IB_DISABLE="1",
            NCCL_DEBUG="WARN",
            NCCL_RAS_ADDR=f"127.0.0.1:{ras}",
            TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_FR_DUMP_TEMP_FILE=f"{d}/fr_nccl_rank_",
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE=f"{d}/fr_nccl_rank_",
            TRAINSENTRY_PROBE="1",
            TRAINSENTRY_PROBE_TOKEN=TOKEN,
            TRAINSENTRY_PROBE_PORT=str(base),
            TRAINSENTRY_PROBE_BIND="127.0.0.1",
            TRAINSENTRY_JOB=case,
            TRAINSENTRY_NAMESPACE="gpu",
            POD_NAME=f"{case}-w-{r}",
            TRAINSENTRY_NODE=f"gpu-{r:02d}",
            POD_IP="127.0.0.1",  # RAS names the node by the address NCCL's sockets use (lo)
            **({"TORCH_NCCL_ENABLE_TIMING": "1"} if spec.get("timing") else {}),
            PYTHONUNBUFFERED="1",
            PYTHONPATH=carry + os.pathsep + env.get("PYTHONPATH", ""),
        )
        log = open(f"{d}/rank{r}.log", "wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainsentry.probe.launch",
                    os.path.abspath(__file__),
                    "--worker",
                    case,
                    d,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    started = time.time()
    stall_at = None
    polls = open(f"{d}/polls.jsonl", "w")
    took_dump = took_ras = False
    deadline = started + 60 + TIMEOUT_S + 75
    while time.time() < deadline:
        if stall_at is None and os.path.exists(f"{d}/stall_at"):
            try:
                stall_at = float(open(f"{d}/stall_at").read())
            except ValueError:
                pass
        row = {
            "t": time.time(),
            "since_stall": None if stall_at is None else round(time.time() - stall_at, 1),
            "alive": [p.poll() is None for p in procs],
            "ranks": {},
        }
        for r in range(world):
            code, body = get(f"http://127.0.0.1:{base + r}/status", timeout=2)
            mcode, mbody = get(f"http://127.0.0.1:{base + r}/metrics", timeout=2)
            lines = [
                ln
                for ln in mbody.decode(errors="replace").splitlines()
                if ln.startswith("trainsentry_") and not ln.startswith("trainsentry_probe_info")
            ]
            try:
                status = json.loads(body) if code == 200 else {"http": code}
            except ValueError:
                status = {"http": code}
            row["ranks"][r] = {"status": status, "metrics": lines[:60]}
        polls.write(json.dumps(row) + "\n")
        polls.flush()
        since = None if stall_at is None else time.time() - stall_at
        if since is not None and since >= 20 and not took_ras:
            took_ras = True
            with open(f"{d}/ras_text.txt", "w") as f:
                f.write(ras_raw(ras, False))
            with open(f"{d}/ras_json.txt", "w") as f:
                f.write(ras_raw(ras, True))
            try:
                from trainsentry.probe import ras as project_ras

                st = project_ras.query(f"127.0.0.1:{ras}", timeout=20, collective_timeout=5)
                with open(f"{d}/ras_project.json", "w") as f:
                    json.dump(st.to_dict(), f, indent=1)
            except Exception as e:
                open(f"{d}/ras_project.json", "w").write(json.dumps({"error": repr(e)}))
        if since is not None and since >= 25 and not took_dump:
            took_dump = True
            for r in range(world):
                code, body = get(f"http://127.0.0.1:{base + r}/dump", token=TOKEN, timeout=10)
                with open(f"{d}/probe_dump_{r}.json", "wb") as f:
                    f.write(
                        body
                        if code == 200
                        else json.dumps(
                            {"http": code, "body": body[:500].decode(errors="replace")}
                        ).encode()
                    )
            code, body = get(f"http://127.0.0.1:{base}/ras", token=TOKEN, timeout=10)
            with open(f"{d}/probe_ras_0.json", "wb") as f:
                f.write(body if code == 200 else json.dumps({"http": code}).encode())
        if all(p.poll() is not None for p in procs):
            break
        # after the watchdog (timeout + dumps), only the sleeping rank is left: give it 40 s to dump
        if (
            since is not None
            and since > TIMEOUT_S + 45
            and sum(p.poll() is None for p in procs) <= 1
        ):
            break
        time.sleep(2)
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
    polls.close()
    return {
        "case": case,
        "seconds": round(time.time() - started, 1),
        "exit_codes": [p.returncode for p in procs],
        "files": sorted(os.listdir(d)),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    root = sys.argv[1]
    names = sys.argv[2:] or list(CASES)
    carry = os.environ.get("CASE_CARRY", os.getcwd())
    sys.path.insert(0, carry)
    os.makedirs(root, exist_ok=True)
    import torch

    gpu = BACKEND == "nccl"
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "backend": BACKEND,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpu else None,
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "has_dump_nccl_trace_json": hasattr(torch._C._distributed_c10d, "_dump_nccl_trace_json"),
        "has_dump_fr_trace_json": hasattr(torch._C._distributed_c10d, "_dump_fr_trace_json"),
    }
    print(json.dumps(info), flush=True)
    with open(f"{root}/env.json", "w") as f:
        json.dump(info, f)
    results = {}
    threads = [
        threading.Thread(target=lambda n=n: results.__setitem__(n, run_case(n, root, carry)))
        for n in names
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in names:
        print(json.dumps(results.get(n)), flush=True)


if __name__ == "__main__":
    main()
