// SPDX-License-Identifier: Apache-2.0
//
// vecadd: a plain CUDA runtime-API program for clc's GPU tests.
//
//   vecadd [iterations [passes]]
//
// Three kernels with distinct names (so a policy can deny one and leave the others alone),
// each launched a different number of times (so a capture that credits a launch to the wrong
// kernel shows up as a wrong count):
//   vecAdd        iterations times, each launch timed with cudaEvents around it
//   scale_kernel  2 * iterations times
//   debug_fill    (iterations + 1) / 2 times
//
// Output, one fact a line, in a fixed order so that two runs can be compared line by line:
//   info vecadd iterations=<i> passes=<p> n=<n>
//   cuda_error <kernel> <cudaGetErrorName>   first time each (kernel, error) pair is seen
//   count <kernel> <launches attempted>      denied launches included
//   errors <kernel> <n>                      only for kernels that had errors
//   event_ms vecAdd <total ms>               sum of the per-launch event times
//   result <kernel> ok|mismatch|skipped      skipped: the kernel had an error, nothing to check
//
// A launch error (a policy's deny, say) is reported and the program carries on: the exit
// status is 0 unless a result mismatches or something other than a launch fails.

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Grid-stride loop with a limited grid, repeated `passes` times: every pass streams all three
// arrays (3 x 64 MiB, larger than any L2) in ~75 us, so the default 8 passes make one launch
// ~0.6 ms on an H200 (measured) and a little more on an H100: long enough that the few
// microseconds between a program's events and clc's are lost in it. The pointers are not
// __restrict__, so the compiler must assume c may alias a or b and cannot fold the passes.
__global__ void vecAdd(const float *a, const float *b, float *c, int n, int passes) {
    int stride = blockDim.x * gridDim.x;
    for (int p = 0; p < passes; ++p)
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            c[i] = a[i] + b[i];
}

// Out of place, so repeating it gives the same result: the check does not depend on how many
// launches ran.
__global__ void scale_kernel(const float *x, float *y, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = x[i] * factor;
}

__global__ void debug_fill(int *d, int seed, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        d[i] = seed * 7 + (i % 11);
}

enum { K_VECADD, K_SCALE, K_FILL, K_COUNT };
static const char *kernel_names[K_COUNT] = {"vecAdd", "scale_kernel", "debug_fill"};
static long launches[K_COUNT];
static long errors[K_COUNT];

// Each distinct error name per kernel is printed once: a denied kernel fails every launch,
// and one line says as much as a thousand.
#define MAX_SEEN 16
static const char *seen[K_COUNT][MAX_SEEN];
static int n_seen[K_COUNT];

static void note_error(int k, cudaError_t err) {
    const char *name = cudaGetErrorName(err);
    errors[k]++;
    for (int s = 0; s < n_seen[k]; ++s)
        if (strcmp(seen[k][s], name) == 0)
            return;
    if (n_seen[k] < MAX_SEEN)
        seen[k][n_seen[k]++] = name;
    printf("cuda_error %s %s\n", kernel_names[k], name);
    fflush(stdout);
}

// Called right after each launch: the runtime reports a refused launch through
// cudaGetLastError(), which also clears it so the next call starts clean.
static void after_launch(int k) {
    launches[k]++;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        note_error(k, err);
}

// Anything that is not a kernel launch failing means the test setup is broken: say where and
// stop, with a distinct status so it is not mistaken for a result mismatch.
#define REQUIRE(call)                                                                         \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            fprintf(stderr, "vecadd: %s failed at %s:%d: %s (%s)\n", #call, __FILE__,         \
                    __LINE__, cudaGetErrorName(err_), cudaGetErrorString(err_));              \
            printf("fatal %s %s\n", #call, cudaGetErrorName(err_));                           \
            exit(3);                                                                          \
        }                                                                                     \
    } while (0)

