/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): streams and stream capture. */

/* ---- streams --------------------------------------------------------------------------------- */

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    struct CUstream_st *s;
    (void)Flags;
    TRY(need_ctx());
    if (!phStream)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(s = calloc(1, sizeof *s)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->tag = TAG_STREAM;
    s->ctx = tls_ctx;
    *phStream = s;
    return CUDA_SUCCESS;
}

static atomic_ulong g_green_streams_destroyed;

static CUresult stream_destroy(CUstream s)
{
    TRY(need_init());
    if (tag_of(s) != TAG_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    if (s->green)
        atomic_fetch_add(&g_green_streams_destroyed, 1);
    s->tag = TAG_DEAD;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream) { return stream_destroy(hStream); }
CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) { return stream_destroy(hStream); }

static atomic_ullong *stream_mark(CUstream s, CUcontext ctx);

static CUresult stream_sync(CUstream s)
{
    TRY(need_ctx());
    TRY(capture_unsafe());
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    if (g_lazy_events)
        advance(stream_mark(s, tls_ctx), atomic_load(&g_record_seq));
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream); }
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) { return stream_sync(hStream); }

/* Work is done when asked about, as everywhere in the fake unless events are lazy: a query of
 * a stream with lazy events is a synchronization that reports completion. */
CUresult CUDAAPI cuStreamQuery(CUstream hStream) { return stream_sync(hStream); }
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) { return stream_sync(hStream); }

/* ---- stream capture ----------------------------------------------------------------------------
 * Enough of it for clc's checks: a stream captures between cuStreamBeginCapture and
 * cuStreamEndCapture (work "captured" still runs at once: nothing is recorded), each thread has
 * an interaction mode (cuThreadExchangeStreamCaptureMode), and the rule that makes a global
 * capture fragile holds: while some stream captures in global mode, a potentially unsafe call
 * (cuMemAlloc, cuModuleLoadData, cuLibraryLoadData, cuStreamSynchronize, cuCtxSynchronize) from a
 * thread whose mode is not relaxed fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 * invalidates those captures (their cuStreamEndCapture then fails with
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED), as the real driver does. */

#define MAX_CAPTURES 8
static CUstream g_capturing[MAX_CAPTURES]; /* under g_lock */
static atomic_int g_global_captures;
static __thread int tls_capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL (0) until exchanged */
static atomic_int g_capture_unsafe_calls;

static CUresult capture_unsafe(void)
{
    unsigned i;
    if (atomic_load(&g_global_captures) == 0 || tls_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    atomic_fetch_add(&g_capture_unsafe_calls, 1);
    lock();
    for (i = 0; i < MAX_CAPTURES; i++)
        if (g_capturing[i] && g_capturing[i]->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
            g_capturing[i]->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    unlock();
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    unsigned i;
    TRY(need_ctx());
    if (tag_of(hStream) != TAG_STREAM || (unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE; /* (the legacy stream cannot capture) */
    lock();
    for (i = 0; i < MAX_CAPTURES && g_capturing[i]; i++)
        ;
    if (hStream->capture || i == MAX_CAPTURES) {
        unlock();
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    g_capturing[i] = hStream;
    hStream->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    hStream->capture_mode = mode;
    unlock();
    if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
        atomic_fetch_add(&g_global_captures, 1);
    return CUDA_SUCCESS;
}

/* Capture into a graph the program made (a conditional node's body, say): each launch on the
 * stream becomes a kernel node of that graph, in the stream's context, instead of running. */
CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                             const CUgraphNode *dependencies,
                                             const CUgraphEdgeData *dependencyData,
                                             size_t numDependencies, CUstreamCaptureMode mode)
{
    (void)dependencies;
    (void)dependencyData;
    if (numDependencies)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (tag_of(hGraph) != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(cuStreamBeginCapture_v2(hStream, mode));
    hStream->capture_graph = hGraph;
    return CUDA_SUCCESS;
}

static CUresult capture_info(CUstream hStream, CUstreamCaptureStatus *status, cuuint64_t *id,
                             CUgraph *graph, const CUgraphNode **deps, size_t *n)
{
    TRY(need_ctx());
    if (!status || !stream_ok(hStream))
        return CUDA_ERROR_INVALID_VALUE;
    *status = tag_of(hStream) == TAG_STREAM ? (CUstreamCaptureStatus)hStream->capture
                                            : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id)
        *id = (cuuint64_t)(uintptr_t)hStream;
    if (graph)
        *graph = *status && tag_of(hStream) == TAG_STREAM ? hStream->capture_graph : NULL;
    if (deps)
        *deps = NULL;
    if (n)
        *n = 0;
    return CUDA_SUCCESS;
}

/* The 12.3 ABI: the dependencies' edge data (always none here) before their count. */
CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *status,
                                           cuuint64_t *id, CUgraph *graph,
                                           const CUgraphNode **deps,
                                           const CUgraphEdgeData **edges, size_t *n)
{
    if (edges)
        *edges = NULL;
    return capture_info(hStream, status, id, graph, deps, n);
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus *status,
                                                cuuint64_t *id, CUgraph *graph,
                                                const CUgraphNode **deps,
                                                const CUgraphEdgeData **edges, size_t *n)
{
    if (edges)
        *edges = NULL;
    return capture_info(hStream, status, id, graph, deps, n);
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    unsigned i;
    int status;
    TRY(need_ctx());
    if (!phGraph || tag_of(hStream) != TAG_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    status = hStream->capture;
    for (i = 0; i < MAX_CAPTURES; i++)
        if (g_capturing[i] == hStream)
            g_capturing[i] = NULL;
    hStream->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    unlock();
    if (status == CU_STREAM_CAPTURE_STATUS_NONE)
        return CUDA_ERROR_ILLEGAL_STATE;
    if (hStream->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
        atomic_fetch_sub(&g_global_captures, 1);
    if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (hStream->capture_graph) {
        *phGraph = hStream->capture_graph;
        hStream->capture_graph = NULL;
        return CUDA_SUCCESS;
    }
    return cuGraphCreate(phGraph, 0);
}

static CUresult stream_is_capturing(CUstream hStream, CUstreamCaptureStatus *status)
{
    TRY(need_ctx());
    if (!status || !stream_ok(hStream))
        return CUDA_ERROR_INVALID_VALUE;
    *status = tag_of(hStream) == TAG_STREAM ? (CUstreamCaptureStatus)hStream->capture
                                            : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return stream_is_capturing(hStream, captureStatus);
}

CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return stream_is_capturing(hStream, captureStatus);
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    int was;
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    was = tls_capture_mode;
    tls_capture_mode = *mode;
    *mode = (CUstreamCaptureMode)was;
    return CUDA_SUCCESS;
}
