/* SPDX-License-Identifier: Apache-2.0
 *
 * green.c: a confined kernel's launch (CLC_ACTION_CONFINE): the kernel, untouched, runs on a
 * stream of a green context that owns a share of the device's SMs.
 *
 * A partition is made once per (device, share): the device's SM resource split by the
 * driver's partition step (cuDevSmResourceSplitByCount), a descriptor, a green context
 * (cuGreenCtxCreate). The share is rounded to that step, said once with the SM count. Each
 * (program context, program stream, partition) gets one green stream of the program stream's
 * priority and two events of the program's context, made at its first confined launch.
 *
 * Per launch, the program's stream order is kept: an event recorded on the program's stream is
 * waited for by the green stream, the kernel is launched there, and an event recorded after it
 * is waited for by the program's stream. The program's own synchronization (its stream, its
 * events, the device) then sees the confined work finished, and under stream capture the same
 * calls fork the capture into the green stream and join it back, so that the graph's replays
 * run on the partition too. The events are reused: a wait takes the event's state when it is
 * called, and the entry's lock keeps one launch's five calls together.
 *
 * The program's primary context is retained by each green context: before the program
 * releases or resets it, the device's green contexts are destroyed (after their streams are
 * synchronized), so that the program's release still tears it down; they are made again at
 * the next confined launch. A destroyed context's entries are forgotten.
 *
 * Graphs (conditional nodes' bodies, the kernels of confined graph nodes) are green_graph.c's.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "priority.h"
#include "green_internal.h"

/* The driver's green-context calls, by layout (cuda.h, CUDA 13.0). */
#define CU_DEV_RESOURCE_TYPE_SM 1
#define CU_GREEN_CTX_DEFAULT_STREAM 1
#define CU_STREAM_NON_BLOCKING 1
#define CU_EVENT_DISABLE_TIMING 2
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

/* ---- partitions ------------------------------------------------------------------------- */

#define MAX_PARTITIONS 32

typedef struct {
    int device;
    uint64_t share;    /* the outcome's word, less CLC_CONFINE_DENY */
    CUgreenCtx green;  /* NULL: not made (or destroyed) */
    unsigned sms;      /* the SMs it has */
    CUresult failed;   /* why it cannot be made (CUDA_SUCCESS: it can) */
    CUcontext program; /* its context as the program's primary context (scope: program) */
    /* its SMs, for the contexts the program makes (scope: program): one group of a split, or
     * (a share of more than half placed last) several of one split, malloc'd */
    cu_dev_resource *groups;
    unsigned n_groups;
} partition;

/* A device whose process is confined program-wide: its partition (index + 1; 0: none) and the
 * program's retains of the primary context that it got the partition's context for. */
#define MAX_DEVICES 64
static struct {
    int part;
    unsigned refs;
} g_program[MAX_DEVICES];

/* ---- green streams: one per (program context, program stream, partition) ------------------- */

#define STREAM_BITS 10
#define STREAM_SLOTS (1u << STREAM_BITS)

/* A table entry's ctx when the entry was dropped: probes go past it, inserts reuse it. Entries
 * never move, so a launch holding one keeps it; a drop takes the entry's lock first. */
#define DROPPED ((CUcontext)1)

typedef struct {
    CUcontext ctx; /* NULL: never used; DROPPED: free again */
    CUstream stream;
    int part; /* index in partitions */
    CUstream green;
    CUevent in, out;
    pthread_mutex_t lock;
} green_stream;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* the two tables' shape */
static partition g_parts[MAX_PARTITIONS];
static unsigned g_nparts;
/* Zero-filled: each entry's lock starts as PTHREAD_MUTEX_INITIALIZER (all zeros in glibc). */
static green_stream g_streams[STREAM_SLOTS];
static unsigned g_nstreams;
static _Atomic unsigned g_live; /* g_nstreams, read without the lock by stream teardown */

/* Whether the driver has green contexts (the calls in g_drv.green, and the events): 1 yes, -1
 * no, 0 not looked at yet. */
