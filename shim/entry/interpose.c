/* SPDX-License-Identifier: Apache-2.0
 *
 * interpose.c: the shim's hooks handed out. Every symbol of core.h's table is exported (by the
 * hook files: launch.c, graph.c, load.c, context.c) and substituted when a program gets it
 * through dlsym, dlvsym or cuGetProcAddress; the real pointer it came with is kept (real.c).
 * Deep-bound libraries get the hooks through dlopen.c.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>

#include "core/elf_dynamic.h"
#include "entry.h"

/* Forward declarations of the hooks, so the table of hook addresses can be built. */
#define CLC_HOOK_DECL(name, params) CLC_EXPORT CUresult name params;
CLC_HOOKED_SYMBOLS(CLC_HOOK_DECL)
#define CLC_HOOK_ADDR(name, params) (void *)&name,
static void *const hook_addr[CLC_N_SYMBOLS] = {CLC_HOOKED_SYMBOLS(CLC_HOOK_ADDR)};

/* ---- handing out the hooks ------------------------------------------------------------------- */

void *clc_hook_addr(int sym) { return sym >= 0 && sym < CLC_N_SYMBOLS ? hook_addr[sym] : NULL; }

static int is_hook(void *p) {
    for (int i = 0; i < CLC_N_SYMBOLS; i++)
        if (hook_addr[i] == p) return 1;
    return 0;
}

int clc_symbol_by_name(const char *name) {
    if (name[0] != 'c' || name[1] != 'u') return -1;
    for (int i = 0; i < CLC_N_SYMBOLS; i++)
        if (strcmp(clc_symbol_names[i], name) == 0) return i;
    return -1;
}

/* cuGetProcAddress takes a base name and picks the variant by flags and version, as the
 * driver's own table does: _ptsz for the per-thread default stream, _v2 ABIs from 12000. A base
 * name's rows stand newest first; the first the request reaches is its variant. */
