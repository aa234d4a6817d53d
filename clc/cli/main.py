# SPDX-License-Identifier: Apache-2.0
"""`clc`: one subcommand per module of this package, one registry, one error type."""

import argparse
import os
import signal
import sys

from clc import __version__
from clc.cli.cache import CacheCommand
from clc.cli.demo import DemoCommand
from clc.cli.doctor import DoctorCommand
from clc.cli.inspect import InspectCommand
from clc.cli.metrics import MetricsCommand
from clc.cli.policy import PolicyCommand
from clc.cli.report import ReportCommand
from clc.cli.run import RunCommand
from clc.cli.wrap import WrapCommand
from clc.errors import ClcError

__all__ = ["main", "build_parser", "run_command", "COMMANDS", "EXIT_BROKEN_PIPE"]

COMMANDS = [RunCommand, ReportCommand, MetricsCommand, PolicyCommand, InspectCommand, WrapCommand,
            CacheCommand, DoctorCommand, DemoCommand]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="clc", description="Control the CUDA kernel launches of programs you cannot change.")
    parser.add_argument("--version", action="version", version=f"clc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(command_class=command)
    return parser


# The status of a command whose reader went away (`clc doctor | head -3`): that of a program
# SIGPIPE ended, as the shell reports it.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def run_command(command, args):
    """Run a command (clc's and clc-run's one entry point): its status, ClcError's message and
    status, 130 for ^C, EXIT_BROKEN_PIPE without a word when its output was closed."""
    try:
        try:
            status = command().run(args)
        except ClcError as e:
            print(f"clc: {e}", file=sys.stderr)
            status = e.exit_code
        # Inside the try: what is still buffered would otherwise fail at exit, with a
        # traceback the interpreter prints itself. (None: the stream was closed at start.)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        return status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence()
        return EXIT_BROKEN_PIPE


def _silence():
    """Point standard output and error at /dev/null: one of them is a closed pipe, and the
    interpreter flushes both at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError, AttributeError):
                pass                # not a file (None, or a test's capture): nothing to flush
    finally:
        os.close(devnull)


def main(argv=None):
    args = build_parser().parse_args(argv)
    return run_command(args.command_class, args)


if __name__ == "__main__":
    sys.exit(main())
