/* SPDX-License-Identifier: Apache-2.0
 *
 * load.c: module and library loads and unloads, and function attributes. A load is recorded in
 * the capture and told to the engine (it may wrap the image's kernels); an unload forgets its
 * kernels' decisions; an attribute set on a wrapped kernel is set on its replacements too.
 */
#include <string.h>

#include <pthread.h>

#include "hooks.h"

/* ---- module and library loads ---------------------------------------------------------------- */

static void report_load(uint32_t api, uint64_t handle, const void *image, const char *path,
                        int preserved, CUresult result) {
    if (t_in_clc) return;
    clc_start();
    t_in_clc = 1;
    clc_ensure_exit_handler();
    clc_module_event ev = {.api = api,
                           .handle = handle,
                           .preserved = (uint32_t)preserved,
                           .result = result,
                           .path = path};
    if (path)
        ev.image_kind = CLC_IMAGE_FILE;
    else if (result == CUDA_SUCCESS && api != CLC_LOAD_MODULE_UNLOAD &&
             api != CLC_LOAD_LIBRARY_UNLOAD)
        clc_describe_image(image, &ev);
    if (clc_capture_enabled()) {
        clc_rec_module r = {.t_ns = clc_now_ns(),
                            .api = ev.api,
                            .image_kind = ev.image_kind,
                            .handle = ev.handle,
                            .image_ptr = ev.image_ptr,
                            .image_size = ev.image_size,
                            .preserved = ev.preserved,
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

CLC_EXPORT CUresult cuModuleLoad(CUmodule *mod, const char *path) {
    CLC_REAL_OR_FAIL(cuModuleLoad)
    CUresult r = CLC_DRIVER_WORK(real(mod, path));
    report_load(CLC_LOAD_MODULE_LOAD, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0, NULL,
                path ? path : "", 1, r);
    return r;
}

CLC_EXPORT CUresult cuModuleLoadData(CUmodule *mod, const void *image) {
    CLC_REAL_OR_FAIL(cuModuleLoadData)
    CUresult r = CLC_DRIVER_WORK(real(mod, image));
    report_load(CLC_LOAD_MODULE_LOAD_DATA, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0, image,
                NULL, 0, r);
    return r;
}

CLC_EXPORT CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n,
                                       void *options, void **values) {
    CLC_REAL_OR_FAIL(cuModuleLoadDataEx)
    CUresult r = CLC_DRIVER_WORK(real(mod, image, n, options, values));
    report_load(CLC_LOAD_MODULE_LOAD_DATA_EX, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0,
                image, NULL, 0, r);
    return r;
}

CLC_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin) {
    CLC_REAL_OR_FAIL(cuModuleLoadFatBinary)
    CUresult r = CLC_DRIVER_WORK(real(mod, fatbin));
    report_load(CLC_LOAD_MODULE_LOAD_FATBINARY, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0,
                fatbin, NULL, 0, r);
    return r;
}

/* ---- the program's libraries: to find the CUkernel behind a library kernel's function -------- */

#define CLC_MAX_LIBRARIES 1024
static pthread_mutex_t g_libraries_lock = PTHREAD_MUTEX_INITIALIZER;
static CUlibrary g_libraries[CLC_MAX_LIBRARIES];
static unsigned g_nlibraries;

static void remember_library(CUlibrary lib) {
    pthread_mutex_lock(&g_libraries_lock);
    if (g_nlibraries < CLC_MAX_LIBRARIES)
        g_libraries[g_nlibraries++] = lib;
    else
        CLC_WARN_ONCE(
            "more than %d libraries loaded: a graph node naming a later one's kernel by its "
            "function cannot be confined (it gets its rule's on_unwrappable)",
            CLC_MAX_LIBRARIES);
    pthread_mutex_unlock(&g_libraries_lock);
}

static void forget_library(CUlibrary lib) {
    pthread_mutex_lock(&g_libraries_lock);
    for (unsigned i = 0; i < g_nlibraries; i++)
        if (g_libraries[i] == lib) {
            g_libraries[i] = g_libraries[--g_nlibraries];
            break;
        }
    pthread_mutex_unlock(&g_libraries_lock);
}

CUkernel clc_library_kernel_of(CUfunction f) {
    CUmodule mod, m;
    const char *name;
    CUkernel k = NULL;
    if (!f || !g_drv.func_get_module || !g_drv.func_get_name || !g_drv.library_get_module ||
        !g_drv.library_get_kernel || g_drv.func_get_module(&mod, f) != CUDA_SUCCESS ||
        g_drv.func_get_name(&name, f) != CUDA_SUCCESS)
        return NULL;
    pthread_mutex_lock(&g_libraries_lock);
    for (unsigned i = 0; i < g_nlibraries && !k; i++)
        if (g_drv.library_get_module(&m, g_libraries[i]) == CUDA_SUCCESS && m == mod &&
            g_drv.library_get_kernel(&k, g_libraries[i], name) != CUDA_SUCCESS)
            k = NULL;
    pthread_mutex_unlock(&g_libraries_lock);
    return k;
}

/* A library load's end: a library the program loaded is remembered (a graph node may name one
 * of its kernels by function), and the load reported. */
static void library_loaded(uint32_t api, const CUlibrary *lib, const void *code, const char *path,
                           int preserved, CUresult r) {
    if (r == CUDA_SUCCESS && !t_in_clc) remember_library(*lib);
    report_load(api, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*lib : 0, code, path, preserved, r);
}

CLC_EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jit_options,
                                      void **jit_values, unsigned int n_jit, int *lib_options,
                                      void **lib_values, unsigned int n_lib) {
    CLC_REAL_OR_FAIL(cuLibraryLoadData)
    CUresult r = CLC_DRIVER_WORK(
        real(lib, code, jit_options, jit_values, n_jit, lib_options, lib_values, n_lib));
    library_loaded(CLC_LOAD_LIBRARY_LOAD_DATA, lib, code, NULL,
                   library_preserved(lib_options, lib_values, n_lib), r);
    return r;
}

