/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_fork [plain|threaded [FORKS]]: a process that launches kernels, forks, and keeps going,
 * as a Python program with multiprocessing workers does. Each child launches three kernels and
 * exits 0 through exit() (so atexit handlers, a shim's included, run in the child); the parent
 * waits for it, checks its status, and launches more. "threaded" keeps a second thread busy
 * launching while the main thread forks, so a lock held at fork time shows up as a child that
 * hangs or crashes. FORKS (1) children are forked one after the other.
 *
 * Lines as in common.h; the child's start with "child: ". The parent also prints
 *   fork: child=<i> exited=<status>        (or signaled=<signal>)
 *   busy: ok=<n> failed=<n>                (threaded only)
 * and exits 1 if a child did not exit 0.
 * Driver counts without a shim, parent: vecAdd launches=3, scale launches=1 + busy ok;
 * each child: its parent's counts at fork time plus scale launches=3.
 */
#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

static struct cudart g_rt;
static __typeof__(&cuLaunchKernel) g_launch, g_launch_ptsz;
static CUfunction g_vecadd, g_scale;
static atomic_int g_stop;
static atomic_ulong g_busy_ok, g_busy_failed;
static float g_a = 1.0f;
static int g_n = 256;
static void *g_args[] = {&g_a, &g_a, &g_a, &g_n};

static CUresult launch(CUfunction f)
{
    return g_launch(f, 2, 1, 1, 64, 1, 1, 0, NULL, g_args, NULL);
}

/* Capped so that a slow child (a shim flushing a capture at exit) cannot make the parent's
 * record of launches grow without bound; the forks happen long before the cap. */
#define BUSY_MAX 1000000ul

static void *busy(void *arg)
{
    unsigned long done = 0;
    (void)arg;
    CHECK(g_rt.set_current(g_rt.ctx));
    while (!atomic_load(&g_stop)) {
        if (done == BUSY_MAX) {
            sched_yield();
            continue;
        }
        if (launch(g_scale) == CUDA_SUCCESS)
            atomic_fetch_add(&g_busy_ok, 1);
        else
            atomic_fetch_add(&g_busy_failed, 1);
        done++;
    }
    return NULL;
}

static void child(void)
{
    g_role = "child: ";
    report_launch(K_SCALE, "cuLaunchKernel", launch(g_scale));
    report_launch(K_SCALE, "cuLaunchKernel", launch(g_scale));
    report_launch(K_SCALE, "cuLaunchKernel_ptsz",
                  g_launch_ptsz(g_scale, 2, 1, 1, 64, 1, 1, 0, NULL, g_args, NULL));
    print_fake_counts();
    exit(0);
}

int main(int argc, char **argv)
{
    int threaded = argc > 1 && strcmp(argv[1], "threaded") == 0;
    long forks = argc > 2 ? atol(argv[2]) : 1, i;
    int all_ok = 1, status;
    pthread_t busy_thread;

    if ((argc > 1 && !threaded && strcmp(argv[1], "plain") != 0) || forks < 1) {
        fprintf(stderr, "usage: %s [plain|threaded [FORKS]]\n", argv[0]);
        return 2;
    }
    start_program();
    cudart_start(&g_rt, CUDART_RETAIN | CUDART_SET_CURRENT | CUDART_SET_CURRENT_LAST);
    g_launch = resolve("cuLaunchKernel", RT_VERSION, 0);
    g_launch_ptsz = resolve("cuLaunchKernel", RT_VERSION, PTSZ);
    g_vecadd = (CUfunction)cudart_kernel(&g_rt, K_VECADD);
    g_scale = (CUfunction)cudart_kernel(&g_rt, K_SCALE);

    report_launch(K_VECADD, "cuLaunchKernel", launch(g_vecadd));
    report_launch(K_VECADD, "cuLaunchKernel", launch(g_vecadd));

    if (threaded) {
        if (pthread_create(&busy_thread, NULL, busy, NULL)) {
            fprintf(stderr, "FAILED pthread_create\n");
            return 1;
        }
        /* Fork only once the other thread is deep in its launch loop. */
        while (atomic_load(&g_busy_ok) + atomic_load(&g_busy_failed) < 1000)
            sched_yield();
    }

    for (i = 0; i < forks; i++) {
        pid_t pid;
        fflush(stdout);
        if ((pid = fork()) < 0) {
            perror("FAILED fork");
            return 1;
        }
        if (pid == 0)
            child();
        if (waitpid(pid, &status, 0) != pid) {
            perror("FAILED waitpid");
            return 1;
        }
        if (WIFEXITED(status))
            printf("fork: child=%ld exited=%d\n", i, WEXITSTATUS(status));
        else
            printf("fork: child=%ld signaled=%d\n", i, WIFSIGNALED(status) ? WTERMSIG(status) : -1);
        all_ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }

    if (threaded) {
        atomic_store(&g_stop, 1);
        pthread_join(busy_thread, NULL);
        printf("busy: ok=%lu failed=%lu\n", atomic_load(&g_busy_ok), atomic_load(&g_busy_failed));
    }
    report_launch(K_VECADD, "cuLaunchKernel", launch(g_vecadd));
    report_launch(K_SCALE, "cuLaunchKernel", launch(g_scale));
    print_fake_counts();
    return all_ok ? 0 : 1;
}
