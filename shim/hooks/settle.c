/* SPDX-License-Identifier: Apache-2.0
 *
 * settle.c: what a process of a priority class does on the GPU besides launching kernels.
 * A latency-critical process: the ways it waits for its work (synchronizations, events it
 * recorded, blocking copies to the host) settle its launches on the board, and its graph
 * replays count as launches. A best-effort process: its graph replays are held as its launches
 * are. Other processes pass straight through, after one test of the process's class.
 */
#include "hooks.h"

static int current_device(void) {
    CUdevice dev = -1;
    if (!g_drv.ctx_get_device || g_drv.ctx_get_device(&dev) != CUDA_SUCCESS) return -1;
    return (int)dev;
}

/* The device of `stream`'s work: a stream the program made may be of another device than the
 * current one (a service on several GPUs); the default streams are the current context's. A
 * driver without cuStreamGetDevice (before CUDA 12.8): the current device. */
static int stream_device(CUstream stream) {
    CUdevice dev = -1;
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
        !g_drv.stream_get_device || g_drv.stream_get_device(stream, &dev) != CUDA_SUCCESS)
        return current_device();
    return (int)dev;
}

/* ---- synchronizations ------------------------------------------------------------------------
 * When one returns, what the process launched before it has finished: priority.c then marks its
 * GPU idle on the board, so that best-effort launches held meanwhile go on at once. A blocking
 * copy to the host is one too: it returns once the stream's earlier work is done. */

/* `when`: whether the call settles at all (a copy of no bytes may return without waiting). */
#define CLC_SYNC_HOOK(name, params, args, blocking, whole, stream_arg, ptsz, when)               \
    CLC_EXPORT CUresult name params {                                                            \
        CLC_REAL_OR_FAIL(name)                                                                   \
        if (likely(g_hot.priority != CLC_PRIORITY_LC) || t_in_clc || !(when)) return real args;  \
        int dev = stream_device(stream_arg), counted;                                            \
        uint64_t launched = clc_priority_sync_begin(dev, blocking, &counted);                    \
        CUresult r = real args;                                                                  \
        clc_priority_sync_end(dev, launched, whole, stream_arg, ptsz, counted, r == CUDA_SUCCESS); \
        return r;                                                                                \
    }
CLC_SYNC_HOOK(cuCtxSynchronize, (void), (), 1, 1, NULL, 0, 1)
CLC_SYNC_HOOK(cuStreamSynchronize, (CUstream stream), (stream), 1, 0, stream, 0, 1)
CLC_SYNC_HOOK(cuStreamSynchronize_ptsz, (CUstream stream), (stream), 1, 0, stream, 1, 1)
CLC_SYNC_HOOK(cuStreamQuery, (CUstream stream), (stream), 0, 0, stream, 0, 1)
CLC_SYNC_HOOK(cuStreamQuery_ptsz, (CUstream stream), (stream), 0, 0, stream, 1, 1)
/* A synchronous copy to the host runs on the default stream (the per-thread one for _ptds). */
CLC_SYNC_HOOK(cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t bytes), (dst, src, bytes), 1, 0,
              NULL, 0, bytes != 0)
CLC_SYNC_HOOK(cuMemcpyDtoH_v2_ptds, (void *dst, CUdeviceptr src, size_t bytes), (dst, src, bytes),
              1, 0, NULL, 1, bytes != 0)

/* cuCtxSynchronize of CUDA 13 names the context: only the current one (or NULL) is settled. */
CLC_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    CLC_REAL_OR_FAIL(cuCtxSynchronize_v2)
    if (likely(g_hot.priority != CLC_PRIORITY_LC) || t_in_clc) return real(ctx);
    int mine = !ctx || ctx == current_ctx();
    int dev = mine ? current_device() : -1, counted;
    uint64_t launched = clc_priority_sync_begin(dev, 1, &counted);
    CUresult r = real(ctx);
    clc_priority_sync_end(dev, launched, 1, NULL, 0, counted, r == CUDA_SUCCESS);
    return r;
}

/* ---- events ----------------------------------------------------------------------------------
 * A latency-critical process that waits on an event it recorded (a CUDA graph replayed, then
 * an event recorded and synchronized: what serving stacks do) settles the work of the event's
 * stream launched before the record (latency_critical.c keeps, per event, its stream and the
 * launches then). A wait on an event not kept still marks the GPU busy while it lasts. */

/* `launched`: the device's launches before the record was made (read before it, so that
 * another thread's launch made meanwhile is not taken for one the event covers). */
