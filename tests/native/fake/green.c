/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): green contexts. */

/* ---- green contexts ---------------------------------------------------------------------------
 * A device of FAKE_SMS SMs, split in groups of FAKE_SM_STEP (2 with
 * CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING), the groups taken in order from the
 * resource's first SM. A green context owns SMs [first, first + sms); a stream made in it runs
 * its launches there, and each launch records on which SMs it ran (fake_cuda_last_green).
 *
 * Stream order: every launch, memset and event record queues one work item on its stream
 * (the default stream handles are one stream here). A launch on a green stream is ordered after
 * the program's stream when the green stream's latest cuStreamWaitEvent waited for an event
 * recorded on that stream after its last work item; the program's stream must then wait for an
 * event recorded on the green stream after the launch before it queues anything else. Every
 * break of either rule is counted (fake_cuda_order_violations). With FAKE_CUDA_NO_GREEN set the
 * device has no SM resource to split (CUDA_ERROR_NOT_SUPPORTED); with FAKE_CUDA_GREEN_REFUSE
 * every launch on a green stream is refused (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE). */

#define FAKE_SM_STEP 8
#define FAKE_SM_STEP_IGNORE 2


struct CUdevResourceDesc_st {
    uint32_t tag;
    unsigned first, sms;
};

static struct CUstream_st g_default_stream = {.tag = TAG_STREAM};
static atomic_ulong g_order_violations;
static atomic_ulong g_green_created, g_green_destroyed, g_green_streams;

/* Where a resource's first SM is kept: in its padding, which the real driver keeps for itself. */
static unsigned res_first(const CUdevResource *r)
{
    unsigned first;
    memcpy(&first, r->_internal_padding, sizeof first);
    return first;
}

static void res_set(CUdevResource *r, unsigned first, unsigned sms, unsigned step)
{
    memset(r, 0, sizeof *r);
    r->type = CU_DEV_RESOURCE_TYPE_SM;
    memcpy(r->_internal_padding, &first, sizeof first);
    r->sm.smCount = sms;
    r->sm.minSmPartitionSize = step;
    r->sm.smCoscheduledAlignment = step;
}

