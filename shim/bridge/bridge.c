/* SPDX-License-Identifier: Apache-2.0
 *
 * bridge.c: the C side of stage 2, the bridge from the shim into Python. Not compiled on its
 * own: bridge_build.py, beside it, gives it to cffi as the source of clc.runtime._bridge, after
 * Python.h and cffi's own declarations (the embedding API's clc_bridge_* functions).
 *
 * clc_bridge_start runs before any Python exists (C hosts only), so it is plain C. The
 * interpreter is isolated from the program's environment (PYTHONPATH, PYTHONHOME) and takes
 * none of its signals; its executable is clc's Python and its module search path is exactly
 * the sys.path clc-run had (CLC_SYS_PATH), so that whatever clc-run could import (cffi's
 * backend first of all, before any Python code runs) is found the same way.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "clc_abi.h"

/* Stage 2's exports, declared with the contract's types (clc_abi.h): cffi's definitions of the
 * embedding API's (after this file) and this file's own must have them. */
#define CLC_STAGE2_EXPORT(type, name) extern __typeof__(*(type)0) name;
CLC_STAGE2_EXPORT(clc_bridge_decide_fn, clc_bridge_decide)
CLC_STAGE2_EXPORT(clc_bridge_launch_fn, clc_bridge_launch)
CLC_STAGE2_EXPORT(clc_bridge_module_fn, clc_bridge_module)
CLC_STAGE2_EXPORT(clc_bridge_exit_fn, clc_bridge_exit)
CLC_STAGE2_EXPORT(clc_bridge_start_fn, clc_bridge_start)

static PyStatus clc_search_path(PyConfig *config, const char *joined) {
    PyStatus st = PyStatus_Ok();
    char *copy = strdup(joined), *save = NULL;
    if (!copy) return PyStatus_NoMemory();
    for (char *p = strtok_r(copy, ":", &save); p && !PyStatus_Exception(st);
         p = strtok_r(NULL, ":", &save)) {
        wchar_t *w = Py_DecodeLocale(p, NULL);
        if (!w) {
            st = PyStatus_NoMemory();
            break;
        }
        st = PyWideStringList_Append(&config->module_search_paths, w);
        PyMem_RawFree(w);
    }
    free(copy);
    config->module_search_paths_set = 1;
    return st;
}

__attribute__((visibility("default"))) int clc_bridge_start(const char *executable,
                                                            const char *search_path) {
    if (Py_IsInitialized()) return 0;
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.install_signal_handlers = 0;
    config.parse_argv = 0;
    PyStatus st = PyConfig_SetBytesString(&config, &config.executable, executable);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(&config, &config.program_name, executable);
    if (!PyStatus_Exception(st) && search_path && *search_path)
        st = clc_search_path(&config, search_path);
    if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) return -1;
    PyEval_SaveThread(); /* the GIL is taken per call by the bridge's entry points */
    return 0;
}

/* A launch of a kernel asked about per shape or at every launch: the hot one of the four
 * entry points, so written against Python's C API rather than through cffi (which makes a
 * cdata per argument and a buffer to read the query through). The query and the arguments
 * after it become one bytes object, given to the kernel's dispatcher, which returns the
 * clc_outcome's 24 bytes (or None when it cannot answer). The first time, the shim's kernel
 * id and the bytes go to clc.runtime.bridge_entry.bridge_launch, which answers (bytes, the kernel's
 * dispatcher, whether to time it here): kept here by kernel id, under the GIL. Only called
 * for kernels the engine already decided through clc_bridge_decide, so the cffi embedding
 * (and clc.runtime.bridge_entry) is initialized. */
static PyObject *clc_launch_fn;
static PyObject **clc_dispatchers; /* by kernel id; NULL: not asked yet */
static size_t clc_n_dispatchers;
/* Dispatchers that do not time their hook themselves (the engine's folded every_launch ones)
 * are timed here, per kernel id: calls, total ns, max ns; a call over CLC_SLOW_HOOK_NS is told to
 * clc.runtime.bridge_entry.bridge_slow(kernel_id, ns) at once. All under the GIL. */
typedef struct {
    unsigned char timed;
    uint64_t calls, total_ns, max_ns;
} clc_dispatch_time;
static clc_dispatch_time *clc_times;

/* What the program wrote to stdout and stderr through C stdio, out before what clc's exit hooks
 * print (Python's own buffers, which the engine flushes after them). Not fflush(NULL): that
 * locks every stream, and a thread of the program blocked reading stdin holds its lock. A
 * stream another thread holds is left as it is. */
int clc_bridge_flush_stdio(void) {
    FILE *streams[2] = {stdout, stderr};
    int r = 0;
    for (int i = 0; i < 2; i++) {
        if (ftrylockfile(streams[i]) != 0) continue;
        r |= fflush_unlocked(streams[i]);
        funlockfile(streams[i]);
    }
    return r;
}

static uint64_t clc_bridge_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

