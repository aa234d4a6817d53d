/* SPDX-License-Identifier: Apache-2.0
 *
 * preload.c: stage 1 of the shim. Exports the hooked driver symbols (shim.h's table), hands
 * out the hooks when a program asks dlsym or cuGetProcAddress for them, and runs every launch
 * through the decision cache. No libpython here: the bridge is dlopened on first need.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elf_dynamic.h"
#include "shim.h"

void *_Atomic g_real[CLC_N_SLOTS] __attribute__((aligned(64)));
clc_driver g_drv;
clc_settings g_cfg;
CLC_TLS int t_in_clc;

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;

#define CLC_SLOT_NAME(name, params) #name,
static const char *const slot_names[CLC_N_SLOTS] = {CLC_HOOKED_SYMBOLS(CLC_SLOT_NAME)};

/* Forward declarations of the hooks, so the table of hook addresses can be built. */
#define CLC_HOOK_DECL(name, params) CLC_EXPORT CUresult name params;
CLC_HOOKED_SYMBOLS(CLC_HOOK_DECL)
#define CLC_HOOK_ADDR(name, params) (void *)&name,
static void *const hook_addr[CLC_N_SLOTS] = {CLC_HOOKED_SYMBOLS(CLC_HOOK_ADDR)};

/* ---- logging -------------------------------------------------------------------------------- */

void clc_log(int level, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    if (level > CLC_MSG_INFO || g_cfg.verbose) {
        char line[1100];
        int m = snprintf(line, sizeof line, "clc: %s\n", buf);
        if (m > 0) (void)!write(2, line, (size_t)(m < (int)sizeof line ? m : (int)sizeof line - 1));
    }
    if (level > CLC_MSG_INFO && clc_capture_enabled()) {
        clc_rec_message body = {.level = (uint32_t)level, .t_ns = clc_now_ns()};
        clc_capture_write(CLC_REC_MESSAGE, &body, sizeof body, buf, (size_t)n);
    }
}

/* ---- settings and start-up -------------------------------------------------------------------- */

static clc_outcome outcome_from_env(const char *v) {
    /* Recorded, whatever the verdict: the capture says which launches clc could not decide. */
    clc_outcome o = {.action = CLC_ACTION_ALLOW, .flags = CLC_FLAG_RECORD,
                     .rule = CLC_RULE_ON_ERROR};
    if (v && strcmp(v, "deny") == 0) {
        o.action = CLC_ACTION_DENY;
        o.error = 800; /* CUDA_ERROR_NOT_PERMITTED */
    }
    return o;
}

static void reset_rule_counts(void);

static void after_fork_child(void) {
    reset_rule_counts();
    clc_bridge_after_fork_child();
    clc_decider_after_fork_child();
    clc_capture_after_fork_child();
    clc_cache_after_fork_child();
}

/* ---- libc's own dlsym and dlvsym ------------------------------------------------------------
 * The shim exports both (a program's lookups of driver symbols must get the hooks), so any call
 * to them from here would reach the shim's own. libc's are found in libc's dynamic symbol table
 * (its GNU hash), by the default version of each name; before glibc 2.34 dlsym and dlvsym are
 * libdl's, found the same way in the first other object that defines them. */

typedef struct {
    const char *name;
    void *found;
    uintptr_t libc_base; /* look in libc only; 0: in any object but the shim */
    uintptr_t shim_base;
} libc_lookup;

static int find_in_libc(struct dl_phdr_info *info, size_t size, void *arg) {
    libc_lookup *q = arg;
    if (q->libc_base ? info->dlpi_addr != q->libc_base : info->dlpi_addr == q->shim_base)
        return 0;
    clc_dynamic d;
    uint32_t i;
    if (clc_read_dynamic(info->dlpi_addr, clc_dynamic_section(info), &d) &&
        (i = clc_gnu_lookup(&d, q->name)) != 0)
        q->found = (void *)(info->dlpi_addr + d.symtab[i].st_value);
    return q->libc_base || q->found;
}

static void *libc_symbol(const char *name) {
    Dl_info where, self;
    libc_lookup q = {name, NULL, 0, 0};
    /* gnu_get_libc_version is libc's alone: no preload defines it. */
    if (!dladdr((void *)&gnu_get_libc_version, &where) || !dladdr((void *)&libc_symbol, &self))
        return NULL;
    q.libc_base = (uintptr_t)where.dli_fbase;
    q.shim_base = (uintptr_t)self.dli_fbase;
    dl_iterate_phdr(find_in_libc, &q);
    if (!q.found) {
        q.libc_base = 0;
        dl_iterate_phdr(find_in_libc, &q);
    }
    return q.found;
}

static void resolve_dlsym(void) { real_dlsym = (dlsym_fn)libc_symbol("dlsym"); }

void *clc_next_symbol(const char *name) {
    if (unlikely(!real_dlsym)) resolve_dlsym();
    return real_dlsym ? real_dlsym(RTLD_NEXT, name) : NULL;
}

/* Runs in every process that inherits LD_PRELOAD, most of which never touch CUDA: read a few
 * variables and return. */
__attribute__((constructor)) static void clc_init(void) {
    resolve_dlsym();
    g_cfg.configured = clc_settings_load();
    const char *v = clc_setting("CLC_VERBOSE");
    g_cfg.verbose = v && *v && strcmp(v, "0") != 0;
    g_cfg.on_error = outcome_from_env(clc_setting("CLC_ON_ERROR"));
    v = clc_setting("CLC_OUTPUT");
    g_cfg.output = v && *v ? v : NULL;
    v = clc_setting("CLC_ROOT_PID");
    g_cfg.root_pid = v ? atoi(v) : 0;
    v = clc_setting("CLC_FORCE");
    g_cfg.force = v && strcmp(v, "1") == 0;
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* ---- the real driver ------------------------------------------------------------------------ */

void *clc_libcuda_handle(void) {
    static void *_Atomic handle;
    void *h = atomic_load_explicit(&handle, memory_order_acquire);
    if (h) return h;
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) h = dlopen("libcuda.so", RTLD_NOW);
    if (h) atomic_store_explicit(&handle, h, memory_order_release);
    return h;
}

void *clc_hook_addr(int slot) { return slot >= 0 && slot < CLC_N_SLOTS ? hook_addr[slot] : NULL; }

static int is_hook(void *p) {
    for (int i = 0; i < CLC_N_SLOTS; i++)
        if (hook_addr[i] == p) return 1;
    return 0;
}

void clc_set_real(int slot, void *p) {
    if (!p || is_hook(p)) return;
    void *expected = NULL;
    atomic_compare_exchange_strong(&g_real[slot], &expected, p);
}

void *clc_resolve_real(int slot) {
    if (!real_dlsym) resolve_dlsym();
    void *p = real_dlsym(RTLD_NEXT, slot_names[slot]);
    if (!p) {
        void *h = clc_libcuda_handle();
        if (h) p = real_dlsym(h, slot_names[slot]);
    }
    clc_set_real(slot, p);
    return atomic_load_explicit(&g_real[slot], memory_order_acquire);
}

static void *driver_sym(void *h, const char *a, const char *b) {
    void *p = real_dlsym(h, a);
    if (!p && b) p = real_dlsym(h, b);
    return p;
}

