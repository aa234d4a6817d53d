/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_green_program: the primary context's life as a program leads it, for a policy that
 * confines the whole process (scope: program): retained twice, released once and launched on,
 * released for good, retained again; four threads launching at once on the legacy stream and
 * streams of their own. With `cudart` it takes the context as libcudart does: retained through
 * the driver's private path (the fake's fake_cuda_private_primary_retain), never through
 * cuDevicePrimaryCtxRetain, made current with cuCtxSetCurrent, released with
 * cuDevicePrimaryCtxRelease; it skips the second retain and release (cudart retains a device's
 * context once). Prints, as the fake driver saw it:
 *
 *   green LABEL rc=N first=F sms=S ordered=0|1
 *   same-handle 0|1                 (both retains handed out the same context)
 *   after-one-release destroyed=D   (green contexts destroyed while one retain is still held)
 *   threads failures=F launches=L
 *   order-violations N
 *   green-contexts created=C destroyed=D streams=S streams-destroyed=X
 */
#include "common.h"

#include <pthread.h>

#define THREADS 4
#define ROUNDS 50

typedef void (*green_counts_t)(unsigned long *, unsigned long *, unsigned long *,
                               unsigned long *);

static green_counts_t g_counts;
static CUcontext g_ctx;
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
static retain_t retain = cuDevicePrimaryCtxRetain;
static CUfunction g_vecadd, g_fill;
static _Atomic int g_failures, g_launches;

static void where(const char *label, const char *kernel, CUresult rc)
{
    print_green(label, kernel, rc);
}

static void *worker(void *arg)
{
    float a = 1.0f;
    int n = 64;
    void *args[] = {&a, &a, &a, &n};
    CUstream s;
    (void)arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS ||
        cuStreamCreate(&s, CU_STREAM_DEFAULT) != CUDA_SUCCESS) {
        g_failures++;
        return NULL;
    }
    for (int r = 0; r < ROUNDS; r++) {
        CUstream on = r % 2 ? s : NULL;
        if (cuLaunchKernel(g_vecadd, 2, 1, 1, 32, 1, 1, 0, on, args, NULL) != CUDA_SUCCESS)
            g_failures++;
        else
            g_launches++;
    }
    if (cuStreamDestroy(s) != CUDA_SUCCESS)
        g_failures++;
    return NULL;
}

static void load(void)
{
    CUmodule app, fill_mod;
    CHECK(cuModuleLoadData(&app, APP_PTX));
    CHECK(cuModuleLoadData(&fill_mod, FILL_PTX));
    CHECK(cuModuleGetFunction(&g_vecadd, app, K_VECADD));
    CHECK(cuModuleGetFunction(&g_fill, fill_mod, K_FILL));
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext again;
    CUstream s;
    float a = 1.0f;
    int n = 1024;
    void *args[] = {&a, &a, &a, &n};
    pthread_t t[THREADS];
    unsigned long created, destroyed, streams, streams_destroyed;

    start_program();
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    g_counts = (green_counts_t)fake_hook("fake_cuda_green_counts");
    CHECK(cuInit(0));
    int cudart = argc > 1 && strcmp(argv[1], "cudart") == 0;
    if (cudart && !(retain = (retain_t)fake_hook("fake_cuda_private_primary_retain"))) {
        fprintf(stderr, "FAILED cudart: runs over the fake driver only\n");
        return 1;
    }
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(retain(&g_ctx, dev));
    CHECK(cuCtxSetCurrent(g_ctx));
    load();
    CHECK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    where("legacy", K_VECADD, cuLaunchKernel(g_vecadd, 4, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    where("stream", K_VECADD, cuLaunchKernel(g_vecadd, 4, 1, 1, 32, 1, 1, 0, s, args, NULL));
    where("other-kernel", K_FILL, cuLaunchKernel(g_fill, 4, 1, 1, 32, 1, 1, 0, s, args, NULL));

    /* A second retain (a library of the program's, say), and its release. */
    if (!cudart) {
        CHECK(retain(&again, dev));
        printf("same-handle %d\n", again == g_ctx);
        CHECK(cuDevicePrimaryCtxRelease(dev));
    }
    if (g_counts) {
        g_counts(&created, &destroyed, &streams, &streams_destroyed);
        printf("after-one-release destroyed=%lu\n", destroyed);
    }
    where("after-one-release", K_VECADD,
          cuLaunchKernel(g_vecadd, 4, 1, 1, 32, 1, 1, 0, s, args, NULL));

    /* Threads, each making the context current and launching on it. */
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("threads failures=%d launches=%d\n", (int)g_failures, (int)g_launches);
    where("threads", K_VECADD, CUDA_SUCCESS);

    /* The last release, then the context retained and used again. */
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    CHECK(retain(&g_ctx, dev));
    CHECK(cuCtxSetCurrent(g_ctx));
    load();
    where("after-release", K_VECADD,
          cuLaunchKernel(g_vecadd, 4, 1, 1, 32, 1, 1, 0, NULL, args, NULL));

    if (!g_counts)
        return 0; /* over a real driver */
    unsigned long (*violations)(void) = fake_sym(h, "fake_cuda_order_violations");
    g_counts(&created, &destroyed, &streams, &streams_destroyed);
    printf("order-violations %lu\n", violations());
    printf("green-contexts created=%lu destroyed=%lu streams=%lu streams-destroyed=%lu\n",
           created, destroyed, streams, streams_destroyed);
    return 0;
}
