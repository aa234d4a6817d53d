/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_life MODE [N]: launches at every moment of a process's life, and every way of leaving
 * it. Linked with liblife.so (lib_life.c: launches from a library's constructor and destructor,
 * set by environment variables) and with the driver (-lcuda). Each launch prints its
 * "launch <kernel> via <where> -> <rc>" line.
 *
 *   plain N      vecAdd N times, then return from main
 *   atexit N     an exit handler registered before the first CUDA call launches debug_kernel N
 *                times; main launches vecAdd once and returns
 *   dtor N       the program's own destructor launches debug_kernel N times
 *   quick N      vecAdd N times, then _exit(0)
 *   exit_group N vecAdd N times, then syscall(SYS_exit_group, 0)
 *   segv N       vecAdd N times, then a NULL write (SIGSEGV)
 *   abort N      vecAdd N times, then abort()
 *   term N       vecAdd N times, then SIGTERM to itself
 *   kill N       vecAdd N times, a 1.5 s sleep, then SIGKILL to itself
 *   handler N    vecAdd N times, then SIGSEGV, which a handler of the program's takes: it
 *                prints "handled" and leaves with _exit(7)
 *   signals N    a thread sends SIGUSR1 to the main thread every 20 us while it makes N first
 *                sights (modules of fresh kernels, each launched once and unloaded), and more
 *                until the handler has run 200 times; the handler launches debug_kernel. Prints
 *                "signals: launches=<n> refused=<n> ran=<n>" (the handler's), then
 *                "signals-main: launches=<n>" (the main thread's).
 *   signals_launch N  the same, while the main thread launches vecAdd (recorded by an audit
 *                policy: clc writes a record at each)
 *   race N       two threads, N rounds each: one loads a module of ok_kernel, launches it,
 *                unloads it; the other does the same with debug_kernel. The driver hands each
 *                new module the handle of the one just unloaded. Prints "race: ok=<n>
 *                debug_ran=<n> debug_refused=<n>".
 *   setuid N     vecAdd once, then setuid(N), then vecAdd and scale once each
 *   fill N       N modules of fill_kernel, each launched once and kept (N handles), then a
 *                module of debug_kernel, launched 100 times
 *   badchild     a forked child puts a folder where its capture would go ($LIFE_CAPTURE, the
 *                run's -o: STEM.child-PID.clc), then launches vecAdd; the parent waits for it
 *                and launches vecAdd too
 */
#define _GNU_SOURCE
#include "common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void life_set_function(CUfunction f);

static CUfunction g_vecadd, g_scale, g_debug;
static int g_n;

static void start_cuda(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, APP_PTX));
    CHECK(cuModuleGetFunction(&g_vecadd, mod, K_VECADD));
    CHECK(cuModuleGetFunction(&g_scale, mod, K_SCALE));
    CHECK(cuModuleGetFunction(&g_debug, mod, K_DEBUG));
    life_set_function(g_debug);
}

static CUresult launch(CUfunction f) { return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL); }

static void launch_n(CUfunction f, const char *name, const char *via, int n)
{
    for (int i = 0; i < n; i++)
        report_launch(name, via, launch(f));
}

static void at_exit_launches(void) { launch_n(g_debug, K_DEBUG, "atexit", g_n); }

static int g_dtor;
__attribute__((destructor)) static void program_dtor(void)
{
    if (g_dtor)
        launch_n(g_debug, K_DEBUG, "dtor", g_n);
}

static void on_segv(int sig)
{
    (void)sig;
    static const char msg[] = "handled\n";
    (void)!write(1, msg, sizeof msg - 1);
    _exit(7);
}

/* ---- signals: a handler's launches while the thread is inside clc's own work ------------- */

static volatile sig_atomic_t g_sig_launches, g_sig_refused, g_sig_ran;
static volatile int g_stop;
static pthread_t g_main;

static void on_usr1(int sig)
{
    (void)sig;
    CUresult r = launch(g_debug);
    g_sig_launches++;
    if (r == CUDA_ERROR_NOT_PERMITTED)
        g_sig_refused++;
    else if (r == CUDA_SUCCESS)
        g_sig_ran++;
}

