/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): error names and strings. */

/* ---- errors ---------------------------------------------------------------------------------- */

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED",
     "context is destroyed"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **pStr, int text)
{
    size_t i;
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        if (errors[i].code == error) {
            *pStr = text ? errors[i].text : errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL; /* the real driver's answer for a code it does not know */
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 0);
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 1);
}

/* The driver's private interfaces, which NVIDIA's own libraries ask for: NVRTC 13, for one,
 * dlopens libcuda.so.1 when it can and asks for tables by UUID, and crashes when the symbol is
 * missing altogether. The fake has none: every table is "not supported", which they take as
 * "no driver features to use". */
/* cudart's way to the primary context (test programs only): the real driver retains it for
 * libcudart through a private table, without passing through the exported
 * cuDevicePrimaryCtxRetain; cudart then makes it current with cuCtxSetCurrent. */
CUresult fake_cuda_private_primary_retain(CUcontext *pctx, CUdevice dev)
{
    return primary_retain(pctx, dev);
}

CUresult CUDAAPI cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}
