/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_threads [THREADS [LAUNCHES]]: THREADS threads (16) launch LAUNCHES kernels each (10000)
 * at once, so that a shim's first sight of a kernel, its caches and its counters are raced.
 * Entry points come from cuGetProcAddress as in cudart; kernels are CUkernel handles from one
 * library. Each thread alternates vecAdd and debug_kernel; even threads use cuLaunchKernel,
 * odd ones cuLaunchKernel_ptsz. A barrier releases all threads together.
 *
 * Prints one line per launch outcome only in aggregate:
 *   threads: threads=<t> launches=<each> total=<t*each>
 *   threads: ok=<n> failed=<n> codes=<rc>:<count>[,<rc>:<count>...]   (sorted by rc)
 * Driver counts without a shim: vecAdd and debug_kernel launches=total/2 each (total even).
 */
#include "common.h"

#include <pthread.h>

#define MAX_CODES 16

static struct cudart g_rt;
static __typeof__(&cuLaunchKernel) g_launch, g_launch_ptsz;
static CUfunction g_kernels[2];
static long g_iters;
static pthread_barrier_t g_start;

/* CUresult -> count, merged from the threads under g_tally_lock. */
static struct {
    int code;
    unsigned long count;
} g_codes[MAX_CODES];
static int g_ncodes;
static pthread_mutex_t g_tally_lock = PTHREAD_MUTEX_INITIALIZER;

static void tally(int code, unsigned long count)
{
    int i;
    for (i = 0; i < g_ncodes && g_codes[i].code != code; i++)
        ;
    if (i == g_ncodes) {
        if (g_ncodes == MAX_CODES)
            i = MAX_CODES - 1; /* more distinct errors than expected: lump into the last */
        else
            g_codes[g_ncodes++].code = code;
    }
    g_codes[i].count += count;
}

static void *worker(void *arg)
{
    long id = (long)arg, i;
    __typeof__(&cuLaunchKernel) launch = id % 2 ? g_launch_ptsz : g_launch;
    unsigned long local[MAX_CODES] = {0};
    int codes[MAX_CODES], ncodes = 0, j;
    float a = 1.0f;
    int n = 256;
    void *args[] = {&a, &a, &a, &n};

    /* A new thread has no current context, as with the real driver. */
    CHECK(g_rt.set_current(g_rt.ctx));
    pthread_barrier_wait(&g_start);
    for (i = 0; i < g_iters; i++) {
        int rc = (int)launch(g_kernels[i % 2], 2, 1, 1, 64, 1, 1, 0, NULL, args, NULL);
        for (j = 0; j < ncodes && codes[j] != rc; j++)
            ;
        if (j == ncodes && ncodes < MAX_CODES)
            codes[ncodes++] = rc;
        local[j < MAX_CODES ? j : MAX_CODES - 1]++;
    }
    pthread_mutex_lock(&g_tally_lock);
    for (j = 0; j < ncodes; j++)
        tally(codes[j], local[j]);
    pthread_mutex_unlock(&g_tally_lock);
    return NULL;
}

static int by_code(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b; /* code is the first member */
}

int main(int argc, char **argv)
{
    long nthreads = argc > 1 ? atol(argv[1]) : 16, t;
    unsigned long ok = 0, failed = 0;
    pthread_t *threads;
    int i;

    g_iters = argc > 2 ? atol(argv[2]) : 10000;
    if (nthreads < 1 || g_iters < 0) {
        fprintf(stderr, "usage: %s [THREADS [LAUNCHES_PER_THREAD]]\n", argv[0]);
        return 2;
    }
    start_program();
    /* The primary context is retained here but made current only by the worker threads. */
    cudart_start(&g_rt, CUDART_RETAIN | CUDART_SET_CURRENT_LAST);
    g_launch = resolve("cuLaunchKernel", RT_VERSION, 0);
    g_launch_ptsz = resolve("cuLaunchKernel", RT_VERSION, PTSZ);
    g_kernels[0] = (CUfunction)cudart_kernel(&g_rt, K_VECADD);
    g_kernels[1] = (CUfunction)cudart_kernel(&g_rt, K_DEBUG);

    printf("threads: threads=%ld launches=%ld total=%ld\n", nthreads, g_iters, nthreads * g_iters);
    if (!(threads = calloc((size_t)nthreads, sizeof *threads)))
        return 1;
    pthread_barrier_init(&g_start, NULL, (unsigned)nthreads);
    for (t = 0; t < nthreads; t++) {
        if (pthread_create(&threads[t], NULL, worker, (void *)t)) {
            fprintf(stderr, "FAILED pthread_create\n");
            return 1;
        }
    }
    for (t = 0; t < nthreads; t++)
        pthread_join(threads[t], NULL);

    qsort(g_codes, (size_t)g_ncodes, sizeof g_codes[0], by_code);
    printf("threads: ");
    for (i = 0; i < g_ncodes; i++) {
        if (g_codes[i].code == CUDA_SUCCESS)
            ok += g_codes[i].count;
        else
            failed += g_codes[i].count;
    }
    printf("ok=%lu failed=%lu codes=", ok, failed);
    for (i = 0; i < g_ncodes; i++)
        printf("%s%d:%lu", i ? "," : "", g_codes[i].code, g_codes[i].count);
    printf("\n");
    print_fake_counts();
    return 0;
}
