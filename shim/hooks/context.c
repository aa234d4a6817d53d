/* SPDX-License-Identifier: Apache-2.0
 *
 * context.c: context and stream teardown (cuCtxDestroy, the primary context's last release and
 * its reset, cuStreamDestroy).
 * Pending GPU times are read back while their events still exist, and the device's green
 * contexts (which hold the primary context) are destroyed; then the context's decisions and
 * green streams are forgotten (a new context may get its address) and the engine told.
 */
#include <string.h>

#include "hooks.h"

/* ---- context teardown: read back pending GPU times while their events still exist --------- */

static void before_teardown(void) {
    if (t_in_clc) return;
    t_in_clc = 1;
    clc_timing_drain_all();
    t_in_clc = 0;
}

/* A context is gone: its decisions stop applying (a new context may get its address), and the
 * engine forgets what it made for it (wrapped kernels' functions and slot rings). */
static void after_teardown(CUcontext ctx) {
    if (t_in_clc || !ctx || !clc_driver_ready()) return;
    t_in_clc = 1;
    clc_green_forget_context(ctx);
    clc_priority_forget_context(ctx);
    clc_cache_forget_context((uint64_t)(uintptr_t)ctx, clc_bridge_module);
    clc_module_event ev = {.api = CLC_LOAD_CONTEXT_DESTROYED, .handle = (uint64_t)(uintptr_t)ctx};
    clc_bridge_module(&ev);
    t_in_clc = 0;
}

/* The device's primary context while it is active, else NULL (a retain and a release of the
 * real driver's, which leave its count as it was). */
static CUcontext active_primary(CUdevice dev, pfn_cuDevicePrimaryCtxRelease_v2 release) {
    unsigned flags = 0;
    int active = 0;
    CUcontext ctx = NULL;
    if (t_in_clc || !release || !clc_driver_ready() || !g_drv.primary_get_state ||
        !g_drv.primary_retain || g_drv.primary_get_state(dev, &flags, &active) != CUDA_SUCCESS ||
        !active)
        return NULL;
    if (g_drv.primary_retain(&ctx, dev) != CUDA_SUCCESS) return NULL;
    release(dev);
    return ctx;
}

static int primary_gone(CUdevice dev) {
    unsigned flags = 0;
    int active = 1;
    return g_drv.primary_get_state &&
           g_drv.primary_get_state(dev, &flags, &active) == CUDA_SUCCESS && !active;
}

/* While a context is torn down no decision is published (clc_cache_unload_begin): the driver may
 * give its address to another thread's new context at once. A context that will surely die
 * (cuCtxDestroy, a reset) has its decisions forgotten before, as an unloaded module's. 1 when
 * the teardown must be ended. */
static int teardown_begin(CUcontext dying) {
    if (t_in_clc || !clc_driver_ready()) return 0;
    t_in_clc = 1;
    clc_cache_unload_begin();
    if (dying) {
        clc_cache_forget_context((uint64_t)(uintptr_t)dying, clc_bridge_module);
        clc_priority_forget_context(dying); /* its run-ahead events, while they are alive */
    }
    t_in_clc = 0;
    return 1;
}

static void teardown_end(int begun) {
    if (begun) clc_cache_unload_end();
}

/* Each teardown entry point in both ABIs (the same parameters). A context clc made for the
 * program (created_context) is a green context's: destroyed as one. */
#define CLC_CTX_DESTROY_HOOK(name)                                                               \
    CLC_EXPORT CUresult name(CUcontext ctx) {                                                    \
        CLC_REAL_OR_FAIL(name)                                                                   \
        before_teardown();                                                                       \
        int begun = teardown_begin(ctx);                                                         \
        CUresult r;                                                                              \
        int made = -1; /* clc made it: destroyed as a green context (inside clc's own work) */   \
        if (!t_in_clc) {                                                                         \
            t_in_clc = 1;                                                                        \
            made = clc_green_destroy_created(ctx, &r);                                           \
            t_in_clc = 0;                                                                        \
        }                                                                                        \
        if (made < 0) r = real(ctx);                                                             \
        if (r == CUDA_SUCCESS) after_teardown(ctx);                                              \
        teardown_end(begun);                                                                     \
        return r;                                                                                \
    }
