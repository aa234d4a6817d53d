/* SPDX-License-Identifier: Apache-2.0
 *
 * core.h: the lowest layer of stage 1 (shim/core/; shim/LAYERS lists the layers, a folder each),
 * which every other layer's header includes: the driver's types, the hooked symbols and their
 * real entry points, the driver's helpers (one table, g_drv), the settings, logging, and the
 * files clc writes.
 *
 * Stage 1 must build where no CUDA toolkit is installed (pip install on a machine with only
 * a driver), so the few driver types it needs are declared here by layout, from cuda.h of
 * CUDA 13.0, instead of including cuda.h (whose #defines would also rename our hooks).
 */
#ifndef CLC_CORE_H
#define CLC_CORE_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "clc_abi.h"

#define CLC_EXPORT __attribute__((visibility("default")))
/* On the declarations of data that the hooks read in files other than the one defining it:
 * reached directly, as in its own file, not through the GOT. */
#define CLC_HIDDEN __attribute__((visibility("hidden")))
#define CLC_TLS __thread __attribute__((tls_model("initial-exec")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* ---- the driver's types, by layout ------------------------------------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUfunction;
typedef void *CUkernel;
typedef void *CUmodule;
typedef void *CUlibrary;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUgraph;
typedef void *CUgraphNode;
typedef void *CUgraphExec;
typedef uint64_t cuuint64_t;
typedef uint64_t CUdeviceptr;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_NOT_PERMITTED 800
#define CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE 720
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_LIBRARY_BINARY_IS_PRESERVED 1
#define CU_EVENT_DEFAULT 0
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
/* A default stream's handle (NULL, legacy, per-thread), not a stream the program made. */
#define CLC_DEFAULT_STREAM(s) ((s) == NULL || (s) == CU_STREAM_LEGACY || (s) == CU_STREAM_PER_THREAD)
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* The members a kernel node's parameters have in both versions, in CUDA's order: the graph
 * hooks read a v2 through a v1 pointer, which holds because v2 begins as v1 is. */
#define CLC_KERNEL_NODE_PARAMS_V1_MEMBERS                                                          \
    CUfunction func;                                                                               \
    unsigned int gridDimX, gridDimY, gridDimZ;                                                     \
    unsigned int blockDimX, blockDimY, blockDimZ;                                                  \
    unsigned int sharedMemBytes;                                                                   \
    void **kernelParams;                                                                           \
    void **extra;

typedef struct { /* CUDA_KERNEL_NODE_PARAMS_v1 */
    CLC_KERNEL_NODE_PARAMS_V1_MEMBERS
} CUDA_KERNEL_NODE_PARAMS_v1;

typedef struct { /* CUDA_KERNEL_NODE_PARAMS_v2: func, or kern in ctx when func is NULL */
    CLC_KERNEL_NODE_PARAMS_V1_MEMBERS
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

/* CUctxCreateParams (cuCtxCreate_v4): execution affinity and CIG parameters, both optional. */
typedef struct {
    void *execAffinityParams;
    int numExecAffinityParams;
    void *cigParams;
} clc_ctx_create_params;

/* CUDA_LAUNCH_PARAMS: one device's launch of cuLaunchCooperativeKernelMultiDevice. */
typedef struct {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} clc_launch_params;

/* The generic graph-node parameters (CUgraphNodeParams, 256 bytes): a type, then per type a
 * union whose kernel member (CUDA_KERNEL_NODE_PARAMS_v3) has the layout of the _v2 struct and
 * whose conditional member (CUDA_CONDITIONAL_NODE_PARAMS) gives the body graphs the driver
 * made for the node. */
#define CU_GRAPH_NODE_TYPE_KERNEL 0
#define CU_GRAPH_NODE_TYPE_CONDITIONAL 13
typedef struct {
    uint64_t handle;
    int type;
    unsigned int size;      /* how many bodies */
    CUgraph *phGraph_out;   /* the bodies, filled by the driver */
    CUcontext ctx;
} clc_conditional_params;
typedef struct {
    int type;
    int reserved0[3];
    union {
        CUDA_KERNEL_NODE_PARAMS_v2 kernel;
        clc_conditional_params conditional;
        long long reserved1[29];
    };
    long long reserved2;
} clc_graph_node_params;
_Static_assert(sizeof(clc_graph_node_params) == 256, "CUgraphNodeParams is 256 bytes (13.0)");

/* ---- the hooked symbols ------------------------------------------------------------------
 * One table: X(name, parameter list). Every symbol here is
 * exported by the preload library, substituted when a program gets it through dlsym or
 * cuGetProcAddress, and has its real pointer in g_real[CLC_SYM_name]. */
#define CLC_LAUNCH_PARAMS                                                                   \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,      \
     unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params, \
     void **extra)
