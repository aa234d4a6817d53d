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

int clc_driver_load(void) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    if (!atomic_load_explicit(&g_hot.driver_ready, memory_order_relaxed)) {
        void *h = clc_libcuda_handle();
        if (h) {
            g_drv.ctx_get_current = driver_sym(h, "cuCtxGetCurrent", NULL);
            g_drv.ctx_set_current = driver_sym(h, "cuCtxSetCurrent", NULL);
            g_drv.ctx_get_device = driver_sym(h, "cuCtxGetDevice", NULL);
            g_drv.ctx_synchronize = driver_sym(h, "cuCtxSynchronize", NULL);
            g_drv.ctx_push = driver_sym(h, "cuCtxPushCurrent_v2", NULL);
            g_drv.ctx_pop = driver_sym(h, "cuCtxPopCurrent_v2", NULL);
            g_drv.stream_get_ctx = driver_sym(h, "cuStreamGetCtx", NULL);
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
            g_drv.memset_d8_async_ptsz = driver_sym(h, "cuMemsetD8Async_ptsz", "cuMemsetD8Async");
            g_drv.kernel_get_library = driver_sym(h, "cuKernelGetLibrary", NULL);
            g_drv.func_get_module = driver_sym(h, "cuFuncGetModule", NULL);
            g_drv.library_get_module = driver_sym(h, "cuLibraryGetModule", NULL);
            g_drv.library_get_kernel = driver_sym(h, "cuLibraryGetKernel", NULL);
            g_drv.graph_child = driver_sym(h, "cuGraphChildGraphNodeGetGraph", NULL);
            g_drv.graph_nodes = driver_sym(h, "cuGraphGetNodes", NULL);
            g_drv.graph_node_type = driver_sym(h, "cuGraphNodeGetType", NULL);
            g_drv.graph_kernel_node_get = driver_sym(h, "cuGraphKernelNodeGetParams_v2", NULL);
            g_drv.device_get_uuid = driver_sym(h, "cuDeviceGetUuid_v2", "cuDeviceGetUuid");
            g_drv.exchange_capture_mode = driver_sym(h, "cuThreadExchangeStreamCaptureMode", NULL);
            g_drv.green.get_resource = driver_sym(h, "cuDeviceGetDevResource", NULL);
            g_drv.green.split = driver_sym(h, "cuDevSmResourceSplitByCount", NULL);
            g_drv.green.generate_desc = driver_sym(h, "cuDevResourceGenerateDesc", NULL);
            g_drv.green.create = driver_sym(h, "cuGreenCtxCreate", NULL);
            g_drv.green.destroy = driver_sym(h, "cuGreenCtxDestroy", NULL);
            g_drv.green.stream_create = driver_sym(h, "cuGreenCtxStreamCreate", NULL);
            g_drv.green.stream_sync = driver_sym(h, "cuStreamSynchronize", NULL);
            g_drv.green.stream_destroy = driver_sym(h, "cuStreamDestroy_v2", NULL);
            g_drv.green.stream_priority = driver_sym(h, "cuStreamGetPriority", NULL);
            g_drv.green.stream_priority_ptsz =
                driver_sym(h, "cuStreamGetPriority_ptsz", "cuStreamGetPriority");
            g_drv.green.wait_event = driver_sym(h, "cuStreamWaitEvent", NULL);
            g_drv.green.wait_event_ptsz =
                driver_sym(h, "cuStreamWaitEvent_ptsz", "cuStreamWaitEvent");
            g_drv.green.ctx_from_green = driver_sym(h, "cuCtxFromGreenCtx", NULL);
            g_drv.green.ctx_set_flags = driver_sym(h, "cuCtxSetFlags", NULL);
            g_drv.green.capture_info = driver_sym(h, "cuStreamGetCaptureInfo_v3", NULL);
            g_drv.green.capture_info_ptsz =
                driver_sym(h, "cuStreamGetCaptureInfo_v3_ptsz", "cuStreamGetCaptureInfo_v3");
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
