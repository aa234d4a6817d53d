/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_green_threads: four threads, each making a stream, launching vecAdd on it, queueing work
 * of its own after the launch and destroying the stream, 200 times over, while the others do
 * the same: under a policy that confines vecAdd, clc's green streams come and go with the
 * program's while other threads' launches are in flight. Prints
 *
 *   threads failures=F launches=L
 *   order-violations N
 *   green-streams made=M destroyed=D
 */
#include "common.h"

#include <pthread.h>

#define THREADS 4
#define ROUNDS 200

static CUcontext g_ctx;
static CUfunction g_vecadd;
static _Atomic int g_failures, g_launches;

static void *worker(void *arg)
{
    float a = 1.0f;
    int n = 64;
    void *args[] = {&a, &a, &a, &n};
    CUevent mark;
    (void)arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS || cuEventCreate(&mark, 0) != CUDA_SUCCESS) {
        g_failures++;
        return NULL;
    }
    for (int r = 0; r < ROUNDS; r++) {
        CUstream s;
        if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
            g_failures++;
            continue;
        }
        if (cuLaunchKernel(g_vecadd, 2, 1, 1, 32, 1, 1, 0, s, args, NULL) != CUDA_SUCCESS)
            g_failures++;
        else
            g_launches++;
        if (cuEventRecord(mark, s) != CUDA_SUCCESS || cuStreamDestroy(s) != CUDA_SUCCESS)
            g_failures++;
    }
    return NULL;
}

int main(void)
{
    CUdevice dev;
    CUmodule app;
    pthread_t t[THREADS];

    start_program();
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&g_ctx, dev));
    CHECK(cuCtxSetCurrent(g_ctx));
    CHECK(cuModuleLoadData(&app, APP_PTX));
    CHECK(cuModuleGetFunction(&g_vecadd, app, K_VECADD));
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("threads failures=%d launches=%d\n", (int)g_failures, (int)g_launches);
    if (!over_fake_driver())
        return 0; /* over a real driver */
    unsigned long (*violations)(void) = fake_sym(h, "fake_cuda_order_violations");
    void (*counts)(unsigned long *, unsigned long *, unsigned long *, unsigned long *) =
        fake_sym(h, "fake_cuda_green_counts");
    unsigned long created, destroyed, streams, streams_destroyed;
    counts(&created, &destroyed, &streams, &streams_destroyed);
    printf("order-violations %lu\n", violations());
    printf("green-streams made=%lu destroyed=%lu\n", streams, streams_destroyed);
    return 0;
}
