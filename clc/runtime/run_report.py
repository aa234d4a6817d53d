# SPDX-License-Identifier: Apache-2.0
"""What clc-run says when the program has exited: the summary of its captures and where they
are (and the next command to run), or why there is none; the processes of the run it did not
see, and those that ran without its settings."""

import pathlib
import shlex
import sys

from clc.capture.reader import CaptureError, scan_captures
from clc.capture.reports import summary
from clc.runtime.run_captures import stem
from clc.runtime.status import MAX_BYTES, MAX_PER_SENDER
from clc.runtime.unpreloadable import static_program
from clc.words import count

__all__ = ["read_captures", "report", "unseen", "dropped", "say_unseen", "say_unsettled"]


def read_captures(files):
    """The captures in files, or None (said) when one cannot be read."""
    try:
        return scan_captures(files)
    except CaptureError as e:
        print(f"clc: cannot read the capture: {e}", file=sys.stderr)
        return None


def report(files, captures, shimmed, program, quiet=False):
    if not files:
        if not shimmed:
            print(f"clc: clc's shim never started in {program} (a setuid or setgid program, a "
                  f"static binary, or LD_PRELOAD removed from its environment): its launches "
                  f"were neither seen nor controlled; no capture was written", file=sys.stderr)
        else:
            names = ", ".join(f"{name} ({pid})" for pid, name in sorted(shimmed.items())[:5])
            more = f" and {len(shimmed) - 5} more" if len(shimmed) > 5 else ""
            print(f"clc: the program launched no kernel in the "
                  f"{count(len(shimmed), 'process', 'processes')} clc ran in ({names}{more}); a "
                  f"CUDA program they started without clc's preload (env -i, setuid, static) "
                  f"would not be seen. No capture was written", file=sys.stderr)
        return
    if captures is not None and not quiet:
        print(summary(captures), file=sys.stderr)
    first = files[0]
    if len(files) == 1:
        named, out = shlex.quote(str(first)), first.stem
        print(f"clc: capture written to {first}", file=sys.stderr)
    else:  # the program's and its children's: one stem
        common = stem(str(first).split(".child-")[0])
        named, out = f"{shlex.quote(common)}*.clc", pathlib.Path(common).name
        print(f"clc: captures written to {first} and {len(files) - 1} more, of child "
              f"processes ({common}*.clc)", file=sys.stderr)
    if not quiet:
        print(f"clc: timeline: clc report {named} --format chrome -o {out}.json",
              file=sys.stderr)


def unseen(run):
    """The processes that ran without clc's shim and could have launched kernels."""
    return [u for u in run.unseen if not static_program(u.path)]


def dropped(run):
    return (f"{count(run.dropped, 'status message')} from "
            f"{count(run.dropped_senders, 'process', 'processes')} not kept")


def say_unseen(run):
    if run.dropped:
        print(f"clc: {dropped(run)}: a process sent more than clc-run keeps "
              f"({MAX_PER_SENDER} entries each, {MAX_BYTES >> 20} MiB in all), so what clc-run "
              f"knows of the program's processes is incomplete", file=sys.stderr)
    for u in unseen(run)[:5]:
        if u.how == "driver":
            print(f"clc: process {u.pid} ({u.path}) loaded the CUDA driver without clc's shim "
                  f"(started past clc's exec hooks, the preload removed from its environment): "
                  f"its launches were neither seen nor controlled", file=sys.stderr)
            continue
        verb = "executed" if u.how == "exec" else "was spawned as"
        print(f"clc: process {u.pid} {verb} {u.path} without clc's shim (a setuid or setgid "
              f"program, or one that removed the preload): its launches were neither seen nor "
              f"controlled", file=sys.stderr)


def say_unsettled(run, on_error):
    for pid, name in sorted(run.unsettled.items())[:5]:
        print(f"clc: process {pid} ({name}) ran without clc-run's settings (started past "
              f"clc's exec hooks after the settings' descriptor was closed, its shim found "
              f"none): any launch it made got on_error={on_error}, unrecorded", file=sys.stderr)
