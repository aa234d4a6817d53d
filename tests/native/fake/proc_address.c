/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): cuGetProcAddress. */

/* ---- cuGetProcAddress --------------------------------------------------------------------------
 * Like the real driver it answers with its own functions: the table below holds the addresses
 * of hidden local aliases, which an LD_PRELOADed shim defining the same names cannot interpose
 * (a plain `&cuLaunchKernel` in a -fPIC library would resolve to the shim's). It does not call
 * dlsym either, which a shim may hook. */

static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status);

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags)
{
    return get_proc(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    return get_proc(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* Every CUDA entry point this library exports (the fake_cuda_* test hooks are not CUDA API and
 * cuGetProcAddress does not hand them out). */
#define FAKE_EXPORTS(X)                                                                            \
    X(cuInit)                                                                                      \
    X(cuDriverGetVersion)                                                                          \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetCount)                                                                            \
    X(cuDeviceGetName)                                                                             \
    X(cuDeviceGetAttribute)                                                                        \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuDevicePrimaryCtxRelease)                                                                   \
    X(cuDevicePrimaryCtxRelease_v2)                                                                \
    X(cuDevicePrimaryCtxReset)                                                                     \
    X(cuDevicePrimaryCtxReset_v2)                                                                  \
    X(cuDevicePrimaryCtxGetState)                                                                  \
    X(cuCtxCreate)                                                                                 \
    X(cuCtxCreate_v2)                                                                              \
    X(cuCtxCreate_v4)                                                                              \
    X(cuCtxDestroy)                                                                                \
    X(cuCtxDestroy_v2)                                                                             \
    X(cuCtxSetCurrent)                                                                             \
    X(cuCtxPushCurrent_v2)                                                                         \
    X(cuCtxPopCurrent_v2)                                                                          \
    X(cuCtxSetFlags)                                                                               \
    X(cuStreamBeginCaptureToGraph)                                                                 \
    X(cuGraphConditionalHandleCreate)                                                              \
    X(cuGraphAddChildGraphNode)                                                                    \
    X(cuGraphChildGraphNodeGetGraph)                                                               \
    X(cuGraphGetNodes)                                                                             \
    X(cuGraphNodeGetType)                                                                          \
    X(cuGraphKernelNodeGetParams_v2)                                                               \
    X(cuStreamGetCaptureInfo_v3)                                                                   \
    X(cuStreamGetCaptureInfo_v3_ptsz)                                                              \
    X(cuCtxGetCurrent)                                                                             \
    X(cuCtxGetDevice)                                                                              \
    X(cuCtxGetDevice_v2)                                                                           \
    X(cuCtxSynchronize)                                                                            \
    X(cuCtxSynchronize_v2)                                                                         \
    X(cuStreamQuery)                                                                               \
    X(cuStreamQuery_ptsz)                                                                          \
    X(cuDeviceGetUuid)                                                                             \
    X(cuDeviceGetUuid_v2)                                                                          \
    X(cuStreamCreate)                                                                              \
    X(cuStreamDestroy)                                                                             \
    X(cuStreamDestroy_v2)                                                                          \
    X(cuStreamSynchronize)                                                                         \
    X(cuStreamBeginCapture_v2)                                                                     \
    X(cuStreamEndCapture)                                                                          \
    X(cuStreamIsCapturing)                                                                         \
    X(cuStreamIsCapturing_ptsz)                                                                    \
    X(cuThreadExchangeStreamCaptureMode)                                                           \
    X(cuStreamSynchronize_ptsz)                                                                    \
    X(cuMemAlloc_v2)                                                                               \
    X(cuMemFree_v2)                                                                                \
    X(cuMemsetD8_v2)                                                                               \
    X(cuMemsetD32_v2)                                                                              \
    X(cuMemcpyDtoH_v2)                                                                             \
    X(cuMemsetD8Async)                                                                             \
    X(cuMemsetD8Async_ptsz)                                                                        \
    X(cuModuleLoad)                                                                                \
    X(cuModuleLoadData)                                                                            \
    X(cuModuleLoadDataEx)                                                                          \
    X(cuModuleLoadFatBinary)                                                                       \
    X(cuModuleGetFunction)                                                                         \
    X(cuModuleUnload)                                                                              \
    X(cuLibraryLoadData)                                                                           \
    X(cuLibraryLoadFromFile)                                                                       \
    X(cuLibraryGetKernel)                                                                          \
    X(cuLibraryUnload)                                                                             \
    X(cuLibraryGetModule)                                                                          \
    X(cuLibraryGetManaged)                                                                         \
    X(cuKernelGetFunction)                                                                         \
    X(cuKernelGetLibrary)                                                                          \
    X(cuFuncGetModule)                                                                             \
    X(cuKernelGetName)                                                                             \
    X(cuFuncGetName)                                                                               \
    X(cuKernelGetParamInfo)                                                                        \
    X(cuFuncGetParamInfo)                                                                          \
    X(cuFuncSetAttribute)                                                                          \
    X(cuFuncGetAttribute)                                                                          \
    X(cuKernelSetAttribute)                                                                        \
    X(cuKernelGetAttribute)                                                                        \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                                                 \
    X(cuLaunchKernel)                                                                              \
    X(cuLaunchKernel_ptsz)                                                                         \
    X(cuLaunchKernelEx)                                                                            \
    X(cuLaunchKernelEx_ptsz)                                                                       \
    X(cuLaunchCooperativeKernel)                                                                   \
    X(cuLaunchCooperativeKernelMultiDevice)                                                        \
    X(cuLaunchCooperativeKernel_ptsz)                                                              \
    X(cuGraphCreate)                                                                               \
    X(cuGraphDestroy)                                                                              \
    X(cuGraphAddKernelNode)                                                                        \
    X(cuGraphAddKernelNode_v2)                                                                     \
    X(cuGraphKernelNodeSetParams)                                                                  \
    X(cuGraphKernelNodeSetParams_v2)                                                               \
    X(cuGraphInstantiateWithFlags)                                                                 \
    X(cuGraphExecKernelNodeSetParams)                                                              \
    X(cuGraphExecKernelNodeSetParams_v2)                                                           \
    X(cuGraphAddNode)                                                                              \
    X(cuGraphAddNode_v2)                                                                           \
    X(cuGraphNodeSetParams)                                                                        \
    X(cuGraphExecNodeSetParams)                                                                    \
    X(cuGraphLaunch)                                                                               \
    X(cuGraphLaunch_ptsz)                                                                          \
    X(cuGraphExecDestroy)                                                                          \
    X(cuDeviceGetDevResource)                                                                      \
    X(cuDevSmResourceSplitByCount)                                                                 \
    X(cuDevResourceGenerateDesc)                                                                   \
    X(cuGreenCtxCreate)                                                                            \
    X(cuGreenCtxDestroy)                                                                           \
    X(cuCtxFromGreenCtx)                                                                           \
    X(cuGreenCtxStreamCreate)                                                                      \
    X(cuStreamWaitEvent)                                                                           \
    X(cuStreamWaitEvent_ptsz)                                                                      \
    X(cuStreamGetCtx)                                                                              \
    X(cuStreamGetCtx_ptsz)                                                                         \
    X(cuStreamGetPriority)                                                                         \
    X(cuStreamGetPriority_ptsz)                                                                    \
    X(cuStreamCreateWithPriority)                                                                  \
    X(cuEventCreate)                                                                               \
    X(cuEventDestroy)                                                                              \
    X(cuEventDestroy_v2)                                                                           \
    X(cuEventRecord)                                                                               \
    X(cuEventRecord_ptsz)                                                                          \
    X(cuEventQuery)                                                                                \
    X(cuEventSynchronize)                                                                          \
    X(cuEventElapsedTime)                                                                          \
    X(cuEventElapsedTime_v2)                                                                       \
    X(cuGetErrorName)                                                                              \
    X(cuGetErrorString)                                                                            \
    X(cuGetExportTable)                                                                            \
    X(cuGetProcAddress)                                                                            \
    X(cuGetProcAddress_v2)

#define LOCAL_ALIAS(n)                                                                             \
    extern __typeof__(n) local_##n __attribute__((alias(#n), visibility("hidden")));
FAKE_EXPORTS(LOCAL_ALIAS)

static const struct {
    const char *name;
    void *fn;
} exports[] = {
#define EXPORT_ROW(n) {#n, (void *)local_##n},
    FAKE_EXPORTS(EXPORT_ROW)
#undef EXPORT_ROW
};

static void *export_named(const char *name)
{
    size_t i;
    for (i = 0; i < sizeof exports / sizeof exports[0]; i++)
        if (strcmp(exports[i].name, name) == 0)
            return exports[i].fn;
    return NULL;
}

/* (base name, first CUDA version that gets this variant, per-thread-stream variant?, the
 * function). For one name and stream flavour the row with the highest version not above the
 * caller's cudaVersion wins; names not listed resolve to the export of the same name for any
 * version. The versions are those of the real driver's table. */
static const struct {
    const char *name;
    int min_version;
    int ptsz;
    const char *target;
} proc_table[] = {
    {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
    {"cuLaunchKernel", 4000, 0, "cuLaunchKernel"},
    {"cuLaunchKernel", 7000, 1, "cuLaunchKernel_ptsz"},
    {"cuLaunchKernelEx", 11060, 0, "cuLaunchKernelEx"},
    {"cuLaunchKernelEx", 11060, 1, "cuLaunchKernelEx_ptsz"},
    {"cuLaunchCooperativeKernel", 9000, 0, "cuLaunchCooperativeKernel"},
    {"cuLaunchCooperativeKernelMultiDevice", 9000, 0, "cuLaunchCooperativeKernelMultiDevice"},
    {"cuLaunchCooperativeKernel", 9000, 1, "cuLaunchCooperativeKernel_ptsz"},
    {"cuEventRecord", 2000, 0, "cuEventRecord"},
    {"cuEventRecord", 7000, 1, "cuEventRecord_ptsz"},
    {"cuStreamSynchronize", 2000, 0, "cuStreamSynchronize"},
    {"cuStreamWaitEvent", 3020, 0, "cuStreamWaitEvent"},
    {"cuStreamWaitEvent", 7000, 1, "cuStreamWaitEvent_ptsz"},
    {"cuStreamGetCtx", 9020, 0, "cuStreamGetCtx"},
    {"cuStreamGetCtx", 9020, 1, "cuStreamGetCtx_ptsz"},
    {"cuStreamGetPriority", 5050, 0, "cuStreamGetPriority"},
    {"cuStreamGetPriority", 7000, 1, "cuStreamGetPriority_ptsz"},
    {"cuStreamSynchronize", 7000, 1, "cuStreamSynchronize_ptsz"},
    {"cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2"},
    {"cuStreamBeginCaptureToGraph", 12030, 0, "cuStreamBeginCaptureToGraph"},
    {"cuGraphConditionalHandleCreate", 12030, 0, "cuGraphConditionalHandleCreate"},
    {"cuGraphKernelNodeGetParams", 12000, 0, "cuGraphKernelNodeGetParams_v2"},
    {"cuStreamGetCaptureInfo", 12030, 0, "cuStreamGetCaptureInfo_v3"},
    {"cuStreamGetCaptureInfo", 12030, 1, "cuStreamGetCaptureInfo_v3_ptsz"},
    {"cuCtxPushCurrent", 4000, 0, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 4000, 0, "cuCtxPopCurrent_v2"},
    {"cuCtxSetFlags", 12010, 0, "cuCtxSetFlags"},
    {"cuStreamIsCapturing", 10000, 1, "cuStreamIsCapturing_ptsz"},
    {"cuGraphLaunch", 10000, 0, "cuGraphLaunch"},
    {"cuGraphLaunch", 10000, 1, "cuGraphLaunch_ptsz"},
    {"cuGraphAddKernelNode", 10000, 0, "cuGraphAddKernelNode"},
    {"cuGraphAddKernelNode", 12000, 0, "cuGraphAddKernelNode_v2"},
    {"cuGraphKernelNodeSetParams", 10000, 0, "cuGraphKernelNodeSetParams"},
    {"cuGraphKernelNodeSetParams", 12000, 0, "cuGraphKernelNodeSetParams_v2"},
    {"cuGraphExecKernelNodeSetParams", 10010, 0, "cuGraphExecKernelNodeSetParams"},
    {"cuGraphExecKernelNodeSetParams", 12000, 0, "cuGraphExecKernelNodeSetParams_v2"},
    {"cuGraphAddNode", 12020, 0, "cuGraphAddNode"},
    {"cuGraphAddNode", 12030, 0, "cuGraphAddNode_v2"},
    {"cuGraphNodeSetParams", 12020, 0, "cuGraphNodeSetParams"},
    {"cuGraphExecNodeSetParams", 12020, 0, "cuGraphExecNodeSetParams"},
    {"cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags"},
    {"cuGraphInstantiateWithFlags", 11040, 0, "cuGraphInstantiateWithFlags"},
    {"cuCtxCreate", 2000, 0, "cuCtxCreate"},
    {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
    {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
    {"cuCtxSynchronize", 2000, 0, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
    {"cuStreamQuery", 2000, 0, "cuStreamQuery"},
    {"cuStreamQuery", 7000, 1, "cuStreamQuery_ptsz"},
    {"cuDeviceGetUuid", 9020, 0, "cuDeviceGetUuid"},
    {"cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"},
    {"cuCtxGetDevice", 2000, 0, "cuCtxGetDevice"},
    {"cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2"},
    {"cuCtxDestroy", 2000, 0, "cuCtxDestroy"},
    {"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"},
    {"cuStreamDestroy", 2000, 0, "cuStreamDestroy"},
    {"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
    {"cuEventDestroy", 2000, 0, "cuEventDestroy"},
    {"cuEventDestroy", 4000, 0, "cuEventDestroy_v2"},
    {"cuEventElapsedTime", 2000, 0, "cuEventElapsedTime"},
    {"cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"},
    {"cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"},
    {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset"},
    {"cuDevicePrimaryCtxReset", 11000, 0, "cuDevicePrimaryCtxReset_v2"},
    {"cuLibraryLoadData", 12000, 0, "cuLibraryLoadData"},
    {"cuLibraryLoadFromFile", 12000, 0, "cuLibraryLoadFromFile"},
    {"cuLibraryGetKernel", 12000, 0, "cuLibraryGetKernel"},
    {"cuLibraryUnload", 12000, 0, "cuLibraryUnload"},
    {"cuLibraryGetModule", 12000, 0, "cuLibraryGetModule"},
    {"cuLibraryGetManaged", 12000, 0, "cuLibraryGetManaged"},
    {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
    {"cuMemFree", 3020, 0, "cuMemFree_v2"},
    {"cuMemsetD8", 3020, 0, "cuMemsetD8_v2"},
    {"cuMemsetD32", 3020, 0, "cuMemsetD32_v2"},
    {"cuMemcpyDtoH", 3020, 0, "cuMemcpyDtoH_v2"},
    {"cuMemsetD8Async", 3020, 0, "cuMemsetD8Async"},
    {"cuMemsetD8Async", 7000, 1, "cuMemsetD8Async_ptsz"},
    {"cuKernelGetFunction", 12000, 0, "cuKernelGetFunction"},
    {"cuKernelGetLibrary", 12000, 0, "cuKernelGetLibrary"},
    {"cuFuncGetModule", 11000, 0, "cuFuncGetModule"},
    {"cuKernelSetAttribute", 12000, 0, "cuKernelSetAttribute"},
    {"cuKernelGetAttribute", 12000, 0, "cuKernelGetAttribute"},
    {"cuKernelGetName", 12030, 0, "cuKernelGetName"},
    {"cuFuncGetName", 12030, 0, "cuFuncGetName"},
    {"cuKernelGetParamInfo", 12040, 0, "cuKernelGetParamInfo"},
    {"cuFuncGetParamInfo", 12040, 0, "cuFuncGetParamInfo"},
};

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The best row for one stream flavour: 1 found, 0 no row, -1 rows exist but all too new. */
static int proc_row(const char *symbol, int cudaVersion, int ptsz, const char **target)
{
    size_t i;
    int best = -1, rows = 0;
    for (i = 0; i < sizeof proc_table / sizeof proc_table[0]; i++) {
        if (proc_table[i].ptsz != ptsz || strcmp(proc_table[i].name, symbol) != 0)
            continue;
        rows++;
        if (proc_table[i].min_version <= cudaVersion &&
            (best < 0 || proc_table[i].min_version > proc_table[best].min_version))
            best = (int)i;
    }
    if (best >= 0) {
        *target = proc_table[best].target;
        return 1;
    }
    return rows ? -1 : 0;
}

static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status)
{
    const char *target = NULL;
    int found = 0;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;

    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    /* The real driver takes base names only ("cuMemAlloc", never "cuMemAlloc_v2"). */
    if (!has_suffix(symbol, "_v2") && !has_suffix(symbol, "_v3") && !has_suffix(symbol, "_v4") &&
        !has_suffix(symbol, "_ptsz") && !has_suffix(symbol, "_ptds")) {
        /* Without the per-thread flag the driver cannot know how the caller was compiled and
         * answers with the legacy-stream variant, as the real one does for DEFAULT. */
        if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
            found = proc_row(symbol, cudaVersion, 1, &target);
        if (found <= 0) {
            int legacy = proc_row(symbol, cudaVersion, 0, &target);
            found = legacy != 0 ? legacy : found;
        }
        if (found == 0 && export_named(symbol)) {
            target = symbol;
            found = 1;
        }
    }
    if (found > 0) {
        *pfn = export_named(target);
        st = CU_GET_PROC_ADDRESS_SUCCESS;
    } else if (found < 0) {
        st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    }
    if (status)
        *status = st;
    /* A symbol too new for the version asked is not an error (pfn NULL, the status says why),
     * as the real driver answers (580); one it does not have at all is. */
    return found != 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
