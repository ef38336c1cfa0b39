"""`trainsentry probe`: query NCCL RAS, or a rank's probe (status, Flight Recorder dump)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HELP = "query NCCL RAS or a training rank's probe (status, Flight Recorder dump)"
DESCRIPTION = """\
Talk to the training-side probe and to NCCL's RAS service.

  trainsentry probe ras [--addr HOST:PORT]     one NCCL RAS status report (default: NCCL_RAS_ADDR
                                               or 127.0.0.1:28028), parsed; --raw prints it as is
  trainsentry probe status URL                 a rank probe's identity and collective progress
  trainsentry probe dump URL [-o FILE]         a rank's current Flight Recorder dump (JSON); the
                                               bearer token comes from TRAINSENTRY_PROBE_TOKEN
  trainsentry probe install DIR                copy the probe and its start-up hook into DIR (the
                                               init container the operator's webhook adds runs it)

URL is the probe's base URL, e.g. http://10.0.0.13:9401. In a training script the probe is
started with `trainsentry.probe.start()` or `TRAINSENTRY_PROBE=1 ... -m trainsentry.probe.launch`.

Exit codes:
  0  success
  1  the RAS service or the probe did not answer, or answered with an error
  2  usage error (also a malformed URL)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="probe_command", metavar="ACTION", required=True)
    ras = sub.add_parser("ras", help="query NCCL RAS once")
    ras.add_argument("--addr", default=os.environ.get("NCCL_RAS_ADDR", "127.0.0.1:28028"))
    ras.add_argument("--timeout", type=float, default=15.0, help="seconds for the whole query")
    ras.add_argument("--text", action="store_true", help="ask for the text report, not JSON")
    ras.add_argument("--raw", action="store_true", help="print the report as NCCL sent it")
    ras.add_argument("--json", action="store_true", help="machine output")
    status = sub.add_parser("status", help="a rank probe's progress")
    status.add_argument("url")
    status.add_argument("--timeout", type=float, default=5.0)
    status.add_argument("--json", action="store_true", help="machine output")
    dump = sub.add_parser("dump", help="a rank's Flight Recorder dump")
    dump.add_argument("url")
    dump.add_argument("-o", "--output", help="write to this file instead of stdout")
    dump.add_argument("--timeout", type=float, default=10.0)
    install = sub.add_parser(
        "install", help="copy the probe into DIR for a training image without it"
    )
    install.add_argument("dir", help="the folder (an emptyDir the training container mounts)")


def _run_ras(args: argparse.Namespace) -> int:
    from trainsentry.probe import ras

    status = ras.query(
        args.addr,
        timeout=args.timeout,
        collective_timeout=max(1.0, args.timeout / 2),
        prefer_json=not args.text,
    )
    if args.raw:
        sys.stdout.write(status.raw)
    elif args.json:
        print(json.dumps(status.to_dict(), indent=2))
    else:
        if not status.ok:
            print(f"NCCL RAS at {args.addr}: {status.error}", file=sys.stderr)
        else:
            print(
                f"NCCL {status.nccl_version or '?'} ({status.format} report, "
                f"{status.query_seconds:.2f}s): {status.communicators} communicators, "
                f"{status.missing_ranks} missing ranks, {status.dead_processes} dead and "
                f"{status.unresponsive_processes} unresponsive processes, "
                f"{status.error_communicators} ERROR, {status.mismatch_communicators} MISMATCH, "
                f"{status.incomplete_communicators} INCOMPLETE, {status.timeouts} timeouts"
            )
    return 0 if status.ok else 1


def _get(url: str, timeout: float, token: str | None = None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url, headers=headers, timeout=timeout)


def _bad_url(url: str, exc: Exception) -> int:
    print(f"trainsentry probe: not a usable probe URL: {url}: {exc}", file=sys.stderr)
    return 2


def _run_status(args: argparse.Namespace) -> int:
    import httpx

    try:
        response = _get(args.url.rstrip("/") + "/status", args.timeout)
        response.raise_for_status()
        status = response.json()
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # InvalidURL: no HTTPError
        return _bad_url(args.url, exc)
    except (httpx.HTTPError, ValueError) as exc:
        print(f"probe at {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(
        f"rank {status['rank']}/{status['world_size']} (local {status['local_rank']}) "
        f"node {status['node'] or '?'} pod {status['pod'] or '?'} step {status['step']} "
        f"{'healthy' if status['healthy'] else 'UNHEALTHY: ' + status['error']}"
    )
    for name, pg in sorted(status["process_groups"].items()):
        flight = pg["in_flight"]
        doing = (
            f"in {flight['op']} #{flight['seq']} for {flight['age_seconds']:.1f}s"
            if flight
            else "idle"
        )
        print(
            f"  pg {name} ({pg['pg_desc'] or '-'}): completed #{pg['last_completed']}, "
            f"enqueued #{pg['last_enqueued']}, {doing}, "
            f"last completion {pg['seconds_since_last_completion']:.1f}s ago"
        )
    return 0


def _run_dump(args: argparse.Namespace) -> int:
    import httpx

    token = os.environ.get("TRAINSENTRY_PROBE_TOKEN")
    if not token:
        print("set TRAINSENTRY_PROBE_TOKEN to the probe's bearer token", file=sys.stderr)
        return 2
    try:
        response = _get(args.url.rstrip("/") + "/dump", args.timeout, token)
        response.raise_for_status()
        json.loads(response.content)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        return _bad_url(args.url, exc)
    except (httpx.HTTPError, ValueError) as exc:
        print(f"probe at {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.output:
        with open(args.output, "wb") as out:
            out.write(response.content)
    else:
        sys.stdout.buffer.write(response.content + b"\n")
    return 0


def _run_install(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trainsentry.probe.inject import install

    try:
        counts = install(Path(args.dir))
    except OSError as exc:
        print(f"trainsentry probe install: cannot write {args.dir}: {exc}", file=sys.stderr)
        return 1
    print(
        f"installed the trainsentry probe in {args.dir}: "
        + ", ".join(f"{name} {count} files" for name, count in counts.items())
    )
    return 0


def run(args: argparse.Namespace) -> int:
    handlers = {
        "ras": _run_ras,
        "status": _run_status,
        "dump": _run_dump,
        "install": _run_install,
    }
    return handlers[args.probe_command](args)