static int g_green;

static int load_driver(void) {
    if (g_green) return g_green > 0;
    if (!clc_driver_ready()) clc_driver_load();
    const typeof(g_drv.green) *d = &g_drv.green;
    g_green = (d->get_resource && d->split && d->generate_desc && d->create && d->destroy &&
               d->stream_create && d->stream_sync && d->stream_destroy && d->stream_priority &&
               d->wait_event && g_drv.event_create && g_drv.event_record && g_drv.event_destroy &&
               g_drv.ctx_get_device)
                  ? 1
                  : -1;
    return g_green > 0;
}

/* The SMs a share asks for on a device of `total` SMs, rounded to the partition step (at least
 * one step, at most the device). */
static unsigned share_sms(uint64_t share, unsigned total, unsigned step) {
    unsigned kind = (unsigned)(share >> CLC_CONFINE_KIND_SHIFT) & 0xff;
    uint64_t value = share & 0xffffffffu;
    double want = kind == CLC_CAP_SHARE ? (double)value / 1e6 * total : (double)value;
    unsigned sms = (unsigned)((want + step / 2.0) / step) * step;
    if (sms < step) sms = step;
    if (sms > total / step * step) sms = total / step * step;
    return sms;
}

/* The contexts graph nodes were put in, for clc_green_is_node_context (a few: one per
 * partition made, kept past the partition's destruction: an address is never reused for them
 * while a graph may still name it). */
#define MAX_NODE_CONTEXTS 64
static CUcontext g_node_ctx[MAX_NODE_CONTEXTS];
static _Atomic unsigned g_n_node_ctx;

int clc_green_any_node_context(void) {
    return atomic_load_explicit(&g_n_node_ctx, memory_order_acquire) != 0;
}

int clc_green_is_node_context(CUcontext ctx) {
    unsigned n = atomic_load_explicit(&g_n_node_ctx, memory_order_acquire);
    for (unsigned i = 0; ctx && i < n; i++)
        if (g_node_ctx[i] == ctx) return 1;
    return 0;
}

static void note_node_context(CUcontext ctx) { /* under g_lock */
    unsigned n = atomic_load_explicit(&g_n_node_ctx, memory_order_relaxed);
    for (unsigned i = 0; i < n; i++)
        if (g_node_ctx[i] == ctx) return;
    if (n < MAX_NODE_CONTEXTS) {
        g_node_ctx[n] = ctx;
        atomic_store_explicit(&g_n_node_ctx, n + 1, memory_order_release);
    }
}

/* Makes partition p (under g_lock, with the capture mode relaxed: a global stream capture in
 * the program must not see these calls). */