#define CLC_COOP_PARAMS                                                                     \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,      \
     unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params)
#define CLC_LAUNCH_EX_PARAMS (const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
#define CLC_LIBRARY_LOAD_OPTS                                                               \
    void *jit_options, void **jit_values, unsigned int n_jit, int *lib_options,             \
        void **lib_values, unsigned int n_lib

#define CLC_HOOKED_SYMBOLS(X)                                                                     \
    X(cuGetProcAddress, (const char *symbol, void **pfn, int version, cuuint64_t flags))         \
    X(cuGetProcAddress_v2,                                                                       \
      (const char *symbol, void **pfn, int version, cuuint64_t flags, int *status))              \
    X(cuLaunchKernel, CLC_LAUNCH_PARAMS)                                                         \
    X(cuLaunchKernel_ptsz, CLC_LAUNCH_PARAMS)                                                    \
    X(cuLaunchKernelEx, CLC_LAUNCH_EX_PARAMS)                                                    \
    X(cuLaunchKernelEx_ptsz, CLC_LAUNCH_EX_PARAMS)                                               \
    X(cuLaunchCooperativeKernel, CLC_COOP_PARAMS)                                                \
    X(cuLaunchCooperativeKernel_ptsz, CLC_COOP_PARAMS)                                           \
    X(cuLaunchCooperativeKernelMultiDevice,                                                      \
      (clc_launch_params * list, unsigned int n, unsigned int flags))                            \
    X(cuGraphAddKernelNode, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps,         \
                             size_t n_deps, const CUDA_KERNEL_NODE_PARAMS_v1 *p))                \
    X(cuGraphAddKernelNode_v2, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps,      \
                                size_t n_deps, const CUDA_KERNEL_NODE_PARAMS_v2 *p))             \
    X(cuGraphKernelNodeSetParams, (CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p))       \
    X(cuGraphKernelNodeSetParams_v2, (CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p))    \
    X(cuGraphExecKernelNodeSetParams,                                                            \
      (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p))                 \
    X(cuGraphExecKernelNodeSetParams_v2,                                                         \
      (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p))                 \
    X(cuGraphAddNode, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps,               \
                       size_t n_deps, clc_graph_node_params *p))                                 \
    X(cuGraphAddNode_v2, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps,            \
                          const void *edges, size_t n_deps, clc_graph_node_params *p))           \
    X(cuGraphNodeSetParams, (CUgraphNode node, clc_graph_node_params * p))                       \
    X(cuGraphAddChildGraphNode, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps,     \
                                 size_t n_deps, CUgraph child))                                  \
    X(cuGraphDestroy, (CUgraph graph))                                                           \
    X(cuGraphInstantiateWithFlags, (CUgraphExec * exec, CUgraph graph, unsigned long long flags))\
    X(cuGraphInstantiateWithParams, (CUgraphExec * exec, CUgraph graph, void *params))           \
    X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec * exec, CUgraph graph, void *params))      \
    X(cuGraphExecNodeSetParams, (CUgraphExec exec, CUgraphNode node, clc_graph_node_params * p)) \
    X(cuModuleLoad, (CUmodule * mod, const char *path))                                          \
    X(cuModuleLoadData, (CUmodule * mod, const void *image))                                     \
    X(cuModuleLoadDataEx, (CUmodule * mod, const void *image, unsigned int n, void *options,     \
                           void **values))                                                       \
    X(cuModuleLoadFatBinary, (CUmodule * mod, const void *fatbin))                               \
    X(cuLibraryLoadData, (CUlibrary * lib, const void *code, CLC_LIBRARY_LOAD_OPTS))             \
    X(cuLibraryLoadFromFile, (CUlibrary * lib, const char *path, CLC_LIBRARY_LOAD_OPTS))         \
    X(cuFuncSetAttribute, (CUfunction f, int attrib, int value))                                 \
    X(cuKernelSetAttribute, (int attrib, int value, CUkernel kernel, CUdevice dev))              \
    X(cuModuleUnload, (CUmodule mod))                                                            \
    X(cuLibraryUnload, (CUlibrary lib))                                                          \
    X(cuCtxCreate, (CUcontext * ctx, unsigned int flags, CUdevice dev))                          \
    X(cuCtxCreate_v2, (CUcontext * ctx, unsigned int flags, CUdevice dev))                       \
    X(cuCtxCreate_v3, (CUcontext * ctx, void *affinity, int n_affinity, unsigned int flags,      \
                       CUdevice dev))                                                            \
    X(cuCtxCreate_v4, (CUcontext * ctx, clc_ctx_create_params * params, unsigned int flags,      \
                       CUdevice dev))                                                            \
    X(cuCtxDestroy, (CUcontext ctx))                                                             \
    X(cuCtxDestroy_v2, (CUcontext ctx))                                                          \
    X(cuDevicePrimaryCtxRelease, (CUdevice dev))                                                 \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                              \
    X(cuDevicePrimaryCtxReset, (CUdevice dev))                                                   \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice dev))                                                \
    X(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev))                                 \
    X(cuStreamDestroy, (CUstream stream))                                                        \
    X(cuStreamDestroy_v2, (CUstream stream))                                                     \
    X(cuCtxSynchronize, (void))                                                                  \
    X(cuCtxSynchronize_v2, (CUcontext ctx))                                                      \
    X(cuStreamSynchronize, (CUstream stream))                                                    \
    X(cuStreamSynchronize_ptsz, (CUstream stream))                                               \
    X(cuStreamQuery, (CUstream stream))                                                          \
    X(cuStreamQuery_ptsz, (CUstream stream))                                                     \
    X(cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t bytes))                               \
    X(cuMemcpyDtoH_v2_ptds, (void *dst, CUdeviceptr src, size_t bytes))                          \
    X(cuEventRecord, (CUevent ev, CUstream stream))                                              \
    X(cuEventRecord_ptsz, (CUevent ev, CUstream stream))                                         \
    X(cuEventRecordWithFlags, (CUevent ev, CUstream stream, unsigned flags))                     \
    X(cuEventRecordWithFlags_ptsz, (CUevent ev, CUstream stream, unsigned flags))                \
    X(cuEventSynchronize, (CUevent ev))                                                          \
    X(cuEventQuery, (CUevent ev))                                                                \
    X(cuEventDestroy, (CUevent ev))                                                              \
    X(cuEventDestroy_v2, (CUevent ev))                                                           \
    X(cuGraphLaunch, (CUgraphExec exec, CUstream stream))                                        \
    X(cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream stream))

