/* SPDX-License-Identifier: Apache-2.0
 *
 * shim.h: what the parts of stage 1 (the preload library) share.
 *
 * Stage 1 must build where no CUDA toolkit is installed (pip install on a machine with only
 * a driver), so the few driver types it needs are declared here by layout, from cuda.h of
 * CUDA 13.0, instead of including cuda.h (whose #defines would also rename our hooks).
 *
 * Layers, lowest first. A file calls into its own layer or those below it, never above, and no
 * files call each other in a loop; a lower file that needs something of a higher one gets it as
 * a function pointer (clc_log_set_sink, the `tell` and `published` arguments below).
 * tests/unit/test_shim_layers.py reads this list and checks both on the compiled objects.
 *   core:     core.c settings.c real.c files.c
 *   records:  decision_cache.c capture.c cupti.c timing.c
 *   deciding: decide.c decider.c bridge_loader.c replace.c green.c priority.c
 *   hooks:    launch.c graph.c load.c context.c process.c leave.c image.c
 *   entry:    interpose.c dlopen.c
 */
#ifndef CLC_SHIM_H
#define CLC_SHIM_H

#include <pthread.h>
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

typedef struct { /* CUDA_KERNEL_NODE_PARAMS_v1 */
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;

typedef struct { /* CUDA_KERNEL_NODE_PARAMS_v2: func, or kern in ctx when func is NULL */
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
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
    X(cuStreamQuery_ptsz, (CUstream stream))

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

/* Driver helpers stage 1 calls itself, resolved from the same libcuda. */
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

typedef struct {
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*ctx_synchronize)(void);
    CUresult (*kernel_get_name)(const char **, CUkernel);
    CUresult (*func_get_name)(const char **, CUfunction);
    CUresult (*kernel_get_param_info)(CUkernel, size_t, size_t *, size_t *);
    CUresult (*func_get_param_info)(CUfunction, size_t, size_t *, size_t *);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_record_ptsz)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_synchronize)(CUevent);
    CUresult (*event_elapsed)(float *, CUevent, CUevent);
    CUresult (*event_destroy)(CUevent);
    CUresult (*stream_is_capturing)(CUstream, int *);
    CUresult (*stream_is_capturing_ptsz)(CUstream, int *);
    CUresult (*occupancy)(int *, CUfunction, int, size_t);
    CUresult (*memset_d8_async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*primary_get_state)(CUdevice, unsigned int *, int *);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*memset_d8_async_ptsz)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*kernel_get_library)(CUlibrary *, CUkernel);
    CUresult (*func_get_module)(CUmodule *, CUfunction);
    CUresult (*library_get_module)(CUmodule *, CUlibrary);
    CUresult (*library_get_kernel)(CUkernel *, CUlibrary, const char *);
    /* graph.c: a child graph node's graph, a graph's nodes, a node's type, a kernel node's
     * parameters (the _v2 struct, with its context) */
    CUresult (*graph_child)(CUgraphNode, CUgraph *);
    CUresult (*graph_nodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*graph_node_type)(CUgraphNode, int *);
    CUresult (*graph_kernel_node_get)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2 *);
    /* priority.c: a device's UUID (16 bytes), which names it across processes; the thread's
     * stream capture mode, set to relaxed around its own event calls */
    CUresult (*device_get_uuid)(unsigned char *, CUdevice);
    CUresult (*exchange_capture_mode)(int *);
    /* green.c: SM partitions (green contexts) and what confining a launch takes */
    struct {
        CUresult (*get_resource)(CUdevice, cu_dev_resource *, int);
        CUresult (*split)(cu_dev_resource *, unsigned *, const cu_dev_resource *, cu_dev_resource *,
                          unsigned, unsigned);
        CUresult (*generate_desc)(CUdevResourceDesc *, cu_dev_resource *, unsigned);
        CUresult (*create)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
        CUresult (*destroy)(CUgreenCtx);
        CUresult (*stream_create)(CUstream *, CUgreenCtx, unsigned, int);
        CUresult (*stream_sync)(CUstream);
        CUresult (*stream_destroy)(CUstream);
        CUresult (*stream_priority)(CUstream, int *);
        CUresult (*stream_priority_ptsz)(CUstream, int *);
        CUresult (*wait_event)(CUstream, CUevent, unsigned);
        CUresult (*wait_event_ptsz)(CUstream, CUevent, unsigned);
        CUresult (*ctx_from_green)(CUcontext *, CUgreenCtx);
        CUresult (*ctx_push)(CUcontext);
        CUresult (*ctx_pop)(CUcontext *);
        CUresult (*ctx_set_flags)(unsigned);
        /* cuStreamGetCaptureInfo_v3 (CUDA 12.3+, as conditional nodes are: edge data before the
         * count). */
        CUresult (*capture_info)(CUstream, int *, cuuint64_t *, CUgraph *, const CUgraphNode **,
                                 const void **, size_t *);
        CUresult (*capture_info_ptsz)(CUstream, int *, cuuint64_t *, CUgraph *,
                                      const CUgraphNode **, const void **, size_t *);
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

/* A launch as the program made it, or a graph kernel node as it made or changed it, beyond the
 * kernel: built once by the hook and passed by pointer to the gate (gate.h), the decision
 * (decide.c) and the replace path (replace.c). */
typedef struct {
    uint32_t entry_point; /* CLC_ENTRY_* */
    uint32_t grid[3], block[3], shmem;
    CUstream stream;
    void **params, **extra;
    const CUlaunchConfig *config; /* cuLaunchKernelEx's (its attributes), else NULL */
} clc_launch;

/* A wrapped kernel's launch (replace.c): the function, grid and arguments to give the driver
 * instead of the program's. clc_replace_begin returns CUDA_SUCCESS, or an error for a launch
 * it cannot rewrite (the caller then applies on_error); clc_replace_end frees what it made.
 * `graph`: the launch is being captured into a CUDA graph (it gets a graph slot, see
 * CLC_GRAPH_SLOTS, which the caller zeroes in the stream before the launch). */
typedef struct {
    CUfunction f;
    unsigned grid[3];
    void **params;
    void **extra;
    void *heap;
    clc_launch_arg arg;
    size_t extra_size;
    void *extra_pairs[5];
    void *small[33];
} clc_replaced;
CUresult clc_replace_begin(clc_replaced *r, const clc_replacement *rep, const clc_launch *l,
                           int graph);
/* clc_replace_begin's answer when a captured launch finds the context's graph slots used up. */
#define CLC_NO_GRAPH_SLOT CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
/* An attribute the program set on a kernel (cuFuncSetAttribute / cuKernelSetAttribute) after
 * its launches in the current context were wrapped: set on the replacements too. */
void clc_replace_set_attribute(uint64_t handle, int attrib, int value, int device);
static inline void clc_replace_end(clc_replaced *r) {
    if (r->heap) free(r->heap);
}

/* ---- confined kernels: launched on a green context's stream (green.c) --------------------- */
typedef struct {
    void *entry;            /* the green stream's entry, locked until clc_green_end */
    CUstream stream;        /* where to launch */
    unsigned sms;           /* the partition's SMs */
    CUstream program_stream;
    CUresult (*record)(CUevent, CUstream);
    CUresult (*wait)(CUstream, CUevent, unsigned);
} clc_green_launch;
/* Orders the green stream after the program's `stream` for a launch confined as `word`
 * (clc_outcome.replacement); CUDA_SUCCESS, or why the launch cannot be confined. */
CUresult clc_green_begin(clc_green_launch *gl, uint64_t word, CUstream stream, int ptsz);
/* The context of the green context a graph kernel node confined as `word` runs in (the v2
 * node parameters' ctx), made if need be. */
CUresult clc_green_context(uint64_t word, CUcontext *out, unsigned *sms);
/* Orders the program's stream after the launch (made or refused). */
CUresult clc_green_end(clc_green_launch *gl, CUresult launched);
/* A launch that cannot be confined, for one of these reasons: 1 when it is to be denied (the
 * rule's on_unwrappable), else it runs on the whole GPU; said once per reason. */
#define CLC_UNCONFINED_NO_PARTITION 0 /* the partition or its stream could not be made (`why`) */
#define CLC_UNCONFINED_GRAPH_NODE 1   /* a graph kernel node made with the graph API */
#define CLC_UNCONFINED_MULTI_DEVICE 2 /* cuLaunchCooperativeKernelMultiDevice */
#define CLC_UNCONFINED_REFUSED 3      /* the driver refused the launch on the green stream */
#define CLC_UNCONFINED_CONDITIONAL 4  /* a node or captured launch in a conditional node's body */
#define CLC_UNCONFINED_COOPERATIVE 5  /* a cooperative grid larger than the partition holds */
int clc_green_unconfined(uint64_t word, CUresult why, int reason);
/* Cooperative grids: the numbers of one the partition cannot hold, said once with them. */
void clc_green_cooperative_too_large(unsigned blocks, unsigned sms, unsigned per_sm);
/* Conditional nodes' bodies: every kernel in one must be in the conditional node's context, so
 * a green context's cannot be there. The bodies the driver made for a new conditional node
 * (graph.c) are noted; whether `graph` is one (1 too when the table filled and it cannot be
 * told); whether a launch on `stream` is being captured into one. */
void clc_green_note_bodies(CUgraphNode parent, CUgraph owner, CUgraph *bodies, unsigned n);
/* A graph the program destroys: the bodies it holds (and theirs) are dropped. */
void clc_green_forget_graph(CUgraph graph);
int clc_green_is_body(CUgraph graph);
/* The bodies noted for a conditional or child graph node (at most `max`). */
unsigned clc_green_bodies_of(CUgraphNode parent, CUgraph *out, unsigned max);
/* A confined graph node's kernel and its outcome word (clc_green_note_node_kernel), and whether
 * its nodes may be put back in the program's context when the driver will not have them
 * confined: not where its rule's on_unwrappable is deny, nor for a kernel never noted. */
void clc_green_note_node_kernel(CUkernel kern, uint64_t word);
int clc_green_node_kernel_movable(CUkernel kern);
/* Whether `ctx` is a partition's context that clc put graph nodes in (clc_green_context). */
int clc_green_is_node_context(CUcontext ctx);
int clc_green_any_node_context(void);
int clc_green_capturing_into_body(CUstream stream, int ptsz);
/* Contexts the program makes (cuCtxCreate) under a policy that confines: a green context of
 * their own, over the partition (`word`, scope: program) or all the device's SMs (word 0),
 * made current as cuCtxCreate's is. CUDA_SUCCESS with *out, or why not. */
CUresult clc_green_create_context(CUdevice dev, uint64_t word, unsigned flags, CUcontext *out);
/* The program destroys a context: -1 when clc did not make it, else the green context's
 * destruction's result. */
int clc_green_destroy_created(CUcontext ctx, CUresult *result);
void clc_green_forget_context(CUcontext ctx);
void clc_green_forget_stream(CUstream stream);
/* scope: program. The partition's context (cuCtxFromGreenCtx) handed to the program as the
 * device's primary context, counted as one of the program's retains. */
CUresult clc_green_program_retain(CUdevice device, uint64_t word, CUcontext *out);
/* The SMs of the partition whose program context `ctx` is, with its word; 0 when it is none. */
unsigned clc_green_program_sms(CUcontext ctx, uint64_t *word);
/* The program releases the device's primary context: 1 when the device's green contexts were
 * destroyed (its last release, or no program context: the release goes on as without green
 * contexts), with *program the program context that died with them (NULL: none); 0 when the
 * program still holds its program context. */
int clc_green_release(CUdevice device, CUcontext *program);
/* The device's primary context is reset: its green contexts are destroyed (*program as above). */
void clc_green_reset(CUdevice device, CUcontext *program);
void clc_green_after_fork_child(void);

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
} clc_settings;
extern CLC_HIDDEN clc_settings g_cfg;

