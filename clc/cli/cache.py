# SPDX-License-Identifier: Apache-2.0
"""`clc cache ls|stats|clear [--dir DIR]`: the disk cache of wrapped kernels (clc.wrapping.cache).

The directory is --dir (which must exist), else $CLC_CACHE_DIR, else ~/.cache/clc. A
directory that is not the user's alone is refused here as it is by the traced programs, and
`ls` marks the entries that they would not use, and why. Only what is on disk is shown: the
hit and miss counters belong to the processes that used the cache.
"""

import argparse
import json
import os
import sys
import time

from clc.errors import ClcError
from clc.wrapping.cache import DiskCache

__all__ = ["CacheCommand", "format_size", "format_age"]


def format_size(n):
    """1536 -> "1.5 KiB"; bytes below 1 KiB as is."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


def format_age(seconds):
    """The largest whole unit: 42s, 5m, 3h, 12d."""
    seconds = max(0, int(seconds))
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length}{unit}"
    return f"{seconds}s"


# of --json (clc/schemas/cache-ls-1.schema.json, cache-stats-1.schema.json)
JSON_VERSION = 1

class CacheCommand:
    name = "cache"
    help = ("list, count or clear the cache of wrapped kernels (linked cubins, and the "
            "wrappers' PTX from NVRTC) in $CLC_CACHE_DIR, by default ~/.cache/clc")

    @staticmethod
    def add_arguments(parser):
        common = argparse.ArgumentParser(add_help=False)
        common.add_argument("--dir", metavar="DIR",
                            help="the cache directory (default: $CLC_CACHE_DIR or ~/.cache/clc)")
        sub = parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
        ls = sub.add_parser("ls", parents=[common],
                            help="one line per entry, most recently used first")
        ls.add_argument("--json", action="store_true", help="print the entries as JSON")
        ls.add_argument("--verify", action="store_true",
                        help="also check each entry's authentication (reads every entry whole)")
        stats = sub.add_parser("stats", parents=[common],
                               help="the number of entries, their bytes and the cap")
        stats.add_argument("--json", action="store_true", help="print the numbers as JSON")
        sub.add_parser("clear", parents=[common], help="remove every entry")

    def run(self, args):
        cache = DiskCache(args.dir, warn=lambda text: print(f"clc: {text}", file=sys.stderr))
        # A mistyped --dir would otherwise list nothing, as an empty cache does.
        if args.dir is not None and not os.path.lexists(cache.root):
            raise ClcError(f"{cache.root}: no such cache directory")
        try:
            return getattr(self, args.cache_command)(cache, args)
        except OSError as e:
            raise ClcError(f"{cache.root}: {e.strerror or e}") from None

    @staticmethod
    def ls(cache, args):
        entries = sorted(cache.entries(verify=args.verify), key=lambda e: (-e.mtime, e.key))
        if args.json:
            out = {"version": JSON_VERSION, "root": str(cache.root), "entries": [
                {"key": e.key, "size": e.size, "mtime": e.mtime, "metadata": e.metadata,
                 "problem": e.problem} for e in entries]}
            sys.stdout.write(json.dumps(out, indent=2) + "\n")
            return 0
        if not entries:
            print(f"no entries in {cache.root}", file=sys.stderr)
            return 0
        now = time.time()
        for e in entries:
            described = [f"{name}={e.metadata[name]}"
                         for name in ("kind", "kernel", "source", "wrapper", "arch")
                         if e.metadata and e.metadata.get(name) is not None]
            if e.problem:
                described.append(f"(not used: {e.problem})")
            line = f"{e.key[:12]}  {format_size(e.size):>10}  {format_age(now - e.mtime):>4} ago"
            print(f"{line}  {' '.join(described)}".rstrip())
        return 0

    @staticmethod
    def stats(cache, args):
        stats = cache.stats()
        numbers = {"version": JSON_VERSION, **{
            name: stats[name] for name in ("root", "entries", "bytes", "max_bytes", "shared")}}
        if args.json:
            sys.stdout.write(json.dumps(numbers, indent=2) + "\n")
            return 0
        used = 100 * stats["bytes"] / stats["max_bytes"] if stats["max_bytes"] else 0.0
        print(f"root:      {stats['root']}")
        print(f"entries:   {stats['entries']}")
        print(f"bytes:     {stats['bytes']} ({format_size(stats['bytes'])}, {used:.1f}% of cap)")
        print(f"max_bytes: {stats['max_bytes']} ({format_size(stats['max_bytes'])})")
        if stats["shared"]:
            print(f"shared:    {stats['shared']} (read-only, $CLC_CACHE_SHARED_DIR)")
        return 0

    @staticmethod
    def clear(cache, args):
        removed = cache.clear()
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {cache.root}")
        return 0