int clc_driver_load(void) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    if (!atomic_load_explicit(&g_hot.driver_ready, memory_order_relaxed)) {
        void *h = clc_libcuda_handle();
        if (h) {
            g_drv.ctx_get_current = driver_sym(h, "cuCtxGetCurrent", NULL);
            g_drv.ctx_set_current = driver_sym(h, "cuCtxSetCurrent", NULL);
            g_drv.ctx_get_device = driver_sym(h, "cuCtxGetDevice", NULL);
            g_drv.kernel_get_name = driver_sym(h, "cuKernelGetName", NULL);
            g_drv.func_get_name = driver_sym(h, "cuFuncGetName", NULL);
            g_drv.kernel_get_param_info = driver_sym(h, "cuKernelGetParamInfo", NULL);
            g_drv.func_get_param_info = driver_sym(h, "cuFuncGetParamInfo", NULL);
            g_drv.event_create = driver_sym(h, "cuEventCreate", NULL);
            g_drv.event_record = driver_sym(h, "cuEventRecord", NULL);
            g_drv.event_record_ptsz = driver_sym(h, "cuEventRecord_ptsz", "cuEventRecord");
            g_drv.event_query = driver_sym(h, "cuEventQuery", NULL);
            g_drv.event_synchronize = driver_sym(h, "cuEventSynchronize", NULL);
            g_drv.event_elapsed = driver_sym(h, "cuEventElapsedTime_v2", "cuEventElapsedTime");
            g_drv.event_destroy = driver_sym(h, "cuEventDestroy_v2", "cuEventDestroy");
            g_drv.stream_is_capturing = driver_sym(h, "cuStreamIsCapturing", NULL);
            g_drv.stream_is_capturing_ptsz =
                driver_sym(h, "cuStreamIsCapturing_ptsz", "cuStreamIsCapturing");
            g_drv.occupancy = driver_sym(h, "cuOccupancyMaxActiveBlocksPerMultiprocessor", NULL);
            g_drv.memset_d8_async = driver_sym(h, "cuMemsetD8Async", NULL);
            g_drv.primary_get_state = driver_sym(h, "cuDevicePrimaryCtxGetState", NULL);
            g_drv.primary_retain = driver_sym(h, "cuDevicePrimaryCtxRetain", NULL);
            g_drv.memset_d8_async_ptsz =
                driver_sym(h, "cuMemsetD8Async_ptsz", "cuMemsetD8Async");
            g_drv.kernel_get_library = driver_sym(h, "cuKernelGetLibrary", NULL);
            g_drv.func_get_module = driver_sym(h, "cuFuncGetModule", NULL);
            g_drv.library_get_module = driver_sym(h, "cuLibraryGetModule", NULL);
            g_hot.ctx_get_current = g_drv.ctx_get_current;
            atomic_store_explicit(&g_hot.driver_ready, 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&lock);
    return atomic_load_explicit(&g_hot.driver_ready, memory_order_relaxed);
}

/* ---- handing out the hooks -------------------------------------------------------------------- */

int clc_slot_by_name(const char *name) {
    if (name[0] != 'c' || name[1] != 'u') return -1;
    for (int i = 0; i < CLC_N_SLOTS; i++)
        if (strcmp(slot_names[i], name) == 0) return i;
    return -1;
}

/* cuGetProcAddress takes a base name and picks the variant by flags and version, as the
 * driver's own table does: _ptsz for the per-thread default stream, _v2 ABIs from 12000. */
static int slot_for_request(const char *name, int version, cuuint64_t flags) {
    int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int v2 = version >= 12000;
    if (strcmp(name, "cuLaunchKernel") == 0)
        return ptsz ? CLC_SLOT_cuLaunchKernel_ptsz : CLC_SLOT_cuLaunchKernel;
    if (strcmp(name, "cuLaunchKernelEx") == 0)
        return ptsz ? CLC_SLOT_cuLaunchKernelEx_ptsz : CLC_SLOT_cuLaunchKernelEx;
    if (strcmp(name, "cuLaunchCooperativeKernel") == 0)
        return ptsz ? CLC_SLOT_cuLaunchCooperativeKernel_ptsz : CLC_SLOT_cuLaunchCooperativeKernel;
    if (strcmp(name, "cuGetProcAddress") == 0)
        return v2 ? CLC_SLOT_cuGetProcAddress_v2 : CLC_SLOT_cuGetProcAddress;
    if (strcmp(name, "cuGraphAddKernelNode") == 0)
        return v2 ? CLC_SLOT_cuGraphAddKernelNode_v2 : CLC_SLOT_cuGraphAddKernelNode;
    if (strcmp(name, "cuGraphKernelNodeSetParams") == 0)
        return v2 ? CLC_SLOT_cuGraphKernelNodeSetParams_v2 : CLC_SLOT_cuGraphKernelNodeSetParams;
    if (strcmp(name, "cuGraphExecKernelNodeSetParams") == 0)
        return v2 ? CLC_SLOT_cuGraphExecKernelNodeSetParams_v2
                  : CLC_SLOT_cuGraphExecKernelNodeSetParams;
    if (strcmp(name, "cuGraphAddNode") == 0)
        return version >= 12030 ? CLC_SLOT_cuGraphAddNode_v2 : CLC_SLOT_cuGraphAddNode;
    /* Context teardown, both ABIs: cudart 13 asks for the primary context's release and reset
     * at version 7000 (the first ABI; measured on driver 580). */
    if (strcmp(name, "cuCtxDestroy") == 0)
        return version >= 4000 ? CLC_SLOT_cuCtxDestroy_v2 : CLC_SLOT_cuCtxDestroy;
    if (strcmp(name, "cuDevicePrimaryCtxRelease") == 0)
        return version >= 11000 ? CLC_SLOT_cuDevicePrimaryCtxRelease_v2
                                : CLC_SLOT_cuDevicePrimaryCtxRelease;
    if (strcmp(name, "cuDevicePrimaryCtxReset") == 0)
        return version >= 11000 ? CLC_SLOT_cuDevicePrimaryCtxReset_v2
                                : CLC_SLOT_cuDevicePrimaryCtxReset;
    return clc_slot_by_name(name);
}

static void *substitute(int slot, void *real) {
    if (slot < 0 || !real || is_hook(real)) return real;
    clc_set_real(slot, real);
    clc_debug("hooked %s (real %p)", slot_names[slot], real);
    return hook_addr[slot];
}

/* A hooked symbol asked for with RTLD_NEXT: whatever comes after the caller, its launches must
 * reach the hook (which calls the driver's own). NULL when the driver does not define it. */
__attribute__((noinline)) static void *next_hooked(int slot) {
    return clc_real(slot) ? hook_addr[slot] : NULL;
}

/* Whether the object that made the call at `ret` defines `name` itself: an interposer of that
 * symbol (another preload library, a profiler), whose RTLD_NEXT lookup wants what comes after
 * it, as without clc. The shim's own real pointer may be that interposer's definition, so
 * answering it with the hook would loop. */
__attribute__((noinline)) static int caller_defines(const void *ret, const char *name) {
    Dl_info where;
    struct link_map *map = NULL;
    clc_dynamic d;
    uint32_t i;
    if (!dladdr1(ret, &where, (void **)&map, RTLD_DL_LINKMAP) || !map ||
        !clc_read_dynamic(map->l_addr, map->l_ld, &d) || !(i = clc_gnu_lookup(&d, name)))
        return 0;
    return d.symtab[i].st_shndx != SHN_UNDEF;
}

/* RTLD_NEXT is resolved by glibc from the caller's return address, so a lookup that libc
 * answers must leave as a tail call (a jump) for "next" to mean next after the caller, not
 * after the shim. A hooked driver symbol gets the hook, by any handle, unless its caller is an
 * interposer of that symbol. */
CLC_EXPORT void *dlsym(void *handle, const char *name) {
    if (unlikely(!real_dlsym)) resolve_dlsym();
    if (handle == RTLD_NEXT) {
        int slot = name[0] == 'c' && name[1] == 'u' ? clc_slot_by_name(name) : -1;
        if (slot >= 0 && !caller_defines(__builtin_return_address(0), name))
            return next_hooked(slot);
        return real_dlsym(handle, name);
    }
    void *p = real_dlsym(handle, name);
    if (p && name[0] == 'c' && name[1] == 'u') p = substitute(clc_slot_by_name(name), p);
    return p;
}

/* dlvsym: the same substitution, for programs that ask for a symbol version. */
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
CLC_EXPORT void *dlvsym(void *handle, const char *name, const char *version) {
    static dlvsym_fn real_dlvsym;
    if (unlikely(!real_dlvsym)) {
        real_dlvsym = (dlvsym_fn)libc_symbol("dlvsym");
        if (!real_dlvsym) return NULL;
    }
    if (handle == RTLD_NEXT) {
        int slot = name[0] == 'c' && name[1] == 'u' ? clc_slot_by_name(name) : -1;
        if (slot >= 0 && !caller_defines(__builtin_return_address(0), name))
            return next_hooked(slot);
        return real_dlvsym(handle, name, version);
    }
    void *p = real_dlvsym(handle, name, version);
    if (p && name[0] == 'c' && name[1] == 'u') p = substitute(clc_slot_by_name(name), p);
    return p;
}

CLC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                     cuuint64_t flags) {
    pfn_cuGetProcAddress real = (pfn_cuGetProcAddress)clc_real(CLC_SLOT_cuGetProcAddress);
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
        *pfn = substitute(slot_for_request(symbol, version, flags), *pfn);
    return r;
}