/* ---- settings: what clc-run gave the program, fixed at start (settings.c) ------------------ */
int clc_settings_load(void);            /* 1 when the process has clc-run's settings */
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
/* Where warnings and errors go besides stderr (the capture: process.c sets it at start). */
typedef void (*clc_log_sink)(int level, const char *text, size_t len);
void clc_log_set_sink(clc_log_sink sink);
#define clc_debug(...)                                                                        \
    do {                                                                                      \
        if (unlikely(g_cfg.verbose)) clc_log(CLC_MSG_INFO, __VA_ARGS__);                      \
    } while (0)

/* ---- inside clc: set while this thread does clc's own work. A hook entered then (clc's own
 * driver calls, a signal handler that interrupted clc) does not start that work again: the
 * loading, teardown and lookup hooks pass through, and a launch is decided from the decision
 * cache alone (gate.h). Code that sets it restores what it found. */
extern CLC_TLS int t_in_clc;

/* ---- the decision cache ------------------------------------------------------------------ */
typedef struct clc_entry {
    /* The first cache line holds all that a plain launch reads and writes. */
    uint64_t handle;
    uint64_t ctx;
    _Atomic uint32_t ready; /* 0 until every other field is written */
    union {
        struct {
            uint16_t n_clauses; /* shape clauses (mode CLC_MODE_CACHED) */
            uint16_t mode;      /* CLC_MODE_* */
        };
        uint32_t shaped; /* 0: `fallback` decides every launch, the fast path's one test */
    };
    clc_outcome fallback;
    _Atomic uint64_t launches;
    uint32_t kernel_id;
    int32_t device;
    /* The rest: shape rules, and counts kept by the slower paths. */
    clc_clause *clauses;                /* n_clauses of them, or NULL */
    struct clc_shape_cache *_Atomic shapes; /* mode CLC_MODE_PER_SHAPE: answers so far */
    const clc_param_info *layout;       /* the parameters (n_params), or NULL when unknown */
    uint32_t n_params, args_end;        /* args_end: the parameter block's size in bytes */
    _Atomic uint64_t denied, failed, recorded, timed, graph_nodes, gpu_ns; /* CLC_KERNEL_COUNTERS
                                                                           but launches */
    _Atomic uint32_t confined_sms; /* the SMs its confined launches last ran on (green.c) */
    uint64_t owner;         /* the CUlibrary or CUmodule the kernel came from; 0: unknown */
    uint64_t snapshot_sum;  /* its counts' sum when the capture last wrote them (under the
                               table's lock) */
    struct clc_entry *prev; /* the same kernel's entry in the table this one was copied from
                               (launches in flight then may still count there): counted too */
} __attribute__((aligned(64))) clc_entry;

