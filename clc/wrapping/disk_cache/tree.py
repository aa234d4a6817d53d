# SPDX-License-Identifier: Apache-2.0
"""The user's own cache tree: its root opened (made 0700 when asked), its entries and
temporary files found and removed, and the size cap kept.

The root's ancestors are not checked: whatever path leads to it, the directory reached is
refused unless it is the user's own.

The cap is kept by evicting the least recently used entries (a hit touches its file's mtime)
after each store; a full scan is cheap next to the build that preceded it. Temporary files
that a killed writer left are removed after an hour.
"""

import os
import time

from clc.wrapping.disk_cache.layout import is_key, is_temp
from clc.wrapping.disk_cache.trust import open_dir, unlink_at

__all__ = ["open_root", "scan", "unlink_in", "evicted"]

_TEMP_MAX_AGE = 3600.0


def open_root(root, owners, create):
    """A descriptor of the root; None when it is missing and not to be made."""
    try:
        return open_dir(root, owners, root)
    except FileNotFoundError:
        if not create:
            return None
    os.makedirs(os.path.dirname(root), exist_ok=True)
    return open_dir(root, owners, root, create=True)


def scan(root, root_fd, owners):
    """([(key, subdirectory, stat)] of the entries, [(subdirectory, name, stat)] of the
    temporary files); Refused for a subdirectory that is not this user's alone."""
    found, temps = [], []
    with os.scandir(root_fd) as it:
        subs = [d.name for d in it if len(d.name) == 2 and d.is_dir(follow_symlinks=False)]
    for sub in subs:
        try:
            sub_fd = open_dir(sub, owners, os.path.join(root, sub), root_fd)
        except FileNotFoundError:
            continue
        try:
            with os.scandir(sub_fd) as it:
                files = list(it)
            for f in files:
                try:
                    if f.name.endswith(".cubin") and f.name.startswith(sub):
                        key = f.name[:-len(".cubin")]
                        if is_key(key):
                            found.append((key, sub, f.stat(follow_symlinks=False)))
                    elif is_temp(f.name):
                        temps.append((sub, f.name, f.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue
        finally:
            os.close(sub_fd)
    return found, temps


def unlink_in(root, root_fd, owners, sub, name):
    """True when this call removed <sub>/<name>."""
    try:
        sub_fd = open_dir(sub, owners, os.path.join(root, sub), root_fd)
    except OSError:
        return False
    try:
        return unlink_at(name, sub_fd)
    finally:
        os.close(sub_fd)


def evicted(root, root_fd, owners, max_bytes, keep):
    """Removes stale temporary files, then the least recently used entries but keep until the
    rest fit in max_bytes; yields the key of each entry this call removed."""
    found, temps = scan(root, root_fd, owners)
    stale = time.time() - _TEMP_MAX_AGE
    for sub, name, st in temps:
        if st.st_mtime < stale:
            unlink_in(root, root_fd, owners, sub, name)
    total = sum(st.st_size for _, _, st in found)
    for key, sub, st in sorted(found, key=lambda e: e[2].st_mtime):
        if total <= max_bytes:
            break
        if key == keep:
            continue
        # Gone already (another process evicted it) counts as freed, not as our eviction.
        if unlink_in(root, root_fd, owners, sub, key + ".cubin"):
            yield key
        total -= st.st_size
