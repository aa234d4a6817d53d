# SPDX-License-Identifier: Apache-2.0
"""clc: control the CUDA kernel launches of programs you cannot change.

Kept free of imports on purpose: the shim's bridge imports this package inside the traced
program, where only the standard library can be assumed.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