static const struct variant {
    const char *base;
    int since; /* the lowest version that gets it; 0: every version */
    int ptsz;  /* only for the per-thread default stream */
    int sym;   /* -1: the driver offers none */
} variants[] = {
    {"cuLaunchKernel", 0, 1, CLC_SYM_cuLaunchKernel_ptsz},
    {"cuLaunchKernel", 0, 0, CLC_SYM_cuLaunchKernel},
    {"cuLaunchKernelEx", 0, 1, CLC_SYM_cuLaunchKernelEx_ptsz},
    {"cuLaunchKernelEx", 0, 0, CLC_SYM_cuLaunchKernelEx},
    {"cuLaunchCooperativeKernel", 0, 1, CLC_SYM_cuLaunchCooperativeKernel_ptsz},
    {"cuLaunchCooperativeKernel", 0, 0, CLC_SYM_cuLaunchCooperativeKernel},
    {"cuGetProcAddress", 12000, 0, CLC_SYM_cuGetProcAddress_v2},
    {"cuGetProcAddress", 0, 0, CLC_SYM_cuGetProcAddress},
    {"cuGraphAddKernelNode", 12000, 0, CLC_SYM_cuGraphAddKernelNode_v2},
    {"cuGraphAddKernelNode", 0, 0, CLC_SYM_cuGraphAddKernelNode},
    {"cuGraphKernelNodeSetParams", 12000, 0, CLC_SYM_cuGraphKernelNodeSetParams_v2},
    {"cuGraphKernelNodeSetParams", 0, 0, CLC_SYM_cuGraphKernelNodeSetParams},
    {"cuGraphExecKernelNodeSetParams", 12000, 0, CLC_SYM_cuGraphExecKernelNodeSetParams_v2},
    {"cuGraphExecKernelNodeSetParams", 0, 0, CLC_SYM_cuGraphExecKernelNodeSetParams},
    {"cuGraphInstantiateWithParams", 0, 1, CLC_SYM_cuGraphInstantiateWithParams_ptsz},
    {"cuGraphInstantiateWithParams", 0, 0, CLC_SYM_cuGraphInstantiateWithParams},
    {"cuGraphAddNode", 12030, 0, CLC_SYM_cuGraphAddNode_v2},
    {"cuGraphAddNode", 0, 0, CLC_SYM_cuGraphAddNode},
    /* Context teardown, both ABIs: cudart 13 asks for the primary context's release and reset
     * at version 7000 (the first ABI; measured on driver 580). */
    {"cuCtxDestroy", 4000, 0, CLC_SYM_cuCtxDestroy_v2},
    {"cuCtxDestroy", 0, 0, CLC_SYM_cuCtxDestroy},
    {"cuCtxCreate", 12050, 0, CLC_SYM_cuCtxCreate_v4},
    {"cuCtxCreate", 11040, 0, CLC_SYM_cuCtxCreate_v3},
    {"cuCtxCreate", 3020, 0, CLC_SYM_cuCtxCreate_v2},
    {"cuCtxCreate", 0, 0, CLC_SYM_cuCtxCreate},
    {"cuDevicePrimaryCtxRelease", 11000, 0, CLC_SYM_cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxRelease", 0, 0, CLC_SYM_cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxReset", 11000, 0, CLC_SYM_cuDevicePrimaryCtxReset_v2},
    {"cuDevicePrimaryCtxReset", 0, 0, CLC_SYM_cuDevicePrimaryCtxReset},
    {"cuStreamDestroy", 4000, 0, CLC_SYM_cuStreamDestroy_v2},
    {"cuStreamDestroy", 0, 0, CLC_SYM_cuStreamDestroy},
    {"cuCtxSynchronize", 13000, 0, CLC_SYM_cuCtxSynchronize_v2},
    {"cuCtxSynchronize", 0, 0, CLC_SYM_cuCtxSynchronize},
    {"cuStreamSynchronize", 0, 1, CLC_SYM_cuStreamSynchronize_ptsz},
    {"cuStreamSynchronize", 0, 0, CLC_SYM_cuStreamSynchronize},
    {"cuStreamQuery", 0, 1, CLC_SYM_cuStreamQuery_ptsz},
    {"cuStreamQuery", 0, 0, CLC_SYM_cuStreamQuery},
    /* The driver has no cuMemcpyDtoH before the _v2 ABI of 3020 that the shim hooks. */
    {"cuMemcpyDtoH", 3020, 1, CLC_SYM_cuMemcpyDtoH_v2_ptds},
    {"cuMemcpyDtoH", 3020, 0, CLC_SYM_cuMemcpyDtoH_v2},
    {"cuMemcpyDtoH", 0, 0, -1},
    {"cuEventRecord", 0, 1, CLC_SYM_cuEventRecord_ptsz},
    {"cuEventRecord", 0, 0, CLC_SYM_cuEventRecord},
    {"cuEventRecordWithFlags", 0, 1, CLC_SYM_cuEventRecordWithFlags_ptsz},
    {"cuEventRecordWithFlags", 0, 0, CLC_SYM_cuEventRecordWithFlags},
    {"cuEventDestroy", 4000, 0, CLC_SYM_cuEventDestroy_v2},
    {"cuEventDestroy", 0, 0, CLC_SYM_cuEventDestroy},
    {"cuGraphLaunch", 0, 1, CLC_SYM_cuGraphLaunch_ptsz},
    {"cuGraphLaunch", 0, 0, CLC_SYM_cuGraphLaunch},
};

static int symbol_for_request(const char *name, int version, cuuint64_t flags) {
    int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        const struct variant *v = &variants[i];
        if ((!v->since || version >= v->since) && (ptsz || !v->ptsz) && strcmp(v->base, name) == 0)
            return v->sym;
    }
    return clc_symbol_by_name(name);
}

static void *substitute(int sym, void *real) {
    if (sym < 0 || !real || is_hook(real)) return real;
    clc_set_real(sym, real);
    clc_debug("hooked %s (real %p)", clc_symbol_names[sym], real);
    return hook_addr[sym];
}

/* ---- what the shim exports -------------------------------------------------------------------
 * Every function the shim exports stands in for the program's: the driver's entry points, and
 * libc's dlsym, dlvsym, dlopen, dlmopen, the exec family, _exit, sigaction... A lookup of one of
 * them by any handle gets the shim's, so that a program that takes libc's own dlsym from
 * dlopen("libc.so.6"), say, does not step past the shim with it. */

typedef struct {
    ElfW(Addr) base;
    clc_dynamic dyn;
} self_exports;

static const self_exports *exports(void) {
    static self_exports self;
    static _Atomic int state; /* 0: not read, 1: read, 2: unreadable */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (likely(s)) return s == 1 ? &self : NULL;
    Dl_info where;
    struct link_map *map = NULL;
    self_exports e;
    int ok = dladdr1((void *)&exports, &where, (void **)&map, RTLD_DL_LINKMAP) && map &&
             clc_read_dynamic(map->l_addr, map->l_ld, &e.dyn) && e.dyn.gnu_hash;
    if (ok) {
        e.base = map->l_addr;
        self = e;
    }
    atomic_store_explicit(&state, ok ? 1 : 2, memory_order_release);
    return ok ? &self : NULL;
}

