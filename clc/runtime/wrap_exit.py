# SPDX-License-Identifier: Apache-2.0
"""What the engine writes at exit of a program whose kernels it wrapped: each wrapped kernel's
counts (its clc_stats) as a WRAP_STATS record, the deadline wrapper's skipped blocks, each
build's source and time, and the wrapped libraries, unloaded here while the driver still runs.
Standard library only, as the engine."""

import os
import sys

from clc import abi
from clc.runtime.shim_calls import shim_wrap_stats
from clc.words import count

__all__ = ["report_wrap_exit"]


def report_wrap_exit(wrapping, message):
    """Into the capture through message(level, text) (a clc.wrapping.engine.WrapEngine's
    counts, builds and libraries); on stderr what no capture can take."""
    try:
        rows = wrapping.exit_stats()
    except Exception as e:
        rows = []
        message(abi.MSG_WARNING, f"the wrapped kernels' counts could not be read: {e}")
    for name, spec, counts in rows:
        label = os.path.basename(spec.name) + "".join(f" {k}={v}" for k, v in spec.params)
        if not shim_wrap_stats(name, label, counts):  # no capture: said here
            sys.stderr.write(f"clc: wrapped {name} ({label}): "
                             + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                             + "\n")
        if counts["skipped"]:
            total = counts["skipped"] + counts["blocks"]
            message(abi.MSG_WARNING, f"{name}: the deadline wrapper skipped "
                    f"{count(counts['skipped'], 'block')} (of {total})")
    for name, wrapper, source, ms in wrapping.timings:
        message(abi.MSG_INFO, f"wrap build: {name} with {os.path.basename(wrapper)}: "
                f"{source} in {ms:.1f} ms")
    libs = wrapping.libraries.stats()
    # The program is done with them: unloaded here, while the driver still runs.
    wrapping.libraries.close()
    unloaded = wrapping.libraries.stats()["unloads"] - libs["unloads"]
    if libs["loads"] or libs["entries"]:
        message(abi.MSG_INFO, f"wrap libraries: "
                f"{count(libs['loads'], 'cuLibraryLoadData call')}, "
                f"{count(wrapping.contexts(), 'context')}, {unloaded} unloaded at exit")
    if unloaded < libs["entries"]:
        message(abi.MSG_WARNING, f"{libs['entries'] - unloaded} wrapped libraries "
                f"could not be unloaded at exit: {wrapping.libraries.last_error}")
