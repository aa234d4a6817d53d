/* SPDX-License-Identifier: Apache-2.0
 *
 * bridge_loader.c: loads stage 2 (the cffi bridge into Python) on first need.
 *
 * In a Python host the bridge joins the running interpreter, but only one of the minor
 * version it was built for: a bridge of another version was seen to hang, so the version is
 * checked before anything of Python is touched. In a C/C++ host, libpython is loaded with
 * RTLD_GLOBAL and an interpreter is started whose executable is the Python clc was installed
 * with, so that its site-packages are found. A forked child never calls into Python: another
 * thread of the parent may have held the GIL at the fork, and the child would wait forever.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deciding.h"

enum { BRIDGE_UNTRIED, BRIDGE_READY, BRIDGE_OFF, BRIDGE_OFF_IN_CHILD };

static _Atomic int g_bridge = BRIDGE_UNTRIED;
static pthread_mutex_t g_load_lock = PTHREAD_MUTEX_INITIALIZER;
static clc_bridge_decide_fn p_decide; /* stage 2's exports (clc_abi.h) */
static clc_bridge_launch_fn p_launch;
static clc_bridge_module_fn p_module;
static clc_bridge_exit_fn p_exit;
static int (*p_is_initialized)(void); /* Py_IsInitialized of the host, NULL in a C host */

static void bridge_off(const char *why) {
    atomic_store(&g_bridge, BRIDGE_OFF);
    clc_log(CLC_MSG_ERROR, "%s; launches %sget on_error=%s", why,
            clc_decider_configured() ? "that clc-run does not decide " : "",
            g_cfg.on_error.action == CLC_ACTION_DENY ? "deny" : "allow");
}

/* "3.12.1 (main, ...)" -> "3.12" */
static void minor_version(const char *full, char *out, size_t n) {
    size_t i = 0;
    int dots = 0;
    while (full[i] && i + 1 < n) {
        if (full[i] == '.' && ++dots == 2) break;
        if (full[i] == ' ') break;
        out[i] = full[i];
        i++;
    }
    out[i] = '\0';
}

static void load(void) {
    const char *bridge = clc_setting("CLC_BRIDGE");
    const char *want = clc_setting("CLC_PYTHON_VERSION");
    if (g_cfg.unsettled) {
        bridge_off("this process of a clc-run run has none of its settings: it was started past "
                   "clc's exec hooks (the execve system call, system() or popen()) after its "
                   "settings' descriptor was closed");
        return;
    }
    if (!bridge || !*bridge || !want) {
        bridge_off("no Python bridge configured (run the program under clc-run)");
        return;
    }
    const char *(*get_version)(void) = clc_libc_dlsym(RTLD_DEFAULT, "Py_GetVersion");
    char msg[512];
    if (get_version) {
        char have[32];
        minor_version(get_version(), have, sizeof have);
        if (strcmp(have, want) != 0) {
            snprintf(msg, sizeof msg,
                     "this program runs Python %s but clc's bridge was built for Python %s "
                     "(install clc into this Python to decide its launches)",
                     have, want);
            bridge_off(msg);
            return;
        }
        p_is_initialized = clc_libc_dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    } else {
        const char *libpython = clc_setting("CLC_PYTHON_LIB");
        if (!libpython || !*libpython || !clc_libc_dlopen(libpython, RTLD_NOW | RTLD_GLOBAL)) {
            snprintf(msg, sizeof msg, "cannot load libpython (%s): %s",
                     libpython && *libpython ? libpython : "clc's Python has no shared library",
                     dlerror());
            bridge_off(msg);
            return;
        }
    }
    void *h = clc_libc_dlopen(bridge, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(msg, sizeof msg, "cannot load the bridge %s: %s", bridge, dlerror());
        bridge_off(msg);
        return;
    }
    p_decide = clc_libc_dlsym(h, "clc_bridge_decide");
    p_launch = clc_libc_dlsym(h, "clc_bridge_launch");
    p_module = clc_libc_dlsym(h, "clc_bridge_module");
    p_exit = clc_libc_dlsym(h, "clc_bridge_exit");
    clc_bridge_start_fn start = clc_libc_dlsym(h, "clc_bridge_start");
    if (!p_decide || !p_launch || !p_module || !p_exit || !start) {
        bridge_off("the bridge lacks its entry points (rebuild clc)");
        return;
    }
    if (!get_version) {
        const char *exe = clc_setting("CLC_PYTHON_EXE");
        if (start(exe ? exe : "python3", clc_setting("CLC_SYS_PATH")) != 0) {
            bridge_off("cannot start clc's Python interpreter");
            return;
        }
    }
    atomic_store(&g_bridge, BRIDGE_READY);
}

static int ready(void) {
    int s = atomic_load_explicit(&g_bridge, memory_order_acquire);
    if (s == BRIDGE_UNTRIED) {
        pthread_mutex_lock(&g_load_lock);
        if (atomic_load(&g_bridge) == BRIDGE_UNTRIED) load();
        pthread_mutex_unlock(&g_load_lock);
        s = atomic_load(&g_bridge);
    }
    /* A Python host that is not running Python (yet, or any more) cannot be called into. */
    return s == BRIDGE_READY && (!p_is_initialized || p_is_initialized());
}

int clc_bridge_decide(const clc_kernel_query *q, clc_decision *out) {
    if (atomic_load_explicit(&g_bridge, memory_order_acquire) == BRIDGE_OFF_IN_CHILD) {
        CLC_WARN_ONCE("forked child %d: kernels first launched after fork() get on_error=%s "
                      "(calling into Python after fork() can deadlock)",
                      (int)getpid(), g_cfg.on_error.action == CLC_ACTION_DENY ? "deny" : "allow");
        return -1;
    }
    if (!ready()) return -1;
    return p_decide(q, out);
}

int clc_bridge_launch(const clc_kernel_query *q, clc_outcome *out) {
    /* Only kernels the engine already decided are asked about: the bridge is loaded. */
    if (atomic_load_explicit(&g_bridge, memory_order_acquire) != BRIDGE_READY ||
        (p_is_initialized && !p_is_initialized()))
        return -1;
    return p_launch(q, out);
}

/* With clc-run deciding first sights, the engine here hears of loads only when it may have to
 * wrap one of their kernels: no other load brings Python in, nor waits for its GIL. */
void clc_bridge_module(const clc_module_event *ev) {
    static int skip = -1;
    if (skip < 0) {
        const char *wraps = clc_setting("CLC_POLICY_WRAPS");
        skip = clc_decider_configured() && !(wraps && strcmp(wraps, "1") == 0);
    }
    if (!skip && ready()) p_module(ev);
}

/* Only while Python still runs: in a Python host it has finalized by now, and the engine ran
 * its exit work from Python's own atexit. */
void clc_bridge_exit(void) {
    if (atomic_load(&g_bridge) == BRIDGE_READY && (!p_is_initialized || p_is_initialized()))
        p_exit();
}

void clc_bridge_after_fork_child(void) {
    pthread_mutex_init(&g_load_lock, NULL);
    if (atomic_load(&g_bridge) != BRIDGE_OFF) atomic_store(&g_bridge, BRIDGE_OFF_IN_CHILD);
}