#define CLC_SYM_ENUM(name, params) CLC_SYM_##name,
enum { CLC_HOOKED_SYMBOLS(CLC_SYM_ENUM) CLC_N_SYMBOLS };

#define CLC_PFN_TYPEDEF(name, params) typedef CUresult(*pfn_##name) params;
CLC_HOOKED_SYMBOLS(CLC_PFN_TYPEDEF)

/* Real pointers, one per symbol: written once when first resolved, read on every call. The
 * launch symbols come first in the table, so that they share one cache line. */
extern CLC_HIDDEN void *_Atomic g_real[CLC_N_SYMBOLS] __attribute__((aligned(64)));
void *clc_resolve_real(int sym); /* resolves on first use (plain-symbol callers) */
static inline void *clc_real(int sym) {
    void *p = atomic_load_explicit(&g_real[sym], memory_order_acquire);
    return likely(p != NULL) ? p : clc_resolve_real(sym);
}

/* The hooked symbols by name (real.c): the names by index; a symbol's index in the table above,
 * or -1; the real pointer for a symbol (only the first one; never a hook: interpose.c checks
 * what programs' lookups give, and the shim's own lookups, after the shim or in libcuda's
 * scope, cannot give one); libcuda's dlopen handle. The hook's address for a symbol
 * (interpose.c). */
extern CLC_HIDDEN const char *const clc_symbol_names[CLC_N_SYMBOLS];
int clc_symbol_by_name(const char *name);
void *clc_hook_addr(int sym);
void clc_set_real(int sym, void *p);
void *clc_libcuda_handle(void);
/* libc's own dlsym (real.c), since the shim exports dlsym and dlvsym: found in libc's symbol
 * table by clc_libc_symbol, resolved at start (process.c) or at first need. */