CUresult CUDAAPI cuDeviceGetDevResource(CUdevice device, CUdevResource *resource,
                                        CUdevResourceType type)
{
    TRY(need_init());
    if (device != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!resource || type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_VALUE;
    if (getenv("FAKE_CUDA_NO_GREEN")) /* a device (or MIG slice) without SM partitions */
        return CUDA_ERROR_NOT_SUPPORTED;
    res_set(resource, 0, FAKE_SMS, FAKE_SM_STEP);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nbGroups,
                                             const CUdevResource *input,
                                             CUdevResource *remaining, unsigned int useFlags,
                                             unsigned int minCount)
{
    unsigned step, count, most, groups, i, first;
    TRY(need_init());
    if (!nbGroups || !input || input->type != CU_DEV_RESOURCE_TYPE_SM ||
        (useFlags & ~CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING))
        return CUDA_ERROR_INVALID_VALUE;
    step = (useFlags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) ? FAKE_SM_STEP_IGNORE
                                                                        : FAKE_SM_STEP;
    count = minCount < step ? step : (minCount + step - 1) / step * step;
    most = input->sm.smCount / count;
    if (most == 0)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    groups = result ? (*nbGroups < most ? *nbGroups : most) : most;
    first = res_first(input);
    for (i = 0; result && i < groups; i++)
        res_set(&result[i], first + i * count, count, step);
    if (remaining)
        res_set(remaining, first + groups * count, input->sm.smCount - groups * count, step);
    *nbGroups = groups;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources,
                                           unsigned int nbResources)
{
    struct CUdevResourceDesc_st *d;
    TRY(need_init());
    if (!phDesc || !resources || nbResources != 1 || resources[0].type != CU_DEV_RESOURCE_TYPE_SM ||
        resources[0].sm.smCount == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(d = calloc(1, sizeof *d)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    d->tag = TAG_DESC;
    d->first = res_first(&resources[0]);
    d->sms = resources[0].sm.smCount;
    *phDesc = d;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                                  unsigned int flags)
{
    struct CUgreenCtx_st *g;
    TRY(need_init());
    if (!phCtx || tag_of(desc) != TAG_DESC || !(flags & CU_GREEN_CTX_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!(g = calloc(1, sizeof *g)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->tag = TAG_GREEN;
    g->dev = dev;
    g->first = desc->first;
    g->sms = desc->sms;
    g->ctx.tag = TAG_CTX;
    g->ctx.dev = dev;
    g->ctx.green = g;
    atomic_fetch_add(&g_green_created, 1);
    *phCtx = g;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx hCtx)
{
    TRY(need_init());
    if (tag_of(hCtx) != TAG_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    hCtx->tag = TAG_DEAD;
    hCtx->ctx.tag = TAG_DEAD;
    atomic_fetch_add(&g_green_destroyed, 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx)
{
    TRY(need_init());
    if (!pContext)
        return CUDA_ERROR_INVALID_VALUE;
    if (tag_of(hCtx) != TAG_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    *pContext = &hCtx->ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx,
                                        unsigned int flags, int priority)
{
    struct CUstream_st *s;
    TRY(need_init());
    if (!phStream || flags != CU_STREAM_NON_BLOCKING)
        return CUDA_ERROR_INVALID_VALUE;
    if (tag_of(greenCtx) != TAG_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!(s = calloc(1, sizeof *s)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->tag = TAG_STREAM;
    s->ctx = &greenCtx->ctx;
    s->flags = flags;
    s->priority = priority;
    s->green = greenCtx;
    atomic_fetch_add(&g_green_streams, 1);
    *phStream = s;
    return CUDA_SUCCESS;
}

/* The stream a handle names for ordering: the default stream handles are one stream. */
static struct CUstream_st *order_stream(CUstream s)
{
    return (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) ? &g_default_stream
                                                                            : s;
}

/* One work item queued on s, under g_lock. A stream that owes a wait for a green launch and
 * queues work instead breaks the order. */
static void queue_locked(struct CUstream_st *s)
{
    if (s->join) {
        atomic_fetch_add(&g_order_violations, 1);
        s->join = NULL;
    }
    s->ops++;
}

/* A launch's work item; returns the SMs it ran on (first << 16 | count: the whole device, but
 * a green context's SMs on a stream of one, or on any stream of a context converted from one)
 * and whether it was ordered after the stream it was redirected from. */
static unsigned queue_launch(CUstream hs, int *ordered)
{
    struct CUstream_st *s = order_stream(hs);
    unsigned where = FAKE_SMS_ALL;
    /* A default stream handle is the current context's default stream. */
    const struct CUctx_st *in = s == &g_default_stream ? tls_ctx : s->ctx;
    lock();
    *ordered = 0;
    if (!s->green && in && in->green) {
        where = in->green->first << 16 | in->green->sms;
    } else if (s->green) {
        struct CUstream_st *from = s->dep;
        if (from && s->dep_ops == from->ops) {
            *ordered = 1;
            from->join = s;
            from->join_ops = s->ops + 1;
        } else {
            atomic_fetch_add(&g_order_violations, 1);
        }
        where = s->green->first << 16 | s->green->sms;
    }
    queue_locked(s);
    unlock();
    return where;
}

static CUresult stream_wait_event(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    struct CUstream_st *s;
    TRY(need_ctx());
    if (tag_of(hEvent) != TAG_EVENT || !stream_ok(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    s = order_stream(hStream);
    lock();
    if (hEvent->rec_stream) {
        if (s->join && hEvent->rec_stream == s->join && hEvent->rec_ops >= s->join_ops)
            s->join = NULL;
        s->dep = hEvent->rec_stream;
        s->dep_ops = hEvent->rec_ops;
    }
    unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return stream_wait_event(hStream, hEvent, Flags);
}

CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return stream_wait_event(hStream, hEvent, Flags);
}

static CUresult stream_get_ctx(CUstream hStream, CUcontext *pctx)
{
    TRY(need_ctx());
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!stream_ok(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    *pctx = order_stream(hStream) == &g_default_stream ? tls_ctx : hStream->ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    return stream_get_ctx(hStream, pctx);
}

CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    return stream_get_ctx(hStream, pctx);
}

static CUresult stream_get_priority(CUstream hStream, int *priority)
{
    TRY(need_ctx());
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    if (!stream_ok(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    *priority = order_stream(hStream)->priority;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int *priority)
{
    return stream_get_priority(hStream, priority);
}

CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream hStream, int *priority)
{
    return stream_get_priority(hStream, priority);
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    CUresult r = cuStreamCreate(phStream, flags);
    if (r == CUDA_SUCCESS) {
        (*phStream)->flags = flags;
        (*phStream)->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    }
    return r;
}
