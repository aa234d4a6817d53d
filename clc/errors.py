# SPDX-License-Identifier: Apache-2.0
"""The one error type of the CLI: a message for the user and the exit status it means."""

__all__ = ["ClcError", "EXIT_USAGE", "EXIT_STRICT"]

EXIT_USAGE = 2
# clc-run --strict: the program exited 0, but launches were denied or not decided
EXIT_STRICT = 3


class ClcError(Exception):
    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code
