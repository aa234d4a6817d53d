/* SPDX-License-Identifier: Apache-2.0
 *
 * real.c: the real functions behind the shim's own: libc's dlsym (the shim exports one), the
 * driver's entry points behind the hooks (g_real, one per symbol of core.h's table), and the
 * driver helpers the shim calls itself (g_drv). The shim's own lookups and loads go to libc
 * directly, never through its hooks of dlsym and dlopen.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "elf_dynamic.h"
#include "core.h"

void *_Atomic g_real[CLC_N_SYMBOLS] __attribute__((aligned(64)));
clc_driver g_drv;
clc_hot g_hot;

void *(*clc_real_dlsym)(void *, const char *);

#define CLC_SYM_NAME(name, params) #name,
const char *const clc_symbol_names[CLC_N_SYMBOLS] = {CLC_HOOKED_SYMBOLS(CLC_SYM_NAME)};

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
    if (q->libc_base ? info->dlpi_addr != q->libc_base : info->dlpi_addr == q->shim_base) return 0;
    clc_dynamic d;
    uint32_t i;
    if (clc_read_dynamic(info->dlpi_addr, clc_dynamic_section(info), &d) &&
        (i = clc_gnu_lookup(&d, q->name)) != 0)
        q->found = (void *)(info->dlpi_addr + d.symtab[i].st_value);
    return q->libc_base || q->found;
}

void *clc_libc_symbol(const char *name) {
    Dl_info where, self;
    libc_lookup q = {name, NULL, 0, 0};
    /* gnu_get_libc_version is libc's alone: no preload defines it. */
    if (!dladdr((void *)&gnu_get_libc_version, &where) || !dladdr((void *)&clc_libc_symbol, &self))
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

void *clc_next_symbol(const char *name) {
    if (unlikely(!clc_real_dlsym)) clc_resolve_dlsym();
    return clc_real_dlsym ? clc_real_dlsym(RTLD_NEXT, name) : NULL;
}

/* libc's dlopen: the shim's own loads are never deep-bound, so its hook (dlopen.c) would only
 * pass them on. */
void *clc_libc_dlopen(const char *file, int mode) {
    void *(*real)(const char *, int) = (void *(*)(const char *, int))clc_next_symbol("dlopen");
    return real ? real(file, mode) : NULL;
}

/* libc's dlsym, for the shim's lookups of names other than the hooked ones. */
void *clc_libc_dlsym(void *handle, const char *name) {
    if (unlikely(!clc_real_dlsym)) clc_resolve_dlsym();
    return clc_real_dlsym ? clc_real_dlsym(handle, name) : NULL;
}

/* ---- the real driver ------------------------------------------------------------------------ */

/* The object that defines the entry points the program reached (its real pointers): the driver
 * it calls, whatever path or name it was loaded by (a copy without the usual SONAME too). Its
 * handle, when the driver's helpers are found there (dlsym with a handle also searches the
 * object's dependencies: an interposer linked with the driver leads to it). */
static void *driver_of_real_pointers(void) {
    for (int i = 0; i < CLC_N_SYMBOLS; i++) {
        void *p = atomic_load_explicit(&g_real[i], memory_order_acquire), *h;
        Dl_info info;
        struct link_map *map = NULL;
        if (!p || !dladdr1(p, &info, (void **)&map, RTLD_DL_LINKMAP) || !map || !map->l_name ||
            !map->l_name[0] || !(h = clc_libc_dlopen(map->l_name, RTLD_NOW | RTLD_NOLOAD)))
            continue;
        if (clc_real_dlsym(h, "cuCtxGetCurrent")) return h;
        dlclose(h);
    }
    return NULL;
}

void *clc_libcuda_handle(void) {
    static void *_Atomic handle;
    void *h = atomic_load_explicit(&handle, memory_order_acquire);
    if (h) return h;
    if (!clc_real_dlsym) clc_resolve_dlsym();
    h = driver_of_real_pointers();
    if (!h) h = clc_libc_dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = clc_libc_dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) h = clc_libc_dlopen("libcuda.so", RTLD_NOW);
    if (h) atomic_store_explicit(&handle, h, memory_order_release);
    return h;
}

void clc_set_real(int sym, void *p) {
    if (!p) return;
    void *expected = NULL;
    atomic_compare_exchange_strong(&g_real[sym], &expected, p);
}

void *clc_resolve_real(int sym) {
    if (!clc_real_dlsym) clc_resolve_dlsym();
    void *p = clc_real_dlsym(RTLD_NEXT, clc_symbol_names[sym]);
    if (!p) {
        void *h = clc_libcuda_handle();
        if (h) p = clc_real_dlsym(h, clc_symbol_names[sym]);
    }
    clc_set_real(sym, p);
    return atomic_load_explicit(&g_real[sym], memory_order_acquire);
}

static void *driver_sym(void *h, const char *a, const char *b) {
    void *p = clc_real_dlsym(h, a);
    if (!p && b) p = clc_real_dlsym(h, b);
    return p;
}

/* Each helper of core.h's tables from the driver's handle `h`, in the tables' order. */
#define LOAD_HELPER(member, name, fallback, params) g_drv.member = driver_sym(h, name, fallback);
#define LOAD_GREEN_HELPER(member, name, fallback, params)                                          \
    g_drv.green.member = driver_sym(h, name, fallback);

int clc_driver_load(void) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    if (!atomic_load_explicit(&g_hot.driver_ready, memory_order_relaxed)) {
        void *h = clc_libcuda_handle();
        if (h) {
            CLC_DRIVER_TABLE(LOAD_HELPER)
            CLC_DRIVER_GREEN_TABLE(LOAD_GREEN_HELPER)
            g_hot.ctx_get_current = g_drv.ctx_get_current;
            /* Without a current context or a kernel's name nothing can be decided: the driver
             * is not placed (its launches get on_error). */
            if (g_drv.ctx_get_current && (g_drv.kernel_get_name || g_drv.func_get_name))
                atomic_store_explicit(&g_hot.driver_ready, 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&lock);
    return atomic_load_explicit(&g_hot.driver_ready, memory_order_relaxed);
}
