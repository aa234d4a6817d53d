# SPDX-License-Identifier: Apache-2.0
"""The hook API's errors (docs/hooks.md), apart so that every part of the API raises the same."""

__all__ = ["HookError", "HookLoadError"]


class HookError(Exception):
    """A hook used wrongly: bad decorator options, a bad return value, a bad parameter read."""


class HookLoadError(HookError):
    """A hook file or hook reference that cannot be used; str() is `path: message`."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
