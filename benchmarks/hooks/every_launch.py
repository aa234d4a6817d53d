# SPDX-License-Identifier: Apache-2.0
"""bench_launch's every-launch hook: reads the kernel's first argument at each launch."""

import clc

seen = 0


@clc.on_launch(every_launch=True)
def read_one_argument(launch):
    global seen
    seen += launch.params[0].as_int()
    return None
