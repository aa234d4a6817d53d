# SPDX-License-Identifier: Apache-2.0
"""clc: control the CUDA kernel launches of programs you cannot change.

Kept free of imports on purpose: the shim's bridge imports this package inside the traced
program, where only the standard library can be assumed, and every `clc` command imports it.
The hook API (docs/hooks.md) is re-exported from clc.runtime.hooks on first use (PEP 562), so
`import clc` stays this cheap and `clc.on_launch` still works in a hook file.
"""

__all__ = ["__version__", "on_launch", "on_exit", "allow", "deny", "wrap", "Launch", "Params",
           "Param", "HookError"]

__version__ = "0.1.0"

_HOOK_API = frozenset(["on_launch", "on_exit", "allow", "deny", "wrap", "Launch", "Params", "Param",
                       "HookError"])


def __getattr__(name):
    if name in _HOOK_API:
        import importlib
        value = getattr(importlib.import_module("clc.runtime.hooks"), name)
        # Bound here, so that later lookups never come back to this function.
        globals()[name] = value
        return value
    raise AttributeError(f"module 'clc' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _HOOK_API)
