# SPDX-License-Identifier: Apache-2.0
"""`clc metrics PATH... [-o FILE.prom] [--force] [--max-kernels N] [--max-jobs N]
[--hostname NAME]`"""

import argparse
import os
import secrets
import stat
import sys
from pathlib import Path

from clc.capture.reader import CaptureError, scan_capture
from clc.errors import EXIT_USAGE, ClcError
from clc.outputs import check_output, open_output, remove_output, resolve_parent
from clc.words import count

__all__ = ["MetricsCommand"]


def _at_least_one(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least 1")
    return n


def capture_paths(paths):
    """The .clc files named, and those under the folders named (recursively), each once, in
    a stable order; ClcError for a path that does not exist."""
    seen, out = set(), []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*.clc") if f.is_file() and not f.is_symlink())
        elif p.exists():
            found = [p]
        else:
            raise ClcError(f"{p}: no such file or folder", EXIT_USAGE)
        for f in found:
            real = os.path.realpath(f)
            if real not in seen:
                seen.add(real)
                out.append(f)
    return out


def write_atomically(path, text, force):
    """text at path for node_exporter's textfile collector: written to a hidden file beside
    it (opened as every file clc writes, docs/security.md), then renamed over path, so that a
    scrape reads the old file or the new one, never a part."""
    check_output(path, force)
    name = Path(path).name
    tmp = Path(path).with_name(f".{name}.{secrets.token_hex(8)}.tmp")
    out = open_output(tmp, False, mode=0o644, text=True)
    try:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    except BaseException:
        remove_output(tmp, out)
        out.close()
        raise
    out.close()
    dir_fd, _ = resolve_parent(str(path))
    try:
        os.rename(tmp.name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as e:
        try:
            os.unlink(tmp.name, dir_fd=dir_fd)
        except OSError:
            pass
        raise ClcError(f"cannot replace {path}: {e.strerror or e}") from None
    finally:
        os.close(dir_fd)


def open_capture(path):
    """(descriptor, owner uid) of a capture file to count: opened without following a link
    and without becoming a terminal's, and only when it is a regular file (a capture under a
    folder that users write may be swapped for anything between the listing and the open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_uid


class MetricsCommand:
    name = "metrics"
    help = ("count captures per job, user, tenant, GPU and kernel in Prometheus's text format "
            "(for node_exporter's textfile collector)")

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("paths", nargs="+", metavar="PATH",
                            help="capture files, or folders searched for *.clc (the Slurm "
                                 "plugin's captures=)")
        parser.add_argument("-o", "--output", metavar="FILE.prom",
                            help="write here, replaced whole (a .prom file in node_exporter's "
                                 "--collector.textfile.directory), instead of standard output")
        parser.add_argument("--force", action="store_true",
                            help="replace OUTPUT if it exists (a regular file of yours)")
        parser.add_argument("--max-kernels", type=_at_least_one, default=None, metavar="N",
                            help="distinct kernels per job at most; the rest, those with the "
                                 "fewest launches, are counted together as kernel=\"(other)\" "
                                 "(default 100)")
        parser.add_argument("--max-jobs", type=_at_least_one, default=None, metavar="N",
                            help="distinct (job, user, tenant) at most; the rest, those with "
                                 "the fewest launches, are counted together as \"(other)\" "
                                 "(default 1000)")
        parser.add_argument("--hostname", help="the Hostname label (default: this machine's)")

    def run(self, args):
        try:
            from prometheus_client import generate_latest

            from clc.capture.metrics import (DEFAULT_MAX_JOBS, DEFAULT_MAX_KERNELS,
                                             OTHER_KERNELS, Tally, registry)
        except ImportError as e:
            raise ClcError(f"clc metrics needs the prometheus_client package ({e}): "
                           "pip install prometheus_client") from None
        if args.output:
            check_output(args.output, args.force)
        tally = Tally(args.hostname, args.max_kernels or DEFAULT_MAX_KERNELS,
                      args.max_jobs or DEFAULT_MAX_JOBS)
        unreadable, partial = [], []
        for path in capture_paths(args.paths):
            try:
                fd, owner = open_capture(path)
            except OSError as e:
                unreadable.append(f"{path} ({e.strerror or e})")
                continue
            try:
                capture = scan_capture(f"/proc/self/fd/{fd}")
            except CaptureError as e:  # its path is the descriptor's: name the file instead
                unreadable.append(f"{path} ({e.message})")
                continue
            except OSError as e:
                unreadable.append(f"{path} ({e.strerror or e})")
                continue
            finally:
                os.close(fd)
            # the Slurm plugin's layout, CAPTURES/<job id>/: the directory root made names
            # the job, whatever the file says
            job = path.parent.name if path.parent.name.isdigit() else None
            tally.add(capture, owner, job)
            if capture.partial:
                partial.append(str(path))
        jobs = tally.fold_jobs()
        if jobs:
            print(f"clc metrics: more than {tally.max_jobs} distinct runs (job, user, tenant): "
                  f"{jobs} with the fewest launches are counted together as \"(other)\" "
                  f"(--max-jobs)", file=sys.stderr)
        for (job, user, tenant), n in tally.fold().items():
            print(f"clc metrics: job {job or '-'} of {user} (tenant {tenant or '-'}) launched "
                  f"more than {tally.max_kernels} distinct kernels: {n} with the fewest "
                  f"launches are counted together as kernel=\"{OTHER_KERNELS}\" "
                  f"(--max-kernels)", file=sys.stderr)
        if partial:
            print(f"clc metrics: {count(len(partial), 'capture')} partial, their records dropped "
                  f"at the size cap (clc-run --capture-limit), for full buffers or to write "
                  f"errors: their counts are whole (clc_captures_partial): "
                  + "; ".join(partial[:5]) + (" ..." if len(partial) > 5 else ""),
                  file=sys.stderr)
        if unreadable:
            print(f"clc metrics: {count(len(unreadable), 'file')} left out, not readable as "
                  f"captures: "
                  + "; ".join(unreadable[:5]) + (" ..." if len(unreadable) > 5 else ""),
                  file=sys.stderr)
        text = generate_latest(registry(tally)).decode()
        if args.output:
            write_atomically(args.output, text, args.force)
            print(f"clc metrics: {count(sum(tally.processes.values()), 'capture')} counted into "
                  f"{args.output}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0