CLC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                        cuuint64_t flags, int *status) {
    pfn_cuGetProcAddress_v2 real = (pfn_cuGetProcAddress_v2)clc_real(CLC_SLOT_cuGetProcAddress_v2);
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
        *pfn = substitute(slot_for_request(symbol, version, flags), *pfn);
    return r;
}

/* ---- the launch gate -------------------------------------------------------------------------- */

typedef struct {
    clc_entry *entry;
    const clc_outcome *outcome;
    uint32_t entry_point;
    uint32_t grid[3], block[3], shmem;
    CUstream stream;
    uint64_t t_ns, seq;
    clc_timing *timing;
    int record; /* write a LAUNCH record: the outcome asks, or one of a kernel's first denies */
    clc_outcome scratch; /* the engine's answer for this launch (modes other than cached) */
} gate;

/* Denied launches per deciding rule (clc_outcome.rule + 2; the last counts every rule past the
 * table's end), written into the capture at exit (CLC_REC_RULE_STATS). */
#define CLC_RULE_COUNTERS 4096
static _Atomic uint64_t g_rule_denied[CLC_RULE_COUNTERS];

static void count_denied_by(int32_t rule) {
    int64_t i = (int64_t)rule + 2;
    if (i < 0 || i >= CLC_RULE_COUNTERS) i = CLC_RULE_COUNTERS - 1;
    atomic_fetch_add_explicit(&g_rule_denied[i], 1, memory_order_relaxed);
}

static void reset_rule_counts(void) {
    for (int i = 0; i < CLC_RULE_COUNTERS; i++) atomic_store(&g_rule_denied[i], 0);
}

void clc_rule_stats(void (*fn)(int32_t rule, uint64_t denied, void *), void *arg) {
    for (int i = 0; i < CLC_RULE_COUNTERS; i++) {
        uint64_t n = atomic_load_explicit(&g_rule_denied[i], memory_order_relaxed);
        if (n) fn(i == CLC_RULE_COUNTERS - 1 ? INT32_MAX : i - 2, n, arg);
    }
}

static _Atomic uint64_t g_seq;

static inline CUcontext current_ctx(void) {
    CUcontext ctx = NULL;
    if (likely(g_hot.ctx_get_current != NULL)) g_hot.ctx_get_current(&ctx);
    return ctx;
}

#define CLC_LAUNCH_INFO(entry_point)                                                          \
    {                                                                                        \
        .entry_point = entry_point, .grid = {gx, gy, gz}, .block = {bx, by, bz}, .shmem = shmem, \
        .stream = stream, .params = params, .extra = extra                                    \
    }

__attribute__((noinline)) static clc_entry *first_sight(gate *g, uint64_t f, uint64_t ctx,
                                                       uint32_t entry_point, unsigned gx,
                                                       unsigned gy, unsigned gz, unsigned bx,
                                                       unsigned by, unsigned bz, unsigned shmem,
                                                       CUstream stream, void **params,
                                                       void **extra) {
    clc_launch_info l = CLC_LAUNCH_INFO(entry_point);
    t_in_clc = 1;
    clc_entry *e = clc_cache_decide(f, ctx, &l, &g->scratch);
    t_in_clc = 0;
    return e;
}

/* An entry whose outcome depends on the launch: shape clauses, or the engine's hooks. */
__attribute__((noinline)) static const clc_outcome *shaped_outcome(
    gate *g, clc_entry *e, uint32_t entry_point, unsigned gx, unsigned gy, unsigned gz,
    unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params,
    void **extra) {
    clc_launch_info l = CLC_LAUNCH_INFO(entry_point);
    return clc_outcome_for(e, &l, &g->scratch);
}

/* Everything a launch that is not a plain allow needs: kept out of the inlined fast path. */
__attribute__((noinline)) static int gate_setup(gate *g, const clc_outcome *o,
                                                uint32_t entry_point, unsigned gx, unsigned gy,
                                                unsigned gz, unsigned bx, unsigned by,
                                                unsigned bz, unsigned shmem, CUstream stream) {
    clc_entry *e = g->entry;
    g->outcome = o;
    g->entry_point = entry_point;
    g->grid[0] = gx, g->grid[1] = gy, g->grid[2] = gz;
    g->block[0] = bx, g->block[1] = by, g->block[2] = bz;
    g->shmem = shmem;
    g->stream = stream;
    g->timing = NULL;
    g->seq = atomic_fetch_add_explicit(&g_seq, 1, memory_order_relaxed);
    g->record = (o->flags & CLC_FLAG_RECORD) != 0;
    if (o->action == CLC_ACTION_DENY) {
        count_denied_by(o->rule);
        if (e && atomic_fetch_add_explicit(&e->denied, 1, memory_order_relaxed) <
                     CLC_DENIED_RECORDED)
            g->record = 1;
    }
    g->t_ns = g->record ? clc_launch_time_ns() : 0;
    if ((o->flags & CLC_FLAG_TIME) && o->action != CLC_ACTION_DENY && e &&
        (entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) < CLC_ENTRY_GRAPH_ADD_NODE) {
        t_in_clc = 1;
        clc_timing_begin(&g->timing, stream, (entry_point & CLC_ENTRY_PTSZ) != 0);
        t_in_clc = 0;
    }
    return 1;
}

/* The fast path, inlined into each hook: find the (kernel, context) entry, count the launch,
 * pick its outcome. Returns 0 when the launch is a plain allow with nothing to record, the
 * common case; it then touches one cache line of the table and one of g_hot. */
static inline __attribute__((always_inline)) int gate_enter(
    gate *g, CUfunction f, CUcontext ctx, uint32_t entry_point, unsigned gx, unsigned gy,
    unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream,
    void **params, void **extra) {
    g->entry = NULL;
    if (unlikely(!clc_driver_ready())) return 0;
    if (!ctx) ctx = current_ctx();
    clc_entry *e = clc_cache_find((uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)ctx);
    int first = 0;
    if (unlikely(!e)) {
        e = first_sight(g, (uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)ctx, entry_point, gx, gy,
                        gz, bx, by, bz, shmem, stream, params, extra);
        first = 1;
    }
    const clc_outcome *o;
    if (likely(e != NULL)) {
        /* At first sight the engine has just answered for this very launch (in the cached
         * mode the entry's answer holds for every launch, whichever thread made it). */
        if (likely(e->shaped == 0))
            o = &e->fallback;
        else if (first && e->mode != CLC_MODE_CACHED)
            o = &g->scratch;
        else
            o = shaped_outcome(g, e, entry_point, gx, gy, gz, bx, by, bz, shmem, stream, params,
                               extra);
        if (unlikely((entry_point & ~(uint32_t)CLC_ENTRY_PTSZ) >= CLC_ENTRY_GRAPH_ADD_NODE))
            atomic_fetch_add_explicit(&e->graph_nodes, 1, memory_order_relaxed);
        else
            atomic_fetch_add_explicit(&e->launches, 1, memory_order_relaxed);
    } else {
        o = &g_cfg.on_error;
    }
    g->entry = e;
    if (likely(o->action == CLC_ACTION_ALLOW && o->flags == 0)) return 0;
    return gate_setup(g, o, entry_point, gx, gy, gz, bx, by, bz, shmem, stream);
}

