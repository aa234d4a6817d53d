/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fake_cuda.c: a stand-in for the NVIDIA driver library, built as libcuda.so.1, so that clc's
 * shim can be tested on CI machines without a GPU.
 *
 * Nothing runs on a device: a launch is validated the way the real driver validates it (handle
 * types, current context, launch shape, stream) and then only counted. The counters are exact
 * and per kernel name, so a test can compare what the driver really received with what clc
 * recorded, allowed or denied. The behaviour the shim depends on is modelled after the real
 * driver: typed handles, a thread-local current context, images that name their kernels, and
 * cuGetProcAddress handing out per-thread-stream (_ptsz) and ABI-versioned (_v2) variants.
 *
 * Kernel parameters: each image entry's PTX parameter list gives its layout (offsets and sizes
 * as nvcc lays them out), which cuKernelGetParamInfo/cuFuncGetParamInfo report and launches are
 * checked against: a kernel that takes parameters needs kernelParams or a well-formed `extra`
 * whose buffer holds them all. Entries declared `NAME(\n)` or without a list take none.
 *
 * Cubins (ELF for the GPU, such as clc's wrapped kernels linked by nvJitLink) load too: their
 * kernels are the symbol table's entry functions, with no parameter layout (launches of them
 * take any arguments), and their managed variables are zeroed host buffers. Device memory
 * (cuMemAlloc) is host memory too, so that memsets really write it; a test reads it back.
 *
 * Events complete instantly by default. With FAKE_CUDA_LAZY_EVENTS=1 in the environment (read
 * once, when the library is loaded) they behave like a real GPU's instead: see "events" below.
 *
 * Test-only entry points (fake_cuda_*) are at the end of the file.
 */
#define _GNU_SOURCE /* memmem */
/* Declare every variant the real library exports (legacy names, _v2, _ptsz) with its exact
 * signature: this is the mode the driver itself is built in, so the compiler checks each
 * definition below against the real header. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAKE_DRIVER_VERSION 13000
#define FAKE_NS_PER_LAUNCH 5000ull /* the fake GPU clock advances this much per kernel run */
#define FATBIN_WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xBA55ED50u
#define MAX_BLOCK_THREADS 1024u
#define DEFAULT_DYN_SMEM 49152 /* what a kernel may use before cuFuncSetAttribute raises it */
#define MAX_DYN_SMEM 232448    /* the opt-in ceiling of an sm_90 part */
#define MAX_KERNEL_NAMES 4096
#define FAKE_SMS 132          /* the device's SMs, for green contexts */
#define FAKE_SMS_ALL FAKE_SMS /* where a launch off a green stream runs: SMs [0, FAKE_SMS) */
/* Occupancy, cuOccupancyMaxActiveBlocksPerMultiprocessor: an SM holds this many threads and at
 * most this many blocks (an sm_90 part's limits), and MAX_DYN_SMEM of shared memory. */
#define SM_THREADS 2048
#define SM_BLOCKS 32

/* ---- handles -------------------------------------------------------------------------------
 * Every handle points at a struct whose first field is a type tag, so that a handle of the
 * wrong kind is refused as the real driver refuses it. Destroyed or unloaded objects are not
 * freed, only re-tagged as dead: a stale handle then fails with CUDA_ERROR_INVALID_HANDLE
 * instead of reading freed memory (the tests leak a few hundred bytes at most). */

enum handle_tag {
    TAG_DEAD = 0x0dead000,
    TAG_CTX = 0x0c7a0001,
    TAG_MODULE,
    TAG_FUNCTION,
    TAG_LIBRARY,
    TAG_KERNEL,
    TAG_STREAM,
    TAG_EVENT,
    TAG_GRAPH,
    TAG_NODE,
    TAG_EXEC,
    TAG_GREEN,
    TAG_DESC,
};

/* A handle's tag; the default stream handles (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) and NULL
 * have none. */
static uint32_t tag_of(const void *h) { return (uintptr_t)h > 0xff ? *(const uint32_t *)h : 0; }

struct seen_launch;

/* One per distinct kernel name across all images; never freed, so launch paths can keep
 * pointers to it and count without taking a lock. */
struct kname {
    char *name;
    atomic_ulong launches;   /* direct launches through any cuLaunch* entry point */
    atomic_ulong graph;      /* runs as a node of a launched graph */
    atomic_ulong green;      /* launches of it on a green context's stream */
    atomic_uint where;       /* its last launch's SMs: first << 16 | count */
    atomic_int ordered;      /* whether that launch was in its program stream's order */
    struct seen_launch *seen; /* its last launch while launches are observed; under g_lock */
};

struct CUgreenCtx_st;

struct CUctx_st {
    uint32_t tag;
    CUdevice dev;
    int primary;
    struct CUgreenCtx_st *green; /* the green context this context was converted from */
    /* Lazy events only (see "events"): bumped when the context is torn down, which kills the
     * events created before; and how far cuCtxSynchronize and the default stream's
     * synchronization have run the context's work (in event record numbers). */
    atomic_uint epoch;
    atomic_ullong synced;
    atomic_ullong default_synced;
};

struct CUgreenCtx_st {
    uint32_t tag;
    CUdevice dev;
    unsigned first, sms;
    struct CUctx_st ctx; /* cuCtxFromGreenCtx */
};

/* A kernel's parameters as its image's PTX declares them: where each one lies in the parameter
 * buffer (cuFuncGetParamInfo), and the buffer's size (`extra` must hold at least that much).
 * Built once per image entry and never freed, like the names. */
struct param_info {
    size_t offset, size;
};

struct param_layout {
    unsigned n;
    size_t total; /* the end of the last parameter */
    struct param_info *p;
};

struct CUfunc_st {
    uint32_t tag;
    struct CUmod_st *module; /* the module it came from (cuFuncGetModule); NULL in a library */
    struct kname *k;
    const struct param_layout *params; /* NULL: no parameter list (or a cubin's kernel) */
    int from_cubin;                    /* its image was a cubin, not PTX */
    int attrs[CU_FUNC_ATTRIBUTE_MAX];
};

struct CUmod_st {
    uint32_t tag;
    struct CUctx_st *ctx; /* the context current when it was loaded (a library's: NULL) */
    unsigned n, cap;
    struct CUfunc_st *funcs;
    struct CUmod_st *next_free; /* unloaded: kept for the next load, as the real driver does */
};

/* A CUkernel is context-independent; its CUfunction (cuKernelGetFunction) lives inside it. */
struct CUkern_st {
    uint32_t tag;
    struct CUlib_st *library; /* cuKernelGetLibrary */
    struct kname *k;
    struct CUfunc_st func;
};

/* A managed variable of a cubin (cuLibraryGetManaged): zeroed at load, per library. */
struct managed_var {
    char *name;
    size_t size;
    void *data;
};

struct CUlib_st {
    uint32_t tag;
    unsigned n, cap;
    struct CUkern_st *kernels;
    /* What cuLibraryGetModule gives, and cuFuncGetModule of its kernels' functions: one module
     * standing for the library (the fake has one context's worth of everything). */
    struct CUmod_st module;
    struct CUlib_st *next_free;
    unsigned n_managed;
    struct managed_var *managed;
};

struct CUstream_st {
    uint32_t tag;
    CUcontext ctx;
    struct CUgraph_st *capture_graph; /* cuStreamBeginCaptureToGraph's graph */
    atomic_ullong synced; /* lazy events: the last record number this stream has run up to */
    int capture;          /* CUstreamCaptureStatus (stream capture, below) */
    int capture_mode;     /* CUstreamCaptureMode it was begun with */
    unsigned flags;
    int priority;
    struct CUgreenCtx_st *green; /* made by cuGreenCtxStreamCreate */
    /* Stream order (see "green contexts"): under g_lock. */
    unsigned long long ops;       /* work items queued on it so far */
    struct CUstream_st *dep;      /* the stream and work count of its latest cuStreamWaitEvent */
    unsigned long long dep_ops;
    struct CUstream_st *join;     /* a green stream whose launch this stream must wait for */
    unsigned long long join_ops;
};

struct CUevent_st {
    uint32_t tag;
    unsigned flags;
    int recorded;
    struct CUstream_st *rec_stream; /* stream order: where and after how much work it was */
    unsigned long long rec_ops;     /* last recorded (under g_lock) */
    uint64_t t_ns; /* the fake GPU clock when recorded */
    /* Lazy events only: the context current at creation and its epoch then (fixed for the
     * event's life), the number of its latest record and the synchronization mark of the
     * stream it was recorded on. */
    CUcontext ctx;
    unsigned epoch;
    atomic_ullong seq;
    _Atomic(atomic_ullong *) mark;
    _Atomic uint64_t wall_ns; /* CLOCK_MONOTONIC at the latest record (FAKE_CUDA_EVENT_US) */
};

/* A node is a kernel node (k: its kernel) or, made through cuGraphAddNode, a memset node (k
 * NULL: it does nothing when the graph runs). Its type never changes. */
#define MAX_BODIES 4
struct CUgraphNode_st {
    uint32_t tag;
    CUgraphNodeType type;
    struct CUgraph_st *graph;
    struct kname *k;
    const struct CUctx_st *ctx; /* a kernel node's context; a conditional node's */
    CUDA_KERNEL_NODE_PARAMS kp;  /* a kernel node's parameters (cuGraphKernelNodeGetParams) */
    struct CUgraph_st *child;    /* a child graph node's copy of its graph */
    struct CUgraph_st *bodies[MAX_BODIES]; /* a conditional node's bodies */
    unsigned n_bodies;
    unsigned where; /* a kernel node's SMs (first << 16 | count): a green context's, or all */
    struct CUgraphNode_st *next;
};

struct CUgraph_st {
    uint32_t tag;
    struct CUgraphNode_st *head;
    struct CUgraphNode_st **tailp;
};

struct exec_node {
    struct CUgraphNode_st *node;
    struct kname *k; /* NULL for a memset node */
    unsigned where;
};

/* Instantiation copies the kernel of every node: later changes to the graph do not reach the
 * executable graph, only cuGraphExecKernelNodeSetParams does (as in the real driver). */
struct CUgraphExec_st {
    uint32_t tag;
    struct CUgraph_st *graph;
    unsigned n;
    struct exec_node *nodes;
};

/* The layouts cudart registers code with (see the README of tests/native). */
struct fatbin_wrapper {
    uint32_t magic;
    uint32_t version;
    const void *data;
    void *filename_or_fatbins;
};

struct fatbin_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t payload_size;
};

/* ---- global state ---------------------------------------------------------------------------- */

/* Launch paths only touch atomics; g_lock guards the name table, loads and graphs. It is
 * taken around fork() so that a child forked while another thread loads code does not
 * inherit it locked. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_initialized;
static atomic_int g_primary_refs;
static atomic_int g_primary_active; /* made by a retain; gone at a reset or the last release */
static struct CUctx_st g_primary = {.tag = TAG_CTX, .dev = 0, .primary = 1};
static __thread CUcontext tls_ctx; /* cuInit makes nothing current, like the real driver */
static atomic_ullong g_clock_ns;
static int g_lazy_events;          /* FAKE_CUDA_LAZY_EVENTS=1; set before any CUDA call */
/* FAKE_CUDA_EVENT_US=N (with lazy events): the work before a record finishes by itself N us
 * after the record, as a GPU that runs behind the program does; 0 (unset): never by itself. */
