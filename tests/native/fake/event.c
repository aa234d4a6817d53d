/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): events. */

/* ---- events ----------------------------------------------------------------------------------
 * By default work completes instantly: an event is complete as soon as it is recorded.
 *
 * With FAKE_CUDA_LAZY_EVENTS=1 events behave like a real, asynchronous GPU's, with the work
 * never finishing by itself:
 *   - a recorded event is not complete (cuEventQuery: CUDA_ERROR_NOT_READY, cuEventElapsedTime
 *     of it: CUDA_ERROR_NOT_READY) until it is waited for: cuEventSynchronize of it or of a
 *     later event recorded on the same stream, cuStreamSynchronize of that stream (the default
 *     stream handles NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are one stream per
 *     context here), or cuCtxSynchronize in its context;
 *   - an event belongs to the context current when it was created; when that context is torn
 *     down (cuCtxDestroy, the primary context's last cuDevicePrimaryCtxRelease, or
 *     cuDevicePrimaryCtxReset) the event dies with it: cuEventRecord, cuEventQuery,
 *     cuEventSynchronize and cuEventElapsedTime on it return CUDA_ERROR_CONTEXT_IS_DESTROYED.
 * Every record takes the next number of a global counter; each stream and context keeps the
 * number up to which it has been synchronized, and an event is complete once one of the marks
 * it is under has reached its number. The timestamp is still taken at record time. */

/* Raises *mark to `to` if it is lower. */
static void advance(atomic_ullong *mark, unsigned long long to)
{
    unsigned long long cur = atomic_load(mark);
    while (cur < to && !atomic_compare_exchange_weak(mark, &cur, to))
        ;
}

/* The synchronization mark of work queued on s in ctx. */
static atomic_ullong *stream_mark(CUstream s, CUcontext ctx)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return &ctx->default_synced;
    return &s->synced;
}

/* Lazy events: the event's context was torn down since it was created. The context struct is
 * never freed, so this reads a live object even for a destroyed context. */
static int event_dead(CUevent ev)
{
    return g_lazy_events &&
           (tag_of(ev->ctx) != TAG_CTX || atomic_load(&ev->ctx->epoch) != ev->epoch);
}

/* Lazy events: everything before the event's latest record has run (never recorded: true). */
static int event_complete(CUevent ev)
{
    unsigned long long seq = atomic_load(&ev->seq);
    atomic_ullong *mark;
    if (!g_lazy_events || seq == 0)
        return 1;
    mark = atomic_load(&ev->mark);
    if (atomic_load(mark) >= seq || atomic_load(&ev->ctx->synced) >= seq)
        return 1;
    if (g_event_wall_ns) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec -
                   atomic_load(&ev->wall_ns) >= g_event_wall_ns;
    }
    return 0;
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    struct CUevent_st *ev;
    TRY(need_ctx());
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(ev = calloc(1, sizeof *ev)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->tag = TAG_EVENT;
    ev->flags = Flags;
    ev->ctx = tls_ctx;
    ev->epoch = atomic_load(&tls_ctx->epoch);
    *phEvent = ev;
    return CUDA_SUCCESS;
}

static CUresult event_destroy(CUevent ev)
{
    TRY(need_init());
    if (tag_of(ev) != TAG_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    ev->tag = TAG_DEAD;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent) { return event_destroy(hEvent); }
CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) { return event_destroy(hEvent); }

/* The event captures the clock as of every launch before it (in lazy mode too: the fake GPU
 * ran them, it only does not say so before it is asked to wait). */
static CUresult event_record(CUevent ev, CUstream s)
{
    TRY(need_ctx());
    if (tag_of(ev) != TAG_EVENT || !stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    if (event_dead(ev))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    ev->t_ns = atomic_load(&g_clock_ns);
    ev->recorded = 1;
    lock();
    ev->rec_stream = order_stream(s);
    queue_locked(ev->rec_stream);
    ev->rec_ops = ev->rec_stream->ops;
    unlock();
    if (g_lazy_events) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        atomic_store(&ev->wall_ns, (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec);
        atomic_store(&ev->mark, stream_mark(s, ev->ctx));
        atomic_store(&ev->seq, atomic_fetch_add(&g_record_seq, 1) + 1);
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return event_record(hEvent, hStream);
}

CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    return event_record(hEvent, hStream);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    TRY(need_init());
    if (tag_of(hEvent) != TAG_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    if (event_dead(hEvent))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return event_complete(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* Waiting for an event runs its stream up to it: the events recorded before it there complete
 * too, as on a real GPU. */
CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    unsigned long long seq;
    TRY(need_init());
    if (tag_of(hEvent) != TAG_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    if (event_dead(hEvent))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (g_lazy_events && (seq = atomic_load(&hEvent->seq)) != 0)
        advance(atomic_load(&hEvent->mark), seq);
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
    TRY(need_init());
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if (tag_of(a) != TAG_EVENT || tag_of(b) != TAG_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    if (event_dead(a) || event_dead(b))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    /* As documented for the real call: unrecorded or timing-disabled events are refused, and
     * events that have not completed yet are not ready. */
    if (!a->recorded || !b->recorded || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!event_complete(a) || !event_complete(b))
        return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)b->t_ns - (double)a->t_ns) / 1e6);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return elapsed(pMilliseconds, hStart, hEnd);
}

/* What `cuEventElapsedTime` means in the CUDA 12.8+ header. */
CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return elapsed(pMilliseconds, hStart, hEnd);
}