/* A launch the driver refused: counted apart, so that `launches - denied - failed` is what
 * the GPU was given. */
static inline CUresult count_failure(const gate *g, CUresult result) {
    if (unlikely(result != CUDA_SUCCESS) && g->entry)
        atomic_fetch_add_explicit(&g->entry->failed, 1, memory_order_relaxed);
    return result;
}

static CUresult gate_exit(gate *g, CUresult result) {
    clc_entry *e = g->entry;
    const clc_outcome *o = g->outcome;
    if (o->action != CLC_ACTION_DENY) count_failure(g, result);
    t_in_clc = 1;
    if (g->timing) {
        if (result == CUDA_SUCCESS)
            clc_timing_end(g->timing, g->stream, (g->entry_point & CLC_ENTRY_PTSZ) != 0, e, g->seq);
        else
            clc_timing_end(g->timing, NULL, 0, NULL, 0);
    }
    clc_rec_launch *r;
    if (g->record && e && e->kernel_id != CLC_KERNEL_UNCACHED && clc_capture_enabled() &&
        (r = clc_capture_begin(CLC_REC_LAUNCH, sizeof *r)) != NULL) {
        *r = (clc_rec_launch){
            .seq = g->seq,
            .t_ns = g->t_ns,
            .stream = (uint64_t)(uintptr_t)g->stream,
            .kernel_id = e->kernel_id,
            .entry = g->entry_point,
            .grid = {g->grid[0], g->grid[1], g->grid[2]},
            .block = {g->block[0], g->block[1], g->block[2]},
            .shared_mem = g->shmem,
            .tid = clc_tid(),
            .action = o->action,
            .rule = o->rule,
            .result = result,
        };
        clc_capture_commit();
        atomic_fetch_add_explicit(&e->recorded, 1, memory_order_relaxed);
    }
    t_in_clc = 0;
    return result;
}

/* Graph slots used up (CLC_GRAPH_SLOTS in one context): said once, for launches captured into
 * graphs and kernel nodes alike. */
static void graph_slots_used_up(void) {
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "more than %d kernel nodes and captured launches of wrapped kernels in one "
                "context: later ones run unwrapped",
                CLC_GRAPH_SLOTS);
}

/* Whether the launch on `stream` is being captured into a CUDA graph (stream capture). An
 * invalidated capture counts as one: the launch fails either way, and must not take a ring
 * slot that a replay would reuse. */
static int stream_captured(CUstream stream, int ptsz) {
    int status;
    CUresult r = clc_stream_capture_status(stream, ptsz, &status);
    return r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
           (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE);
}

/* A wrapped kernel's launch that cannot be rewritten runs the original: said once. A kernel
 * that uses its slot, launched into a graph under stream capture, gets a graph slot, zeroed
 * by a memset captured just before it (so each replay starts afresh). */
__attribute__((noinline)) static int replace_begin(gate *g, clc_replaced *r, unsigned gx,
                                                   unsigned gy, unsigned gz, unsigned bx,
                                                   unsigned by, unsigned bz, unsigned shmem,
                                                   void **params, void **extra) {
    const clc_replacement *rep = (const clc_replacement *)(uintptr_t)g->outcome->replacement;
    int ptsz = (g->entry_point & CLC_ENTRY_PTSZ) != 0;
    int graph = rep && (rep->flags & CLC_REPLACE_SLOT) && stream_captured(g->stream, ptsz);
    CUresult e = rep ? clc_replace_begin(r, rep, gx, gy, gz, bx, by, bz, shmem, params, extra,
                                         graph)
                     : CUDA_ERROR_INVALID_HANDLE;
    if (e == CUDA_SUCCESS && graph) {
        CUresult (*zero)(CUdeviceptr, unsigned char, size_t, CUstream) =
            ptsz ? g_drv.memset_d8_async_ptsz : g_drv.memset_d8_async;
        e = zero ? zero((CUdeviceptr)r->arg.slot, 0, CLC_SLOT_BYTES, g->stream)
                   : CUDA_ERROR_NOT_FOUND;
        if (e != CUDA_SUCCESS) clc_replace_end(r);
    }
    if (e == CUDA_SUCCESS) return 1;
    if (e == CLC_NO_GRAPH_SLOT) {
        graph_slots_used_up();
        return 0;
    }
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING, "a wrapped kernel's launch could not be rewritten (CUresult %d): "
                                 "it runs unwrapped", (int)e);
    return 0;
}

/* The driver refused the wrapped kernel's launch (a cooperative grid sized for the original,
 * a resource limit the wrapper crosses): the original is launched instead, said once. */
__attribute__((noinline)) static void replaced_launch_failed(CUresult e) {
    if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING, "the driver refused a wrapped kernel's launch (CUresult %d): "
                                 "the original kernel was launched instead", (int)e);
}

/* The replace path of each launch entry point has a function of its own, out of line: its
 * rewritten arguments live in that function's frame, not in the hook's fast path. */
#define CLC_LAUNCH_HOOK(name, entry_point)                                                       \
    __attribute__((noinline)) static CUresult name##_replaced(                                  \
        gate *g, pfn_##name real, CUfunction f, unsigned gx, unsigned gy, unsigned gz,           \
        unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params,   \
        void **extra) {                                                                          \
        clc_replaced r;                                                                          \
        if (!replace_begin(g, &r, gx, gy, gz, bx, by, bz, shmem, params, extra))                 \
            return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                \
        CUresult res = real(r.f, r.grid[0], r.grid[1], r.grid[2], bx, by, bz, shmem, stream,     \
                            r.params, r.extra);                                                  \
        clc_replace_end(&r);                                                                     \
        if (unlikely(res != CUDA_SUCCESS)) {                                                     \
            replaced_launch_failed(res);                                                         \
            res = real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                 \
        }                                                                                        \
        return res;                                                                              \
    }                                                                                            \
    CLC_EXPORT CUresult name CLC_LAUNCH_PARAMS {                                                 \
        pfn_##name real = (pfn_##name)clc_real(CLC_SLOT_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        if (unlikely(t_in_clc)) return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra); \
        if (likely(!gate_enter(&g, f, NULL, entry_point, gx, gy, gz, bx, by, bz, shmem, stream,  \
                               params, extra)))                                                  \
            return count_failure(&g, real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)); \
        if (g.outcome->action == CLC_ACTION_DENY) return gate_exit(&g, g.outcome->error);        \
        if (g.outcome->action == CLC_ACTION_REPLACE)                                             \
            return gate_exit(&g, name##_replaced(&g, real, f, gx, gy, gz, bx, by, bz, shmem,     \
                                                 stream, params, extra));                        \
        return gate_exit(&g, real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra));     \
    }
CLC_LAUNCH_HOOK(cuLaunchKernel, CLC_ENTRY_LAUNCH)
CLC_LAUNCH_HOOK(cuLaunchKernel_ptsz, CLC_ENTRY_LAUNCH | CLC_ENTRY_PTSZ)