int clc_bridge_dispatch_time(uint32_t kernel_id, uint64_t out[3]) {
    if (kernel_id >= clc_n_dispatchers || !clc_times[kernel_id].timed) return -1;
    out[0] = clc_times[kernel_id].calls;
    out[1] = clc_times[kernel_id].total_ns;
    out[2] = clc_times[kernel_id].max_ns;
    return 0;
}

static PyObject *clc_entry_fn(const char *name) {
    PyObject *entry = PyImport_ImportModule("clc.runtime.bridge_entry");
    if (!entry) return NULL;
    PyObject *fn = PyObject_GetAttrString(entry, name);
    Py_DECREF(entry);
    return fn;
}

static void clc_report_slow(uint32_t kernel_id, uint64_t ns) {
    static PyObject *slow_fn;
    if (!slow_fn && !(slow_fn = clc_entry_fn("bridge_slow"))) return;
    PyObject *r =
        PyObject_CallFunction(slow_fn, "IK", (unsigned int)kernel_id, (unsigned long long)ns);
    Py_XDECREF(r);
}

/* The first launch of a kernel asked about: clc.runtime.bridge_entry.bridge_launch(kernel_id, blob)
 * answers (bytes, dispatcher, timed_here) and the dispatcher is kept for the kernel's later
 * launches. */
static PyObject *clc_first_launch(uint32_t kernel_id, PyObject *blob) {
    if (!clc_launch_fn && !(clc_launch_fn = clc_entry_fn("bridge_launch"))) return NULL;
    PyObject *id = PyLong_FromUnsignedLong(kernel_id);
    if (!id) return NULL;
    PyObject *args[2] = {id, blob};
    PyObject *got = PyObject_Vectorcall(clc_launch_fn, args, 2, NULL);
    Py_DECREF(id);
    if (!got || !PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 3) return got;
    PyObject *answer = PyTuple_GET_ITEM(got, 0), *dispatch = PyTuple_GET_ITEM(got, 1);
    if (kernel_id == CLC_KERNEL_UNCACHED) { /* no id to keep it under: asked afresh */
        Py_INCREF(answer);
        Py_DECREF(got);
        return answer;
    }
    if (kernel_id >= clc_n_dispatchers) {
        size_t n = clc_n_dispatchers ? clc_n_dispatchers : 64;
        while (n <= kernel_id) n *= 2;
        PyObject **grown = realloc(clc_dispatchers, n * sizeof *grown);
        clc_dispatch_time *times = grown ? realloc(clc_times, n * sizeof *times) : NULL;
        if (grown) clc_dispatchers = grown;
        if (times) {
            memset(grown + clc_n_dispatchers, 0, (n - clc_n_dispatchers) * sizeof *grown);
            memset(times + clc_n_dispatchers, 0, (n - clc_n_dispatchers) * sizeof *times);
            clc_times = times;
            clc_n_dispatchers = n;
        }
    }
    if (kernel_id < clc_n_dispatchers && !clc_dispatchers[kernel_id]) {
        Py_INCREF(dispatch);
        clc_dispatchers[kernel_id] = dispatch;
        clc_times[kernel_id].timed = (unsigned char)PyObject_IsTrue(PyTuple_GET_ITEM(got, 2));
    }
    Py_INCREF(answer);
    Py_DECREF(got);
    return answer;
}

__attribute__((visibility("default"))) int clc_bridge_launch(const clc_kernel_query *q,
                                                             clc_outcome *out) {
    int rc = -1;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *blob = PyBytes_FromStringAndSize((const char *)q, sizeof *q + q->args_size);
    PyObject *answer = NULL;
    uint32_t id = q->kernel_id;
    if (blob) {
        PyObject *dispatch = id < clc_n_dispatchers ? clc_dispatchers[id] : NULL;
        if (dispatch && !clc_times[id].timed) {
            answer = PyObject_CallOneArg(dispatch, blob);
        } else {
            uint64_t t0 = clc_bridge_now_ns();
            answer = dispatch ? PyObject_CallOneArg(dispatch, blob)
                              : clc_first_launch(id, blob); /* timed if it says so */
            uint64_t ns = clc_bridge_now_ns() - t0;
            clc_dispatch_time *t = id < clc_n_dispatchers ? &clc_times[id] : NULL;
            if (t && t->timed) {
                t->calls++;
                t->total_ns += ns;
                if (ns > t->max_ns) t->max_ns = ns;
                if (ns > CLC_SLOW_HOOK_NS) clc_report_slow(id, ns);
            }
        }
    }
    if (answer && PyBytes_Check(answer) && PyBytes_GET_SIZE(answer) == sizeof *out) {
        memcpy(out, PyBytes_AS_STRING(answer), sizeof *out);
        rc = 0;
    }
    if (PyErr_Occurred()) PyErr_Clear(); /* the engine reports its own errors */
    Py_XDECREF(answer);
    Py_XDECREF(blob);
    PyGILState_Release(gil);
    return rc;
}
