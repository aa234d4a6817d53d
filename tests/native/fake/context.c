/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): initialisation, devices, contexts. */

/* ---- initialisation, devices, contexts ------------------------------------------------------- */

CUresult CUDAAPI cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    atomic_store(&g_initialized, 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    TRY(need_init());
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

/* The device's UUID: FAKE_CUDA_UUID's first 16 characters (padded with '0') when set, so that
 * tests can put two processes on one GPU or on two; "fake-gpu-0000000" otherwise. */
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    const char *name = getenv("FAKE_CUDA_UUID");
    size_t i, n;
    TRY(need_init());
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!name)
        name = "fake-gpu-0000000";
    n = strlen(name);
    for (i = 0; i < 16; i++)
        uuid->bytes[i] = i < n ? name[i] : '0';
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    TRY(need_init());
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    TRY(need_init());
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", "Fake GPU");
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    TRY(need_init());
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) { /* an H100-like part; whatever is not listed reads 0 */
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
        *pi = 1024;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
        *pi = 64;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
        *pi = 2147483647;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
        *pi = 65535;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
        *pi = DEFAULT_DYN_SMEM;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        *pi = MAX_DYN_SMEM;
        break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        *pi = 32;
        break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *pi = 132;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *pi = 9;
        break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        *pi = 1;
        break;
    default:
        *pi = 0;
        break;
    }
    return CUDA_SUCCESS;
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev)
{
    TRY(need_init());
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    atomic_fetch_add(&g_primary_refs, 1);
    atomic_store(&g_primary_active, 1);
    *pctx = &g_primary;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    return primary_retain(pctx, dev);
}

/* The primary context's handle stays usable after its last release or a reset: the real driver
 * hands back the same handle on the next retain. What the real driver does destroy, the events
 * created in it, dies with it when events are lazy (a new epoch). */
static CUresult primary_release(CUdevice dev)
{
    int refs;
    TRY(need_init());
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    refs = atomic_load(&g_primary_refs);
    while (refs > 0 && !atomic_compare_exchange_weak(&g_primary_refs, &refs, refs - 1))
        ;
    if (refs == 1) {
        atomic_fetch_add(&g_primary.epoch, 1); /* the last release destroys the context */
        atomic_store(&g_primary_active, 0);
    }
    return refs > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release(dev); }
CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }

/* Destroys the primary context's resources whoever still holds it; the retain count stays. */
static CUresult primary_reset(CUdevice dev)
{
    TRY(need_init());
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    atomic_fetch_add(&g_primary.epoch, 1);
    atomic_store(&g_primary_active, 0);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    TRY(need_init());
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = atomic_load(&g_primary_active);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return primary_reset(dev); }
CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_reset(dev); }

static CUresult ctx_create(CUcontext *pctx, CUdevice dev)
{
    struct CUctx_st *c;
    TRY(need_init());
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!(c = calloc(1, sizeof *c)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->tag = TAG_CTX;
    c->dev = dev;
    tls_ctx = c; /* a created context becomes current on the calling thread */
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return ctx_create(pctx, dev);
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return ctx_create(pctx, dev);
}

/* What `cuCtxCreate` means in the CUDA 13 header. */
/* Execution affinity (an SM count) is for clients of an MPS server: without one the real
 * driver refuses it (CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, driver 580). FAKE_CUDA_MPS=1 plays
 * an MPS client, whose context is made (its SM count is not modelled). */
CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                unsigned int flags, CUdevice dev)
{
    const char *mps = getenv("FAKE_CUDA_MPS");
    (void)flags;
    if (ctxCreateParams && ctxCreateParams->numExecAffinityParams > 0) {
        if (!ctxCreateParams->execAffinityParams)
            return CUDA_ERROR_INVALID_VALUE;
        if (!(mps && strcmp(mps, "1") == 0))
            return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
    }
    return ctx_create(pctx, dev);
}

static CUresult ctx_destroy(CUcontext ctx)
{
    TRY(need_init());
    if (tag_of(ctx) != TAG_CTX || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    atomic_fetch_add(&ctx->epoch, 1);
    ctx->tag = TAG_DEAD;
    if (tls_ctx == ctx)
        tls_ctx = NULL;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { return ctx_destroy(ctx); }
CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(ctx); }

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    TRY(need_init());
    if (ctx != NULL && tag_of(ctx) != TAG_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    tls_ctx = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    TRY(need_init());
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = tag_of(tls_ctx) == TAG_CTX ? tls_ctx : NULL;
    return CUDA_SUCCESS;
}

/* The thread's context stack: what a push hides, a pop makes current again. */
#define CTX_STACK 16
static __thread CUcontext tls_ctx_stack[CTX_STACK];
static __thread unsigned tls_ctx_depth;

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    TRY(need_init());
    if (tag_of(ctx) != TAG_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_ctx_depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_ctx_stack[tls_ctx_depth++] = tls_ctx;
    tls_ctx = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    TRY(need_init());
    if (!tls_ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx)
        *pctx = tls_ctx;
    tls_ctx = tls_ctx_depth ? tls_ctx_stack[--tls_ctx_depth] : NULL;
    return CUDA_SUCCESS;
}

/* Scheduling flags change nothing in the fake; any flag it does not know is refused. */
CUresult CUDAAPI cuCtxSetFlags(unsigned int flags)
{
    TRY(need_ctx());
    return flags & ~0x1fu ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    TRY(need_ctx());
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = tls_ctx->dev;
    return CUDA_SUCCESS;
}

/* The device of `ctx`, or of the current context when ctx is NULL (CUDA 13). */
CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    if (ctx == NULL)
        return cuCtxGetDevice(device);
    TRY(need_init());
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (tag_of(ctx) != TAG_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = ctx->dev;
    return CUDA_SUCCESS;
}

static void advance(atomic_ullong *mark, unsigned long long to);
static CUresult capture_unsafe(void);

CUresult CUDAAPI cuCtxSynchronize(void)
{
    TRY(need_ctx());
    TRY(capture_unsafe());
    if (g_lazy_events)
        advance(&tls_ctx->synced, atomic_load(&g_record_seq));
    return CUDA_SUCCESS;
}

/* CUDA 13's, naming the context (NULL: the current one); the fake knows only the current. */
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    TRY(need_ctx());
    if (ctx && ctx != tls_ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    return cuCtxSynchronize();
}