/* What every launch reads, together in one cache line. */
typedef struct {
    _Atomic int driver_ready;
    clc_entry *_Atomic table; /* the decision cache, mapped at the first decision */
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
/* process.c: the process's start-up (once, from the constructor or the first hook called before
 * it), then the driver placed; 1 when it is. */
void clc_start(void);
int clc_start_driver(void);
static inline int clc_hook_ready(void) { return clc_driver_ready() || clc_start_driver(); }

#define CLC_CACHE_BITS 16
#define CLC_CACHE_SIZE (1u << CLC_CACHE_BITS)

static inline uint32_t clc_bucket_of(uint64_t handle, uint64_t ctx) {
    uint64_t h = (handle ^ (ctx * 0xff51afd7ed558ccdull)) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> (64 - CLC_CACHE_BITS));
}

/* Lock-free: a bucket is used once `ready` is set (acquire) and never becomes empty again, so
 * the probe for a key ends at the first bucket that is not ready. A forgotten entry (its kernel's
 * module unloaded, its context destroyed) stays as a tombstone whose ctx has CLC_CTX_DESTROYED,
 * which no launch's context has; an insert may reuse it, writing its handle first and its ctx
 * last (release), so a reader that sees the new ctx (acquire) sees the whole new entry. */
static inline clc_entry *clc_cache_find(uint64_t handle, uint64_t ctx) {
    clc_entry *t = atomic_load_explicit(&g_hot.table, memory_order_acquire);
    if (unlikely(!t)) return NULL;
    for (uint32_t i = clc_bucket_of(handle, ctx), n = 0; n < CLC_CACHE_SIZE;
         i = (i + 1) & (CLC_CACHE_SIZE - 1), n++) {
        clc_entry *e = &t[i];
        if (!atomic_load_explicit(&e->ready, memory_order_acquire)) return NULL;
        if (likely(__atomic_load_n(&e->ctx, __ATOMIC_ACQUIRE) == ctx && e->handle == handle))
            return e;
    }
    return NULL;
}
/* The kernel's mangled name from the driver, whether the handle is a CUkernel or a
 * CUfunction; NULL when neither getter knows it. */