#define CLC_COOP_HOOK(name, entry_point)                                                         \
    __attribute__((noinline)) static CUresult name##_replaced(                                  \
        gate *g, pfn_##name real, CUfunction f, unsigned gx, unsigned gy, unsigned gz,           \
        unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params) { \
        clc_replaced r;                                                                          \
        if (!params || !replace_begin(g, &r, gx, gy, gz, bx, by, bz, shmem, params, NULL))       \
            return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                       \
        CUresult res = real(r.f, r.grid[0], r.grid[1], r.grid[2], bx, by, bz, shmem, stream,     \
                            r.params);                                                           \
        clc_replace_end(&r);                                                                     \
        if (unlikely(res != CUDA_SUCCESS)) {                                                     \
            replaced_launch_failed(res);                                                         \
            res = real(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                        \
        }                                                                                        \
        return res;                                                                              \
    }                                                                                            \
    CLC_EXPORT CUresult name CLC_COOP_PARAMS {                                                   \
        pfn_##name real = (pfn_##name)clc_real(CLC_SLOT_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        if (unlikely(t_in_clc)) return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params);   \
        if (likely(!gate_enter(&g, f, NULL, entry_point, gx, gy, gz, bx, by, bz, shmem, stream,  \
                               params, NULL)))                                                   \
            return count_failure(&g, real(f, gx, gy, gz, bx, by, bz, shmem, stream, params));    \
        if (g.outcome->action == CLC_ACTION_DENY) return gate_exit(&g, g.outcome->error);        \
        if (g.outcome->action == CLC_ACTION_REPLACE)                                             \
            return gate_exit(&g, name##_replaced(&g, real, f, gx, gy, gz, bx, by, bz, shmem,     \
                                                 stream, params));                               \
        return gate_exit(&g, real(f, gx, gy, gz, bx, by, bz, shmem, stream, params));            \
    }
CLC_COOP_HOOK(cuLaunchCooperativeKernel, CLC_ENTRY_LAUNCH_COOPERATIVE)
CLC_COOP_HOOK(cuLaunchCooperativeKernel_ptsz, CLC_ENTRY_LAUNCH_COOPERATIVE | CLC_ENTRY_PTSZ)

/* Several devices' cooperative launches at once: each decided as a cooperative launch; when one
 * is denied, none is launched (the call is all or nothing, as the driver's is). Wrapped kernels
 * run unwrapped here (said once): their replacement is made for one context. */
CLC_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(clc_launch_params *list, unsigned int n,
                                                         unsigned int flags) {
    pfn_cuLaunchCooperativeKernelMultiDevice real =
        (pfn_cuLaunchCooperativeKernelMultiDevice)clc_real(CLC_SLOT_cuLaunchCooperativeKernelMultiDevice);
    if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;
    if (t_in_clc || !list || n == 0) return real(list, n, flags);
    gate small[8], *g = n <= 8 ? small : malloc(n * sizeof *g);
    unsigned char small_gated[8], *gated = n <= 8 ? small_gated : malloc(n);
    if (!g || !gated) {
        if (g != small) free(g);
        if (gated != small_gated) free(gated);
        return g_cfg.on_error.action == CLC_ACTION_DENY ? g_cfg.on_error.error
                                                         : real(list, n, flags);
    }
    CUresult refused = CUDA_SUCCESS;
    for (unsigned i = 0; i < n; i++) {
        const clc_launch_params *p = &list[i];
        gated[i] = (unsigned char)gate_enter(&g[i], p->function, NULL, CLC_ENTRY_LAUNCH_COOPERATIVE,
                                             p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                                             p->blockDimY, p->blockDimZ, p->sharedMemBytes,
                                             p->hStream, p->kernelParams, NULL);
        if (!gated[i]) continue;
        if (g[i].outcome->action == CLC_ACTION_DENY && refused == CUDA_SUCCESS)
            refused = g[i].outcome->error;
        if (g[i].outcome->action == CLC_ACTION_REPLACE) {
            if (CLC_FIRST_TIME())
                clc_log(CLC_MSG_WARNING, "a wrapped kernel launched with "
                                         "cuLaunchCooperativeKernelMultiDevice runs unwrapped");
        }
    }
    CUresult r = refused != CUDA_SUCCESS ? refused : real(list, n, flags);
    for (unsigned i = 0; i < n; i++) {
        if (!gated[i])
            count_failure(&g[i], r);
        else
            gate_exit(&g[i], g[i].outcome->action == CLC_ACTION_DENY ? g[i].outcome->error : r);
    }
    if (g != small) free(g);
    if (gated != small_gated) free(gated);
    return r;
}

#define CLC_LAUNCH_EX_HOOK(name, entry_point)                                                    \
    __attribute__((noinline)) static CUresult name##_replaced(                                  \
        gate *g, pfn_##name real, const CUlaunchConfig *config, CUfunction f, void **params,     \
        void **extra) {                                                                          \
        clc_replaced r;                                                                          \
        if (!replace_begin(g, &r, config->gridDimX, config->gridDimY, config->gridDimZ,          \
                           config->blockDimX, config->blockDimY, config->blockDimZ,              \
                           config->sharedMemBytes, params, extra))                               \
            return real(config, f, params, extra);                                               \
        CUlaunchConfig c = *config;                                                              \
        c.gridDimX = r.grid[0], c.gridDimY = r.grid[1], c.gridDimZ = r.grid[2];                  \
        CUresult res = real(&c, r.f, r.params, r.extra);                                         \
        clc_replace_end(&r);                                                                     \
        if (unlikely(res != CUDA_SUCCESS)) {                                                     \
            replaced_launch_failed(res);                                                         \
            res = real(config, f, params, extra);                                                \
        }                                                                                        \
        return res;                                                                              \
    }                                                                                            \
    CLC_EXPORT CUresult name CLC_LAUNCH_EX_PARAMS {                                              \
        pfn_##name real = (pfn_##name)clc_real(CLC_SLOT_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        if (unlikely(t_in_clc) || unlikely(!config)) return real(config, f, params, extra);      \
        if (likely(!gate_enter(&g, f, NULL, entry_point, config->gridDimX, config->gridDimY,     \
                               config->gridDimZ, config->blockDimX, config->blockDimY,           \
                               config->blockDimZ, config->sharedMemBytes, config->hStream,       \
                               params, extra)))                                                  \
            return count_failure(&g, real(config, f, params, extra));                            \
        if (g.outcome->action == CLC_ACTION_DENY) return gate_exit(&g, g.outcome->error);        \
        if (g.outcome->action == CLC_ACTION_REPLACE)                                             \
            return gate_exit(&g, name##_replaced(&g, real, config, f, params, extra));           \
        return gate_exit(&g, real(config, f, params, extra));                                    \
    }
CLC_LAUNCH_EX_HOOK(cuLaunchKernelEx, CLC_ENTRY_LAUNCH_EX)
CLC_LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz, CLC_ENTRY_LAUNCH_EX | CLC_ENTRY_PTSZ)

/* ---- graph kernel nodes: the same decision, taken when the node is made or changed ---------- */

static CUresult graph_gate(gate *g, int *gated, CUfunction f, CUcontext ctx, uint32_t entry_point,
                           const CUDA_KERNEL_NODE_PARAMS_v1 *p, int wraps) {
    *gated = 0;
    if (t_in_clc || !p || !f) return CUDA_SUCCESS;
    *gated = gate_enter(g, f, ctx, entry_point, p->gridDimX, p->gridDimY, p->gridDimZ,
                        p->blockDimX, p->blockDimY, p->blockDimZ, p->sharedMemBytes, NULL,
                        p->kernelParams, p->extra);
    if (*gated && g->outcome->action == CLC_ACTION_DENY) return gate_exit(g, g->outcome->error);
    if (*gated && g->outcome->action == CLC_ACTION_REPLACE && !wraps) {
        if (CLC_FIRST_TIME())
            clc_log(CLC_MSG_WARNING,
                    "a wrapped kernel was put in a CUDA graph through the generic node API "
                    "(cuGraphAddNode / cuGraphNodeSetParams): those nodes run the original "
                    "kernel");
    }
    return CUDA_SUCCESS;
}

