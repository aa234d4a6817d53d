# SPDX-License-Identifier: Apache-2.0
"""`clc`: one subcommand per module of this package, one registry, one error type."""

import argparse
import sys

from clc import __version__
from clc.cli.cache import CacheCommand
from clc.cli.doctor import DoctorCommand
from clc.cli.inspect import InspectCommand
from clc.cli.policy import PolicyCommand
from clc.cli.report import ReportCommand
from clc.cli.run import RunCommand
from clc.cli.wrap import WrapCommand
from clc.errors import ClcError

__all__ = ["main", "build_parser", "COMMANDS"]

COMMANDS = [RunCommand, ReportCommand, PolicyCommand, InspectCommand, WrapCommand, CacheCommand,
            DoctorCommand]


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


def run_command(command, args):
    try:
        return command().run(args)
    except ClcError as e:
        print(f"clc: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def main(argv=None):
    args = build_parser().parse_args(argv)
    return run_command(args.command_class, args)


if __name__ == "__main__":
    sys.exit(main())