static void event_recorded(int dev, CUevent ev, CUstream stream, int ptsz, uint64_t launched,
                           CUresult r) {
    if (r != CUDA_SUCCESS) return;
    int capturing;
    /* recorded into a graph being captured: nothing is recorded now */
    if (clc_stream_capture_status(stream, ptsz, &capturing) != CUDA_SUCCESS ||
        capturing != CU_STREAM_CAPTURE_STATUS_NONE)
        return;
    clc_priority_event_record(dev, ev, stream, ptsz, launched);
}

#define CLC_EVENT_RECORD_HOOK(name, params, args, ptsz)                                          \
    CLC_EXPORT CUresult name params {                                                            \
        CLC_REAL_OR_FAIL(name)                                                                   \
        if (likely(g_hot.priority != CLC_PRIORITY_LC) || t_in_clc) return real args;             \
        int dev = stream_device(stream);                                                         \
        uint64_t launched = clc_priority_launched(dev);                                          \
        CUresult r = real args;                                                                  \
        event_recorded(dev, ev, stream, ptsz, launched, r);                                      \
        return r;                                                                                \
    }
CLC_EVENT_RECORD_HOOK(cuEventRecord, (CUevent ev, CUstream stream), (ev, stream), 0)
CLC_EVENT_RECORD_HOOK(cuEventRecord_ptsz, (CUevent ev, CUstream stream), (ev, stream), 1)
CLC_EVENT_RECORD_HOOK(cuEventRecordWithFlags, (CUevent ev, CUstream stream, unsigned flags),
                      (ev, stream, flags), 0)
CLC_EVENT_RECORD_HOOK(cuEventRecordWithFlags_ptsz, (CUevent ev, CUstream stream, unsigned flags),
                      (ev, stream, flags), 1)

#define CLC_EVENT_WAIT_HOOK(name, blocking)                                                      \
    CLC_EXPORT CUresult name(CUevent ev) {                                                       \
        CLC_REAL_OR_FAIL(name)                                                                   \
        if (likely(g_hot.priority != CLC_PRIORITY_LC) || t_in_clc) return real(ev);             \
        uint64_t launched = 0;                                                                   \
        CUstream key = NULL;                                                                     \
        int dev = clc_priority_event_covers(ev, &key, &launched), counted;                       \
        if (dev < 0) dev = current_device();                                                     \
        clc_priority_sync_begin(dev, blocking, &counted);                                        \
        CUresult r = real(ev);                                                                   \
        clc_priority_event_settle(dev, key, launched, counted, r == CUDA_SUCCESS);               \
        return r;                                                                                \
    }
CLC_EVENT_WAIT_HOOK(cuEventSynchronize, 1)
CLC_EVENT_WAIT_HOOK(cuEventQuery, 0)

#define CLC_EVENT_DESTROY_HOOK(name)                                                             \
    CLC_EXPORT CUresult name(CUevent ev) {                                                       \
        CLC_REAL_OR_FAIL(name)                                                                   \
        if (likely(g_hot.priority != CLC_PRIORITY_LC) || t_in_clc) return real(ev);             \
        clc_priority_event_forget(ev); /* a later event may get its handle */                    \
        return real(ev);                                                                         \
    }
CLC_EVENT_DESTROY_HOOK(cuEventDestroy)
CLC_EVENT_DESTROY_HOOK(cuEventDestroy_v2)

/* ---- graph replays ---------------------------------------------------------------------------
 * A latency-critical process's replay marks its GPU busy as a launch does; a best-effort
 * process's waits as a launch would (a graph cannot be confined to a share of the SMs: under
 * held_share it waits, down to the floor). */

#define CLC_GRAPH_LAUNCH_HOOK(name, ptsz)                                                        \
    CLC_EXPORT CUresult name(CUgraphExec exec, CUstream stream) {                                \
        CLC_REAL_OR_FAIL(name)                                                                   \
        if (likely(!g_hot.priority) || t_in_clc || !clc_hook_ready()) return real(exec, stream); \
        int dev = stream_device(stream);                                                         \
        if (dev >= 0 && g_hot.priority == CLC_PRIORITY_LC)                                       \
            clc_priority_lc_launch(dev, stream, ptsz);                                           \
        else if (dev >= 0)                                                                       \
            clc_priority_be_graph_launch(dev, current_ctx(), stream, ptsz);                      \
        return real(exec, stream);                                                               \
    }
CLC_GRAPH_LAUNCH_HOOK(cuGraphLaunch, 0)
CLC_GRAPH_LAUNCH_HOOK(cuGraphLaunch_ptsz, 1)