extern CLC_HIDDEN void *(*clc_real_dlsym)(void *, const char *);
void *clc_libc_symbol(const char *name);
static inline void clc_resolve_dlsym(void) {
    clc_real_dlsym = (void *(*)(void *, const char *))clc_libc_symbol("dlsym");
}
/* libc's dlopen and dlsym for the shim's own loads and lookups, never through its hooks. */
void *clc_libc_dlopen(const char *file, int mode);
void *clc_libc_dlsym(void *handle, const char *name);
/* The next definition of a symbol after the shim's (libc's own for the exec family, dlopen):
 * looked up with libc's dlsym, since the shim exports dlsym and dlvsym. */
void *clc_next_symbol(const char *name);
/* A hook's first lines: the real entry point, or CUDA_ERROR_NOT_INITIALIZED without one. */
#define CLC_REAL_OR_FAIL(name)                                                                   \
    pfn_##name real = (pfn_##name)clc_real(CLC_SYM_##name);                                     \
    if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;

/* The driver's green-context types, by layout (cuda.h, CUDA 13.0). */
typedef struct {
    int type;
    unsigned char internal_padding[92];
    union {
        struct {
            unsigned sm_count, min_partition, coscheduled_alignment;
        } sm;
        unsigned char oversize[48]; /* RESOURCE_ABI_EXTERNAL_BYTES */
    };
} cu_dev_resource; /* CUdevResource_v1 */
_Static_assert(sizeof(cu_dev_resource) == 144, "CUdevResource_v1 is 144 bytes (cuda.h 13.0)");

typedef void *CUgreenCtx;
typedef void *CUdevResourceDesc;

/* ---- the driver's helpers: the calls stage 1 makes itself, resolved from the same libcuda ---
 * One table: X(member of g_drv, the driver's name, the name tried when that one is missing or
 * NULL, parameter list); every helper returns a CUresult. The members and real.c's loading are
 * both made from it, so that adding a helper is one line here. A missing helper stays NULL:
 * its users check before calling. */