CLC_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, void *jit_options,
                                          void **jit_values, unsigned int n_jit, int *lib_options,
                                          void **lib_values, unsigned int n_lib) {
    CLC_REAL_OR_FAIL(cuLibraryLoadFromFile)
    CUresult r = CLC_DRIVER_WORK(
        real(lib, path, jit_options, jit_values, n_jit, lib_options, lib_values, n_lib));
    library_loaded(CLC_LOAD_LIBRARY_LOAD_FILE, lib, NULL, path ? path : "", 1, r);
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
 * handles for the next kernels it loads). They are forgotten before the driver unloads, and no
 * decision is published until it has (clc_cache_unload_begin): another thread's load may get an
 * unloaded kernel's handle the moment the driver frees it. A library's kernels may have been
 * launched as CUfunctions of its per-context modules (cuKernelGetFunction): those are asked for
 * while the library still exists. 1 when the unload must be ended (unload_end). */
static int unload_begin(const uint64_t *owners, unsigned n) {
    if (t_in_clc || !atomic_load_explicit(&g_hot.table, memory_order_acquire)) return 0;
    t_in_clc = 1;
    clc_cache_unload_begin();
    /* GPU times still pending count to their kernels' entries: read them back before the
     * entries' counts are archived. */
    clc_timing_drain_all();
    unsigned k = clc_cache_forget_owners(owners, n, clc_bridge_module);
    if (k) clc_debug("%u decisions forgotten at an unload", k);
    t_in_clc = 0;
    return 1;
}

static void unload_end(int begun) {
    if (begun) clc_cache_unload_end();
}

CLC_EXPORT CUresult cuModuleUnload(CUmodule mod) {
    CLC_REAL_OR_FAIL(cuModuleUnload)
    uint64_t owner = (uint64_t)(uintptr_t)mod;
    int begun = unload_begin(&owner, 1);
    CUresult r = CLC_DRIVER_WORK(real(mod));
    unload_end(begun);
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
    int begun = unload_begin(owners, n);
    CUresult r = CLC_DRIVER_WORK(real(lib));
    unload_end(begun);
    if (r == CUDA_SUCCESS) forget_library(lib);
    report_load(CLC_LOAD_LIBRARY_UNLOAD, (uint64_t)(uintptr_t)lib, NULL, NULL, 0, r);
    return r;
}
