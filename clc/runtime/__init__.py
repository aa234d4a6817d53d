# SPDX-License-Identifier: Apache-2.0
"""What serves a running program: the engine and the hook API inside it (engine, hooks, the
shim's cffi bridge `_bridge`), the decider that answers its first sights from clc-run
(decider), and the settings that start the shim in it (shim).

Standard library only, and never the wrap pipeline at import: the engine imports clc.wrapping only
when a decision wraps a kernel.
"""
