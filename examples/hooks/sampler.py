# SPDX-License-Identifier: Apache-2.0
"""Sampled recording: write one launch in N of each kernel into the capture.

Recording every launch (`record: true`) costs a little time per launch and makes captures of
long runs large; sampling keeps the picture (which kernels, which shapes, how often) at a
fraction of the size. Shows a hook that lets everything run and only chooses what is recorded:
`clc.allow(record=True)` on every N-th launch of each kernel (the N-th, 2N-th, ...),
`clc.allow()` otherwise. Every launch is still counted in the capture's per-kernel totals.

    CLC_SAMPLE_EVERY=100 clc-run --hooks examples/hooks/sampler.py -o sampled.clc -- ./app

N comes from the environment (CLC_SAMPLE_EVERY, default 10).
"""

import collections
import os
import threading

import clc

EVERY = max(1, int(os.environ.get("CLC_SAMPLE_EVERY", "10")))

_lock = threading.Lock()
_seen = collections.Counter()  # kernel name -> launches so far


# every_launch=True: which launch of a kernel this is matters, so the hook sees each one.
@clc.on_launch(kernel="*", every_launch=True)
def sample(launch):
    with _lock:  # launches may come from several threads at once
        _seen[launch.name] += 1
        nth = _seen[launch.name]
    # An answer, not None: the hook decides every launch, so the policy's own record settings
    # do not add to the sample.
    return clc.allow(record=True) if nth % EVERY == 0 else clc.allow()
