"""Benchmark: many TrainingJobs created at once → time until every job has its children and a
status; peak RSS of the operator process.

The operator runs as the real CLI (`trainsentry operator`) in its own process, so its RSS is
its own; the Kubernetes API is the test emulator (tests/support/kube_emulator.py) in this process.
Baseline in the same run: a small batch (default 50 jobs, several rounds, median) gives the
per-job time; the big batch (default 500) is compared to it (ratio of per-job times; 1.0 means
linear scaling). Targets: big batch < 60 s, RSS < 300 MB.

    .venv/bin/python -m bench.bench_operator [--jobs 500] [--baseline 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]

import kmock  # noqa: E402

from tests.support.kube_emulator import KubeEmulator  # noqa: E402

TJ = "trainsentry.io/v1alpha1/trainingjobs"
PODS_PER_JOB = 2
NODES = 64


def declare(emu: KubeEmulator) -> None:
    emu.declare("v1/namespaces", "Namespace", namespaced=False, verbs=["list", "watch"])
    emu.declare("v1/pods", "Pod")
    emu.declare("v1/nodes", "Node", namespaced=False)
    emu.declare("v1/configmaps", "ConfigMap")
    emu.declare("v1/events", "Event")
    emu.declare("monitoring.coreos.com/v1/prometheusrules", "PrometheusRule")
    emu.declare("monitoring.coreos.com/v1/podmonitors", "PodMonitor")
    emu.declare(TJ, "TrainingJob", status=True)


async def post(emu: KubeEmulator, path: str, body: dict[str, Any]) -> None:
    async with emu.post(path, json=body) as resp:
        if resp.status != 201:
            raise RuntimeError(f"POST {path}: {resp.status} {await resp.text()}")


def kubeconfig(directory: Path, url: str) -> Path:
    path = directory / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        f"clusters: [{{name: emu, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: bench, user: {token: not-a-secret}}]\n"
        "contexts: [{name: emu, context: {cluster: emu, user: bench}}]\n"
    )
    return path


def done(emu: KubeEmulator, namespace: str, names: list[str]) -> int:
    """How many jobs have all three children and a status with a phase."""
    count = 0
    for name in names:
        job = emu.get_live(TJ, namespace, name)
        if not job or not (job.get("status") or {}).get("phase"):
            continue
        if (
            emu.get_live(
                "monitoring.coreos.com/v1/prometheusrules", namespace, f"{name}-trainsentry"
            )
            and emu.get_live(
                "monitoring.coreos.com/v1/podmonitors", namespace, f"{name}-trainsentry-probe"
            )
            and emu.get_live("v1/configmaps", namespace, f"{name}-trainsentry-dashboards")
        ):
            count += 1
    return count


async def batch(
    emu: KubeEmulator,
    namespace: str,
    jobs: int,
    operator: psutil.Process,
    peak: list[int],
    limit: float,
) -> float:
    """Creates `jobs` TrainingJobs (and their pods) at once; seconds until all are done."""
    names = [f"job-{index:04d}" for index in range(jobs)]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for index, name in enumerate(names):
        for rank in range(PODS_PER_JOB):
            await post(
                emu,
                pods,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{name}-{rank}", "labels": {"job": name}},
                    "spec": {
                        "nodeName": f"node-{(index * PODS_PER_JOB + rank) % NODES}",
                        "containers": [{"name": "t", "image": "t"}],
                    },
                    "status": {"phase": "Running"},
                },
            )
    started = time.perf_counter()
    path = f"/apis/trainsentry.io/v1alpha1/namespaces/{namespace}/trainingjobs"
    await asyncio.gather(
        *(
            post(
                emu,
                path,
                {
                    "apiVersion": "trainsentry.io/v1alpha1",
                    "kind": "TrainingJob",
                    "metadata": {"name": name},
                    "spec": {"selector": {"matchLabels": {"job": name}}, "worldSize": PODS_PER_JOB},
                },
            )
            for name in names
        )
    )
    for _ in range(int(limit / 0.25)):
        peak[0] = max(peak[0], operator.memory_info().rss)
        if done(emu, namespace, names) == jobs:
            break
        await asyncio.sleep(0.25)
    else:
        raise TimeoutError(f"{done(emu, namespace, names)}/{jobs} done after {limit}s")
    peak[0] = max(peak[0], operator.memory_info().rss)
    return time.perf_counter() - started


async def main(args: argparse.Namespace) -> None:
    async with KubeEmulator() as emu, kmock.Server(emu):
        declare(emu)
        emu.history_limit = 2
        for index in range(NODES):
            await post(
                emu,
                "/api/v1/nodes",
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{index}"}},
            )
        with tempfile.TemporaryDirectory() as tmp:
            config = kubeconfig(Path(tmp), str(emu.url).rstrip("/"))
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "trainsentry",
                "operator",
                "--kubeconfig",
                str(config),
                "--resync",
                "3600",
                "--no-discovery",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                operator = psutil.Process(process.pid)
                for _ in range(600):  # until it watches (a cold start takes seconds)
                    if any(call.verb == "watch" for call in emu.calls):
                        break
                    await asyncio.sleep(0.1)
                idle_rss = operator.memory_info().rss
                peak = [idle_rss]
                small = [
                    await batch(emu, f"base-{r}", args.baseline, operator, peak, args.timeout)
                    for r in range(args.rounds)
                ]
                big = await batch(emu, "big", args.jobs, operator, peak, args.timeout)
                operator_cpu = sum(operator.cpu_times()[:2])
            finally:
                process.terminate()
                try:  # keep serving the API while it shuts down
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()
    per_job_small = statistics.median(small) / args.baseline
    per_job_big = big / args.jobs
    mb = 1024 * 1024
    print(
        f"baseline: {args.baseline} jobs x {args.rounds} rounds, median "
        f"{statistics.median(small):.2f} s ({per_job_small * 1000:.1f} ms/job)"
    )
    print(
        f"big batch: {args.jobs} jobs at once -> all children + status in {big:.2f} s "
        f"({per_job_big * 1000:.1f} ms/job); target < 60 s: "
        f"{'OK' if big < 60 else 'MISSED'}"
    )
    print(f"scaling ratio (per-job big / per-job baseline): {per_job_big / per_job_small:.2f}")
    print(
        f"operator RSS: idle {idle_rss / mb:.0f} MB, peak {peak[0] / mb:.0f} MB; "
        f"target < 300 MB: {'OK' if peak[0] < 300 * mb else 'MISSED'}"
    )
    if args.verbose:
        counts = collections.Counter(
            f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}"
            for c in emu.calls
        )
        for call, count in counts.most_common():
            print(f"  {count:6d}  {call}")
    own_cpu = sum(psutil.Process().cpu_times()[:2])
    print(
        f"API calls served: {len(emu.calls)}; CPU seconds: operator {operator_cpu:.1f}, "
        f"emulator (this process) {own_cpu:.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--baseline", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("-v", "--verbose", action="store_true", help="print calls by kind")
    asyncio.run(main(parser.parse_args()))
