"""The `trainsentry` command. Each subcommand lives in its own module (see COMMANDS): a
part's `<command>_command.py` (`diagnostics/analyze_command.py` is `trainsentry analyze`),
or the gateway's `gateway/commands/<command>.py`.

A command module provides `HELP` (one line), `DESCRIPTION` (the --help text, with exit
codes), `add_arguments(parser)` and `run(args) -> int`. Heavy imports belong inside
`run`, so `trainsentry --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from trainsentry import __version__

COMMANDS: dict[str, str] = {
    "gateway": "trainsentry.gateway.commands.serve",
    "ack": "trainsentry.gateway.commands.ack",
    "escalate": "trainsentry.gateway.commands.escalate",
    "export": "trainsentry.gateway.commands.export",
    "outbox": "trainsentry.gateway.commands.outbox",
    "maintenance": "trainsentry.gateway.commands.maintenance",
    "node": "trainsentry.gateway.commands.node",
    "demo": "trainsentry.demo",
    "analyze": "trainsentry.diagnostics.analyze_command",
    "operator": "trainsentry.operator.operator_command",
    "probe": "trainsentry.probe.probe_command",
    "report": "trainsentry.reports.report_command",
    "oncall": "trainsentry.oncall.oncall_command",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainsentry",
        description="Monitoring, alerting and fault diagnosis for GPU training jobs.",
        epilog="Exit codes: 0 success, 1 failure, 2 usage error, 141 the output was closed "
        "early (`| head`). Commands document their own.",
    )
    parser.add_argument("--version", action="version", version=f"trainsentry {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(
            name,
            help=module.HELP,
            description=module.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


#: The exit code when whoever reads our output went away (`trainsentry analyze --json | head`):
#: 128 + SIGPIPE, what a shell reports for a command a closed pipe stopped.
EXIT_PIPE_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args._run(args)
        sys.stdout.flush()  # inside the try: a closed pipe is found here, not at exit
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left: nothing more can be said to it. Point stdout at /dev/null so the
        # interpreter's own flush at exit does not raise (and print) the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    return result


if __name__ == "__main__":
    sys.exit(main())