static CUresult make_partition(partition *p) {
    cu_dev_resource all, rest;
    CUdevResourceDesc desc;
    CUresult r = g_drv.green.get_resource(p->device, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (r != CUDA_SUCCESS) return r;
    unsigned step = all.sm.min_partition ? all.sm.min_partition : 1;
    unsigned sms = share_sms(p->share, all.sm.sm_count, step);
    int last = (p->share & CLC_CONFINE_LAST) != 0;
    /* Every group of this size, then the first or the last taken: the driver lays groups out by
     * how many it is asked for, so two processes (tenants at either end) must ask for the same
     * split to get groups that do not overlap. More than half of the SMs at the end (a
     * best-effort reserve's) is one group too few: the device is split in groups of the
     * smallest size instead, and the last of them are taken together (one split's groups may
     * make one descriptor), leaving at least the share's complement free at the start; the
     * split's remainder is never used, as cuda.h advises. */
    int several = last && 2 * sms > all.sm.sm_count;
    unsigned size = several ? step : sms, groups = all.sm.sm_count / size, from = 0, take = 1;
    cu_dev_resource *each = calloc(groups ? groups : 1, sizeof *each);
    if (!each) return CUDA_ERROR_OUT_OF_MEMORY;
    r = g_drv.green.split(each, &groups, &all, &rest, 0, size);
    if (r == CUDA_SUCCESS && groups == 0) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && several) {
        unsigned free_sms = all.sm.sm_count - sms;
        if (((p->share >> CLC_CONFINE_KIND_SHIFT) & 0xff) == CLC_CAP_SHARE)
            free_sms = all.sm.sm_count -
                       (unsigned)((double)(p->share & 0xffffffffu) / 1e6 * all.sm.sm_count);
        unsigned skip = (free_sms + step - 1) / step;
        if (groups <= skip)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            from = skip, take = groups - skip;
    } else if (r == CUDA_SUCCESS) {
        from = last ? groups - 1 : 0;
    }
    if (r == CUDA_SUCCESS) r = g_drv.green.generate_desc(&desc, each + from, take);
    if (r == CUDA_SUCCESS)
        r = g_drv.green.create(&p->green, desc, p->device, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r != CUDA_SUCCESS) {
        p->green = NULL;
        free(each);
        return r;
    }
    memmove(each, each + from, take * sizeof *each);
    free(p->groups); /* a partition made again: its earlier groups */
    p->groups = each;
    p->n_groups = take;
    p->sms = 0;
    for (unsigned i = 0; i < take; i++) p->sms += each[i].sm.sm_count;
    CUcontext as_ctx;
    if (g_drv.green.ctx_from_green && g_drv.green.ctx_from_green(&as_ctx, p->green) == CUDA_SUCCESS)
        note_node_context(as_ctx); /* what a launch captured on its streams names */
    char what[64];
    if (((p->share >> CLC_CONFINE_KIND_SHIFT) & 0xff) == CLC_CAP_SHARE)
        snprintf(what, sizeof what, "a share of %.3g", (double)(p->share & 0xffffffffu) / 1e6);
    else
        snprintf(what, sizeof what, "%u SMs", (unsigned)(p->share & 0xffffffffu));
    /* Said once per partition: into the capture (the summary's messages), and to stderr with -v. */
    char text[256];
    int n = snprintf(text, sizeof text,
                     "sm_share: %s of device %d is %u of its %u SMs (a green context; the device "
                     "partitions SMs in steps of %u), its %s ones",
                     what, p->device, p->sms, all.sm.sm_count, step, last ? "last" : "first");
    if (n > 0) {
        clc_debug("%s", text);
        clc_capture_message(CLC_MSG_INFO, text,
                            (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
    }
    return CUDA_SUCCESS;
}

static int find_partition(int device, uint64_t share) {
    for (unsigned i = 0; i < g_nparts; i++)
        if (g_parts[i].device == device && g_parts[i].share == share) return (int)i;
    if (g_nparts == MAX_PARTITIONS) return -1;
    g_parts[g_nparts] = (partition){.device = device, .share = share};
    return (int)g_nparts++;
}

/* Partition `share` of `device` (under g_lock): found, and made if need be with the capture
 * mode relaxed (a global stream capture in the program must not see these calls); a failure
 * is kept, so that it is not tried at every launch. */
static CUresult partition_ready(int device, uint64_t share, int *part) {
    int i = find_partition(device, share);
    if (i < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *part = i;
    partition *p = &g_parts[i];
    if (p->failed != CUDA_SUCCESS || p->green) return p->failed;
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (g_drv.exchange_capture_mode) g_drv.exchange_capture_mode(&mode);
    CUresult r = make_partition(p);
    if (g_drv.exchange_capture_mode) g_drv.exchange_capture_mode(&mode);
    if (r != CUDA_SUCCESS) p->failed = r;
    return r;
}

/* The partition whose program context (scope: program) ctx is, or -1 (under g_lock; a
 * destroyed partition has none). */
static int created_part(CUcontext ctx);
static int program_part(CUcontext ctx) {
    for (unsigned i = 0; ctx && i < g_nparts; i++)
        if (g_parts[i].program == ctx) return (int)i;
    return created_part(ctx);
}

static uint32_t stream_slot(CUcontext ctx, CUstream s, int part) {
    uint64_t h = ((uint64_t)(uintptr_t)ctx * 0xff51afd7ed558ccdull) ^ (uint64_t)(uintptr_t)s ^
                 ((uint64_t)part << 56);
    return (uint32_t)((h * 0x9e3779b97f4a7c15ull) >> (64 - STREAM_BITS));
}

/* The green stream for a launch on `stream` in `ctx` (under g_lock): found or made. */
static CUresult stream_for(CUcontext ctx, CUstream stream, int ptsz, int part, green_stream **out) {
    uint32_t i = stream_slot(ctx, stream, part), free_at = STREAM_SLOTS;
    for (uint32_t n = 0; n < STREAM_SLOTS; n++, i = (i + 1) & (STREAM_SLOTS - 1)) {
        green_stream *s = &g_streams[i];
        if (s->ctx == DROPPED) {
            if (free_at == STREAM_SLOTS) free_at = i;
            continue;
        }
        if (!s->ctx) {
            if (free_at == STREAM_SLOTS) free_at = i;
            break;
        }
        if (s->ctx == ctx && s->stream == stream && s->part == part) {
            *out = s;
            return CUDA_SUCCESS;
        }
    }
    if (free_at == STREAM_SLOTS || g_nstreams >= STREAM_SLOTS * 3 / 4) {
        CLC_WARN_ONCE("sm_share: more than %u program streams with confined kernels: launches on "
                      "later ones cannot be confined",
                      STREAM_SLOTS * 3 / 4);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    partition *p = &g_parts[part];
    CUresult r;
    int priority = 0;
    if (!CLC_DEFAULT_STREAM(stream))
        (ptsz ? g_drv.green.stream_priority_ptsz : g_drv.green.stream_priority)(stream, &priority);
    green_stream *s = &g_streams[free_at];
    if ((r = g_drv.green.stream_create(&s->green, p->green, CU_STREAM_NON_BLOCKING, priority)) !=
        CUDA_SUCCESS)
        return r;
    if ((r = g_drv.event_create(&s->in, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        g_drv.green.stream_destroy(s->green);
        return r;
    }
    if ((r = g_drv.event_create(&s->out, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        g_drv.event_destroy(s->in);
        g_drv.green.stream_destroy(s->green);
        return r;
    }
    s->stream = stream;
    s->part = part;
    s->ctx = ctx; /* last: the slot is taken */
    atomic_store(&g_live, ++g_nstreams);
    *out = s;
    return CUDA_SUCCESS;
}

CUresult clc_green_begin(clc_green_launch *gl, uint64_t word, CUstream stream, int ptsz) {
    gl->entry = NULL;
    if (!load_driver()) return CUDA_ERROR_NOT_SUPPORTED;
    CUcontext ctx = NULL;
    CUdevice device = 0;
    if (!g_hot.ctx_get_current || g_hot.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx ||
        g_drv.ctx_get_device(&device) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    /* NULL is the legacy default stream, or with the _ptsz entry points the thread's own. */
    if (stream == NULL) stream = ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    uint64_t share = word & ~(uint64_t)CLC_CONFINE_DENY;
    pthread_mutex_lock(&g_lock);
    int program = program_part(ctx);
    if (program >= 0) {
        /* The program's own context is a partition's (scope: program): it holds the kernel
         * already, which is launched as it is (no other share applies inside it). */
        gl->stream = stream;
        gl->sms = g_parts[program].sms;
        pthread_mutex_unlock(&g_lock);
        return CUDA_SUCCESS;
    }
    int part = -1;
    green_stream *s = NULL;
    CUresult r = partition_ready(device, share, &part);
    if (r == CUDA_SUCCESS) {
        int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        if (g_drv.exchange_capture_mode) g_drv.exchange_capture_mode(&mode);
        r = stream_for(ctx, stream, ptsz, part, &s);
        if (g_drv.exchange_capture_mode) g_drv.exchange_capture_mode(&mode);
    }
    pthread_mutex_unlock(&g_lock);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&s->lock);
    if (s->ctx != ctx || s->stream != stream || s->part != part) {
        /* Dropped in between (its stream or context torn down): ask again. */
        pthread_mutex_unlock(&s->lock);
        return clc_green_begin(gl, word, stream, ptsz);
    }
    CUresult (*record)(CUevent, CUstream) = ptsz ? g_drv.event_record_ptsz : g_drv.event_record;
    CUresult (*wait)(CUstream, CUevent, unsigned) =
        ptsz ? g_drv.green.wait_event_ptsz : g_drv.green.wait_event;
    if ((r = record(s->in, stream)) != CUDA_SUCCESS ||
        (r = g_drv.green.wait_event(s->green, s->in, 0)) != CUDA_SUCCESS) {
        pthread_mutex_unlock(&s->lock);
        return r;
    }
    gl->entry = s;
    gl->stream = s->green;
    gl->sms = g_parts[s->part].sms;
    gl->program_stream = stream;
    gl->record = record;
    gl->wait = wait;
    return CUDA_SUCCESS;
}

CUresult clc_green_context(uint64_t word, CUcontext *out, unsigned *sms) {
    if (!load_driver() || !g_drv.green.ctx_from_green) return CUDA_ERROR_NOT_SUPPORTED;
    CUdevice device = 0;
    if (g_drv.ctx_get_device(&device) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_lock);
    int part = -1;
    CUresult r = partition_ready(device, word & ~(uint64_t)CLC_CONFINE_DENY, &part);
    if (r == CUDA_SUCCESS) {
        r = g_drv.green.ctx_from_green(out, g_parts[part].green);
        *sms = g_parts[part].sms;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult clc_green_end(clc_green_launch *gl, CUresult launched) {
    green_stream *s = gl->entry;
    CUresult r = CUDA_SUCCESS;
    if (!s) return CUDA_SUCCESS;
    /* Even when the launch failed: the green stream waited for the program's, and the program's
     * must not be left behind it. */
    if ((r = g_drv.event_record(s->out, s->green)) == CUDA_SUCCESS)
        r = gl->wait(gl->program_stream, s->out, 0);
    pthread_mutex_unlock(&s->lock);
    (void)launched;
    return r;
}

int clc_green_unconfined(uint64_t word, CUresult why, int reason) {
    static const char *const what[6] = {
        "a kernel could not be confined by a green context",
        "a confined kernel's graph node (made with the graph API) could not be put in its green "
        "context",
        "a confined kernel launched with cuLaunchCooperativeKernelMultiDevice is not confined",
        "the driver refused a confined kernel's launch on its green context",
        "a confined kernel's graph node or captured launch in a conditional node's body is not "
        "confined (the driver requires every kernel of a body to be in the conditional node's "
        "context)",
        "a confined kernel's cooperative grid is larger than its partition can hold",
    };
    int deny = (word & CLC_CONFINE_DENY) != 0, first = 0;
    switch (reason) { /* said once per reason: one CLC_FIRST_TIME each */
    case CLC_UNCONFINED_NO_PARTITION: first = CLC_FIRST_TIME(); break;
    case CLC_UNCONFINED_GRAPH_NODE: first = CLC_FIRST_TIME(); break;
    case CLC_UNCONFINED_MULTI_DEVICE: first = CLC_FIRST_TIME(); break;
    case CLC_UNCONFINED_REFUSED: first = CLC_FIRST_TIME(); break;
    case CLC_UNCONFINED_CONDITIONAL: first = CLC_FIRST_TIME(); break;
    case CLC_UNCONFINED_COOPERATIVE: first = CLC_FIRST_TIME(); break;
    }
    if (first)
        clc_log(CLC_MSG_WARNING,
                "sm_share: %s (CUresult %d%s): its launches are %s, as its rule's "
                "on_unwrappable says",
                what[reason], (int)why,
                reason == CLC_UNCONFINED_NO_PARTITION && why == CUDA_ERROR_NOT_SUPPORTED
                    ? ": no SM partitions on this driver or device"
                    : "",
                deny ? "denied" : "run on the whole GPU");
    return deny;
}

/* ---- cooperative grids ------------------------------------------------------------------------
 */

void clc_green_cooperative_too_large(unsigned blocks, unsigned sms, unsigned per_sm) {
    if (!CLC_FIRST_TIME()) return;
    char text[320];
    int n = snprintf(text, sizeof text,
                     "sm_share: a cooperative grid of %u blocks cannot be resident on a partition "
                     "of %u SMs (%u blocks per SM at most for its block shape: %u in all)",
                     blocks, sms, per_sm, sms * per_sm);
    if (n > 0) clc_log(CLC_MSG_WARNING, "%s", text);
}

/* ---- contexts the program makes (cuCtxCreate) -------------------------------------------------
 * The driver launches no function of a context the program made on a green context's stream
 * (CUresult 400), but it does launch a green context's function on another green context's
 * stream (measured on driver 580). So under a policy that confines, a context the program makes
 * is a green context of its own, converted (cuCtxFromGreenCtx) and pushed as cuCtxCreate's
 * would be: over the partition's SMs where the process is confined program-wide (everything in
 * it then runs there, as in a program context), over all the device's SMs otherwise (its
 * confined kernels then go to their partitions one launch at a time). Its destruction destroys
 * the green context. */

static void drop_stream(green_stream *s, int sync, int events);
static int live(const green_stream *s);

#define MAX_CREATED 256
static struct {
    CUcontext ctx; /* NULL: free */
    CUgreenCtx green;
    int part; /* its partition (scope: program), -1 for all SMs */
} g_created[MAX_CREATED];

/* Under g_lock. */
static int created_part(CUcontext ctx) {
    for (unsigned i = 0; ctx && i < MAX_CREATED; i++)
        if (g_created[i].ctx == ctx) return g_created[i].part;
    return -1;
}

/* cuCtxCreate's flags that cuCtxSetFlags takes: the scheduling policy, host mapping (always on),
 * local memory resize and the sync-memops bit. */
#define CTX_SETTABLE_FLAGS 0x1fu

CUresult clc_green_create_context(CUdevice dev, uint64_t word, unsigned flags, CUcontext *out) {
    if (!load_driver() || !g_drv.green.ctx_from_green || !g_drv.ctx_push)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    unsigned slot = MAX_CREATED;
    for (unsigned i = 0; i < MAX_CREATED && slot == MAX_CREATED; i++)
        if (!g_created[i].ctx) slot = i;
    CUresult r = slot == MAX_CREATED ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    int part = -1;
    cu_dev_resource all;
    cu_dev_resource *group = &all;
    unsigned n_groups = 1;
    if (r == CUDA_SUCCESS && word) {
        r = partition_ready(dev, word & ~(uint64_t)CLC_CONFINE_DENY, &part);
        if (r == CUDA_SUCCESS) group = g_parts[part].groups, n_groups = g_parts[part].n_groups;
    } else if (r == CUDA_SUCCESS) {
        r = g_drv.green.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    }
    CUdevResourceDesc desc;
    CUgreenCtx green = NULL;
    CUcontext ctx = NULL;
    if (r == CUDA_SUCCESS) r = g_drv.green.generate_desc(&desc, group, n_groups);
    if (r == CUDA_SUCCESS) r = g_drv.green.create(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r == CUDA_SUCCESS) r = g_drv.green.ctx_from_green(&ctx, green);
    if (r == CUDA_SUCCESS) r = g_drv.ctx_push(ctx);
    if (r == CUDA_SUCCESS) {
        g_created[slot].ctx = ctx;
        g_created[slot].green = green;
        g_created[slot].part = part;
        /* What the driver cannot apply (a flag of a later driver) is left as it is. */
        if (g_drv.green.ctx_set_flags && (flags & CTX_SETTABLE_FLAGS))
            g_drv.green.ctx_set_flags(flags & CTX_SETTABLE_FLAGS);
        *out = ctx;
    } else if (green) {
        g_drv.green.destroy(green);
    }
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS)
        clc_debug("cuCtxCreate: context %p is green context %p (%s)", ctx, green,
                  part >= 0 ? "the partition's SMs" : "all SMs");
    return r;
}

int clc_green_destroy_created(CUcontext ctx, CUresult *result) {
    if (g_green <= 0 || !ctx) return -1;
    pthread_mutex_lock(&g_lock);
    unsigned slot = MAX_CREATED;
    for (unsigned i = 0; i < MAX_CREATED && slot == MAX_CREATED; i++)
        if (g_created[i].ctx == ctx) slot = i;
    if (slot == MAX_CREATED) {
        pthread_mutex_unlock(&g_lock);
        return -1;
    }
    /* Its green streams first (their events are its own), then off the thread's stack as
     * cuCtxDestroy takes a current context off, then the green context. */
    for (unsigned i = 0; i < STREAM_SLOTS; i++)
        if (live(&g_streams[i]) && g_streams[i].ctx == ctx) drop_stream(&g_streams[i], 1, 1);
    CUcontext current = NULL;
    if (g_hot.ctx_get_current && g_hot.ctx_get_current(&current) == CUDA_SUCCESS &&
        current == ctx && g_drv.ctx_pop)
        g_drv.ctx_pop(&current);
    *result = g_drv.green.destroy(g_created[slot].green);
    g_created[slot].ctx = NULL;
    g_created[slot].green = NULL;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

/* ---- program-wide confinement (scope: program) ------------------------------------------------
 * A device on which the process is confined program-wide hands the program its partition's
 * green context, converted by cuCtxFromGreenCtx, wherever the program retains the device's
 * primary context: every stream, launch and graph of the program in that context then runs on
 * the partition, with nothing added per launch. The program's retains are counted: its last
 * release destroys the green context (which holds the primary context) before the driver's
 * release tears the primary context down. */

CUresult clc_green_program_retain(CUdevice device, uint64_t word, CUcontext *out) {
    if (device < 0 || device >= MAX_DEVICES) return CUDA_ERROR_NOT_SUPPORTED;
    if (!load_driver() || !g_drv.green.ctx_from_green) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    int part = -1;
    CUresult r = partition_ready(device, word & ~(uint64_t)CLC_CONFINE_DENY, &part);
    if (r == CUDA_SUCCESS && !g_parts[part].program)
        r = g_drv.green.ctx_from_green(&g_parts[part].program, g_parts[part].green);
    if (r == CUDA_SUCCESS) {
        *out = g_parts[part].program;
        g_program[device].part = part + 1;
        g_program[device].refs++;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

unsigned clc_green_program_sms(CUcontext ctx, uint64_t *word) {
    unsigned sms = 0;
    if (g_green <= 0 || !ctx) return 0;
    pthread_mutex_lock(&g_lock);
    int part = program_part(ctx);
    if (part >= 0) {
        sms = g_parts[part].sms;
        *word = g_parts[part].share;
    }
    pthread_mutex_unlock(&g_lock);
    return sms;
}

static void forget_device(CUdevice device);

int clc_green_release(CUdevice device, CUcontext *program) {
    *program = NULL;
    if (g_green <= 0) return 1;
    pthread_mutex_lock(&g_lock);
    if (device >= 0 && device < MAX_DEVICES) {
        if (g_program[device].refs > 1) {
            g_program[device].refs--;
            if (g_program[device].part) {
                /* Not the program's last release: its context lives on. */
                pthread_mutex_unlock(&g_lock);
                return 0;
            }
        } else {
            g_program[device].refs = 0;
        }
        if (g_program[device].part) *program = g_parts[g_program[device].part - 1].program;
    }
    forget_device(device);
    pthread_mutex_unlock(&g_lock);
    return 1;
}

void clc_green_reset(CUdevice device, CUcontext *program) {
    *program = NULL;
    if (g_green <= 0) return;
    pthread_mutex_lock(&g_lock);
    if (device >= 0 && device < MAX_DEVICES && g_program[device].part)
        *program = g_parts[g_program[device].part - 1].program;
    /* The program's retains outlive a reset (the driver keeps its count): the next retain
     * makes the green context again and counts on from there. */
    forget_device(device);
    pthread_mutex_unlock(&g_lock);
}

/* ---- teardown ------------------------------------------------------------------------------ */

/* Drops entry s (under g_lock): waits for a launch holding it, destroys its green stream, and
 * its events unless their context is gone (`events`). */
static void drop_stream(green_stream *s, int sync, int events) {
    pthread_mutex_lock(&s->lock);
    if (sync) g_drv.green.stream_sync(s->green);
    if (events) {
        g_drv.event_destroy(s->in);
        g_drv.event_destroy(s->out);
    }
    g_drv.green.stream_destroy(s->green);
    s->ctx = DROPPED;
    pthread_mutex_unlock(&s->lock);
    atomic_store(&g_live, --g_nstreams);
}

static int live(const green_stream *s) { return s->ctx && s->ctx != DROPPED; }

void clc_green_forget_context(CUcontext ctx) {
    if (g_green <= 0 || !ctx) return;
    pthread_mutex_lock(&g_lock);
    /* The context's events died with it; its green streams are the green contexts'. */
    for (unsigned i = 0; i < STREAM_SLOTS; i++)
        if (live(&g_streams[i]) && g_streams[i].ctx == ctx) drop_stream(&g_streams[i], 1, 0);
    pthread_mutex_unlock(&g_lock);
}

void clc_green_forget_stream(CUstream stream) {
    if (g_green <= 0 || !atomic_load_explicit(&g_live, memory_order_relaxed) ||
        CLC_DEFAULT_STREAM(stream))
        return;
    pthread_mutex_lock(&g_lock);
    for (unsigned i = 0; i < STREAM_SLOTS; i++)
        if (live(&g_streams[i]) && g_streams[i].stream == stream) drop_stream(&g_streams[i], 0, 1);
    pthread_mutex_unlock(&g_lock);
}

/* Destroys the device's green streams and green contexts (under g_lock); they are made again
 * when next needed. */
static void forget_device(CUdevice device) {
    for (unsigned i = 0; i < STREAM_SLOTS; i++)
        if (live(&g_streams[i]) && g_parts[g_streams[i].part].device == device)
            drop_stream(&g_streams[i], 1, 1);
    for (unsigned i = 0; i < g_nparts; i++)
        if (g_parts[i].device == device && g_parts[i].green) {
            g_drv.green.destroy(g_parts[i].green);
            g_parts[i].green = NULL;
            g_parts[i].program = NULL;
            free(g_parts[i].groups);
            g_parts[i].groups = NULL;
        }
    if (device >= 0 && device < MAX_DEVICES) g_program[device].part = 0;
}

void clc_green_after_fork_child(void) {
    /* The parent's contexts are not the child's: start afresh (nothing to destroy). */
    memset(g_streams, 0, sizeof g_streams);
    for (unsigned i = 0; i < STREAM_SLOTS; i++) pthread_mutex_init(&g_streams[i].lock, NULL);
    g_nstreams = 0;
    atomic_store(&g_live, 0);
    for (unsigned i = 0; i < g_nparts; i++) g_parts[i].green = NULL, g_parts[i].program = NULL;
    memset(g_program, 0, sizeof g_program);
    memset(g_created, 0, sizeof g_created);
    pthread_mutex_init(&g_lock, NULL);
    pthread_mutex_init(&g_body_lock, NULL);
    pthread_mutex_init(&g_node_kernel_lock, NULL);
}