const char *clc_kernel_name(uint64_t handle);

/* Asks the engine about a new (kernel, context) and publishes its entry; `answer` gets the
 * engine's outcome for this very launch (another thread's entry may have won the insert).
 * decide.c, as is clc_outcome_for. */
clc_entry *clc_cache_decide(uint64_t handle, uint64_t ctx, const clc_launch *l,
                            clc_outcome *answer);
/* The outcome of a launch of an entry whose `shaped` is not 0: shape clauses, or the engine
 * asked per shape (answers cached here) or at every launch (answer in *scratch). */
const clc_outcome *clc_outcome_for(clc_entry *e, const clc_launch *l, clc_outcome *scratch);
/* What a first sight found of a kernel (decide.c), for its entry: the layout is malloc'd and
 * becomes the entry's. */
typedef struct {
    uint64_t handle, ctx, owner;
    uint64_t epoch; /* clc_cache_epoch() before the kernel was named */
    uint32_t kernel_id;
    int device;
    clc_param_info *layout;
    uint32_t n_params, end;
    const char *name; /* NULL when the driver could not say */
} clc_new_kernel;
/* Publishes the entry of a first sight decided `d` (the decision cache's insert, under its lock;
 * `published` is called there with each new entry and its name); an entry of another thread
 * may have won. When the table is full, or an unload began or ended since k->epoch, the
 * launch is decided alone, in an entry of the thread's (kernel id CLC_KERNEL_UNCACHED). NULL
 * only without memory. */