/* The shim's own definition of `name`, or NULL when it exports none. */
static void *shim_export(const char *name) {
    const self_exports *e = exports();
    uint32_t i = e ? clc_gnu_lookup(&e->dyn, name) : 0;
    if (!i || e->dyn.symtab[i].st_shndx == SHN_UNDEF) return NULL;
    return (void *)(e->base + e->dyn.symtab[i].st_value);
}

/* The definition of `name` in the object that made the call at `ret`, or NULL when it has none:
 * an interposer of that symbol (another preload library, a profiler) asks dlsym(RTLD_NEXT) for
 * what comes after it. */
__attribute__((noinline)) static void *caller_definition(const void *ret, const char *name) {
    Dl_info where;
    struct link_map *map = NULL;
    clc_dynamic d;
    uint32_t i;
    if (!dladdr1(ret, &where, (void **)&map, RTLD_DL_LINKMAP) || !map ||
        !clc_read_dynamic(map->l_addr, map->l_ld, &d) || !(i = clc_gnu_lookup(&d, name)) ||
        d.symtab[i].st_shndx == SHN_UNDEF)
        return NULL;
    return (void *)(map->l_addr + d.symtab[i].st_value);
}

/* What the shim itself calls behind its own definition of `name`. */
static void *shim_next(const char *name, int sym) {
    return sym >= 0 ? clc_real(sym) : clc_next_symbol(name);
}

/* RTLD_NEXT for a name the shim exports: the shim's own, unless the caller is an interposer in
 * the chain the shim calls down (its definition is what the shim calls next), which gets what
 * comes after it, as without clc; answering it with the shim's would loop. A library that only
 * defines the symbol, to ask past the shim, gets the shim's. NULL when the caller is such an
 * interposer (the caller then leaves with libc's answer). */
__attribute__((noinline)) static void *next_for(const void *ret, const char *name, void *own) {
    int sym = clc_symbol_by_name(name);
    void *theirs = caller_definition(ret, name);
    if (theirs && theirs == shim_next(name, sym)) return NULL;
    if (sym >= 0 && !clc_real(sym)) return NULL; /* the driver does not define it */
    return own;
}

/* A lookup by a handle: a name the shim exports gets the shim's definition (a driver entry
 * point keeps the real pointer it came with). */
static void *substitute_export(const char *name, void *p) {
    if (!p) return p;
    int sym = name[0] == 'c' && name[1] == 'u' ? clc_symbol_by_name(name) : -1;
    if (sym >= 0) return substitute(sym, p);
    void *own = shim_export(name);
    return own && own != p ? own : p;
}

/* RTLD_NEXT is resolved by glibc from the caller's return address, so a lookup that libc
 * answers must leave as a tail call (a jump) for "next" to mean next after the caller, not
 * after the shim. */
CLC_EXPORT void *dlsym(void *handle, const char *name) {
    if (unlikely(!clc_real_dlsym)) clc_resolve_dlsym();
    if (handle == RTLD_NEXT) {
        void *own = shim_export(name), *p;
        if (own && (p = next_for(__builtin_return_address(0), name, own)) != NULL) return p;
        return clc_real_dlsym(handle, name);
    }
    return substitute_export(name, clc_real_dlsym(handle, name));
}

/* dlvsym: the same substitution, for programs that ask for a symbol version. */
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
CLC_EXPORT void *dlvsym(void *handle, const char *name, const char *version) {
    static dlvsym_fn real_dlvsym;
    if (unlikely(!real_dlvsym)) {
        real_dlvsym = (dlvsym_fn)clc_libc_symbol("dlvsym");
        if (!real_dlvsym) return NULL;
    }
    if (handle == RTLD_NEXT) {
        void *own = shim_export(name), *p;
        if (own && (p = next_for(__builtin_return_address(0), name, own)) != NULL) return p;
        return real_dlvsym(handle, name, version);
    }
    return substitute_export(name, real_dlvsym(handle, name, version));
}

CLC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                     cuuint64_t flags) {
    pfn_cuGetProcAddress real = (pfn_cuGetProcAddress)clc_real(CLC_SYM_cuGetProcAddress);
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
        *pfn = substitute(symbol_for_request(symbol, version, flags), *pfn);
    return r;
}

CLC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                        cuuint64_t flags, int *status) {
    pfn_cuGetProcAddress_v2 real = (pfn_cuGetProcAddress_v2)clc_real(CLC_SYM_cuGetProcAddress_v2);
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
        *pfn = substitute(symbol_for_request(symbol, version, flags), *pfn);
    return r;
}
