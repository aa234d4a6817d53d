# SPDX-License-Identifier: Apache-2.0
"""The registry of `clc` subcommands: one module and one class each."""

from clc.commands.cache import CacheCommand
from clc.commands.doctor import DoctorCommand
from clc.commands.inspect import InspectCommand
from clc.commands.policy import PolicyCommand
from clc.commands.report import ReportCommand
from clc.commands.run import RunCommand
from clc.commands.wrap import WrapCommand

__all__ = ["COMMANDS"]

COMMANDS = [RunCommand, ReportCommand, PolicyCommand, InspectCommand, WrapCommand, CacheCommand,
            DoctorCommand]
