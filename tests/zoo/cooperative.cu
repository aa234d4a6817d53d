// SPDX-License-Identifier: Apache-2.0
//
// cooperative: a grid-wide barrier (cooperative_groups::this_grid().sync()) in a kernel
// launched with cudaLaunchCooperativeKernel. Every block of the grid must be resident at
// once for the barrier to complete, which is why the grid is sized from the occupancy
// (blocks per SM x SMs) and why the runtime refuses a cooperative launch that is larger.
// A wrap cannot loop such a kernel: a physical block running virtual block k would wait at
// the grid barrier for virtual blocks that can only run after it, and deadlock. Nor is there
// anything to gain: the grid already fits the GPU.
//
// Phase 1 rewrites data[0..n) in place; after the grid barrier, phase 2 writes
// data[n + i] = data[i] + data[n - 1 - i], reading an element that (for most i) another
// block wrote in phase 1. Without the barrier, or with blocks that did not all run at once,
// phase 2 reads stale values. `data` therefore holds 2n ints.
//
// Expected loop verdict: refused (cooperative: grid-wide sync). README.md in this folder
// quotes the PTX that marks it.
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <integer>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>) or the device cannot launch cooperatively.

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

namespace cg = cooperative_groups;

extern "C" __global__ void grid_sync_kernel(int *data, int n) {
    cg::grid_group grid = cg::this_grid();
    int stride = blockDim.x * gridDim.x;
    int first = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = first; i < n; i += stride)
        data[i] = 3 * data[i] + 1;
    grid.sync();
    for (int i = first; i < n; i += stride)
        data[n + i] = data[i] + data[n - 1 - i];
}

int main() {
    const int n = 1 << 22;
    const int block = 256;

    int dev = 0, coop = 0, sms = 0, per_sm = 0;
    CHECK("cudaGetDevice", cudaGetDevice(&dev));
    CHECK("cudaDeviceGetAttribute",
          cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    if (!coop) {
        printf("cuda_error cudaDevAttrCooperativeLaunch not_supported\n");
        return 2;
    }
    CHECK("cudaDeviceGetAttribute",
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK("cudaOccupancyMaxActiveBlocksPerMultiprocessor",
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_sync_kernel, block, 0));
    // As many blocks as can be resident together: ~8 per SM, over a thousand on an H100.
    int grid = per_sm * sms;
    fprintf(stderr, "grid_sync_kernel: %d blocks per SM x %d SMs = %d blocks of %d\n", per_sm,
            sms, grid, block);

    int *h = (int *)malloc(sizeof(int) * 2 * (size_t)n);
    int *out = (int *)malloc(sizeof(int) * 2 * (size_t)n);
    if (!h || !out) {
        fprintf(stderr, "cooperative: out of host memory\n");
        return 2;
    }
    for (int i = 0; i < 2 * n; ++i)
        h[i] = 1 + i % 1009; // the second half too: an unwritten output keeps a wrong value

    int *d;
    CHECK("cudaMalloc", cudaMalloc(&d, sizeof(int) * 2 * (size_t)n));
    CHECK("cudaMemcpy", cudaMemcpy(d, h, sizeof(int) * 2 * (size_t)n, cudaMemcpyHostToDevice));
    int n_arg = n;
    void *args[] = {&d, &n_arg};
    CHECK("grid_sync_kernel",
          cudaLaunchCooperativeKernel((void *)grid_sync_kernel, dim3(grid), dim3(block), args,
                                      0, 0));
    CHECK("grid_sync_kernel", cudaGetLastError());
    CHECK("grid_sync_kernel", cudaDeviceSynchronize());
    CHECK("cudaMemcpy",
          cudaMemcpy(out, d, sizeof(int) * 2 * (size_t)n, cudaMemcpyDeviceToHost));

    // CPU reference: phase 1 over all of it, then phase 2.
    for (int i = 0; i < n; ++i)
        h[i] = 3 * h[i] + 1;
    for (int i = 0; i < n; ++i)
        h[n + i] = h[i] + h[n - 1 - i];
    int bad = 0;
    long long sum = 0;
    for (int i = 0; i < 2 * n; ++i) {
        if (out[i] != h[i] && !bad) {
            fprintf(stderr, "grid_sync_kernel: data[%d] = %d, want %d\n", i, out[i], h[i]);
            bad = 1;
        }
        sum += (long long)out[i] * (i % 3 + 1);
    }
    printf("result grid_sync_kernel %s\n", bad ? "mismatch" : "ok");
    printf("checksum grid_sync_kernel %lld\n", sum);

    cudaFree(d);
    free(h);
    free(out);
    return bad;
}