clc_entry *clc_cache_insert(const clc_new_kernel *k, const clc_decision *d, const clc_launch *l,
                            void (*published)(const clc_entry *, const char *));
/* Unloads and context teardowns: between begin and end no entry is published (see
 * decision_cache.c); the epoch tells a first sight whether one began or ended meanwhile. */
uint64_t clc_cache_epoch(void);
void clc_cache_unload_begin(void);
void clc_cache_unload_end(void);
/* Whether the table filled with live kernels (said once). */
int clc_cache_table_full(void);
/* An entry's answers per launch shape (mode CLC_MODE_PER_SHAPE): the one for l's shape, or
 * NULL; the engine's answer `o` kept for it (NULL when the kernel has too many shapes). */
const clc_outcome *clc_find_shape(clc_entry *e, const clc_launch *l);
const clc_outcome *clc_add_shape(clc_entry *e, const clc_launch *l, const clc_outcome *o);
/* Each outcome an entry holds (fallback, shape clauses, per-shape answers). */
void clc_entry_outcomes(clc_entry *e, void (*fn)(const clc_outcome *, void *), void *arg);
typedef void (*clc_entry_fn)(clc_entry *, void *);
/* How the engine hears of each forgotten kernel (CLC_LOAD_KERNEL_FORGOTTEN): clc_bridge_module. */
typedef void (*clc_forget_fn)(const clc_module_event *ev);
/* A context was destroyed: its entries are forgotten (see CLC_CTX_DESTROYED), and `tell` told. */
unsigned clc_cache_forget_context(uint64_t ctx, clc_forget_fn tell);
/* Modules or libraries were unloaded: the entries of their kernels (and of kernels whose owner
 * the driver could not say) are forgotten, and `tell` told. */
unsigned clc_cache_forget_owners(const uint64_t *owners, unsigned n, clc_forget_fn tell);
/* The modules that stand for library `lib` in each context holding entries (the driver's
 * cuLibraryGetModule, asked with each such context current): up to max, into out. */
unsigned clc_cache_library_modules(uint64_t lib, uint64_t *out, unsigned max);
/* Every entry forgotten (the process changed its user or groups). */
unsigned clc_cache_forget_all(clc_forget_fn tell);
void clc_cache_each(clc_entry_fn fn, void *arg);
/* Each kernel's counts, forgotten entries included (live entries summed with their copies, the
 * launches decided alone as one kernel, CLC_KERNEL_UNCACHED); `changed_only`: those whose
 * counts changed since the last such walk. With try_ms > 0 the table's lock is waited for at
 * most that long (a fatal signal's handler), then the live entries are read without it. */
void clc_cache_counts(void (*fn)(const clc_kernel_counts *, void *), void *arg, int changed_only,
                      int try_ms);
void clc_cache_after_fork_child(void);