static uint64_t g_event_wall_ns;
/* Handles are reused after an unload, as the real driver's are (measured on driver 580: the next
 * module's kernel gets the unloaded one's handle): an unloaded module or library is kept and
 * given to the next load that fits in it. FAKE_CUDA_NO_REUSE=1 makes every load new. */
static int g_no_reuse;
static struct CUmod_st *g_free_modules;
static struct CUlib_st *g_free_libraries;
static atomic_ullong g_record_seq; /* lazy events: numbers every cuEventRecord, from 1 */

static struct kname *g_names[MAX_KERNEL_NAMES]; /* sorted by name */
static unsigned g_nnames;

/* Counted per entry point so tests can tell which variant reached the driver. */
enum entry {
    E_LAUNCH,
    E_LAUNCH_PTSZ,
    E_LAUNCH_EX,
    E_LAUNCH_EX_PTSZ,
    E_COOP,
    E_COOP_PTSZ,
    E_GRAPH_LAUNCH,
    E_GRAPH_LAUNCH_PTSZ,
    E_GRAPH_ADD,
    E_GRAPH_ADD_V2,
    E_NODE_SET,
    E_NODE_SET_V2,
    E_EXEC_SET,
    E_EXEC_SET_V2,
    E_ADD_NODE,
    E_ADD_NODE_V2,
    E_NODE_SET_PARAMS,
    E_EXEC_NODE_SET_PARAMS,
    E_COUNT
};
static const char *const entry_names[E_COUNT] = {
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuGraphAddKernelNode",
    "cuGraphAddKernelNode_v2",
    "cuGraphKernelNodeSetParams",
    "cuGraphKernelNodeSetParams_v2",
    "cuGraphExecKernelNodeSetParams",
    "cuGraphExecKernelNodeSetParams_v2",
    "cuGraphAddNode",
    "cuGraphAddNode_v2",
    "cuGraphNodeSetParams",
    "cuGraphExecNodeSetParams",
};
static atomic_ulong g_entry[E_COUNT];
static atomic_ulong g_total_launches, g_total_graph;
/* The fake CUPTI's (tests/native/fake_cupti.c): told of each launch that ran, inside the call,
 * as CUPTI's callbacks and kernel records are. */
static void (*_Atomic g_cupti_launched)(unsigned gx, unsigned bx, int entry);
void fake_cuda_set_cupti(void (*launched)(unsigned, unsigned, int))
{
    atomic_store(&g_cupti_launched, launched);
}

static void lock(void) { pthread_mutex_lock(&g_lock); }
static void unlock(void) { pthread_mutex_unlock(&g_lock); }

/* A child forked after the driver was initialized cannot use it: every call that needs it
 * fails with CUDA_ERROR_NOT_INITIALIZED, as the real driver's launches do (580). */
static atomic_int g_forked;

static void forked_child(void)
{
    unlock();
    if (atomic_load(&g_initialized))
        atomic_store(&g_forked, 1);
}

__attribute__((constructor)) static void fake_init(void)
{
    const char *lazy = getenv("FAKE_CUDA_LAZY_EVENTS");
    g_lazy_events = lazy && strcmp(lazy, "1") == 0;
    const char *event_us = getenv("FAKE_CUDA_EVENT_US");
    g_event_wall_ns = event_us ? strtoull(event_us, NULL, 10) * 1000ull : 0;
    const char *reuse = getenv("FAKE_CUDA_NO_REUSE");
    g_no_reuse = reuse && strcmp(reuse, "1") == 0;
    pthread_atfork(lock, unlock, forked_child);
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS)                                                                    \
            return r_;                                                                             \
    } while (0)

