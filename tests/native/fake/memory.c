/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): device memory. */

/* ---- device memory ---------------------------------------------------------------------------
 * Host memory standing in for the device's: an allocation's address is its CUdeviceptr, so
 * addresses are distinct and memsets really write. Fresh memory is filled with DEVICE_GARBAGE,
 * as a real allocation is not zeroed, so that a test can tell whether something cleared it.
 * The table of allocations (under g_lock) lets a memset check its range, as the real driver
 * does, and a test ask which allocation an address lies in (fake_cuda_device_allocation). */

#define DEVICE_GARBAGE 0xa5

struct allocation {
    uintptr_t base;
    size_t size;
};

static struct allocation *g_allocs; /* live allocations, unordered */
static unsigned g_nallocs, g_allocs_cap;

/* The live allocation holding [p, p + n), or NULL. Caller holds g_lock. */
static struct allocation *allocation_of_locked(uintptr_t p, size_t n)
{
    unsigned i;
    for (i = 0; i < g_nallocs; i++)
        if (p >= g_allocs[i].base && n <= g_allocs[i].size &&
            p - g_allocs[i].base <= g_allocs[i].size - n)
            return &g_allocs[i];
    return NULL;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    void *mem;
    TRY(need_ctx());
    TRY(capture_unsafe());
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(mem = malloc(bytesize)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(mem, DEVICE_GARBAGE, bytesize);
    lock();
    if (g_nallocs == g_allocs_cap) {
        unsigned cap = g_allocs_cap ? 2 * g_allocs_cap : 16;
        struct allocation *a = realloc(g_allocs, cap * sizeof *a);
        if (!a) {
            unlock();
            free(mem);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g_allocs = a;
        g_allocs_cap = cap;
    }
    g_allocs[g_nallocs++] = (struct allocation){(uintptr_t)mem, bytesize};
    unlock();
    *dptr = (CUdeviceptr)(uintptr_t)mem;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    unsigned i;
    TRY(need_ctx());
    lock();
    for (i = 0; i < g_nallocs && g_allocs[i].base != (uintptr_t)dptr; i++)
        ;
    if (i == g_nallocs) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    g_allocs[i] = g_allocs[--g_nallocs];
    unlock();
    free((void *)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}

/* Work completes at once here, so the asynchronous memset is the synchronous one. */
static CUresult memset_d8(CUdeviceptr dst, unsigned char value, size_t n, CUstream s)
{
    TRY(need_ctx());
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    if (n == 0)
        return CUDA_SUCCESS;
    lock();
    if (!allocation_of_locked((uintptr_t)dst, n)) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    memset((void *)(uintptr_t)dst, value, n);
    unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return memset_d8(dstDevice, uc, N, NULL);
}

CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    size_t i;
    TRY(need_ctx());
    if (N == 0)
        return CUDA_SUCCESS;
    lock();
    if (N > SIZE_MAX / 4 || !allocation_of_locked((uintptr_t)dstDevice, N * 4)) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < N; i++)
        memcpy((char *)(uintptr_t)dstDevice + 4 * i, &ui, 4);
    unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    TRY(need_ctx());
    if (ByteCount == 0)
        return CUDA_SUCCESS;
    if (!dstHost)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    if (!allocation_of_locked((uintptr_t)srcDevice, ByteCount)) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
    unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                 CUstream hStream)
{
    return memset_d8(dstDevice, uc, N, hStream);
}

CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                      CUstream hStream)
{
    return memset_d8(dstDevice, uc, N, hStream);
}
