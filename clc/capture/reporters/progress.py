# SPDX-License-Identifier: Apache-2.0
"""A progress bar for the exports that list launches (JSON, the Chrome trace)."""

import sys

__all__ = ["PROGRESS_DELAY_S", "Progress"]

PROGRESS_DELAY_S = 1.0  # an export shorter than this shows none
_PROGRESS_STEP = 4096   # launches between updates


class Progress:
    """A progress bar on standard error, by tqdm, for an export of `total` launch records:
    only where standard error is a terminal (and tqdm is installed), shown once the export
    has taken PROGRESS_DELAY_S; otherwise nothing."""

    def __init__(self, total, what, out=None):
        self.bar = None
        self.pending = 0
        out_is_tty = out is not None and hasattr(out, "isatty") and out.isatty()
        if total and sys.stderr.isatty() and not out_is_tty:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, desc=what, unit=" launches", unit_scale=True,
                            delay=PROGRESS_DELAY_S, file=sys.stderr, leave=False)

    def step(self):
        if self.bar is not None:
            self.pending += 1
            if self.pending == _PROGRESS_STEP:
                self.bar.update(self.pending)
                self.pending = 0

    def close(self):
        if self.bar is not None:
            self.bar.update(self.pending)
            self.bar.close()