static CUresult need_init(void)
{
    return atomic_load(&g_initialized) && !atomic_load_explicit(&g_forked, memory_order_relaxed)
               ? CUDA_SUCCESS
               : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult need_ctx(void)
{
    TRY(need_init());
    return tag_of(tls_ctx) == TAG_CTX ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static int stream_ok(CUstream s)
{
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
           tag_of(s) == TAG_STREAM;
}

/* ---- kernel names ---------------------------------------------------------------------------- */

/* Binary search; *pos is where the name is or would go. Caller holds g_lock. */
static struct kname *find_name_locked(const char *name, unsigned *pos)
{
    unsigned lo = 0, hi = g_nnames;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        int c = strcmp(g_names[mid]->name, name);
        if (c == 0) {
            *pos = mid;
            return g_names[mid];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *pos = lo;
    return NULL;
}

/* Takes ownership of name. Caller holds g_lock. */
static struct kname *intern_locked(char *name)
{
    unsigned pos;
    struct kname *k = find_name_locked(name, &pos);
    if (k) {
        free(name);
        return k;
    }
    if (g_nnames == MAX_KERNEL_NAMES || !(k = calloc(1, sizeof *k))) {
        free(name);
        return NULL;
    }
    k->name = name;
    memmove(&g_names[pos + 1], &g_names[pos], (g_nnames - pos) * sizeof g_names[0]);
    g_names[pos] = k;
    g_nnames++;
    return k;
}

/* ---- images ---------------------------------------------------------------------------------- */

/* Finds the PTX text inside an image: plain text, a fatbin container, or cudart's wrapper
 * around a container. */
static CUresult image_text(const void *image, const char **text, size_t *len)
{
    uint32_t magic = 0;
    if (image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    /* Neither magic has a zero byte, so a shorter string is text and is not over-read. */
    if (strnlen(image, sizeof magic) == sizeof magic)
        memcpy(&magic, image, sizeof magic);
    if (magic == FATBIN_WRAPPER_MAGIC) {
        struct fatbin_wrapper w;
        memcpy(&w, image, sizeof w);
        if (w.data == NULL || strnlen(w.data, sizeof magic) != sizeof magic)
            return CUDA_ERROR_INVALID_IMAGE;
        image = w.data;
        memcpy(&magic, image, sizeof magic);
        if (magic != FATBIN_MAGIC)
            return CUDA_ERROR_INVALID_IMAGE;
    }
    if (magic == FATBIN_MAGIC) {
        /* The container's entries, back to back: the first uncompressed PTX entry is read
         * (kind 1, no compressed size); a container with none has no code this fake runs. */
        struct fatbin_header h;
        const char *p, *end;
        memcpy(&h, image, sizeof h);
        if (h.header_size < sizeof h)
            return CUDA_ERROR_INVALID_IMAGE;
        /* A container claims its size: one past what any test image holds is refused before
         * it is used as a bound. */
        if (h.payload_size > (64u << 20))
            return CUDA_ERROR_INVALID_IMAGE;
        p = (const char *)image + h.header_size;
        end = p + h.payload_size;
        while (end - p >= 64) {
            uint16_t kind;
            uint32_t header_size, compressed;
            uint64_t size;
            memcpy(&kind, p, sizeof kind);
            memcpy(&header_size, p + 4, sizeof header_size);
            memcpy(&size, p + 8, sizeof size);
            memcpy(&compressed, p + 16, sizeof compressed);
            if (header_size < 64 || header_size > (uint64_t)(end - p) ||
                size > (uint64_t)(end - p) - header_size)
                return CUDA_ERROR_INVALID_IMAGE;
            if (kind == 1 && compressed == 0) {
                *text = p + header_size;
                *len = strnlen(*text, size);
                return CUDA_SUCCESS;
            }
            p += header_size + size;
        }
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    *text = image;
    *len = strlen(image);
    return CUDA_SUCCESS;
}

static int ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '$';
}

static int space_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* ---- parameter lists ---------------------------------------------------------------------------
 * `.entry NAME(.param .u64 a, .param .align 8 .b8 p[16], ...)`: each parameter is `.param`,
 * optionally `.align A`, a type (.b/.u/.s 8..64, .f16/.f32/.f64), attributes such as
 * `.ptr .global .align 4` (which describe the pointee and are skipped), and a name with an
 * optional `[N]` element count. Its size is the type's size times N; it lies at the next offset
 * aligned to A (or to the type's size without .align), as nvcc lays kernel parameters out. */

static const char *skip_spaces(const char *p, const char *end)
{
    while (p < end && space_char(*p))
        p++;
    return p;
}

/* The size in bytes of a PTX scalar type token (".u32" -> 4), 0 when tok is none. */
static size_t type_size(const char *tok, size_t len)
{
    static const char *const types[] = {".b8",  ".u8",  ".s8",  ".b16", ".u16", ".s16", ".f16",
                                        ".b32", ".u32", ".s32", ".f32", ".b64", ".u64", ".s64",
                                        ".f64"};
    static const size_t sizes[] = {1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 8, 8, 8, 8};
    size_t i;
    for (i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strlen(types[i]) == len && memcmp(types[i], tok, len) == 0)
            return sizes[i];
    return 0;
}

/* Reads a decimal number at *pp (advancing it); 0 when there is none. */
static size_t read_number(const char **pp, const char *end)
{
    size_t v = 0;
    const char *p = *pp;
    while (p < end && *p >= '0' && *p <= '9' && v < ((size_t)1 << 40))
        v = v * 10 + (size_t)(*p++ - '0');
    *pp = p;
    return v;
}

/* One `.param ...` declaration, the text in [p, end); appends it to l (capacity checked by the
 * caller). */
static CUresult parse_param(const char *p, const char *end, struct param_layout *l)
{
    size_t align = 0, elem = 0, count = 1, offset;
    int named = 0;

    p = skip_spaces(p, end);
    if ((size_t)(end - p) < 7 || memcmp(p, ".param", 6) != 0 || !space_char(p[6]))
        return CUDA_ERROR_INVALID_IMAGE;
    p += 6;
    for (p = skip_spaces(p, end); p < end; p = skip_spaces(p, end)) {
        const char *t = p;
        if (named)
            return CUDA_ERROR_INVALID_IMAGE; /* nothing may follow the name and its count */
        if (*p == '.') {
            for (p++; p < end && ident_char(*p); p++)
                ;
            if ((size_t)(p - t) == 6 && memcmp(t, ".align", 6) == 0) {
                size_t a;
                p = skip_spaces(p, end);
                a = read_number(&p, end);
                if (a == 0 || (a & (a - 1)) != 0)
                    return CUDA_ERROR_INVALID_IMAGE;
                if (!elem)
                    align = a; /* after the type it is a .ptr attribute: the pointee's */
            } else if (!elem && type_size(t, (size_t)(p - t))) {
                elem = type_size(t, (size_t)(p - t));
            } else if (!elem) {
                return CUDA_ERROR_INVALID_IMAGE; /* an unknown type */
            }
            continue;
        }
        if (!elem || !ident_char(*p))
            return CUDA_ERROR_INVALID_IMAGE;
        while (p < end && ident_char(*p))
            p++;
        p = skip_spaces(p, end);
        if (p < end && *p == '[') {
            p = skip_spaces(p + 1, end);
            count = read_number(&p, end);
            p = skip_spaces(p, end);
            if (count == 0 || p == end || *p != ']')
                return CUDA_ERROR_INVALID_IMAGE;
            p++;
        }
        named = 1;
    }
    if (!named)
        return CUDA_ERROR_INVALID_IMAGE;
    if (!align)
        align = elem;
    offset = (l->total + align - 1) & ~(align - 1);
    l->p[l->n].offset = offset;
    l->p[l->n].size = elem * count;
    l->n++;
    l->total = offset + elem * count;
    return CUDA_SUCCESS;
}

/* The parameter list after an entry's name (p points just past the name): *out is NULL when
 * there is no list, else a layout (of no parameters for `()`). */
static CUresult parse_params(const char *p, const char *end, struct param_layout **out)
{
    const char *close, *q;
    unsigned cap = 1;
    struct param_layout *l;

    *out = NULL;
    p = skip_spaces(p, end);
    if (p == end || *p != '(')
        return CUDA_SUCCESS;
    if (!(close = memchr(p, ')', (size_t)(end - p))))
        return CUDA_ERROR_INVALID_IMAGE;
    for (q = p; q < close; q++)
        cap += *q == ',';
    if (!(l = calloc(1, sizeof *l)) || !(l->p = calloc(cap, sizeof *l->p))) {
        free(l);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p++;
    if (skip_spaces(p, close) != close) { /* `(\n)` declares none */
        for (;;) {
            const char *comma = memchr(p, ',', (size_t)(close - p));
            const char *stop = comma ? comma : close;
            CUresult rc = parse_param(p, stop, l);
            if (rc != CUDA_SUCCESS) {
                free(l->p);
                free(l);
                return rc;
            }
            if (!comma)
                break;
            p = comma + 1;
        }
    }
    *out = l;
    return CUDA_SUCCESS;
}

/* An entry of an image: its kernel name and its parameters. */
struct entry_decl {
    struct kname *k;
    struct param_layout *params;
};

/* The kernels of a PTX text: every `.entry NAME(...)`, without duplicates (the first
 * declaration of a name gives its parameters). */
static CUresult parse_kernels(const char *text, size_t len, struct entry_decl **out, unsigned *n)
{
    const char *end = text + len, *p;
    unsigned cap = 0, count = 0;
    struct entry_decl *ks;

    if (!memmem(text, len, ".version", 8))
        return CUDA_ERROR_INVALID_IMAGE; /* a cubin or garbage: the fake reads PTX only */
    for (p = text; (p = memmem(p, (size_t)(end - p), ".entry", 6)); p += 6)
        cap++;
    if (!(ks = calloc(cap ? cap : 1, sizeof *ks)))
        return CUDA_ERROR_OUT_OF_MEMORY;

    lock();
    for (p = text; (p = memmem(p, (size_t)(end - p), ".entry", 6));) {
        const char *q;
        struct kname *k;
        struct param_layout *params;
        CUresult rc;
        unsigned i;
        p += 6;
        if (p == end || !space_char(*p))
            continue;
        while (p < end && space_char(*p))
            p++;
        for (q = p; q < end && ident_char(*q); q++)
            ;
        if (q == p)
            continue;
        if ((rc = parse_params(q, end, &params)) != CUDA_SUCCESS ||
            !(k = intern_locked(strndup(p, (size_t)(q - p))))) {
            unlock();
            free(ks);
            return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_OUT_OF_MEMORY;
        }
        for (i = 0; i < count && ks[i].k != k; i++)
            ;
        if (i == count) {
            ks[count].k = k;
            ks[count++].params = params;
        } else if (params) {
            free(params->p);
            free(params);
        }
    }
    unlock();
    *out = ks;
    *n = count;
    return CUDA_SUCCESS;
}

/* ---- cubins ----------------------------------------------------------------------------------
 * An ELF image for the GPU (e_machine EM_CUDA). Nothing runs, so only its symbol table is read:
 * the kernels are the functions marked STO_CUDA_ENTRY in st_other, the managed variables the
 * objects marked STO_CUDA_MANAGED (as nvcc and nvJitLink write them). A cubin does not say how
 * its kernels' parameters are laid out in a form the fake reads, so its kernels have none: their
 * launches take any arguments, as those of an entry declared without a list. The real call has no
 * size argument either; the section headers are trusted as the driver trusts them. */

#define ELF_MAGIC 0x464c457fu /* "\x7fELF" */
#define EM_CUDA 190
#define STO_CUDA_ENTRY 0x10
#define STO_CUDA_MANAGED 0x04

static int is_cubin(const void *image)
{
    uint32_t magic = 0;
    /* The magic has no zero byte, so a shorter string is not over-read. */
    if (image && strnlen(image, sizeof magic) == sizeof magic)
        memcpy(&magic, image, sizeof magic);
    return magic == ELF_MAGIC;
}

static void free_managed(struct managed_var *vars, unsigned n)
{
    unsigned i;
    for (i = 0; vars && i < n; i++) {
        free(vars[i].name);
        free(vars[i].data);
    }
    free(vars);
}

/* One symbol: appended to the kernels (an entry function, by its interned name, once) or to the
 * managed variables (vars NULL: not wanted). Caller holds g_lock. */
static CUresult cubin_symbol(const Elf64_Sym *sym, const char *name, struct entry_decl *ks,
                             unsigned *n, struct managed_var *vars, unsigned *nvars)
{
    unsigned type = ELF64_ST_TYPE(sym->st_info), i;
    if (type == STT_FUNC && (sym->st_other & STO_CUDA_ENTRY) && *name) {
        char *copy = strdup(name);
        struct kname *k = copy ? intern_locked(copy) : NULL;
        if (!k)
            return CUDA_ERROR_OUT_OF_MEMORY;
        for (i = 0; i < *n && ks[i].k != k; i++)
            ;
        if (i == *n)
            ks[(*n)++] = (struct entry_decl){k, NULL};
    } else if (vars && type == STT_OBJECT && (sym->st_other & STO_CUDA_MANAGED) && *name &&
               sym->st_shndx != SHN_UNDEF) {
        struct managed_var *v = &vars[*nvars];
        if (!(v->name = strdup(name)) || !(v->data = calloc(1, sym->st_size ? sym->st_size : 1))) {
            free(v->name);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        v->size = sym->st_size;
        (*nvars)++;
    }
    return CUDA_SUCCESS;
}

/* The kernels of a cubin and, when vars is not NULL, its managed variables (*vars, *nvars). */
static CUresult parse_cubin(const unsigned char *elf, struct entry_decl **out, unsigned *n,
                            struct managed_var **vars, unsigned *nvars)
{
    Elf64_Ehdr eh;
    Elf64_Shdr *sh;
    unsigned cap = 0, i, count = 0, nv = 0;
    struct entry_decl *ks;
    struct managed_var *vs = NULL;
    CUresult rc = CUDA_SUCCESS;

    memcpy(&eh, elf, sizeof eh);
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_machine != EM_CUDA || eh.e_shoff == 0 ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0)
        return CUDA_ERROR_INVALID_IMAGE; /* a host ELF, or not one the fake reads */
    /* Copied out: the image need not be aligned for the headers. */
    if (!(sh = malloc(eh.e_shnum * sizeof *sh)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(sh, elf + eh.e_shoff, eh.e_shnum * sizeof *sh);
    for (i = 0; i < eh.e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB)
            continue;
        if (sh[i].sh_entsize != sizeof(Elf64_Sym) || sh[i].sh_link >= eh.e_shnum) {
            free(sh);
            return CUDA_ERROR_INVALID_IMAGE;
        }
        cap += (unsigned)(sh[i].sh_size / sizeof(Elf64_Sym));
    }
    if (!(ks = calloc(cap ? cap : 1, sizeof *ks)) ||
        (vars && !(vs = calloc(cap ? cap : 1, sizeof *vs)))) {
        free(ks);
        free(sh);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    lock();
    for (i = 0; i < eh.e_shnum && rc == CUDA_SUCCESS; i++) {
        const Elf64_Shdr *strtab;
        const char *names;
        size_t j, nsyms = sh[i].sh_size / sizeof(Elf64_Sym);
        if (sh[i].sh_type != SHT_SYMTAB)
            continue;
        strtab = &sh[sh[i].sh_link];
        names = (const char *)elf + strtab->sh_offset;
        for (j = 0; j < nsyms && rc == CUDA_SUCCESS; j++) {
            Elf64_Sym sym;
            memcpy(&sym, elf + sh[i].sh_offset + j * sizeof sym, sizeof sym);
            if (sym.st_name >= strtab->sh_size ||
                strnlen(names + sym.st_name, strtab->sh_size - sym.st_name) ==
                    strtab->sh_size - sym.st_name) {
                rc = CUDA_ERROR_INVALID_IMAGE; /* a name outside its string table */
                break;
            }
            rc = cubin_symbol(&sym, names + sym.st_name, ks, &count, vs, &nv);
        }
    }
    unlock();
    free(sh);
    if (rc != CUDA_SUCCESS) {
        free(ks);
        free_managed(vs, nv);
        return rc;
    }
    *out = ks;
    *n = count;
    if (vars) {
        *vars = vs;
        *nvars = nv;
    }
    return CUDA_SUCCESS;
}

static void func_init(struct CUfunc_st *f, const struct entry_decl *e, int from_cubin)
{
    f->tag = TAG_FUNCTION;
    f->k = e->k;
    f->params = e->params;
    f->from_cubin = from_cubin;
    f->attrs[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK] = MAX_BLOCK_THREADS;
    f->attrs[CU_FUNC_ATTRIBUTE_NUM_REGS] = 32;
    f->attrs[CU_FUNC_ATTRIBUTE_PTX_VERSION] = 80;
    f->attrs[CU_FUNC_ATTRIBUTE_BINARY_VERSION] = 90;
    f->attrs[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES] = DEFAULT_DYN_SMEM;
}

/* Takes ownership of ks. */
static CUresult module_from_entries(CUmodule *out, struct entry_decl *ks, unsigned n,
                                    int from_cubin)
{
    unsigned i;
    struct CUmod_st *m = NULL;
    lock();
    if (g_free_modules && g_free_modules->cap >= n) {
        m = g_free_modules;
        g_free_modules = m->next_free;
        memset(m->funcs, 0, m->cap * sizeof *m->funcs);
    }
    unlock();
    if (!m && (!(m = calloc(1, sizeof *m)) || !(m->funcs = calloc(n ? n : 1, sizeof *m->funcs)))) {
        free(m);
        free(ks);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!m->cap)
        m->cap = n ? n : 1;
    for (i = 0; i < n; i++) {
        func_init(&m->funcs[i], &ks[i], from_cubin);
        m->funcs[i].module = m;
    }
    free(ks);
    m->n = n;
    m->ctx = tls_ctx;
    m->tag = TAG_MODULE;
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult module_from_text(CUmodule *out, const char *text, size_t len)
{
    struct entry_decl *ks;
    unsigned n;
    TRY(parse_kernels(text, len, &ks, &n));
    return module_from_entries(out, ks, n, 0);
}

/* Takes ownership of ks and vars. */
static CUresult library_from_entries(CUlibrary *out, struct entry_decl *ks, unsigned n,
                                     struct managed_var *vars, unsigned nvars, int from_cubin)
{
    unsigned i;
    struct CUlib_st *l = NULL;
    lock();
    if (g_free_libraries && g_free_libraries->cap >= n) {
        l = g_free_libraries;
        g_free_libraries = l->next_free;
        memset(l->kernels, 0, l->cap * sizeof *l->kernels);
    }
    unlock();
    if (!l &&
        (!(l = calloc(1, sizeof *l)) || !(l->kernels = calloc(n ? n : 1, sizeof *l->kernels)))) {
        free(l);
        free(ks);
        free_managed(vars, nvars);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!l->cap)
        l->cap = n ? n : 1;
    for (i = 0; i < n; i++) {
        l->kernels[i].tag = TAG_KERNEL;
        l->kernels[i].k = ks[i].k;
        l->kernels[i].library = l;
        func_init(&l->kernels[i].func, &ks[i], from_cubin);
        l->kernels[i].func.module = &l->module;
    }
    l->module.tag = TAG_MODULE;
    free(ks);
    l->n = n;
    l->managed = vars;
    l->n_managed = nvars;
    l->tag = TAG_LIBRARY;
    *out = l;
    return CUDA_SUCCESS;
}

static CUresult library_from_text(CUlibrary *out, const char *text, size_t len)
{
    struct entry_decl *ks;
    unsigned n;
    TRY(parse_kernels(text, len, &ks, &n));
    return library_from_entries(out, ks, n, NULL, 0, 0);
}

static CUresult library_from_cubin(CUlibrary *out, const void *image)
{
    struct entry_decl *ks;
    struct managed_var *vars;
    unsigned n, nvars;
    TRY(parse_cubin(image, &ks, &n, &vars, &nvars));
    return library_from_entries(out, ks, n, vars, nvars, 1);
}

static CUresult read_file(const char *path, char **text, size_t *len)
{
    FILE *f;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if (path == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(f = fopen(path, "rb")))
        return CUDA_ERROR_FILE_NOT_FOUND;
    for (;;) {
        if (cap - n < 4096) {
            char *nb = realloc(buf, cap + 65536);
            if (!nb) {
                free(buf);
                fclose(f);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            buf = nb;
            cap += 65536;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    buf[n] = '\0';
    *text = buf;
    *len = strlen(buf);
    return CUDA_SUCCESS;
}

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

/* ---- modules and libraries ------------------------------------------------------------------- */

static CUresult module_load_image(CUmodule *module, const void *image)
{
    const char *text;
    size_t len;
    TRY(need_ctx()); /* modules belong to the current context */
    TRY(capture_unsafe());
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_cubin(image)) {
        struct entry_decl *ks;
        unsigned n;
        TRY(parse_cubin(image, &ks, &n, NULL, NULL));
        return module_from_entries(module, ks, n, 1);
    }
    TRY(image_text(image, &text, &len));
    return module_from_text(module, text, len);
}

CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    char *text;
    size_t len;
    CUresult rc;
    TRY(need_ctx());
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(read_file(fname, &text, &len));
    rc = module_from_text(module, text, len);
    free(text);
    return rc;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    return module_load_image(module, image);
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                    CUjit_option *options, void **optionValues)
{
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    return module_load_image(module, image);
}

CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    return module_load_image(module, fatCubin);
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    unsigned i;
    TRY(need_init());
    if (tag_of(hmod) != TAG_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < hmod->n; i++) {
        if (strcmp(hmod->funcs[i].k->name, name) == 0) {
            *hfunc = &hmod->funcs[i];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    unsigned i;
    TRY(need_init());
    lock();
    if (tag_of(hmod) != TAG_MODULE) {
        unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    hmod->tag = TAG_DEAD;
    for (i = 0; i < hmod->n; i++)
        hmod->funcs[i].tag = TAG_DEAD;
    if (!g_no_reuse) {
        hmod->next_free = g_free_modules;
        g_free_modules = hmod;
    }
    unlock();
    return CUDA_SUCCESS;
}

static CUresult library_options_ok(unsigned int numJitOptions, CUjit_option *jitOptions,
                                   void **jitOptionsValues, CUlibraryOption *libraryOptions,
                                   void **libraryOptionValues, unsigned int numLibraryOptions)
{
    unsigned i;
    if (numJitOptions && (!jitOptions || !jitOptionsValues))
        return CUDA_ERROR_INVALID_VALUE;
    if (numLibraryOptions && (!libraryOptions || !libraryOptionValues))
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < numLibraryOptions; i++)
        if ((unsigned)libraryOptions[i] >= CU_LIBRARY_NUM_OPTIONS)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Libraries are context-independent: loading one needs cuInit, not a current context. */
CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                   void **jitOptionsValues, unsigned int numJitOptions,
                                   CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                   unsigned int numLibraryOptions)
{
    const char *text;
    size_t len;
    TRY(need_init());
    TRY(capture_unsafe());
    if (!library)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(library_options_ok(numJitOptions, jitOptions, jitOptionsValues, libraryOptions,
                           libraryOptionValues, numLibraryOptions));
    if (is_cubin(code)) {
        if (getenv("FAKE_CUDA_REFUSE_CUBIN")) /* a driver that cannot load clc's wrapped kernels */
            return CUDA_ERROR_NOT_SUPPORTED;
        return library_from_cubin(library, code);
    }
    TRY(image_text(code, &text, &len));
    return library_from_text(library, text, len);
}

CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                       CUjit_option *jitOptions, void **jitOptionsValues,
                                       unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                       void **libraryOptionValues, unsigned int numLibraryOptions)
{
    char *text;
    size_t len;
    CUresult rc;
    TRY(need_init());
    if (!library)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(library_options_ok(numJitOptions, jitOptions, jitOptionsValues, libraryOptions,
                           libraryOptionValues, numLibraryOptions));
    TRY(read_file(fileName, &text, &len));
    rc = library_from_text(library, text, len);
    free(text);
    return rc;
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    unsigned i;
    TRY(need_init());
    if (tag_of(library) != TAG_LIBRARY)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < library->n; i++) {
        if (strcmp(library->kernels[i].k->name, name) == 0) {
            *pKernel = &library->kernels[i];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    TRY(need_ctx());
    if (tag_of(library) != TAG_LIBRARY)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pMod)
        return CUDA_ERROR_INVALID_VALUE;
    *pMod = &library->module;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library)
{
    unsigned i;
    TRY(need_init());
    lock();
    if (tag_of(library) != TAG_LIBRARY) {
        unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    library->tag = TAG_DEAD;
    library->module.tag = TAG_DEAD;
    for (i = 0; i < library->n; i++) {
        library->kernels[i].tag = TAG_DEAD;
        library->kernels[i].func.tag = TAG_DEAD;
    }
    if (!g_no_reuse && !library->n_managed) {
        library->next_free = g_free_libraries;
        g_free_libraries = library;
    }
    unlock();
    return CUDA_SUCCESS;
}

/* A managed variable of a library loaded from a cubin: its (host) buffer, zeroed at load, and
 * its size. A name the cubin does not define as managed is CUDA_ERROR_NOT_FOUND. */
CUresult CUDAAPI cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
                                     const char *name)
{
    unsigned i;
    TRY(need_init());
    if (tag_of(library) != TAG_LIBRARY)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < library->n_managed; i++) {
        if (strcmp(library->managed[i].name, name) == 0) {
            if (dptr)
                *dptr = (CUdeviceptr)(uintptr_t)library->managed[i].data;
            if (bytes)
                *bytes = library->managed[i].size;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

/* The real driver returns the kernel's function in the current context. */
CUresult CUDAAPI cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel)
{
    TRY(need_init());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pLib)
        return CUDA_ERROR_INVALID_VALUE;
    *pLib = kernel->library;
    return CUDA_SUCCESS;
}

/* A library kernel's function has no module the program could know: refused, where the real
 * driver gives an internal one. */
CUresult CUDAAPI cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_FUNCTION || !hfunc->module)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!hmod)
        return CUDA_ERROR_INVALID_VALUE;
    *hmod = hfunc->module;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    TRY(need_ctx());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    *pFunc = &kernel->func;
    return CUDA_SUCCESS;
}

/* Names point into the never-freed name table, so they outlive the module, as callers of the
 * real driver may assume for the module's lifetime. */
CUresult CUDAAPI cuKernelGetName(const char **name, CUkernel hfunc)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = hfunc->k->name;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_FUNCTION)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = hfunc->k->name;
    return CUDA_SUCCESS;
}

/* A parameter's place in the buffer a launch's `extra` hands over (and the driver copies
 * kernelParams into): the layout of the function's PTX entry. An entry without a parameter list
 * has no parameters, so every index is past the end. */
static CUresult param_info(const struct CUfunc_st *f, size_t index, size_t *offset, size_t *size)
{
    if (!offset || !f->params || index >= f->params->n)
        return CUDA_ERROR_INVALID_VALUE;
    *offset = f->params->p[index].offset;
    if (size) /* optional, as in the real driver */
        *size = f->params->p[index].size;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                                      size_t *paramSize)
{
    TRY(need_init());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    return param_info(&kernel->func, paramIndex, paramOffset, paramSize);
}

static struct CUfunc_st *launchable(const void *h);

/* Like the launch entry points it also takes a CUkernel cast to a CUfunction, the handle a
 * cudart-built program launches with. */
CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                    size_t *paramSize)
{
    const struct CUfunc_st *f;
    TRY(need_init());
    if (!(f = launchable(func)))
        return CUDA_ERROR_INVALID_HANDLE;
    return param_info(f, paramIndex, paramOffset, paramSize);
}

static CUresult func_set_attr(struct CUfunc_st *f, CUfunction_attribute attrib, int value)
{
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (value < 0 || value > MAX_DYN_SMEM)
            return CUDA_ERROR_INVALID_VALUE;
        break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        break;
    default: /* the others are read-only properties of the compiled code */
        return CUDA_ERROR_INVALID_VALUE;
    }
    f->attrs[attrib] = value;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_FUNCTION)
        return CUDA_ERROR_INVALID_HANDLE;
    return func_set_attr(hfunc, attrib, value);
}

CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_FUNCTION)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pi || (unsigned)attrib >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = hfunc->attrs[attrib];
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                      CUdevice dev)
{
    TRY(need_init());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    return func_set_attr(&kernel->func, attrib, val);
}

