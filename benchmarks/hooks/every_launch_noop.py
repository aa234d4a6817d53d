# SPDX-License-Identifier: Apache-2.0
"""bench_launch's floor for hooks asked at every launch: one that reads nothing, no opinion."""

import clc


@clc.on_launch(every_launch=True)
def no_opinion(launch):
    return None