/* ---- the bridge to Python (stage 2) ------------------------------------------------------ */
int clc_bridge_decide(const clc_kernel_query *q, clc_decision *out); /* 0: decided */
int clc_bridge_launch(const clc_kernel_query *q, clc_outcome *out);  /* 0: decided */
void clc_bridge_module(const clc_module_event *ev);
void clc_bridge_exit(void); /* the engine's exit work (on_exit hooks), if Python still runs */
void clc_bridge_after_fork_child(void);

/* ---- the decider: clc-run answers first sights for policies without Python hooks ---------- */
int clc_decider_configured(void);
/* CLC_DECIDE_OK with `out` filled; CLC_DECIDE_ENGINE (the program's engine must decide: a wrap),
 * `out` then what to do without that engine (wraps as their on_unwrappable) when *substitute;
 * or CLC_DECIDE_FAILED (said once; the program's engine decides). */
int clc_decider_decide(const clc_kernel_query *q, clc_decision *out, int *substitute);
/* Whether the process's user or groups changed since the last call (the first call notes
 * them): then the connection to clc-run is dropped, to be made again with the new
 * credentials (decider.c). */
int clc_identity_changed(void);
/* After a change of user or groups, every decision is forgotten (decide.c). */
void clc_identity_follow(void);
/* Whether the process is confined program-wide on `device` (scope: program), and by which
 * CLC_ACTION_CONFINE word (less CLC_CONFINE_DENY): asked once per device (decide.c). */
int clc_program_scope(int device, uint64_t *word);
void clc_decider_after_fork_child(void);

/* ---- the capture ------------------------------------------------------------------------- */
uint64_t clc_now_ns(void);       /* CLOCK_MONOTONIC */
uint64_t clc_launch_time_ns(void); /* the same clock, cheaper: from the TSC once calibrated */
uint32_t clc_tid(void);
int clc_capture_enabled(void);
void clc_capture_write(uint16_t type, const void *body, size_t body_size, const char *text,
                       size_t text_len);
void *clc_capture_begin(uint16_t type, size_t body_size); /* a record's body, filled in place */
void clc_capture_commit(void);                            /* publishes it */
void clc_capture_message(int level, const char *text, size_t len); /* a MESSAGE record */
void clc_capture_kernel(const clc_entry *e, const char *name);
/* A timed launch's GPU time (CLC_TIMING_* source): added to its kernel's counts, and its TIMING
 * record written. */
void clc_capture_gpu_time(clc_entry *e, uint64_t seq, uint64_t gpu_ns, uint32_t source);
/* The counts (KERNEL_STATS, RULE_STATS) and an END record (CLC_END_* `how`, `status`), written
 * to the file at once; again at each call (the last one holds). `in_signal`: from a fatal
 * signal's handler (locks waited for a bounded time). */
void clc_capture_finish(uint32_t how, int32_t status, int in_signal);
/* A launch that no kernel entry could hold (the driver could not be placed): counted in END. */
void clc_capture_undecided(void);
void clc_capture_after_fork_child(void);

/* ---- GPU timing: CUPTI's kernel records where it is present, else events --------------------- */
typedef struct clc_timing clc_timing;
int clc_timing_begin(clc_timing **out, CUstream stream, int ptsz, clc_entry *e, uint64_t seq);
void clc_timing_end(clc_timing *t, CUstream stream, int ptsz, clc_entry *e, uint64_t seq);
void clc_timing_drain_all(void);
/* cupti.c: whether CUPTI times launches (started on the first call); a timed launch between
 * begin and end; the records of all launches so far read */
int clc_cupti_on(void);
void clc_cupti_begin(clc_entry *e, uint64_t seq);
void clc_cupti_end(int launched);
void clc_cupti_drain(void);
void clc_cupti_after_fork_child(void);
/* timing.c: launches of this thread between on and off are timed by events (the several launches
 * of one multi-device call, which CUPTI's launch callbacks do not tell apart) */
void clc_timing_events_only(int on);

/* ---- denied launches per deciding rule (decision_cache.c), counted by the launch gate ------ */
#define CLC_RULE_COUNTERS 4096
extern CLC_HIDDEN _Atomic uint64_t clc_rule_denied[CLC_RULE_COUNTERS];
static inline void clc_count_denied_by(int32_t rule) {
    int64_t i = (int64_t)rule + 2;
    if (i < 0 || i >= CLC_RULE_COUNTERS) i = CLC_RULE_COUNTERS - 1;
    atomic_fetch_add_explicit(&clc_rule_denied[i], 1, memory_order_relaxed);
}
void clc_reset_rule_counts(void);
/* Denied launches per rule so far: fn(rule, count) for each rule that denied any (rule as in
 * clc_outcome.rule; INT32_MAX sums rules past the counters' end). */