/* A kernel node of a wrapped kernel (cuGraphAddKernelNode and its setters) gets the wrapped
 * kernel: its function, the grid it launches with, and the program's arguments plus the launch
 * argument; a wrapper that uses its slot gets a graph slot of its own (each replay of the node
 * starts it afresh, see CLC_GRAPH_SEQ). 1 when `r` holds the rewrite (clc_replace_end after
 * the call); 0: the node keeps the original (said once). */
static int node_replace(const gate *g, clc_replaced *r, const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    const clc_replacement *rep = (const clc_replacement *)(uintptr_t)g->outcome->replacement;
    CUresult e = rep ? clc_replace_begin(r, rep, p->gridDimX, p->gridDimY, p->gridDimZ,
                                         p->blockDimX, p->blockDimY, p->blockDimZ,
                                         p->sharedMemBytes, p->kernelParams, p->extra,
                                         (rep->flags & CLC_REPLACE_SLOT) != 0)
                     : CUDA_ERROR_INVALID_HANDLE;
    if (e == CUDA_SUCCESS) return 1;
    if (e == CLC_NO_GRAPH_SLOT)
        graph_slots_used_up();
    else if (CLC_FIRST_TIME())
        clc_log(CLC_MSG_WARNING,
                "a wrapped kernel's graph node could not be rewritten (CUresult %d): it runs "
                "unwrapped",
                (int)e);
    return 0;
}

/* The v2 parameters name the kernel by `kern` (in `ctx`) when `func` is NULL. */
#define CLC_V2_KERNEL(p) ((p) && (p)->func ? (p)->func : (p) ? (CUfunction)(p)->kern : NULL)
#define CLC_V2_CTX(p) ((p) && !(p)->func ? (p)->ctx : NULL)

#define CLC_GRAPH_HOOK(name, entry_point, params, fn_of, ctx_of, kernel_params, call)            \
    CLC_EXPORT CUresult name params {                                                            \
        pfn_##name real = (pfn_##name)clc_real(CLC_SLOT_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        int gated;                                                                               \
        CUresult r = graph_gate(&g, &gated, fn_of, ctx_of, entry_point,                          \
                                (const CUDA_KERNEL_NODE_PARAMS_v1 *)(kernel_params), 0);         \
        if (r != CUDA_SUCCESS) return r;                                                         \
        r = real call;                                                                           \
        return gated ? gate_exit(&g, r) : r;                                                     \
    }

/* The kernel-node entry points: `p` (of `type`) is given to the driver as is, or rewritten for
 * a wrapped kernel (node_replace); `clear` names the kernel by its function alone (v2). */
#define CLC_KERNEL_NODE_HOOK(name, entry_point, plist, type, fn_of, ctx_of, clear, call)         \
    CLC_EXPORT CUresult name plist {                                                            \
        pfn_##name real = (pfn_##name)clc_real(CLC_SLOT_##name);                                 \
        if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gate g;                                                                                  \
        int gated;                                                                               \
        CUresult r = graph_gate(&g, &gated, fn_of, ctx_of, entry_point,                          \
                                (const CUDA_KERNEL_NODE_PARAMS_v1 *)p, 1);                       \
        if (r != CUDA_SUCCESS) return r;                                                         \
        clc_replaced rr;                                                                         \
        type copy;                                                                               \
        int swapped = gated && g.outcome->action == CLC_ACTION_REPLACE &&                        \
                      node_replace(&g, &rr, (const CUDA_KERNEL_NODE_PARAMS_v1 *)p);              \
        if (swapped) {                                                                           \
            copy = *p;                                                                           \
            copy.func = rr.f;                                                                    \
            copy.gridDimX = rr.grid[0], copy.gridDimY = rr.grid[1], copy.gridDimZ = rr.grid[2];  \
            copy.kernelParams = rr.params;                                                       \
            copy.extra = rr.extra;                                                               \
            clear;                                                                               \
            p = &copy;                                                                           \
        }                                                                                        \
        r = real call;                                                                           \
        if (swapped) clc_replace_end(&rr);                                                       \
        return gated ? gate_exit(&g, r) : r;                                                     \
    }
