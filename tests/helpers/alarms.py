# SPDX-License-Identifier: Apache-2.0
"""A deadline for a test whose failure would be to block or run on (a read of a FIFO, a
policy that takes minutes): SIGALRM ends it with an error that says so."""

import contextlib
import signal


@contextlib.contextmanager
def deadline(seconds, error):
    """Raise `error` (an exception) in the body once `seconds` have passed; 0 arms nothing
    (signal.alarm(n) arms it later). The previous SIGALRM handler is put back."""
    def expired(signum, frame):
        raise error

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