void clc_rule_stats(void (*fn)(int32_t rule, uint64_t denied, void *), void *arg);

/* ---- loaded images (image.c): their kind and size, into a load event ----------------------- */
void clc_describe_image(const void *image, clc_module_event *ev);

/* ---- the program's libraries (load.c) ------------------------------------------------------ */
/* The library kernel whose function in the current context `f` is (cudart names a graph node's
 * kernel by such a function), or NULL when f is not of a library the program loaded. */
CUkernel clc_library_kernel_of(CUfunction f);

/* ---- process lifetime (process.c) ---------------------------------------------------------- */
void clc_ensure_exit_handler(void);
/* After the shim's destructor (another library's destructor launches): the capture finished
 * again after each launch that is recorded or refused (clc_late is set then). */
extern CLC_HIDDEN _Atomic int clc_late;
void clc_late_launch(void);

/* ---- leaving without exit() (leave.c) ------------------------------------------------------ */
void clc_leave_start(void); /* libc's _exit, _Exit, syscall, sigaction: found at start */
/* The process leaves without exit handlers or by a fatal signal: the capture finished. */
void clc_leave(uint32_t how, int32_t status);
/* Handlers for the signals whose default action ends the process, where the program keeps the
 * default: the capture is finished, then the signal acts as it would have. */
void clc_signals_start(void);

/* ---- priority classes (priority.c) --------------------------------------------------------- */
#define CLC_PRIORITY_LC 1 /* latency-critical: its launches mark its GPU busy on the board */
#define CLC_PRIORITY_BE 2 /* best-effort: its launches wait while a latency-critical GPU is busy */
/* The class clc-run gave the process (CLC_PRIORITY), with its board opened (and, for a
 * latency-critical process, its slot made): 0 when it has none. Once, at start. */
int clc_priority_start(void);
/* A latency-critical launch on `device`, and the stream it went to (`ptsz`: by a per-thread
 * entry point). */
void clc_priority_lc_launch(int device, CUstream stream, int ptsz);
/* A best-effort launch: held while a latency-critical process is busy on the GPU (down to the
 * floor), and kept from running far ahead of it while one runs on the machine. With held_share,
 * a held launch does not wait: the CLC_ACTION_CONFINE word it is to run under is returned
 * (else 0). */
uint64_t clc_priority_be_launch(int device, CUcontext ctx, CUstream stream, int per_thread);
/* Around a synchronization of a latency-critical process (its GPU counts as busy meanwhile):
 * what was launched before it (begin); settled once it returned (end, `done`: successfully)
 * for the whole context, or for `stream` when every launch since the GPU went busy was on it. */
uint64_t clc_priority_sync_begin(int device, int *counted);
void clc_priority_sync_end(int device, uint64_t launched, int whole_context, CUstream stream,
                           int ptsz, int counted, int done);
/* A context torn down, a stream destroyed: the run-ahead events kept for them are forgotten. */
void clc_priority_forget_context(CUcontext ctx);
void clc_priority_forget_stream(CUstream stream);
/* The process is leaving: its slot removed (from a fatal signal's handler too). */
void clc_priority_leave(int in_signal);
void clc_priority_after_fork_child(void);

/* ---- the files clc writes (files.c) ---------------------------------------------------------- */
/* The directory holding `path`'s last component, walked without following a symbolic link
 * another user controls (EPERM); the last component into `last`. An O_PATH descriptor, or -1. */
int clc_open_parent(const char *path, char *last, size_t last_size);
struct stat;
/* A new regular file at `path`, mode 0600, never through such a link nor over an existing file
 * (with `force`, an existing file of this user's is replaced, never truncated). *st its
 * identity. -1 with errno (EEXIST, EPERM, EINVAL: not a regular file). */
int clc_create_file(const char *path, int force, struct stat *st);
/* The same file again, for appending: -1 (ESTALE) when `path` now names another file. */
int clc_reopen_file(const char *path, const struct stat *was);

#endif /* CLC_SHIM_H */
