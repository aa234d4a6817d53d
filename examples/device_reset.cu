// SPDX-License-Identifier: Apache-2.0
//
// device_reset: a program that calls cudaDeviceReset() between two phases of work (test
// suites and long-running services do). The reset destroys the primary context, and with it
// every function and allocation made in it; the next CUDA call makes a new primary context,
// which the driver gives the same CUcontext handle. Under clc, a wrapped kernel must be set
// up again in the new context (its function and slot ring), not launched with the dead ones.
//
// Output: result reset_phase1|reset_phase2 ok|mismatch; exit 0 ok, 1 mismatch, 2 a CUDA call
// failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(what, call)                                                                     \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            printf("cuda_error %s %s\n", what, cudaGetErrorName(err_));                       \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

extern "C" __global__ void reset_scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + 1.0f;
}

// Two launches over n elements starting at i + 1: x = a * (a * x + 1) + 1.
static int phase(const char *name, float a) {
    const int n = (1 << 20) + 3, block = 256, grid = (n + block - 1) / block;
    float *h = (float *)malloc(sizeof(float) * n), *d;
    for (int i = 0; i < n; ++i) h[i] = (float)(1 + i % 17);
    CHECK("cudaMalloc", cudaMalloc(&d, sizeof(float) * n));
    CHECK("cudaMemcpy", cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice));
    for (int k = 0; k < 2; ++k) {
        reset_scale<<<grid, block>>>(d, a, n);
        CHECK("reset_scale", cudaGetLastError());
    }
    float *out = (float *)malloc(sizeof(float) * n);
    CHECK("cudaMemcpy", cudaMemcpy(out, d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n && !bad; ++i)
        bad = out[i] != a * (a * (float)(1 + i % 17) + 1.0f) + 1.0f;
    printf("result %s %s\n", name, bad ? "mismatch" : "ok");
    CHECK("cudaFree", cudaFree(d));
    free(h);
    free(out);
    return bad;
}

int main() {
    int bad = phase("reset_phase1", 2.0f);
    CHECK("cudaDeviceReset", cudaDeviceReset());
    bad |= phase("reset_phase2", 0.5f);
    return bad;
}