static void *pester(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 20000};
    while (!g_stop) {
        pthread_kill(g_main, SIGUSR1);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void signals(int n, int loads)
{
    char ptx[256];
    pthread_t t;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    g_main = pthread_self();
    pthread_create(&t, NULL, pester, NULL);
    /* at least N of its own, and on until the handler has launched 200 times: a fast main loop
     * would otherwise finish before the pester thread has been heard often enough */
    int i = 0;
    for (; (i < n || g_sig_launches < 200) && !loads; i++)
        launch(g_vecadd);
    for (; (i < n || g_sig_launches < 200) && loads; i++) {
        CUmodule mod;
        CUfunction f;
        char name[32];
        snprintf(name, sizeof name, "fresh_%d", i);
        snprintf(ptx, sizeof ptx, PTX_HEADER ".visible .entry %s(\n)\n{\n\tret;\n}\n", name);
        CHECK(cuModuleLoadData(&mod, ptx));
        CHECK(cuModuleGetFunction(&f, mod, name));
        launch(f);
        CHECK(cuModuleUnload(mod));
    }
    g_stop = 1;
    pthread_join(t, NULL);
    printf("signals: launches=%d refused=%d ran=%d\n", (int)g_sig_launches, (int)g_sig_refused,
           (int)g_sig_ran);
    printf("signals-main: launches=%d\n", i);
}

/* ---- race: an unload and another thread's load ---------------------------------------------- */

static _Atomic long g_ok, g_debug_ran, g_debug_refused;
static CUcontext g_ctx;

static void *race_loop(void *arg)
{
    const char *name = arg;
    char ptx[256];
    CHECK(cuCtxSetCurrent(g_ctx));
    snprintf(ptx, sizeof ptx, PTX_HEADER ".visible .entry %s(\n)\n{\n\tret;\n}\n", name);
    for (int i = 0; i < g_n; i++) {
        CUmodule mod;
        CUfunction f;
        CHECK(cuModuleLoadData(&mod, ptx));
        CHECK(cuModuleGetFunction(&f, mod, name));
        CUresult r = launch(f);
        if (strcmp(name, "ok_kernel") == 0)
            g_ok += r == CUDA_SUCCESS;
        else if (r == CUDA_SUCCESS)
            g_debug_ran++;
        else
            g_debug_refused++;
        CHECK(cuModuleUnload(mod));
    }
    return NULL;
}

static void race(void)
{
    pthread_t a, b;
    CHECK(cuCtxGetCurrent(&g_ctx));
    pthread_create(&a, NULL, race_loop, "ok_kernel");
    pthread_create(&b, NULL, race_loop, "debug_kernel");
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("race: ok=%ld debug_ran=%ld debug_refused=%ld\n", (long)g_ok, (long)g_debug_ran,
           (long)g_debug_refused);
}

static void fill(int n)
{
    const char *ptx = PTX_HEADER PTX_ENTRY("fill_kernel");
    for (int i = 0; i < n; i++) {
        CUmodule mod;
        CUfunction f;
        CHECK(cuModuleLoadData(&mod, ptx));
        CHECK(cuModuleGetFunction(&f, mod, "fill_kernel"));
        if (launch(f) != CUDA_SUCCESS) {
            fprintf(stderr, "FAILED fill_kernel launch %d\n", i);
            exit(1);
        }
    }
    CUmodule mod;
    CUfunction f;
    CHECK(cuModuleLoadData(&mod, PTX_HEADER PTX_ENTRY("debug_kernel")));
    CHECK(cuModuleGetFunction(&f, mod, "debug_kernel"));
    launch_n(f, "debug_kernel", "fill", 100);
}

static void bad_child(void)
{
    const char *out = getenv("LIFE_CAPTURE");
    pid_t pid = fork();
    if (pid == 0) {
        char path[4096];
        size_t len = strlen(out);
        if (len > 4 && strcmp(out + len - 4, ".clc") == 0)
            len -= 4;
        snprintf(path, sizeof path, "%.*s.child-%d.clc", (int)len, out, (int)getpid());
        mkdir(path, 0700);
        g_role = "child: ";
        launch_n(g_vecadd, K_VECADD, "child", 1);
        exit(0);
    }
    waitpid(pid, NULL, 0);
    launch_n(g_vecadd, K_VECADD, "main", 1);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "plain";
    g_n = argc > 2 ? atoi(argv[2]) : 1;
    start_program();
    if (strcmp(mode, "atexit") == 0)
        atexit(at_exit_launches);
    g_dtor = strcmp(mode, "dtor") == 0;
    start_cuda();
    if (strcmp(mode, "atexit") == 0 || strcmp(mode, "dtor") == 0) {
        launch_n(g_vecadd, K_VECADD, "main", 1);
        return 0;
    }
    if (strcmp(mode, "signals") == 0 || strcmp(mode, "signals_launch") == 0) {
        signals(g_n, strcmp(mode, "signals") == 0);
        return 0;
    }
    if (strcmp(mode, "race") == 0) {
        race();
        return 0;
    }
    if (strcmp(mode, "fill") == 0) {
        fill(g_n);
        return 0;
    }
    if (strcmp(mode, "badchild") == 0) {
        bad_child();
        return 0;
    }
    if (strcmp(mode, "setuid") == 0) {
        launch_n(g_vecadd, K_VECADD, "main", 1);
        if (setuid((uid_t)g_n) != 0) {
            perror("FAILED setuid");
            return 1;
        }
        launch_n(g_vecadd, K_VECADD, "main", 1);
        launch_n(g_scale, K_SCALE, "main", 1);
        return 0;
    }
    launch_n(g_vecadd, K_VECADD, "main", g_n);
    if (strcmp(mode, "quick") == 0)
        _exit(0);
    if (strcmp(mode, "exit_group") == 0)
        syscall(SYS_exit_group, 0);
    if (strcmp(mode, "segv") == 0)
        *(volatile int *)NULL = 1;
    if (strcmp(mode, "abort") == 0)
        abort();
    if (strcmp(mode, "term") == 0) {
        kill(getpid(), SIGTERM);
        pause();
    }
    if (strcmp(mode, "kill") == 0) {
        struct timespec ts = {1, 500000000};
        nanosleep(&ts, NULL);
        kill(getpid(), SIGKILL);
    }
    if (strcmp(mode, "handler") == 0) {
        signal(SIGSEGV, on_segv);
        *(volatile int *)NULL = 1;
    }
    return 0;
}