CLC_CTX_DESTROY_HOOK(cuCtxDestroy)
CLC_CTX_DESTROY_HOOK(cuCtxDestroy_v2)

/* ---- contexts the program makes --------------------------------------------------------------
 * Under a policy that confines (a rule with a green-context sm_share), a context the program
 * makes with cuCtxCreate (every version) is a green context of its own (clc_green_create_context):
 * the driver launches no function of a plain created context on a partition's stream. One with
 * execution-affinity or CIG parameters is made as asked: its confined kernels get their rule's
 * on_unwrappable when the driver refuses them on the partition. */
static int created_context(CUcontext *pctx, unsigned flags, CUdevice dev, int plain,
                           CUresult *result) {
    clc_start();
    int confines = clc_policy_confines(), program_wide = clc_policy_program_wide();
    if (!pctx || (!confines && !program_wide) || t_in_clc || !clc_hook_ready()) return 0;
    if (!plain) {
        CLC_WARN_ONCE(
            "sm_share: a context the program made with execution-affinity or CIG "
            "parameters is made as asked, not as a green context: its confined kernels "
            "get their rule's on_unwrappable where the driver refuses them on a partition");
        return 0;
    }
    uint64_t word = 0;
    t_in_clc = 1;
    if (program_wide && !clc_program_scope(dev, &word)) word = 0;
    CUresult why = word || confines ? clc_green_create_context(dev, word, flags, pctx)
                                    : CUDA_ERROR_NOT_SUPPORTED;
    t_in_clc = 0;
    if (why == CUDA_SUCCESS) {
        *result = CUDA_SUCCESS;
        return 1;
    }
    CLC_WARN_ONCE("sm_share: a context the program made could not be made a green context "
                  "(CUresult %d%s): it is made as asked, and its confined kernels get their rule's "
                  "on_unwrappable where the driver refuses them on a partition",
                  (int)why,
                  why == CUDA_ERROR_NOT_SUPPORTED ? ": no SM partitions on this driver or device"
                                                  : "");
    return 0;
}

CLC_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CLC_REAL_OR_FAIL(cuCtxCreate)
    CUresult r;
    return created_context(pctx, flags, dev, 1, &r) ? r : real(pctx, flags, dev);
}

CLC_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CLC_REAL_OR_FAIL(cuCtxCreate_v2)
    CUresult r;
    return created_context(pctx, flags, dev, 1, &r) ? r : real(pctx, flags, dev);
}

CLC_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *affinity, int n_affinity,
                                   unsigned int flags, CUdevice dev) {
    CLC_REAL_OR_FAIL(cuCtxCreate_v3)
    CUresult r;
    return created_context(pctx, flags, dev, !affinity || n_affinity <= 0, &r)
               ? r
               : real(pctx, affinity, n_affinity, flags, dev);
}

CLC_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, clc_ctx_create_params *params,
                                   unsigned int flags, CUdevice dev) {
    CLC_REAL_OR_FAIL(cuCtxCreate_v4)
    CUresult r;
    int plain = !params || ((!params->execAffinityParams || params->numExecAffinityParams <= 0) &&
                            !params->cigParams);
    return created_context(pctx, flags, dev, plain, &r) ? r : real(pctx, params, flags, dev);
}

/* The device's green contexts torn down before the program's release or reset, inside clc's
 * own work for this thread: a signal handler's launch meanwhile takes the re-entrant gate
 * instead of waiting on the lock held here. */
static int green_release(CUdevice dev, CUcontext *program) {
    *program = NULL;
    if (t_in_clc) return 0;
    t_in_clc = 1;
    int torn = clc_green_release(dev, program);
    t_in_clc = 0;
    return torn;
}

static void green_reset(CUdevice dev, CUcontext *program) {
    *program = NULL;
    if (t_in_clc) return;
    t_in_clc = 1;
    clc_green_reset(dev, program);
    t_in_clc = 0;
}

/* The primary context dies at its last release (then it is no longer active); a reset destroys
 * it whoever holds it (cudaDeviceReset), so its decisions are forgotten before, as
 * cuCtxDestroy's. */