int main(int argc, char **argv) {
    int iterations = argc > 1 ? atoi(argv[1]) : 200;
    int passes = argc > 2 ? atoi(argv[2]) : 8;
    if (iterations < 1 || passes < 1) {
        fprintf(stderr, "usage: vecadd [iterations>=1 [passes>=1]]\n");
        return 2;
    }

    const int n = 1 << 24;       // vecAdd: 64 MiB per array
    const int n_small = 1 << 20; // scale_kernel, debug_fill
    const int block = 256;

    int dev = 0, sms = 0;
    REQUIRE(cudaGetDevice(&dev));
    REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // A few blocks per SM: enough to saturate memory bandwidth, few enough that each thread
    // walks the whole array in strides, so the passes cannot be served from cache.
    int vec_grid = sms * 4;
    int small_grid = (n_small + block - 1) / block;

    printf("info vecadd iterations=%d passes=%d n=%d\n", iterations, passes, n);

    float *ha = (float *)malloc(sizeof(float) * n);
    float *hb = (float *)malloc(sizeof(float) * n);
    float *hc = (float *)malloc(sizeof(float) * n);
    float *hx = (float *)malloc(sizeof(float) * n_small);
    float *hy = (float *)malloc(sizeof(float) * n_small);
    int *hd = (int *)malloc(sizeof(int) * n_small);
    if (!ha || !hb || !hc || !hx || !hy || !hd) {
        fprintf(stderr, "vecadd: out of host memory\n");
        return 3;
    }
    // Small integers (and halves): every sum and product below is exact in float, so the
    // checks compare for equality.
    for (int i = 0; i < n; ++i) {
        ha[i] = (float)(i % 1000);
        hb[i] = 2.0f * (float)(i % 1000) + 0.5f;
    }
    for (int i = 0; i < n_small; ++i)
        hx[i] = (float)(i % 513);

    float *da, *db, *dc, *dx, *dy;
    int *dd;
    REQUIRE(cudaMalloc(&da, sizeof(float) * n));
    REQUIRE(cudaMalloc(&db, sizeof(float) * n));
    REQUIRE(cudaMalloc(&dc, sizeof(float) * n));
    REQUIRE(cudaMalloc(&dx, sizeof(float) * n_small));
    REQUIRE(cudaMalloc(&dy, sizeof(float) * n_small));
    REQUIRE(cudaMalloc(&dd, sizeof(int) * n_small));
    REQUIRE(cudaMemcpy(da, ha, sizeof(float) * n, cudaMemcpyHostToDevice));
    REQUIRE(cudaMemcpy(db, hb, sizeof(float) * n, cudaMemcpyHostToDevice));
    REQUIRE(cudaMemcpy(dx, hx, sizeof(float) * n_small, cudaMemcpyHostToDevice));
    // Zeroed outputs: a kernel that never ran leaves values no check accepts.
    REQUIRE(cudaMemset(dc, 0, sizeof(float) * n));
    REQUIRE(cudaMemset(dy, 0, sizeof(float) * n_small));
    REQUIRE(cudaMemset(dd, 0, sizeof(int) * n_small));

    // With lazy module loading (the default), the first launch of a kernel loads it on the
    // host, between our start event and the launch, and that load would count in our event
    // time but not in the time clc measures inside the launch. Loading the kernels up front
    // keeps the two measurements comparable. This is no launch, so it is not counted.
    cudaFuncAttributes attr;
    REQUIRE(cudaFuncGetAttributes(&attr, vecAdd));
    REQUIRE(cudaFuncGetAttributes(&attr, scale_kernel));
    REQUIRE(cudaFuncGetAttributes(&attr, debug_fill));

    cudaEvent_t ev0, ev1;
    REQUIRE(cudaEventCreate(&ev0));
    REQUIRE(cudaEventCreate(&ev1));
    double vec_ms = 0.0;
    int last_seed = -1;

    for (int it = 0; it < iterations; ++it) {
        REQUIRE(cudaEventRecord(ev0, 0));
        vecAdd<<<vec_grid, block>>>(da, db, dc, n, passes);
        after_launch(K_VECADD);
        REQUIRE(cudaEventRecord(ev1, 0));
        REQUIRE(cudaEventSynchronize(ev1));
        float ms = 0.0f;
        REQUIRE(cudaEventElapsedTime(&ms, ev0, ev1));
        vec_ms += ms;

        for (int r = 0; r < 2; ++r) {
            scale_kernel<<<small_grid, block>>>(dx, dy, 3.0f, n_small);
            after_launch(K_SCALE);
        }
        if (it % 2 == 0) {
            debug_fill<<<small_grid, block>>>(dd, it, n_small);
            after_launch(K_FILL);
            last_seed = it;
        }
    }

    // A fault inside a kernel would surface here rather than at the launch. It is not tied to
    // one kernel, so it is reported under "sync" and fails the run.
    cudaError_t sync_err = cudaDeviceSynchronize();
    if (sync_err != cudaSuccess) {
        printf("cuda_error sync %s\n", cudaGetErrorName(sync_err));
        fprintf(stderr, "vecadd: cudaDeviceSynchronize: %s\n", cudaGetErrorString(sync_err));
        return 3;
    }

    REQUIRE(cudaMemcpy(hc, dc, sizeof(float) * n, cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(hy, dy, sizeof(float) * n_small, cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(hd, dd, sizeof(int) * n_small, cudaMemcpyDeviceToHost));

    const char *result[K_COUNT];
    int bad = 0;
    long first_bad[K_COUNT] = {-1, -1, -1};
    for (int i = 0; i < n && first_bad[K_VECADD] < 0; ++i)
        if (hc[i] != ha[i] + hb[i])
            first_bad[K_VECADD] = i;
    for (int i = 0; i < n_small && first_bad[K_SCALE] < 0; ++i)
        if (hy[i] != hx[i] * 3.0f)
            first_bad[K_SCALE] = i;
    for (int i = 0; i < n_small && first_bad[K_FILL] < 0; ++i)
        if (hd[i] != last_seed * 7 + (i % 11))
            first_bad[K_FILL] = i;
    for (int k = 0; k < K_COUNT; ++k) {
        if (errors[k]) {
            result[k] = "skipped";
        } else if (first_bad[k] >= 0) {
            result[k] = "mismatch";
            bad = 1;
            fprintf(stderr, "vecadd: %s result wrong at index %ld\n", kernel_names[k], first_bad[k]);
        } else {
            result[k] = "ok";
        }
    }

    for (int k = 0; k < K_COUNT; ++k)
        printf("count %s %ld\n", kernel_names[k], launches[k]);
    for (int k = 0; k < K_COUNT; ++k)
        if (errors[k])
            printf("errors %s %ld\n", kernel_names[k], errors[k]);
    printf("event_ms vecAdd %.4f\n", vec_ms);
    for (int k = 0; k < K_COUNT; ++k)
        printf("result %s %s\n", kernel_names[k], result[k]);

    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dd);
    free(ha);
    free(hb);
    free(hc);
    free(hx);
    free(hy);
    free(hd);
    return bad ? 1 : 0;
}