#define CLC_V1_CLEAR ((void)0)
#define CLC_V2_CLEAR (copy.kern = NULL, copy.ctx = NULL)
CLC_KERNEL_NODE_HOOK(cuGraphAddKernelNode, CLC_ENTRY_GRAPH_ADD_NODE,
                     (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                      const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, CLC_V1_CLEAR,
                     (node, graph, deps, n_deps, p))
CLC_KERNEL_NODE_HOOK(cuGraphAddKernelNode_v2, CLC_ENTRY_GRAPH_ADD_NODE,
                     (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                      const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), CLC_V2_CLEAR,
                     (node, graph, deps, n_deps, p))
CLC_KERNEL_NODE_HOOK(cuGraphKernelNodeSetParams, CLC_ENTRY_GRAPH_NODE_SET,
                     (CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, CLC_V1_CLEAR, (node, p))
CLC_KERNEL_NODE_HOOK(cuGraphKernelNodeSetParams_v2, CLC_ENTRY_GRAPH_NODE_SET,
                     (CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), CLC_V2_CLEAR,
                     (node, p))
CLC_KERNEL_NODE_HOOK(cuGraphExecKernelNodeSetParams, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
                     (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p),
                     CUDA_KERNEL_NODE_PARAMS_v1, p ? p->func : NULL, NULL, CLC_V1_CLEAR,
                     (exec, node, p))
CLC_KERNEL_NODE_HOOK(cuGraphExecKernelNodeSetParams_v2, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
                     (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p),
                     CUDA_KERNEL_NODE_PARAMS_v2, CLC_V2_KERNEL(p), CLC_V2_CTX(p), CLC_V2_CLEAR,
                     (exec, node, p))

/* The generic node API: only kernel nodes are gated, any other type passes untouched. */
#define CLC_NODE_KERNEL(p) ((p) && (p)->type == CU_GRAPH_NODE_TYPE_KERNEL ? &(p)->kernel : NULL)
CLC_GRAPH_HOOK(cuGraphAddNode, CLC_ENTRY_GRAPH_ADD_NODE,
               (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
                clc_graph_node_params *p),
               CLC_V2_KERNEL(CLC_NODE_KERNEL(p)), CLC_V2_CTX(CLC_NODE_KERNEL(p)),
               CLC_NODE_KERNEL(p), (node, graph, deps, n_deps, p))
CLC_GRAPH_HOOK(cuGraphAddNode_v2, CLC_ENTRY_GRAPH_ADD_NODE,
               (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, const void *edges,
                size_t n_deps, clc_graph_node_params *p),
               CLC_V2_KERNEL(CLC_NODE_KERNEL(p)), CLC_V2_CTX(CLC_NODE_KERNEL(p)),
               CLC_NODE_KERNEL(p), (node, graph, deps, edges, n_deps, p))
CLC_GRAPH_HOOK(cuGraphNodeSetParams, CLC_ENTRY_GRAPH_NODE_SET,
               (CUgraphNode node, clc_graph_node_params * p), CLC_V2_KERNEL(CLC_NODE_KERNEL(p)),
               CLC_V2_CTX(CLC_NODE_KERNEL(p)), CLC_NODE_KERNEL(p), (node, p))
CLC_GRAPH_HOOK(cuGraphExecNodeSetParams, CLC_ENTRY_GRAPH_EXEC_NODE_SET,
               (CUgraphExec exec, CUgraphNode node, clc_graph_node_params * p),
               CLC_V2_KERNEL(CLC_NODE_KERNEL(p)), CLC_V2_CTX(CLC_NODE_KERNEL(p)),
               CLC_NODE_KERNEL(p), (exec, node, p))

/* ---- module and library loads ----------------------------------------------------------------- */

static uint64_t elf_size(const unsigned char *p) {
    if (p[4] != 2) return 0; /* ELFCLASS64 only: cubins are */
    uint64_t phoff, shoff;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, p + 0x20, 8);
    memcpy(&shoff, p + 0x28, 8);
    memcpy(&phentsize, p + 0x36, 2);
    memcpy(&phnum, p + 0x38, 2);
    memcpy(&shentsize, p + 0x3a, 2);
    memcpy(&shnum, p + 0x3c, 2);
    uint64_t a = phoff + (uint64_t)phentsize * phnum, b = shoff + (uint64_t)shentsize * shnum;
    return a > b ? a : b;
}

/* Only the first fatbin container is sized: reading past it to look for another could touch
 * an unmapped page. */
static uint64_t fatbin_size(const unsigned char *p) {
    uint16_t hsize;
    uint64_t payload;
    memcpy(&hsize, p + 6, 2);
    memcpy(&payload, p + 8, 8);
    return hsize + payload;
}

static void describe_image(const void *image, clc_module_event *ev) {
    const unsigned char *p = image;
    uint32_t magic;
    if (!p) return;
    memcpy(&magic, p, 4);
    ev->image_ptr = (uint64_t)(uintptr_t)p;
    if (magic == 0x466243b1u) {
        const unsigned char *data;
        memcpy(&data, p + 8, sizeof data);
        ev->image_kind = CLC_IMAGE_FATBIN_WRAPPER;
        uint32_t inner = 0;
        if (data) memcpy(&inner, data, 4);
        ev->image_size = inner == 0xBA55ED50u ? fatbin_size(data) : 0;
    } else if (magic == 0xBA55ED50u) {
        ev->image_kind = CLC_IMAGE_FATBIN;
        ev->image_size = fatbin_size(p);
    } else if (memcmp(p, "\177ELF", 4) == 0) {
        ev->image_kind = CLC_IMAGE_ELF;
        ev->image_size = elf_size(p);
    } else {
        ev->image_kind = CLC_IMAGE_PTX;
        ev->image_size = strlen((const char *)p) + 1;
    }
}

static void report_load(uint32_t api, uint64_t handle, const void *image, const char *path,
                        int preserved, CUresult result) {
    if (t_in_clc) return;
    t_in_clc = 1;
    clc_ensure_exit_handler();
    clc_module_event ev = {.api = api, .handle = handle, .preserved = (uint32_t)preserved,
                           .result = result, .path = path};
    if (path)
        ev.image_kind = CLC_IMAGE_FILE;
    else if (result == CUDA_SUCCESS && api != CLC_LOAD_MODULE_UNLOAD &&
             api != CLC_LOAD_LIBRARY_UNLOAD)
        describe_image(image, &ev);
    if (clc_capture_enabled()) {
        clc_rec_module r = {.t_ns = clc_now_ns(), .api = ev.api, .image_kind = ev.image_kind,
                            .handle = ev.handle, .image_ptr = ev.image_ptr,
                            .image_size = ev.image_size, .preserved = ev.preserved,
                            .result = ev.result};
        clc_capture_write(CLC_REC_MODULE, &r, sizeof r, path, path ? strlen(path) : 0);
    }
    if (result == CUDA_SUCCESS) clc_bridge_module(&ev);
    t_in_clc = 0;
}

static int library_preserved(const int *opts, void **values, unsigned int n) {
    for (unsigned int i = 0; opts && values && i < n; i++)
        if (opts[i] == CU_LIBRARY_BINARY_IS_PRESERVED && values[i]) return 1;
    return 0;
}

#define CLC_REAL_OR_FAIL(name)                                                                   \
    pfn_##name real = (pfn_##name)clc_real(CLC_SLOT_##name);                                     \
    if (unlikely(!real)) return CUDA_ERROR_NOT_INITIALIZED;

CLC_EXPORT CUresult cuModuleLoad(CUmodule *mod, const char *path) {
    CLC_REAL_OR_FAIL(cuModuleLoad)
    CUresult r = real(mod, path);
    report_load(CLC_LOAD_MODULE_LOAD, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0, NULL,
                path ? path : "", 1, r);
    return r;
}

CLC_EXPORT CUresult cuModuleLoadData(CUmodule *mod, const void *image) {
    CLC_REAL_OR_FAIL(cuModuleLoadData)
    CUresult r = real(mod, image);
    report_load(CLC_LOAD_MODULE_LOAD_DATA, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0,
                image, NULL, 0, r);
    return r;
}

CLC_EXPORT CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n,
                                       void *options, void **values) {
    CLC_REAL_OR_FAIL(cuModuleLoadDataEx)
    CUresult r = real(mod, image, n, options, values);
    report_load(CLC_LOAD_MODULE_LOAD_DATA_EX, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0,
                image, NULL, 0, r);
    return r;
}

CLC_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin) {
    CLC_REAL_OR_FAIL(cuModuleLoadFatBinary)
    CUresult r = real(mod, fatbin);
    report_load(CLC_LOAD_MODULE_LOAD_FATBINARY, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0,
                fatbin, NULL, 0, r);
    return r;
}

CLC_EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jit_options,
                                      void **jit_values, unsigned int n_jit, int *lib_options,
                                      void **lib_values, unsigned int n_lib) {
    CLC_REAL_OR_FAIL(cuLibraryLoadData)
    CUresult r = real(lib, code, jit_options, jit_values, n_jit, lib_options, lib_values, n_lib);
    report_load(CLC_LOAD_LIBRARY_LOAD_DATA, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*lib : 0,
                code, NULL, library_preserved(lib_options, lib_values, n_lib), r);
    return r;
}

CLC_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, void *jit_options,
                                          void **jit_values, unsigned int n_jit, int *lib_options,
                                          void **lib_values, unsigned int n_lib) {
    CLC_REAL_OR_FAIL(cuLibraryLoadFromFile)
    CUresult r = real(lib, path, jit_options, jit_values, n_jit, lib_options, lib_values, n_lib);
    report_load(CLC_LOAD_LIBRARY_LOAD_FILE, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*lib : 0,
                NULL, path ? path : "", 1, r);
    return r;
}

/* ---- function attributes: kept on wrapped kernels' replacements too ------------------------ */

CLC_EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value) {
    CLC_REAL_OR_FAIL(cuFuncSetAttribute)
    CUresult r = real(f, attrib, value);
    if (r == CUDA_SUCCESS && !t_in_clc && atomic_load_explicit(&g_hot.table, memory_order_acquire))
        clc_replace_set_attribute((uint64_t)(uintptr_t)f, attrib, value, -1);
    return r;
}

CLC_EXPORT CUresult cuKernelSetAttribute(int attrib, int value, CUkernel kernel, CUdevice dev) {
    CLC_REAL_OR_FAIL(cuKernelSetAttribute)
    CUresult r = real(attrib, value, kernel, dev);
    if (r == CUDA_SUCCESS && !t_in_clc && atomic_load_explicit(&g_hot.table, memory_order_acquire))
        clc_replace_set_attribute((uint64_t)(uintptr_t)kernel, attrib, value, dev);
    return r;
}

/* An unloaded module's or library's kernels lose their decisions (the driver reuses their
 * handles). A library's kernels may have been launched as CUfunctions of its per-context
 * modules (cuKernelGetFunction): those are asked for while the library still exists. */
