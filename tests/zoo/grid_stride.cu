// SPDX-License-Identifier: Apache-2.0
//
// grid_stride: the grid-stride loop, the commonest hand-written kernel shape. Each thread
// walks the array in steps of the whole grid, so the kernel is correct for any grid size:
// a wrap that runs fewer physical blocks must still give the same answer, and gridDim.x
// here must read as the launch's (virtual) grid, not the persistent one.
//
// Expected loop verdict: loopable (no barrier, no grid-wide or cluster-wide sync).
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <%.6e>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

extern "C" __global__ void grid_stride_saxpy(int n, float a, const float *x, float *y) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = a * x[i] + y[i];
}

int main() {
    // Not a multiple of the block size, so the tail of the last stride is exercised.
    const int n = (1 << 22) + 37;
    const int block = 256;
    // Two launches: one with a grid much smaller than the data (each thread strides ~27
    // times), one with a block per 256 elements (each thread runs the body at most once).
    const int grid_small = 600;
    const int grid_full = (n + block - 1) / block;
    const float a = 2.5f;

    float *hx = (float *)malloc(sizeof(float) * n);
    float *hy = (float *)malloc(sizeof(float) * n);
    float *out = (float *)malloc(sizeof(float) * n);
    if (!hx || !hy || !out) {
        fprintf(stderr, "grid_stride: out of host memory\n");
        return 2;
    }
    // Small integers and halves, never zero: a*x+y stays exact in float (with or without
    // FMA contraction), so the check is an equality.
    for (int i = 0; i < n; ++i) {
        hx[i] = (float)(1 + i % 97);
        hy[i] = 0.5f * (float)(1 + i % 89);
    }

    float *dx, *dy;
    CHECK("cudaMalloc", cudaMalloc(&dx, sizeof(float) * n));
    CHECK("cudaMalloc", cudaMalloc(&dy, sizeof(float) * n));
    CHECK("cudaMemcpy", cudaMemcpy(dx, hx, sizeof(float) * n, cudaMemcpyHostToDevice));
    CHECK("cudaMemcpy", cudaMemcpy(dy, hy, sizeof(float) * n, cudaMemcpyHostToDevice));

    grid_stride_saxpy<<<grid_small, block>>>(n, a, dx, dy);
    CHECK("grid_stride_saxpy", cudaGetLastError());
    grid_stride_saxpy<<<grid_full, block>>>(n, a, dx, dy);
    CHECK("grid_stride_saxpy", cudaGetLastError());
    CHECK("grid_stride_saxpy", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(out, dy, sizeof(float) * n, cudaMemcpyDeviceToHost));

    int bad = 0;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        float want = a * hx[i] + (a * hx[i] + hy[i]);
        if (out[i] != want && !bad) {
            fprintf(stderr, "grid_stride_saxpy: y[%d] = %g, want %g\n", i, out[i], want);
            bad = 1;
        }
        sum += out[i];
    }
    printf("result grid_stride_saxpy %s\n", bad ? "mismatch" : "ok");
    printf("checksum grid_stride_saxpy %.6e\n", sum);

    cudaFree(dx);
    cudaFree(dy);
    free(hx);
    free(hy);
    free(out);
    return bad;
}