CUresult CUDAAPI cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel,
                                      CUdevice dev)
{
    TRY(need_init());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pi || (unsigned)attrib >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = kernel->func.attrs[attrib];
    return CUDA_SUCCESS;
}

/* How many blocks of blockSize threads (and dynamicSMemSize bytes of shared memory each) fit on
 * one SM at once: min(SM_BLOCKS, SM_THREADS / blockSize, MAX_DYN_SMEM / dynamicSMemSize), a
 * rule a test can compute (registers are not counted). Takes a CUkernel cast to a CUfunction
 * too, as launches do. */
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                             int blockSize,
                                                             size_t dynamicSMemSize)
{
    const struct CUfunc_st *f;
    int n;
    TRY(need_ctx());
    if (!(f = launchable(func)))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!numBlocks || blockSize <= 0 || blockSize > (int)MAX_BLOCK_THREADS)
        return CUDA_ERROR_INVALID_VALUE;
    n = SM_THREADS / blockSize;
    if (n > SM_BLOCKS)
        n = SM_BLOCKS;
    if (dynamicSMemSize > (size_t)f->attrs[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES])
        n = 0; /* no block of this launch could run at all */
    else if (dynamicSMemSize && MAX_DYN_SMEM / dynamicSMemSize < (size_t)n)
        n = (int)(MAX_DYN_SMEM / dynamicSMemSize);
    *numBlocks = n;
    return CUDA_SUCCESS;
}