static void forget_unloaded(const uint64_t *owners, unsigned n) {
    if (t_in_clc || !atomic_load_explicit(&g_hot.table, memory_order_acquire)) return;
    t_in_clc = 1;
    /* GPU times still pending count to their kernels' entries: read them back before the
     * entries' counts are archived. */
    clc_timing_drain_all();
    unsigned k = clc_cache_forget_owners(owners, n);
    if (k) clc_debug("%u decisions forgotten at an unload", k);
    t_in_clc = 0;
}

CLC_EXPORT CUresult cuModuleUnload(CUmodule mod) {
    CLC_REAL_OR_FAIL(cuModuleUnload)
    CUresult r = real(mod);
    if (r == CUDA_SUCCESS) {
        uint64_t owner = (uint64_t)(uintptr_t)mod;
        forget_unloaded(&owner, 1);
    }
    report_load(CLC_LOAD_MODULE_UNLOAD, (uint64_t)(uintptr_t)mod, NULL, NULL, 0, r);
    return r;
}

#define CLC_MAX_LIBRARY_MODULES 64

CLC_EXPORT CUresult cuLibraryUnload(CUlibrary lib) {
    CLC_REAL_OR_FAIL(cuLibraryUnload)
    uint64_t owners[1 + CLC_MAX_LIBRARY_MODULES] = {(uint64_t)(uintptr_t)lib};
    unsigned n = 1;
    if (!t_in_clc && atomic_load_explicit(&g_hot.table, memory_order_acquire)) {
        t_in_clc = 1;
        n += clc_cache_library_modules(owners[0], owners + 1, CLC_MAX_LIBRARY_MODULES);
        t_in_clc = 0;
    }
    CUresult r = real(lib);
    if (r == CUDA_SUCCESS) forget_unloaded(owners, n);
    report_load(CLC_LOAD_LIBRARY_UNLOAD, (uint64_t)(uintptr_t)lib, NULL, NULL, 0, r);
    return r;
}

/* ---- context teardown: read back pending GPU times while their events still exist --------- */

static void before_teardown(void) {
    if (t_in_clc) return;
    t_in_clc = 1;
    clc_timing_drain_all();
    t_in_clc = 0;
}

/* A context is gone: its decisions stop applying (a new context may get its address), and the
 * engine forgets what it made for it (wrapped kernels' functions and slot rings). */
static void after_teardown(CUcontext ctx) {
    if (t_in_clc || !ctx || !clc_driver_ready()) return;
    t_in_clc = 1;
    clc_cache_forget_context((uint64_t)(uintptr_t)ctx);
    clc_module_event ev = {.api = CLC_LOAD_CONTEXT_DESTROYED, .handle = (uint64_t)(uintptr_t)ctx};
    clc_bridge_module(&ev);
    t_in_clc = 0;
}

/* The device's primary context while it is active, else NULL (a retain and a release of the
 * real driver's, which leave its count as it was). */
static CUcontext active_primary(CUdevice dev, pfn_cuDevicePrimaryCtxRelease_v2 release) {
    unsigned flags = 0;
    int active = 0;
    CUcontext ctx = NULL;
    if (t_in_clc || !release || !clc_driver_ready() || !g_drv.primary_get_state ||
        !g_drv.primary_retain || g_drv.primary_get_state(dev, &flags, &active) != CUDA_SUCCESS ||
        !active)
        return NULL;
    if (g_drv.primary_retain(&ctx, dev) != CUDA_SUCCESS) return NULL;
    release(dev);
    return ctx;
}

static int primary_gone(CUdevice dev) {
    unsigned flags = 0;
    int active = 1;
    return g_drv.primary_get_state &&
           g_drv.primary_get_state(dev, &flags, &active) == CUDA_SUCCESS && !active;
}

/* Each teardown entry point in both ABIs (the same parameters). */
#define CLC_CTX_DESTROY_HOOK(name)                                                               \
    CLC_EXPORT CUresult name(CUcontext ctx) {                                                    \
        CLC_REAL_OR_FAIL(name)                                                                   \
        before_teardown();                                                                       \
        CUresult r = real(ctx);                                                                  \
        if (r == CUDA_SUCCESS) after_teardown(ctx);                                              \
        return r;                                                                                \
    }
CLC_CTX_DESTROY_HOOK(cuCtxDestroy)
CLC_CTX_DESTROY_HOOK(cuCtxDestroy_v2)

/* The primary context dies at its last release (then it is no longer active). */
#define CLC_PRIMARY_RELEASE_HOOK(name)                                                           \
    CLC_EXPORT CUresult name(CUdevice dev) {                                                     \
        CLC_REAL_OR_FAIL(name)                                                                   \
        before_teardown();                                                                       \
        CUcontext ctx = active_primary(dev, (pfn_cuDevicePrimaryCtxRelease_v2)real);             \
        CUresult r = real(dev);                                                                  \
        if (r == CUDA_SUCCESS && ctx && primary_gone(dev)) after_teardown(ctx);                  \
        return r;                                                                                \
    }
CLC_PRIMARY_RELEASE_HOOK(cuDevicePrimaryCtxRelease)
CLC_PRIMARY_RELEASE_HOOK(cuDevicePrimaryCtxRelease_v2)

/* A reset destroys it whoever holds it (cudaDeviceReset). */
#define CLC_PRIMARY_RESET_HOOK(name)                                                             \
    CLC_EXPORT CUresult name(CUdevice dev) {                                                     \
        CLC_REAL_OR_FAIL(name)                                                                   \
        before_teardown();                                                                       \
        pfn_cuDevicePrimaryCtxRelease_v2 release =                                               \
            (pfn_cuDevicePrimaryCtxRelease_v2)clc_real(CLC_SLOT_cuDevicePrimaryCtxRelease_v2);   \
        CUcontext ctx = active_primary(dev, release);                                            \
        CUresult r = real(dev);                                                                  \
        if (r == CUDA_SUCCESS && ctx) after_teardown(ctx);                                       \
        return r;                                                                                \
    }
CLC_PRIMARY_RESET_HOOK(cuDevicePrimaryCtxReset)
CLC_PRIMARY_RESET_HOOK(cuDevicePrimaryCtxReset_v2)

/* ---- process lifetime --------------------------------------------------------------------- */

static void at_exit(void) {
    t_in_clc = 1;
    clc_timing_drain_all();
    clc_bridge_exit();
    clc_capture_finish();
}

/* ---- for the engine: counts so far, and messages into the capture ----------------------------- */

typedef struct {
    clc_kernel_counts *out;
    int max, n;
} counts_walk;

static void add_counts(const clc_kernel_counts *c, void *arg) {
    counts_walk *w = arg;
    if (w->n < w->max) w->out[w->n++] = *c;
}

/* Fills up to `max` rows; returns how many were written. */
CLC_EXPORT int clc_shim_kernel_counts(clc_kernel_counts *out, int max) {
    counts_walk w = {out, max, 0};
    clc_cache_counts(add_counts, &w);
    return w.n;
}

/* A message from the engine: into the capture, and on stderr from warnings up. */
CLC_EXPORT void clc_shim_message(int level, const char *text) {
    if (level > CLC_MSG_INFO) {
        clc_log(level, "%s", text);
    } else if (clc_capture_enabled()) {
        clc_rec_message body = {.level = (uint32_t)level, .t_ns = clc_now_ns()};
        clc_capture_write(CLC_REC_MESSAGE, &body, sizeof body, text, strlen(text));
    }
}

/* Registered at the first CUDA activity, after cudart registered its own teardown, so that it
 * runs first (atexit order is reverse) while contexts and events are still alive. */
static void register_exit(void) { atexit(at_exit); }

void clc_ensure_exit_handler(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_exit);
}
