/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): handles, global state, kernel names, images (fatbins, PTX), parameter lists, cubins. */

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