#define CLC_DRIVER_TABLE(X)                                                                        \
    X(ctx_get_current, "cuCtxGetCurrent", NULL, (CUcontext *))                                     \
    X(ctx_set_current, "cuCtxSetCurrent", NULL, (CUcontext))                                       \
    X(ctx_get_device, "cuCtxGetDevice", NULL, (CUdevice *))                                        \
    X(ctx_synchronize, "cuCtxSynchronize", NULL, (void))                                           \
    X(ctx_push, "cuCtxPushCurrent_v2", NULL, (CUcontext))                                          \
    X(ctx_pop, "cuCtxPopCurrent_v2", NULL, (CUcontext *))                                          \
    X(stream_get_ctx, "cuStreamGetCtx", NULL, (CUstream, CUcontext *))                             \
    X(stream_get_device, "cuStreamGetDevice", NULL, (CUstream, CUdevice *))                         \
    X(kernel_get_name, "cuKernelGetName", NULL, (const char **, CUkernel))                         \
    X(func_get_name, "cuFuncGetName", NULL, (const char **, CUfunction))                           \
    X(kernel_get_param_info, "cuKernelGetParamInfo", NULL, (CUkernel, size_t, size_t *, size_t *)) \
    X(func_get_param_info, "cuFuncGetParamInfo", NULL, (CUfunction, size_t, size_t *, size_t *))   \
    X(event_create, "cuEventCreate", NULL, (CUevent *, unsigned int))                              \
    X(event_record, "cuEventRecord", NULL, (CUevent, CUstream))                                    \
    X(event_record_ptsz, "cuEventRecord_ptsz", "cuEventRecord", (CUevent, CUstream))              \
    X(event_query, "cuEventQuery", NULL, (CUevent))                                                \
    X(event_synchronize, "cuEventSynchronize", NULL, (CUevent))                                    \
    X(event_elapsed, "cuEventElapsedTime_v2", "cuEventElapsedTime", (float *, CUevent, CUevent))   \
    X(event_destroy, "cuEventDestroy_v2", "cuEventDestroy", (CUevent))                             \
    X(stream_is_capturing, "cuStreamIsCapturing", NULL, (CUstream, int *))                         \
    X(stream_is_capturing_ptsz, "cuStreamIsCapturing_ptsz", "cuStreamIsCapturing",                 \
      (CUstream, int *))                                                                           \
    X(occupancy, "cuOccupancyMaxActiveBlocksPerMultiprocessor", NULL,                              \
      (int *, CUfunction, int, size_t))                                                            \
    X(memset_d8_async, "cuMemsetD8Async", NULL, (CUdeviceptr, unsigned char, size_t, CUstream))    \
    X(primary_get_state, "cuDevicePrimaryCtxGetState", NULL, (CUdevice, unsigned int *, int *))    \
    X(primary_retain, "cuDevicePrimaryCtxRetain", NULL, (CUcontext *, CUdevice))                   \
    X(memset_d8_async_ptsz, "cuMemsetD8Async_ptsz", "cuMemsetD8Async",                             \
      (CUdeviceptr, unsigned char, size_t, CUstream))                                              \
    X(kernel_get_library, "cuKernelGetLibrary", NULL, (CUlibrary *, CUkernel))                     \
    X(func_get_module, "cuFuncGetModule", NULL, (CUmodule *, CUfunction))                          \
    X(library_get_module, "cuLibraryGetModule", NULL, (CUmodule *, CUlibrary))                    \
    X(library_get_kernel, "cuLibraryGetKernel", NULL, (CUkernel *, CUlibrary, const char *))       \
    /* graph.c: a child graph node's graph, a graph's nodes, a node's type, a kernel node's        \
     * parameters (the _v2 struct, with its context) */                                            \
    X(graph_child, "cuGraphChildGraphNodeGetGraph", NULL, (CUgraphNode, CUgraph *))                \
    X(graph_nodes, "cuGraphGetNodes", NULL, (CUgraph, CUgraphNode *, size_t *))                    \
    X(graph_node_type, "cuGraphNodeGetType", NULL, (CUgraphNode, int *))                           \
    X(graph_kernel_node_get, "cuGraphKernelNodeGetParams_v2", NULL,                                \
      (CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2 *))                                                 \
    /* priority.c: a device's UUID (16 bytes), which names it across processes; the thread's      \
     * stream capture mode, set to relaxed around its own event calls */                           \
    X(device_get_uuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid", (unsigned char *, CUdevice))       \
    X(exchange_capture_mode, "cuThreadExchangeStreamCaptureMode", NULL, (int *))

/* green.c: SM partitions (green contexts) and what confining a launch takes, as g_drv.green.
 * The same columns as CLC_DRIVER_TABLE. */
#define CLC_DRIVER_GREEN_TABLE(X)                                                                  \
    X(get_resource, "cuDeviceGetDevResource", NULL, (CUdevice, cu_dev_resource *, int))            \
    X(split, "cuDevSmResourceSplitByCount", NULL,                                                  \
      (cu_dev_resource *, unsigned *, const cu_dev_resource *, cu_dev_resource *, unsigned,        \
       unsigned))                                                                                  \
    X(generate_desc, "cuDevResourceGenerateDesc", NULL,                                            \
      (CUdevResourceDesc *, cu_dev_resource *, unsigned))                                          \
    X(create, "cuGreenCtxCreate", NULL, (CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned))     \
    X(destroy, "cuGreenCtxDestroy", NULL, (CUgreenCtx))                                            \
    X(stream_create, "cuGreenCtxStreamCreate", NULL, (CUstream *, CUgreenCtx, unsigned, int))      \
    X(stream_sync, "cuStreamSynchronize", NULL, (CUstream))                                        \
    X(stream_destroy, "cuStreamDestroy_v2", NULL, (CUstream))                                      \
    X(stream_priority, "cuStreamGetPriority", NULL, (CUstream, int *))                             \
    X(stream_priority_ptsz, "cuStreamGetPriority_ptsz", "cuStreamGetPriority", (CUstream, int *))  \
    X(wait_event, "cuStreamWaitEvent", NULL, (CUstream, CUevent, unsigned))                        \
    X(wait_event_ptsz, "cuStreamWaitEvent_ptsz", "cuStreamWaitEvent",                             \
      (CUstream, CUevent, unsigned))                                                               \
    X(ctx_from_green, "cuCtxFromGreenCtx", NULL, (CUcontext *, CUgreenCtx))                        \
    X(ctx_set_flags, "cuCtxSetFlags", NULL, (unsigned))                                            \
    /* cuStreamGetCaptureInfo_v3 (CUDA 12.3+, as conditional nodes are: edge data before the      \
     * count). */                                                                                  \
    X(capture_info, "cuStreamGetCaptureInfo_v3", NULL,                                             \
      (CUstream, int *, cuuint64_t *, CUgraph *, const CUgraphNode **, const void **, size_t *))   \
    X(capture_info_ptsz, "cuStreamGetCaptureInfo_v3_ptsz", "cuStreamGetCaptureInfo_v3",            \
      (CUstream, int *, cuuint64_t *, CUgraph *, const CUgraphNode **, const void **, size_t *))

#define CLC_DRIVER_MEMBER(member, name, fallback, params) CUresult(*member) params;
typedef struct {
    CLC_DRIVER_TABLE(CLC_DRIVER_MEMBER)
    struct {
        CLC_DRIVER_GREEN_TABLE(CLC_DRIVER_MEMBER)
    } green;
} clc_driver;
extern CLC_HIDDEN clc_driver g_drv;

/* The stream's capture status (cuStreamIsCapturing, or its _ptsz variant): the query's
 * CUresult, *status set (CU_STREAM_CAPTURE_STATUS_NONE when the driver lacks the query). */
static inline CUresult clc_stream_capture_status(CUstream stream, int ptsz, int *status) {
    CUresult (*is_capturing)(CUstream, int *) =
        ptsz ? g_drv.stream_is_capturing_ptsz : g_drv.stream_is_capturing;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return is_capturing ? is_capturing(stream, status) : CUDA_SUCCESS;
}
int clc_driver_load(void); /* fills g_drv; 1 when done */

/* ---- process-wide settings, read from the environment once --------------------------------- */
typedef struct {
    int configured; /* clc-run's settings were found (settings.c) */
    int verbose;
    clc_outcome on_error; /* what launches get when clc cannot decide */
    const char *output;   /* capture path (CLC_OUTPUT); NULL: no capture */
    int root_pid;         /* the pid clc-run started; other processes are children */
    pid_t pid;            /* this process (set at start and in a forked child): a vfork child,
                             which shares its parent's memory, is not it */
    int force;
    int unsettled; /* none were, but the process is of a clc-run run (CLC_FALLBACK) */
} clc_settings;
extern CLC_HIDDEN clc_settings g_cfg;

/* ---- settings: what clc-run gave the program, fixed at start (settings.c) ------------------ */
int clc_settings_load(void);            /* 1 when the process has clc-run's settings */
/* For a process without them: 1 when CLC_FALLBACK says it is of a clc-run run (told to clc-run),
 * with *deny its on_error. */
int clc_settings_fallback(int *deny);
const char *clc_setting(const char *key); /* a setting's value, NULL when not set */
int clc_policy_confines(void);     /* a rule confines by a green context (sm_share) */
int clc_policy_program_wide(void); /* a rule confines whole processes (scope: program) */
/* Tells clc-run something about this process ("start", "exec", "capture", ...: a word and a
 * text), over its status socket; nothing when clc-run gave none. */
void clc_announce(const char *what, const char *text);

/* ---- a launch's `extra` argument: {BUFFER_POINTER, p, BUFFER_SIZE, &n, END} in any order -- */
#define CLC_EXTRA_MAX_PAIRS 64
/* Its buffer (NULL when not given) and stated size (0 when not given): 0, or -1 when it holds
 * another key or no END within CLC_EXTRA_MAX_PAIRS pairs. */
static inline int clc_parse_extra(void **extra, void **buffer, size_t *size) {
    *buffer = NULL;
    *size = 0;
    for (int k = 0; k < 2 * CLC_EXTRA_MAX_PAIRS; k += 2) {
        if (extra[k] == CU_LAUNCH_PARAM_END) return 0;
        if (extra[k] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            *buffer = extra[k + 1];
        else if (extra[k] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[k + 1])
            *size = *(const size_t *)extra[k + 1];
        else
            return -1;
    }
    return -1;
}

/* ---- said once: true at the first evaluation of this very expression, in any thread ------- */
#define CLC_FIRST_TIME()                                                                      \
    __extension__({                                                                           \
        static _Atomic int said_;                                                             \
        !atomic_exchange(&said_, 1);                                                          \
    })

/* ---- a lock waited for at most `ms` milliseconds (ms <= 0: for as long as it takes); 1 when it
 * is held. A fatal signal's handler uses it: the thread it interrupted may hold the lock. ---- */
int clc_lock_within(pthread_mutex_t *m, int ms);

/* ---- logging: every clc problem is reported once, to stderr and into the capture ---------- */
void clc_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An INFO message kept in the capture (the report's Messages), said on stderr with -v only. */
void clc_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Where warnings and errors go besides stderr (the capture: process.c sets it at start). */
typedef void (*clc_log_sink)(int level, const char *text, size_t len);
void clc_log_set_sink(clc_log_sink sink);
#define clc_debug(...)                                                                        \
    do {                                                                                      \
        if (unlikely(g_cfg.verbose)) clc_log(CLC_MSG_INFO, __VA_ARGS__);                      \
    } while (0)

/* A warning said once where it stands: each place that says one keeps its own once, so one
 * warning said does not silence another. */
#define CLC_WARN_ONCE(...)                                                                    \
    do {                                                                                      \
        if (CLC_FIRST_TIME()) clc_log(CLC_MSG_WARNING, __VA_ARGS__);                          \
    } while (0)

/* ---- inside clc: set while this thread does clc's own work. A hook entered then (clc's own
 * driver calls, a signal handler that interrupted clc) does not start that work again: the
 * loading, teardown and lookup hooks pass through, and a launch is decided from the decision
 * cache alone (gate.h). Code that sets it restores what it found. */
extern CLC_TLS int t_in_clc;

/* ---- the program's signals held across clc's slow work: a first sight (allocations, locks, the
 * engine, the driver's queries) and the driver's own work behind a hook that loads or unloads
 * code. A signal handler that launches there would run inside code that is not re-entrant (a
 * launch inside the driver's module load hangs the real driver, with or without clc); held, it
 * runs when the work ends, and its launches are decided as anywhere else. Faults (SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS), SIGABRT and the signals whose default ends the
 * program, where the program keeps that default, are never held. Two system calls: for the
 * slow paths only, never a launch's fast path. */
void clc_signals_hold(sigset_t *old);
/* Signals whose default action clc's own handler stands for (the program keeps the default:
 * hooks/leave.c), bit sig - 1: never held, so that they end the process as they would without
 * clc (Ctrl-C, SIGTERM during a long first sight). */
extern CLC_HIDDEN _Atomic uint64_t clc_default_signals;
static inline void clc_signals_release(const sigset_t *old) {
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* ---- what every launch reads (real.c), and whether the driver is placed ------------------ */
/* What every launch reads, together in one cache line. */
typedef struct {
    _Atomic int driver_ready;
    struct clc_entry *_Atomic table; /* the decision cache (records.h), mapped at the
                                        first decision */
    CUresult (*ctx_get_current)(CUcontext *);
    int priority; /* CLC_PRIORITY_LC, CLC_PRIORITY_BE, or 0: set once at start */
} __attribute__((aligned(64))) clc_hot;
extern clc_hot g_hot;

/* The calling thread's current context (NULL when none, or before the driver is placed). */
static inline CUcontext current_ctx(void) {
    CUcontext ctx = NULL;
    if (likely(g_hot.ctx_get_current != NULL)) g_hot.ctx_get_current(&ctx);
    return ctx;
}

/* Whether the driver's helpers are known (g_drv). Below the hooks layer this only reads the
 * flag; the hooks start the process and place the driver on first use (clc_hook_ready). */
static inline int clc_driver_ready(void) {
    return likely(atomic_load_explicit(&g_hot.driver_ready, memory_order_acquire));
}
/* ---- the files clc writes (files.c) ---------------------------------------------------------- */
/* The directory holding `path`'s last component, walked without following a symbolic link
 * another user controls (EPERM); the last component into `last`. An O_PATH descriptor, or -1. */
int clc_open_parent(const char *path, char *last, size_t last_size);
struct stat;
/* A new regular file at `path`, mode 0600, never through such a link nor over an existing file
 * (with `force`, an existing file of this user's is replaced, never truncated). *st its
 * identity. -1 with errno (EEXIST, EPERM, EINVAL: not a regular file). */
int clc_create_file(const char *path, int force, struct stat *st);
/* The same file again, for writing (at its end, and in place): -1 (ESTALE) when `path` now names
 * another file. */
int clc_reopen_file(const char *path, const struct stat *was);

#endif /* CLC_CORE_H */