/* ---- launches -------------------------------------------------------------------------------- */

/* cuLaunchKernel and friends take a CUfunction or a CUkernel cast to one (as cudart passes). */
static struct CUfunc_st *launchable(const void *h)
{
    switch (tag_of(h)) {
    case TAG_FUNCTION:
        return (struct CUfunc_st *)h;
    case TAG_KERNEL:
        return &((struct CUkern_st *)h)->func;
    default:
        return NULL;
    }
}

static CUresult check_shape(const struct CUfunc_st *f, unsigned gx, unsigned gy, unsigned gz,
                            unsigned bx, unsigned by, unsigned bz, unsigned smem)
{
    if (!gx || !gy || !gz || !bx || !by || !bz)
        return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)bx * by * bz > MAX_BLOCK_THREADS)
        return CUDA_ERROR_INVALID_VALUE;
    if (smem > (unsigned)f->attrs[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES])
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* The arguments of a launch, as the real driver checks them: a kernel that takes parameters
 * needs kernelParams or extra, and extra is a list of (CU_LAUNCH_PARAM_BUFFER_POINTER, buffer),
 * (CU_LAUNCH_PARAM_BUFFER_SIZE, &size) pairs ended by CU_LAUNCH_PARAM_END whose buffer holds
 * the whole parameter layout. */
