"""Step time of a gloo training loop with and without the trainsentry probe.

One process group of WORLD ranks (CPU, gloo) runs a small MLP with gradient all-reduce.
Rounds alternate "off" (no probe) and "on" (probe polling the Flight Recorder every
INTERVAL seconds, its /metrics scraped every second) inside the same process group, so
both modes see the same machine state. Prints per-mode medians and the median of the
per-round on/off ratios (target: overhead < 1%).

    .venv/bin/python -m bench.bench_probe [--world 2] [--rounds 10] [--steps 200]
                                          [--interval 2.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from tests.support.ports import free_port


def _scraper(port: int, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                r.read()
        except OSError:
            pass


def _worker(rank: int, world: int, master_port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "TORCH_FR_BUFFER_SIZE": "2000",
        }
    )
    import torch
    import torch.distributed as dist

    from trainsentry.probe.identity import config_from_env
    from trainsentry.probe.runtime import Probe

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(64, 256)

    def run_steps(n: int) -> list[float]:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            loss = model(data).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
            opt.step()
            times.append(time.perf_counter() - start)
        return times

    run_steps(args.warmup)
    results: dict[str, list[list[float]]] = {"off": [], "on": []}
    config = config_from_env(
        {
            **os.environ,
            "TRAINSENTRY_PROBE_PORT": "0",
            "TRAINSENTRY_PROBE_BIND": "127.0.0.1",
            "TRAINSENTRY_PROBE_INTERVAL": str(args.interval),
            "TRAINSENTRY_PROBE_RAS": "0",
        }
    )
    for round_index in range(args.rounds):
        order = ("off", "on") if round_index % 2 == 0 else ("on", "off")
        for mode in order:
            dist.barrier()
            probe = None
            stop = threading.Event()
            if mode == "on":
                probe = Probe(config)
                probe.start()
                threading.Thread(target=_scraper, args=(probe.port, stop), daemon=True).start()
                time.sleep(0.05)
            results[mode].append(run_steps(args.steps))
            stop.set()
            if probe is not None:
                probe.stop()
    dist.barrier()
    if rank == 0:
        # Direct cost of the probe's work, independent of step-time noise: one poll (with
        # the ring buffer full and nothing stuck) and one scrape; plus the full dump that
        # /dump and a stuck collective cost, for reference.
        from prometheus_client import generate_latest

        probe = Probe(config)
        poll_s, scrape_s = [], []
        for _ in range(100):
            start = time.perf_counter()
            probe.poll_once()
            poll_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            generate_latest(probe.metrics.registry)
            scrape_s.append(time.perf_counter() - start)
        entries = probe.status()["process_groups"]
        from trainsentry.probe.runtime import dump_generic_recorder

        full_s = []
        for _ in range(5):
            start = time.perf_counter()
            dump_generic_recorder()
            full_s.append(time.perf_counter() - start)
        probe.server.stop()
        # A file, not a queue: a large payload would block a pipe nobody reads until join.
        Path(str(out)).write_text(
            json.dumps(
                {
                    "results": results,
                    "poll_s": poll_s,
                    "scrape_s": scrape_s,
                    "full_s": full_s,
                    "groups": entries,
                }
            )
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--interval", type=float, default=2.0, help="probe poll interval (s)")
    args = parser.parse_args()

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        mp.spawn(_worker, args=(args.world, free_port(), args, str(out)), nprocs=args.world)
        payload = json.loads(out.read_text())
    results = payload["results"]

    def median_ms(runs: list[list[float]]) -> float:
        return statistics.median(t for run in runs for t in run) * 1000

    ratios = [
        statistics.median(on) / statistics.median(off)
        for on, off in zip(results["on"], results["off"], strict=True)
    ]
    off_ms, on_ms = median_ms(results["off"]), median_ms(results["on"])
    overhead = (statistics.median(ratios) - 1) * 100
    print(
        f"gloo ranks={args.world} rounds={args.rounds} steps/round={args.steps} "
        f"probe interval={args.interval}s (rank 0 timings)"
    )
    print(f"  without probe: median step {off_ms:.3f} ms")
    print(f"  with probe:    median step {on_ms:.3f} ms")
    print(f"  ratio of medians (on/off):        {on_ms / off_ms:.4f}")
    print(
        f"  median per-round ratio (on/off): {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f}) -> overhead {overhead:+.2f}%"
    )
    print(f"  target < 1%: {'MET' if overhead < 1.0 else 'NOT MET'}")
    poll_ms = statistics.median(payload["poll_s"]) * 1000
    scrape_ms = statistics.median(payload["scrape_s"]) * 1000
    # Work per second of training: one poll per interval, one scrape per second.
    busy = (poll_ms / args.interval + scrape_ms) / 1000
    print(f"  direct cost: one poll (status dump, parse, metrics) median {poll_ms:.3f} ms,")
    print(f"               scrape median {scrape_ms:.3f} ms")
    full_ms = statistics.median(payload["full_s"]) * 1000
    print(f"  full Flight Recorder dump (/dump, or once per stuck collective): {full_ms:.1f} ms")
    print(
        f"  -> probe busy {busy * 100:.3f}% of one core at interval {args.interval}s "
        f"with a 1 s scrape (upper bound on the step-time overhead)"
    )


if __name__ == "__main__":
    main()
