/* SPDX-License-Identifier: Apache-2.0
 *
 * shim.h: stage 1 (the preload library), layer by layer. Each layer has its header, which
 * includes the one below it; each file includes its own layer's (the entry layer this one).
 *
 * Layers, lowest first. A file calls into its own layer or those below it, never above, and no
 * files call each other in a loop; a lower file that needs something of a higher one gets it as
 * a function pointer (clc_log_set_sink, the `tell` and `published` arguments in records.h).
 * tests/unit/test_shim_layers.py reads this list and checks both on the compiled objects, and
 * that each file includes its layer's header.
 *   core:     core.c settings.c real.c files.c
 *   records:  decision_cache.c capture.c cupti.c timing.c
 *   deciding: decide.c decider.c bridge_loader.c replace.c green.c priority.c
 *   hooks:    launch.c graph.c load.c context.c process.c leave.c image.c
 *   entry:    interpose.c dlopen.c
 */
#ifndef CLC_SHIM_H
#define CLC_SHIM_H

#include "hooks.h"

#endif /* CLC_SHIM_H */