static CUresult primary_teardown(CUdevice dev, CUresult (*real)(CUdevice), int reset) {
    before_teardown();
    CUcontext program = NULL, ctx;
    if (reset) {
        green_reset(dev, &program);
        ctx = active_primary(
            dev, (pfn_cuDevicePrimaryCtxRelease_v2)clc_real(CLC_SYM_cuDevicePrimaryCtxRelease_v2));
    } else {
        int torn = green_release(dev, &program);
        ctx = torn ? active_primary(dev, (pfn_cuDevicePrimaryCtxRelease_v2)real) : NULL;
    }
    int begun = teardown_begin(reset ? ctx : NULL);
    CUresult r = real(dev);
    if (program) after_teardown(program);
    if (r == CUDA_SUCCESS && ctx && (reset || primary_gone(dev))) after_teardown(ctx);
    teardown_end(begun);
    return r;
}

#define CLC_PRIMARY_TEARDOWN_HOOK(name, reset)                                                   \
    CLC_EXPORT CUresult name(CUdevice dev) {                                                     \
        CLC_REAL_OR_FAIL(name)                                                                   \
        return primary_teardown(dev, real, reset);                                               \
    }
CLC_PRIMARY_TEARDOWN_HOOK(cuDevicePrimaryCtxRelease, 0)
CLC_PRIMARY_TEARDOWN_HOOK(cuDevicePrimaryCtxRelease_v2, 0)
CLC_PRIMARY_TEARDOWN_HOOK(cuDevicePrimaryCtxReset, 1)
CLC_PRIMARY_TEARDOWN_HOOK(cuDevicePrimaryCtxReset_v2, 1)

/* scope: program. Where the process is confined program-wide on the device (a policy rule
 * with scope: program, asked once per device), the program gets the partition's context in
 * place of the primary context, which it retained all the same: what it runs there is on the
 * partition. Without a partition the primary context is handed back, and the rule's kernels are
 * confined one launch at a time (or get its on_unwrappable). */
CLC_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CLC_REAL_OR_FAIL(cuDevicePrimaryCtxRetain)
    CUresult r = real(pctx, dev);
    clc_start();
    int program_wide = clc_policy_program_wide();
    clc_debug("cuDevicePrimaryCtxRetain(device %d) -> %d: program-wide %d, inside clc %d", dev,
              (int)r, program_wide, (int)t_in_clc);
    if (r != CUDA_SUCCESS || !pctx || !program_wide || t_in_clc || !clc_hook_ready()) return r;
    uint64_t word;
    t_in_clc = 1;
    int scoped = clc_program_scope(dev, &word);
    clc_debug("scope: program on device %d: %s", dev, scoped ? "confined" : "not confined");
    if (scoped) {
        CUcontext green;
        CUresult why = clc_green_program_retain(dev, word, &green);
        clc_debug("the program's context %p for primary %p (CUresult %d)",
                  why == CUDA_SUCCESS ? green : NULL, *pctx, (int)why);
        if (why == CUDA_SUCCESS)
            *pctx = green;
        else
            CLC_WARN_ONCE(
                "sm_share: the program's context could not be made a green context (scope: "
                "program) (CUresult %d%s): the rule's kernels are confined one launch at a "
                "time instead, where they can be",
                (int)why,
                why == CUDA_ERROR_NOT_SUPPORTED ? ": no SM partitions on this driver or device"
                                                : "");
    }
    t_in_clc = 0;
    return r;
}

/* A program's stream destroyed: the green stream and events clc kept for it go too (a later
 * stream may get its address; its work, which the program's stream waited for, still runs). */
#define CLC_STREAM_DESTROY_HOOK(name)                                                            \
    CLC_EXPORT CUresult name(CUstream stream) {                                                  \
        CLC_REAL_OR_FAIL(name)                                                                   \
        CUresult r = real(stream);                                                               \
        if (r == CUDA_SUCCESS && !t_in_clc) {                                                    \
            clc_green_forget_stream(stream);                                                     \
            clc_priority_forget_stream(stream);                                                  \
        }                                                                                        \
        return r;                                                                                \
    }
CLC_STREAM_DESTROY_HOOK(cuStreamDestroy)
CLC_STREAM_DESTROY_HOOK(cuStreamDestroy_v2)