static CUresult check_args(const struct CUfunc_st *f, void **params, void **extra)
{
    size_t need = f->params ? f->params->total : 0;
    const void *buf = NULL;
    const size_t *size = NULL;
    unsigned i;

    if (params && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (!extra)
        return params || need == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (i >= 64)
            return CUDA_ERROR_INVALID_VALUE;
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
            size = extra[i + 1];
        else
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (need == 0 && !buf && !size)
        return CUDA_SUCCESS;
    if (!buf || !size || *size < need)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* ---- observed launches -----------------------------------------------------------------------
 * Off until a test program turns it on (fake_cuda_observe_launches). Then each successful direct
 * launch is kept as its kernel name's last launch: the handle as passed, the entry point, grid,
 * block, shared memory, whether the code came from a cubin, and copies of its arguments made
 * during the call (a caller's arrays often live on its stack): the kernelParams entries the
 * program asked for beforehand (fake_cuda_capture_param), or the whole `extra` buffer. */

#define CAPTURE_SLOTS 8
#define CAPTURE_BYTES 64
#define EXTRA_BYTES 4096

enum arg_form { FORM_NONE, FORM_PARAMS, FORM_EXTRA };

struct seen_launch {
    int valid;
    const void *handle;
    int from_cubin;
    enum entry entry;
    unsigned dims[7]; /* grid x y z, block x y z, shared memory */
    enum arg_form form;
    unsigned n_params;  /* capture slots filled (FORM_PARAMS) */
    unsigned param_index[CAPTURE_SLOTS];
    long param_len[CAPTURE_SLOTS]; /* -1: the launch had no such argument */
    unsigned char param[CAPTURE_SLOTS][CAPTURE_BYTES];
    size_t extra_size; /* what CU_LAUNCH_PARAM_BUFFER_SIZE said (FORM_EXTRA) */
    unsigned char extra[EXTRA_BYTES];
};

static atomic_int g_observe;
static struct {
    unsigned index, bytes;
} g_capture[CAPTURE_SLOTS]; /* which kernelParams entries to copy; under g_lock */
static unsigned g_ncapture;

/* Copies what fn's launch was given into its name's record. Only called while observing, after
 * check_args accepted the arguments. */
static void observe(enum entry e, const void *handle, const struct CUfunc_st *f,
                    const unsigned dims[7], void **params, void **extra)
{
    struct seen_launch *s;
    unsigned i;
    lock();
    if (!(s = f->k->seen) && !(s = f->k->seen = malloc(sizeof *s))) {
        unlock();
        return;
    }
    memset(s, 0, sizeof *s);
    s->valid = 1;
    s->handle = handle;
    s->from_cubin = f->from_cubin;
    s->entry = e;
    memcpy(s->dims, dims, sizeof s->dims);
    if (params) {
        s->form = FORM_PARAMS;
        for (i = 0; i < g_ncapture; i++) {
            unsigned index = g_capture[i].index;
            size_t bytes = g_capture[i].bytes;
            s->param_index[i] = index;
            s->param_len[i] = -1;
            /* With a known layout, only the kernel's own arguments exist; a cubin's kernel has
             * none known, so the program's word is taken for how many it passes. */
            if (f->params && index >= f->params->n)
                continue;
            if (f->params && bytes > f->params->p[index].size)
                bytes = f->params->p[index].size;
            if (!params[index])
                continue;
            memcpy(s->param[i], params[index], bytes);
            s->param_len[i] = (long)bytes;
        }
        s->n_params = g_ncapture;
    } else if (extra) {
        const void *buf = NULL;
        const size_t *size = NULL;
        s->form = FORM_EXTRA;
        for (i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
                size = extra[i + 1];
        }
        s->extra_size = size ? *size : 0;
        if (buf)
            memcpy(s->extra, buf, s->extra_size < EXTRA_BYTES ? s->extra_size : EXTRA_BYTES);
    }
    unlock();
}

/* Where the kernel of the node last checked by this thread runs: a v2 node naming its kernel
 * by `kern` in a context converted from a green context runs on that partition's SMs. */
static __thread unsigned tls_node_where = FAKE_SMS_ALL;
/* And the context it runs in (the conditional node's for a conditional node), and its
 * parameters as the v2 struct holds them. */
static __thread const struct CUctx_st *tls_node_ctx;
static __thread CUDA_KERNEL_NODE_PARAMS tls_node_params;
static CUresult add_node(enum entry e, CUgraphNode *phGraphNode, CUgraph g,
                         const CUgraphNode *deps, size_t ndeps, CUgraphNodeType type,
                         struct kname *k);

static unsigned queue_launch(CUstream hs, int *ordered);

/* A cooperative grid must be resident at once: on its partition's SMs for a green stream. */
static int coop_fits(CUstream s, unsigned long long blocks, unsigned threads)
{
    unsigned per_sm = SM_THREADS / threads;
    unsigned sms = tag_of(s) == TAG_STREAM && s->green ? s->green->sms : FAKE_SMS;
    if (per_sm > SM_BLOCKS)
        per_sm = SM_BLOCKS;
    return blocks <= (unsigned long long)sms * per_sm;
}

static CUresult launch(enum entry e, CUfunction fn, unsigned gx, unsigned gy, unsigned gz,
                       unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream s,
                       void **params, void **extra)
{
    struct CUfunc_st *f;
    TRY(need_ctx());
    if (!(f = launchable(fn)))
        return CUDA_ERROR_INVALID_HANDLE;
    TRY(check_args(f, params, extra));
    TRY(check_shape(f, gx, gy, gz, bx, by, bz, smem));
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    /* As the real driver: no function of a context the program made (not a primary context,
     * not one converted from a green context) launches on a green context's stream. */
    if (tag_of(s) == TAG_STREAM && s->green && f->module && f->module->ctx &&
        !f->module->ctx->primary && !f->module->ctx->green)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((e == E_COOP || e == E_COOP_PTSZ) && !coop_fits(s, gx * gy * gz, bx * by * bz))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    /* Captured into a graph the program made: a node of it, in the stream's context. */
    if (tag_of(s) == TAG_STREAM && s->capture_graph &&
        s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        CUgraphNode n;
        tls_node_ctx = s->ctx;
        tls_node_where = s->green ? s->green->first << 16 | s->green->sms : FAKE_SMS_ALL;
        return add_node(e, &n, s->capture_graph, NULL, 0, CU_GRAPH_NODE_TYPE_KERNEL, f->k);
    }
    /* FAKE_CUDA_GREEN_REFUSE: a partition too small for every launch (a cooperative grid that
     * does not fit, say). */
    if (tag_of(s) == TAG_STREAM && s->green && getenv("FAKE_CUDA_GREEN_REFUSE"))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    if (atomic_load_explicit(&g_observe, memory_order_relaxed)) {
        const unsigned dims[7] = {gx, gy, gz, bx, by, bz, smem};
        observe(e, fn, f, dims, params, extra);
    }
    {
        int ordered;
        unsigned where = queue_launch(s, &ordered);
        atomic_store(&f->k->where, where);
        atomic_store(&f->k->ordered, ordered);
        if (where != FAKE_SMS_ALL)
            atomic_fetch_add(&f->k->green, 1);
    }
    atomic_fetch_add(&f->k->launches, 1);
    atomic_fetch_add(&g_entry[e], 1);
    atomic_fetch_add(&g_total_launches, 1);
    atomic_fetch_add(&g_clock_ns, FAKE_NS_PER_LAUNCH);
    {
        void (*cupti)(unsigned, unsigned, int) = atomic_load(&g_cupti_launched);
        if (cupti)
            cupti(gx, bx, (int)e);
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream,
                                void **kernelParams, void **extra)
{
    return launch(E_LAUNCH, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX,
                                     unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream,
                                     void **kernelParams, void **extra)
{
    return launch(E_LAUNCH_PTSZ, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                  blockDimZ, sharedMemBytes, hStream, kernelParams, extra);
}

static CUresult launch_ex(enum entry e, const CUlaunchConfig *c, CUfunction f, void **params,
                          void **extra)
{
    unsigned i;
    if (!c || (c->numAttrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && c->attrs[i].value.cooperative &&
            c->blockDimX && c->blockDimY && c->blockDimZ &&
            !coop_fits(c->hStream, (unsigned long long)c->gridDimX * c->gridDimY * c->gridDimZ,
                       c->blockDimX * c->blockDimY * c->blockDimZ))
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    return launch(e, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                  c->blockDimZ, c->sharedMemBytes, c->hStream, params, extra);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                  void **extra)
{
    return launch_ex(E_LAUNCH_EX, config, f, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                       void **kernelParams, void **extra)
{
    return launch_ex(E_LAUNCH_EX_PTSZ, config, f, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                           unsigned int gridDimY, unsigned int gridDimZ,
                                           unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes,
                                           CUstream hStream, void **kernelParams)
{
    return launch(E_COOP, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, NULL);
}

/* Each device's launch in turn (one fake device: the same one each time). */
CUresult CUDAAPI cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list,
                                                      unsigned int numDevices, unsigned int flags)
{
    unsigned i;
    (void)flags;
    if (!list || numDevices == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < numDevices; i++)
        TRY(launch(E_COOP, list[i].function, list[i].gridDimX, list[i].gridDimY,
                   list[i].gridDimZ, list[i].blockDimX, list[i].blockDimY, list[i].blockDimZ,
                   list[i].sharedMemBytes, list[i].hStream, list[i].kernelParams, NULL));
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                unsigned int gridDimY, unsigned int gridDimZ,
                                                unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ,
                                                unsigned int sharedMemBytes, CUstream hStream,
                                                void **kernelParams)
{
    return launch(E_COOP_PTSZ, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, NULL);
}

/* ---- graphs ---------------------------------------------------------------------------------- */

CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    struct CUgraph_st *g;
    TRY(need_init());
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(g = calloc(1, sizeof *g)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->tailp = &g->head;
    g->tag = TAG_GRAPH;
    *phGraph = g;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
    struct CUgraphNode_st *n;
    TRY(need_init());
    lock();
    if (tag_of(hGraph) != TAG_GRAPH) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    hGraph->tag = TAG_DEAD;
    for (n = hGraph->head; n; n = n->next)
        n->tag = TAG_DEAD;
    unlock();
    return CUDA_SUCCESS;
}


/* The kernel a node's parameters name. The v1 struct has only `func`; the v2 struct adds
 * `kern`, used when func is NULL, and `ctx` (NULL: the current context). Both structs start
 * with the same ten fields, passed here one by one. */
static CUresult node_kernel(enum entry e, CUfunction func, CUkernel kern, CUcontext ctx, int v2,
                            unsigned gx,
                            unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned smem, void **params, void **extra, struct kname **out)
{
    struct CUfunc_st *f;
    if (func || !v2) {
        /* A CUkernel goes in `kern`: in `func`, where a launch takes one, a node refuses it
         * (CUDA_ERROR_INVALID_HANDLE on the real driver, 580). */
        f = tag_of(func) == TAG_KERNEL ? NULL : launchable(func);
    } else {
        if (ctx == NULL)
            TRY(need_ctx());
        else if (tag_of(ctx) != TAG_CTX)
            return CUDA_ERROR_INVALID_CONTEXT;
        f = tag_of(kern) == TAG_KERNEL ? &kern->func : NULL;
    }
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (params && extra)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(check_shape(f, gx, gy, gz, bx, by, bz, smem));
    if (atomic_load_explicit(&g_observe, memory_order_relaxed)) {
        /* what the node was given, read as a launch's (fake_cuda_last_launch) */
        const unsigned dims[7] = {gx, gy, gz, bx, by, bz, smem};
        observe(e, func ? (const void *)func : (const void *)kern, f, dims, params, extra);
    }
    *out = f->k;
    {
        /* A node runs in the context its v2 parameters name with `kern`, else the current one. */
        const struct CUctx_st *in = !func && v2 && ctx ? ctx : tls_ctx;
        tls_node_where = in && in->green ? in->green->first << 16 | in->green->sms : FAKE_SMS_ALL;
        tls_node_ctx = in;
        tls_node_params = (CUDA_KERNEL_NODE_PARAMS){
            .func = func, .gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = bx,
            .blockDimY = by, .blockDimZ = bz, .sharedMemBytes = smem, .kernelParams = params,
            .extra = extra, .kern = func ? NULL : kern, .ctx = func ? NULL : ctx};
    }
    return CUDA_SUCCESS;
}

#define NODE_KERNEL_V1(e, p, out)                                                                  \
    node_kernel(e, (p)->func, NULL, NULL, 0, (p)->gridDimX, (p)->gridDimY, (p)->gridDimZ,           \
                (p)->blockDimX, (p)->blockDimY, (p)->blockDimZ, (p)->sharedMemBytes,               \
                (p)->kernelParams, (p)->extra, out)
#define NODE_KERNEL_V2(e, p, out)                                                                  \
    node_kernel(e, (p)->func, (p)->kern, (p)->ctx, 1, (p)->gridDimX, (p)->gridDimY, (p)->gridDimZ,  \
                (p)->blockDimX, (p)->blockDimY, (p)->blockDimZ, (p)->sharedMemBytes,               \
                (p)->kernelParams, (p)->extra, out)

static CUresult add_node(enum entry e, CUgraphNode *phGraphNode, CUgraph g,
                         const CUgraphNode *deps, size_t ndeps, CUgraphNodeType type,
                         struct kname *k)
{
    struct CUgraphNode_st *n;
    size_t i;
    if (!phGraphNode || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    if (tag_of(g) != TAG_GRAPH) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < ndeps; i++) {
        if (tag_of(deps[i]) != TAG_NODE || deps[i]->graph != g) {
            unlock();
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (!(n = calloc(1, sizeof *n))) {
        unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n->tag = TAG_NODE;
    n->type = type;
    n->graph = g;
    n->k = k;
    n->where = k ? tls_node_where : FAKE_SMS_ALL;
    n->ctx = k || type == CU_GRAPH_NODE_TYPE_CONDITIONAL ? tls_node_ctx : NULL;
    if (k)
        n->kp = tls_node_params;
    *g->tailp = n;
    g->tailp = &n->next;
    unlock();
    atomic_fetch_add(&g_entry[e], 1);
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                      const CUgraphNode *dependencies, size_t numDependencies,
                                      const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V1(E_GRAPH_ADD, nodeParams, &k));
    return add_node(E_GRAPH_ADD, phGraphNode, hGraph, dependencies, numDependencies,
                    CU_GRAPH_NODE_TYPE_KERNEL, k);
}

CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                         const CUgraphNode *dependencies, size_t numDependencies,
                                         const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V2(E_GRAPH_ADD_V2, nodeParams, &k));
    return add_node(E_GRAPH_ADD_V2, phGraphNode, hGraph, dependencies, numDependencies,
                    CU_GRAPH_NODE_TYPE_KERNEL, k);
}

/* Parameters of one type only fit a node of that type (a kernel node's setter refuses a memset
 * node, as the real driver does). */
static CUresult node_set(enum entry e, CUgraphNode n, CUgraphNodeType type, struct kname *k)
{
    lock();
    if (tag_of(n) != TAG_NODE || n->type != type) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    n->k = k;
    n->where = k ? tls_node_where : FAKE_SMS_ALL;
    n->ctx = k ? tls_node_ctx : NULL;
    if (k)
        n->kp = tls_node_params;
    unlock();
    atomic_fetch_add(&g_entry[e], 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeSetParams(CUgraphNode hNode,
                                            const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V1(E_NODE_SET, nodeParams, &k));
    return node_set(E_NODE_SET, hNode, CU_GRAPH_NODE_TYPE_KERNEL, k);
}

CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode hNode,
                                               const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V2(E_NODE_SET_V2, nodeParams, &k));
    return node_set(E_NODE_SET_V2, hNode, CU_GRAPH_NODE_TYPE_KERNEL, k);
}

/* Every kernel of a conditional node's body (nested bodies too) must be in the conditional
 * node's context, as the real driver requires (else cudaErrorInvalidValue at instantiation). */
static int body_ok(const struct CUgraph_st *g, const struct CUctx_st *ctx)
{
    const struct CUgraphNode_st *n;
    unsigned i;
    for (n = g->head; n; n = n->next) {
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL && n->k && n->ctx != ctx)
            return 0;
        if (n->type == CU_GRAPH_NODE_TYPE_GRAPH && n->child && !body_ok(n->child, ctx))
            return 0;
        if (n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
            if (n->ctx != ctx)
                return 0;
            for (i = 0; i < n->n_bodies; i++)
                if (!body_ok(n->bodies[i], ctx))
                    return 0;
        }
    }
    return 1;
}

/* No kernel node of g, its child graphs or bodies, in a green context. */
static int body_ok_green(const struct CUgraph_st *g)
{
    const struct CUgraphNode_st *n;
    unsigned i;
    for (n = g->head; n; n = n->next) {
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL && n->k && n->ctx && n->ctx->green)
            return 0;
        if (n->type == CU_GRAPH_NODE_TYPE_GRAPH && n->child && !body_ok_green(n->child))
            return 0;
        for (i = 0; i < n->n_bodies; i++)
            if (!body_ok_green(n->bodies[i]))
                return 0;
    }
    return 1;
}

/* What `cuGraphInstantiate` means in the CUDA 12+ header. */
CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             unsigned long long flags)
{
    struct CUgraphExec_st *x;
    struct CUgraphNode_st *n;
    unsigned count = 0;
    (void)flags;
    TRY(need_init());
    if (!phGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    if (tag_of(hGraph) != TAG_GRAPH) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* FAKE_CUDA_REFUSE_GREEN_NODES: a driver that will not instantiate a graph holding a kernel
     * node in a green context (as it refuses one in a conditional body of another context). */
    if (getenv("FAKE_CUDA_REFUSE_GREEN_NODES") && !body_ok_green(hGraph)) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (n = hGraph->head; n; n = n->next) {
        unsigned i;
        count++;
        for (i = 0; n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL && i < n->n_bodies; i++) {
            if (!body_ok(n->bodies[i], n->ctx)) {
                unlock();
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
    }
    if (!(x = calloc(1, sizeof *x)) || !(x->nodes = calloc(count ? count : 1, sizeof *x->nodes))) {
        unlock();
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (n = hGraph->head; n; n = n->next) {
        x->nodes[x->n].node = n;
        x->nodes[x->n].k = n->k;
        x->nodes[x->n].where = n->where;
        x->n++;
    }
    x->graph = hGraph;
    x->tag = TAG_EXEC;
    unlock();
    *phGraphExec = x;
    return CUDA_SUCCESS;
}

static CUresult exec_node_set(enum entry e, CUgraphExec x, CUgraphNode n, CUgraphNodeType type,
                              struct kname *k)
{
    unsigned i;
    lock();
    if (tag_of(x) != TAG_EXEC) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < x->n; i++) {
        if (x->nodes[i].node == n) {
            if (n->type != type) {
                unlock();
                return CUDA_ERROR_INVALID_VALUE;
            }
            x->nodes[i].k = k;
            x->nodes[i].where = k ? tls_node_where : FAKE_SMS_ALL;
            unlock();
            atomic_fetch_add(&g_entry[e], 1);
            return CUDA_SUCCESS;
        }
    }
    unlock();
    return CUDA_ERROR_INVALID_VALUE; /* not a node of the graph this was instantiated from */
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V1(E_EXEC_SET, nodeParams, &k));
    return exec_node_set(E_EXEC_SET, hGraphExec, hNode, CU_GRAPH_NODE_TYPE_KERNEL, k);
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                   const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(NODE_KERNEL_V2(E_EXEC_SET_V2, nodeParams, &k));
    return exec_node_set(E_EXEC_SET_V2, hGraphExec, hNode, CU_GRAPH_NODE_TYPE_KERNEL, k);
}

/* ---- the generic node API (CUDA 12.2+): one CUgraphNodeParams for every node type ------------
 * A KERNEL node goes through the kernel-node machinery above (its params are
 * CUDA_KERNEL_NODE_PARAMS_v3: `func`, or `kern` when func is NULL, and `ctx`), so a graph launch
 * counts it as it counts a node from cuGraphAddKernelNode. A MEMSET node is checked (its rows
 * within one cuMemAlloc allocation) and kept, but does nothing when the graph runs. Other types:
 * CUDA_ERROR_NOT_SUPPORTED. As in the real driver the reserved fields must be zero. */

static CUresult generic_params(const CUgraphNodeParams *p, struct kname **k)
{
    const CUDA_MEMSET_NODE_PARAMS_v2 *m;
    if (!p || p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2)
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        return NODE_KERNEL_V2(E_ADD_NODE, &p->kernel, k);
    case CU_GRAPH_NODE_TYPE_MEMSET:
        m = &p->memset;
        if (!m->dst || !m->width || !m->height ||
            (m->elementSize != 1 && m->elementSize != 2 && m->elementSize != 4))
            return CUDA_ERROR_INVALID_VALUE;
        {
            /* The rows it sets lie in one allocation (the real driver refuses an address it
             * did not allocate, 580). */
            size_t row, span = 0;
            int inside;
            if (__builtin_mul_overflow(m->width, (size_t)m->elementSize, &row) ||
                (m->height > 1 && m->pitch < row) ||
                __builtin_mul_overflow(m->height - 1, m->pitch, &span) ||
                __builtin_add_overflow(span, row, &span))
                return CUDA_ERROR_INVALID_VALUE;
            lock();
            inside = allocation_of_locked((uintptr_t)m->dst, span) != NULL;
            unlock();
            if (!inside)
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (m->ctx == NULL)
            TRY(need_ctx());
        else if (tag_of(m->ctx) != TAG_CTX)
            return CUDA_ERROR_INVALID_CONTEXT;
        *k = NULL;
        return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
        const CUDA_CONDITIONAL_NODE_PARAMS *c = &p->conditional;
        unsigned most = c->type == CU_GRAPH_COND_TYPE_IF       ? 2
                        : c->type == CU_GRAPH_COND_TYPE_SWITCH ? MAX_BODIES
                                                               : 1;
        if (!c->handle || c->size == 0 || c->size > most)
            return CUDA_ERROR_INVALID_VALUE;
        if (c->ctx == NULL)
            TRY(need_ctx());
        else if (tag_of(c->ctx) != TAG_CTX)
            return CUDA_ERROR_INVALID_CONTEXT;
        tls_node_ctx = c->ctx ? c->ctx : tls_ctx;
        *k = NULL;
        return CUDA_SUCCESS;
    }
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

/* Child graph nodes: a copy of the graph's nodes (not of their dependencies, which the fake
 * does not keep); cuGraphChildGraphNodeGetGraph gives the copy, which may be changed. */
CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                          const CUgraphNode *dependencies, size_t numDependencies,
                                          CUgraph childGraph)
{
    struct CUgraph_st *copy;
    struct CUgraphNode_st *n;
    TRY(need_init());
    if (tag_of(childGraph) != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(cuGraphCreate(&copy, 0));
    lock();
    for (n = childGraph->head; n; n = n->next) {
        struct CUgraphNode_st *c = malloc(sizeof *c);
        if (!c) {
            unlock();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *c = *n;
        c->graph = copy;
        c->next = NULL;
        *copy->tailp = c;
        copy->tailp = &c->next;
    }
    unlock();
    TRY(add_node(E_GRAPH_ADD, phGraphNode, hGraph, dependencies, numDependencies,
                 CU_GRAPH_NODE_TYPE_GRAPH, NULL));
    (*phGraphNode)->child = copy;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    TRY(need_init());
    if (!phGraph || tag_of(hNode) != TAG_NODE || hNode->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = hNode->child;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    struct CUgraphNode_st *n;
    size_t i = 0;
    TRY(need_init());
    if (!numNodes || tag_of(hGraph) != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    for (n = hGraph->head; n; n = n->next, i++)
        if (nodes && i < *numNodes)
            nodes[i] = n;
    unlock();
    if (!nodes || i < *numNodes)
        *numNodes = i;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    TRY(need_init());
    if (!type || tag_of(hNode) != TAG_NODE)
        return CUDA_ERROR_INVALID_VALUE;
    *type = hNode->type;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                               CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    TRY(need_init());
    if (!nodeParams || tag_of(hNode) != TAG_NODE || hNode->type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    *nodeParams = hNode->kp;
    return CUDA_SUCCESS;
}

/* Conditional handles: distinct non-zero values; the fake keeps no condition. The context is
 * required (NULL is CUDA_ERROR_INVALID_CONTEXT on the real driver, 580). */
CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle *pHandle_out,
                                                CUgraph hGraph, CUcontext ctx,
                                                unsigned int defaultLaunchValue,
                                                unsigned int flags)
{
    static atomic_ullong next = 1;
    (void)defaultLaunchValue;
    (void)flags;
    TRY(need_init());
    if (!pHandle_out || tag_of(hGraph) != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    if (tag_of(ctx) != TAG_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    *pHandle_out = atomic_fetch_add(&next, 1);
    return CUDA_SUCCESS;
}

/* A new conditional node's bodies: empty graphs, handed back in the caller's parameters. */
static CUresult make_bodies(CUgraphNode n, CUgraphNodeParams *p)
{
    unsigned i;
    if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL)
        return CUDA_SUCCESS;
    for (i = 0; i < p->conditional.size; i++)
        TRY(cuGraphCreate(&n->bodies[i], 0));
    n->n_bodies = p->conditional.size;
    p->conditional.phGraph_out = n->bodies;
    return CUDA_SUCCESS;
}

/* Edge data: the fake has no ports or programmatic edges, only full-completion edges (all
 * fields zero, which is also what NULL means). */
static CUresult default_edges(const CUgraphEdgeData *edges, size_t n)
{
    size_t i;
    for (i = 0; edges && i < n; i++)
        if (edges[i].from_port || edges[i].to_port || edges[i].type)
            return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

/* The 12.2 ABI, without edge data (cuGetProcAddress versions 12020..12029). */
CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUgraphNodeParams *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    TRY(generic_params(nodeParams, &k));
    TRY(add_node(E_ADD_NODE, phGraphNode, hGraph, dependencies, numDependencies,
                 nodeParams->type, k));
    return make_bodies(*phGraphNode, nodeParams);
}

/* The 12.3 ABI: per-dependency edge data (may be NULL) before the count. */
CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                   const CUgraphNode *dependencies,
                                   const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                   CUgraphNodeParams *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    TRY(generic_params(nodeParams, &k));
    TRY(default_edges(dependencyData, numDependencies));
    TRY(add_node(E_ADD_NODE_V2, phGraphNode, hGraph, dependencies, numDependencies,
                 nodeParams->type, k));
    return make_bodies(*phGraphNode, nodeParams);
}

/* The node keeps its type: parameters of another type are CUDA_ERROR_INVALID_VALUE. */
CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    TRY(generic_params(nodeParams, &k));
    return node_set(E_NODE_SET_PARAMS, hNode, nodeParams->type, k);
}

CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                          CUgraphNodeParams *nodeParams)
{
    struct kname *k;
    TRY(need_init());
    TRY(generic_params(nodeParams, &k));
    return exec_node_set(E_EXEC_NODE_SET_PARAMS, hGraphExec, hNode, nodeParams->type, k);
}

/* One graph launch runs every kernel node once (a memset node does nothing). */
static CUresult graph_launch(enum entry e, CUgraphExec x, CUstream s)
{
    unsigned i;
    TRY(need_ctx());
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    lock();
    if (tag_of(x) != TAG_EXEC) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < x->n; i++) {
        if (!x->nodes[i].k)
            continue;
        atomic_fetch_add(&x->nodes[i].k->graph, 1);
        atomic_store(&x->nodes[i].k->where, x->nodes[i].where);
        if (x->nodes[i].where != FAKE_SMS_ALL)
            atomic_fetch_add(&x->nodes[i].k->green, 1);
        atomic_fetch_add(&g_total_graph, 1);
        atomic_fetch_add(&g_clock_ns, FAKE_NS_PER_LAUNCH);
    }
    unlock();
    atomic_fetch_add(&g_entry[e], 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(E_GRAPH_LAUNCH, hGraphExec, hStream);
}

CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(E_GRAPH_LAUNCH_PTSZ, hGraphExec, hStream);
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    TRY(need_init());
    lock();
    if (tag_of(hGraphExec) != TAG_EXEC) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    hGraphExec->tag = TAG_DEAD;
    unlock();
    return CUDA_SUCCESS;
}


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

/* ---- test-only entry points ------------------------------------------------------------------
 * Not part of CUDA: the test programs (via dlsym) and the Python tests (via ctypes) read the
 * driver's true counts with these. */

#define TEST_API __attribute__((visibility("default")))

TEST_API unsigned long fake_cuda_launch_count(const char *name);
TEST_API unsigned long fake_cuda_graph_launch_count(const char *name);
TEST_API unsigned long fake_cuda_total_launches(void);
TEST_API unsigned long fake_cuda_total_graph_launches(void);
TEST_API unsigned long fake_cuda_entry_count(const char *entry);
TEST_API const char *fake_cuda_entry_name(unsigned i);
TEST_API unsigned fake_cuda_kernel_count(void);
TEST_API const char *fake_cuda_kernel_name(unsigned i);
TEST_API unsigned long long fake_cuda_clock_ns(void);
TEST_API void fake_cuda_print_counts(FILE *out);
TEST_API void fake_cuda_observe_launches(int on);
TEST_API int fake_cuda_capture_param(unsigned index, unsigned bytes);
TEST_API int fake_cuda_last_launch(const char *name, const void **handle, const char **entry,
                                   unsigned dims[7], int *from_cubin);
TEST_API long fake_cuda_last_param(const char *name, unsigned index, void *buf, size_t cap);
TEST_API long fake_cuda_last_extra(const char *name, void *buf, size_t cap);
TEST_API int fake_cuda_device_allocation(CUdeviceptr p, CUdeviceptr *base, size_t *size);
TEST_API int fake_cuda_capture_unsafe_calls(void);
TEST_API int fake_cuda_last_green(const char *name, unsigned *first, unsigned *sms,
                                  int *ordered, unsigned long *green_launches);
TEST_API unsigned long fake_cuda_order_violations(void);
TEST_API void fake_cuda_green_counts(unsigned long *created, unsigned long *destroyed,
                                     unsigned long *streams, unsigned long *streams_destroyed);

static struct kname *lookup(const char *name);

/* Where the kernel's last launch ran (SMs [first, first + sms)), whether it was in its program
 * stream's order, and how many of its launches ran on green streams: 0, or -1 for an unknown
 * name. */
int fake_cuda_last_green(const char *name, unsigned *first, unsigned *sms, int *ordered,
                         unsigned long *green_launches)
{
    struct kname *k = lookup(name);
    unsigned where;
    if (!k)
        return -1;
    where = atomic_load(&k->where);
    *first = where == FAKE_SMS_ALL ? 0 : where >> 16;
    *sms = where == FAKE_SMS_ALL ? FAKE_SMS : where & 0xffff;
    *ordered = atomic_load(&k->ordered);
    *green_launches = atomic_load(&k->green);
    return 0;
}

/* Breaks of stream order seen (green contexts, above). */
unsigned long fake_cuda_order_violations(void) { return atomic_load(&g_order_violations); }

void fake_cuda_green_counts(unsigned long *created, unsigned long *destroyed,
                            unsigned long *streams, unsigned long *streams_destroyed)
{
    *created = atomic_load(&g_green_created);
    *destroyed = atomic_load(&g_green_destroyed);
    *streams = atomic_load(&g_green_streams);
    *streams_destroyed = atomic_load(&g_green_streams_destroyed);
}

/* How many potentially unsafe calls a global stream capture refused (stream capture, above). */
int fake_cuda_capture_unsafe_calls(void) { return atomic_load(&g_capture_unsafe_calls); }

static struct kname *lookup(const char *name)
{
    unsigned pos;
    struct kname *k;
    if (!name)
        return NULL;
    lock();
    k = find_name_locked(name, &pos);
    unlock();
    return k;
}

/* Direct launches (all cuLaunch* entry points) of the kernel with this mangled name. */
unsigned long fake_cuda_launch_count(const char *name)
{
    struct kname *k = lookup(name);
    return k ? atomic_load(&k->launches) : 0;
}

/* Runs of this kernel as a node of a launched graph. */
unsigned long fake_cuda_graph_launch_count(const char *name)
{
    struct kname *k = lookup(name);
    return k ? atomic_load(&k->graph) : 0;
}

/* All direct launches; graph node runs are in fake_cuda_total_graph_launches. */
unsigned long fake_cuda_total_launches(void) { return atomic_load(&g_total_launches); }
unsigned long fake_cuda_total_graph_launches(void) { return atomic_load(&g_total_graph); }

/* Successful calls of one entry point, by exported name ("cuLaunchKernel_ptsz"). */
unsigned long fake_cuda_entry_count(const char *entry)
{
    unsigned i;
    for (i = 0; entry && i < E_COUNT; i++)
        if (strcmp(entry_names[i], entry) == 0)
            return atomic_load(&g_entry[i]);
    return 0;
}

/* The counted entry points in a fixed order; NULL past the end. */
const char *fake_cuda_entry_name(unsigned i) { return i < E_COUNT ? entry_names[i] : NULL; }

/* Every kernel name seen in a loaded image, launched or not, sorted by strcmp. */
unsigned fake_cuda_kernel_count(void)
{
    unsigned n;
    lock();
    n = g_nnames;
    unlock();
    return n;
}

const char *fake_cuda_kernel_name(unsigned i)
{
    const char *name;
    lock();
    name = i < g_nnames ? g_names[i]->name : NULL;
    unlock();
    return name;
}

unsigned long long fake_cuda_clock_ns(void) { return atomic_load(&g_clock_ns); }

/* The summary every test program ends with:
 *   fake: <name> launches=<n> graph=<n>      one per kernel, sorted by name
 *   fake-entry: <entry point> calls=<n>      one per counted entry point, fixed order */
void fake_cuda_print_counts(FILE *out)
{
    unsigned i, n = fake_cuda_kernel_count();
    for (i = 0; i < n; i++) {
        const char *name = fake_cuda_kernel_name(i);
        fprintf(out, "fake: %s launches=%lu graph=%lu\n", name, fake_cuda_launch_count(name),
                fake_cuda_graph_launch_count(name));
    }
    for (i = 0; i < E_COUNT; i++)
        fprintf(out, "fake-entry: %s calls=%lu\n", entry_names[i], atomic_load(&g_entry[i]));
    fflush(out);
}

/* Observing launches (see "observed launches"): on (1) or off (0); either way every kernel's
 * last launch is forgotten, so that a launch refused from now on leaves no stale record. */
void fake_cuda_observe_launches(int on)
{
    unsigned i;
    lock();
    for (i = 0; i < g_nnames; i++)
        if (g_names[i]->seen)
            g_names[i]->seen->valid = 0;
    unlock();
    atomic_store(&g_observe, on != 0);
}

/* Copy `bytes` (at most 64) of kernelParams[index] at each observed launch from now on; bytes 0
 * stops copying that index. Up to 8 indices at once. 0, or -1 when bytes is over 64 or the eight
 * are taken. */
int fake_cuda_capture_param(unsigned index, unsigned bytes)
{
    unsigned i;
    int rc = 0;
    if (bytes > CAPTURE_BYTES)
        return -1;
    lock();
    for (i = 0; i < g_ncapture && g_capture[i].index != index; i++)
        ;
    if (bytes == 0) {
        if (i < g_ncapture)
            g_capture[i] = g_capture[--g_ncapture];
    } else if (i < g_ncapture) {
        g_capture[i].bytes = bytes;
    } else if (g_ncapture < CAPTURE_SLOTS) {
        g_capture[g_ncapture].index = index;
        g_capture[g_ncapture++].bytes = bytes;
    } else {
        rc = -1;
    }
    unlock();
    return rc;
}

/* The last observed launch of the kernel `name`: the handle the launch passed, its entry point
 * ("cuLaunchKernelEx"), dims = grid x y z, block x y z, shared memory, and whether the function's
 * code was a cubin (any out-pointer may be NULL). Returns how its arguments came: 0 none,
 * 1 kernelParams, 2 extra; -1 when no launch of it was observed. */
int fake_cuda_last_launch(const char *name, const void **handle, const char **entry,
                          unsigned dims[7], int *from_cubin)
{
    struct kname *k = lookup(name);
    int form = -1;
    lock();
    if (k && k->seen && k->seen->valid) {
        const struct seen_launch *s = k->seen;
        form = (int)s->form;
        if (handle)
            *handle = s->handle;
        if (entry)
            *entry = entry_names[s->entry];
        if (dims)
            memcpy(dims, s->dims, sizeof s->dims);
        if (from_cubin)
            *from_cubin = s->from_cubin;
    }
    unlock();
    return form;
}

/* The bytes of kernelParams[index] that the last observed launch of `name` passed, as many as
 * fake_cuda_capture_param asked for (fewer for a smaller parameter of a known layout), copied
 * into buf (cap bytes at most). Returns their number, or -1 when they were not copied (no
 * kernelParams, an index past the kernel's parameters, or not asked for). */
long fake_cuda_last_param(const char *name, unsigned index, void *buf, size_t cap)
{
    struct kname *k = lookup(name);
    long n = -1;
    unsigned i;
    lock();
    if (k && k->seen && k->seen->valid && k->seen->form == FORM_PARAMS) {
        const struct seen_launch *s = k->seen;
        for (i = 0; i < s->n_params; i++) {
            if (s->param_index[i] == index && s->param_len[i] >= 0) {
                n = s->param_len[i];
                memcpy(buf, s->param[i], (size_t)n < cap ? (size_t)n : cap);
                break;
            }
        }
    }
    unlock();
    return n;
}

/* The `extra` argument buffer of the last observed launch of `name`: copied into buf (at most
 * cap, and at most its first 4096 bytes), its size as CU_LAUNCH_PARAM_BUFFER_SIZE gave it
 * returned; -1 when that launch had no `extra`. */
long fake_cuda_last_extra(const char *name, void *buf, size_t cap)
{
    struct kname *k = lookup(name);
    long n = -1;
    lock();
    if (k && k->seen && k->seen->valid && k->seen->form == FORM_EXTRA) {
        const struct seen_launch *s = k->seen;
        size_t have = s->extra_size < EXTRA_BYTES ? s->extra_size : EXTRA_BYTES;
        memcpy(buf, s->extra, have < cap ? have : cap);
        n = (long)s->extra_size;
    }
    unlock();
    return n;
}

/* Whether the device address p lies in a live cuMemAlloc allocation: 1 with its base and size
 * (either pointer may be NULL), else 0. The memory is host memory: a test may read it through
 * p directly once it knows the range is allocated. */
int fake_cuda_device_allocation(CUdeviceptr p, CUdeviceptr *base, size_t *size)
{
    struct allocation *a;
    int found = 0;
    lock();
    if ((a = allocation_of_locked((uintptr_t)p, 1))) {
        found = 1;
        if (base)
            *base = (CUdeviceptr)a->base;
        if (size)
            *size = a->size;
    }
    unlock();
    return found;
}

/* ---- a launch while the caller holds something (tests of first sight under a held GIL) ----
 * fake_cuda_launch_when_held starts a thread that, once fake_cuda_hold is called, launches f
 * in ctx through the process's cuLaunchKernel (a preloaded shim's, if any). fake_cuda_hold
 * waits up to timeout_ms for that launch to return: 1 if it did (its CUresult in *result). A
 * Python caller reaching fake_cuda_hold through ctypes.PyDLL keeps the GIL all the while. */
static atomic_int g_hold_on, g_hold_done, g_hold_result;

struct hold_launch {
    CUcontext ctx;
    CUfunction f;
};

static void *launch_when_held(void *arg)
{
    struct hold_launch job = *(struct hold_launch *)arg;
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    free(arg);
    while (!atomic_load(&g_hold_on))
        usleep(1000);
    *(void **)&launch = dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    cuCtxSetCurrent(job.ctx);
    atomic_store(&g_hold_result, launch(job.f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    atomic_store(&g_hold_done, 1);
    return NULL;
}

int fake_cuda_launch_when_held(CUcontext ctx, CUfunction f)
{
    pthread_t t;
    struct hold_launch *job = malloc(sizeof *job);
    if (!job)
        return -1;
    job->ctx = ctx;
    job->f = f;
    if (pthread_create(&t, NULL, launch_when_held, job)) {
        free(job);
        return -1;
    }
    pthread_detach(t);
    return 0;
}

int fake_cuda_hold(unsigned timeout_ms, int *result)
{
    unsigned waited = 0;
    atomic_store(&g_hold_on, 1);
    while (!atomic_load(&g_hold_done) && waited < timeout_ms) {
        usleep(1000);
        waited++;
    }
    *result = atomic_load(&g_hold_result);
    return atomic_load(&g_hold_done);
}
