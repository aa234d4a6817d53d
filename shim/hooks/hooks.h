/* SPDX-License-Identifier: Apache-2.0
 *
 * hooks.h: the hooks layer of stage 1 (shim/hooks/: launch.c graph.c load.c context.c process.c
 * leave.c image.c; the launch gate is gate.h): the process's start and end, loaded images, the
 * program's libraries.
 */
#ifndef CLC_HOOKS_H
#define CLC_HOOKS_H

#include "deciding/deciding.h"

/* ---- the process's start (process.c), then the driver placed ----------------------------- */
/* process.c: the process's start-up (once, from the constructor or the first hook called before
 * it), then the driver placed; 1 when it is. */
void clc_start(void);
int clc_start_driver(void);
static inline int clc_hook_ready(void) { return clc_driver_ready() || clc_start_driver(); }

/* The driver's own work behind a hook that loads or unloads code (its allocations, its locks),
 * as clc's own and with the program's signals held (core.h): a signal handler runs when the
 * driver's call has returned, and a handler's launch never enters the driver while the driver's
 * load holds its locks (the real driver hangs) nor allocates while the load's allocation holds
 * the allocator's lock. */
#define CLC_DRIVER_WORK(call)                                                                     \
    ({                                                                                            \
        sigset_t held_;                                                                           \
        clc_signals_hold(&held_);                                                                 \
        int was_ = t_in_clc;                                                                      \
        t_in_clc = 1;                                                                             \
        CUresult r_ = (call);                                                                     \
        t_in_clc = was_;                                                                          \
        clc_signals_release(&held_);                                                              \
        r_;                                                                                       \
    })

/* ---- loaded images (image.c): their kind and size, into a load event ----------------------- */
void clc_describe_image(const void *image, clc_module_event *ev);

/* ---- the program's libraries (load.c) ------------------------------------------------------ */
/* The library kernel whose function in the current context `f` is (cudart names a graph node's
 * kernel by such a function), or NULL when f is not of a library the program loaded. */
CUkernel clc_library_kernel_of(CUfunction f);

/* ---- process lifetime (process.c) ---------------------------------------------------------- */
void clc_ensure_exit_handler(void);
/* After the shim's destructor (another library's destructor launches): the capture finished
 * again after each launch that is recorded or refused (clc_late is set then). */
extern CLC_HIDDEN _Atomic int clc_late;
void clc_late_launch(void);

/* ---- leaving without exit() (leave.c) ------------------------------------------------------ */
void clc_leave_start(void); /* libc's _exit, _Exit, syscall, sigaction: found at start */
/* The process leaves without exit handlers or by a fatal signal: the capture finished. */
void clc_leave(uint32_t how, int32_t status);
/* Handlers for the signals whose default action ends the process, where the program keeps the
 * default: the capture is finished, then the signal acts as it would have. */
void clc_signals_start(void);

#endif /* CLC_HOOKS_H */
