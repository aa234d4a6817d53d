// SPDX-License-Identifier: Apache-2.0
//
// divergent_exit: a thread-divergent early exit followed by a barrier,
//   if (threadIdx.x >= limit) return;   ...   __syncthreads();
// Run as launched, this works on current GPUs: the hardware counts exited threads as
// arrived at the barrier (CUDA C++ calls a __syncthreads that not all threads reach
// undefined, but the pattern is common and it does run). A persistent loop cannot keep it:
// if the exit stays an exit, the threads past `limit` are gone for every later virtual
// block; if it becomes "go on to the next virtual block", those threads reach the next
// block's barrier while the rest of the block is still at this one's, and the barrier counts
// mix two virtual blocks. So a wrap must refuse any barrier that a thread-divergent exit
// can precede. (reduction.cu has the block-uniform exit that is safe.)
//
// The body reads, after the barrier, a value another thread stored before it, so the
// barrier is needed and the compiler keeps it. The exit is on threadIdx.x alone, which nvcc
// cannot prove uniform, so it survives in the PTX as a predicated branch to the kernel's
// `ret`, ahead of the bar.sync (see README.md in this folder).
//
// Expected loop verdict: refused (a barrier after a thread-divergent exit).
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <%.6e>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

#define MAX_BLOCK 1024 // limit must be at most blockDim.x, which must be at most this

// For the first `limit` threads of each block: d[i] = s[t] + 2 * s[limit - 1 - t], the
// element and its mirror within the block's first `limit` elements (0 past the end of d).
// The other threads' elements are left as they were.
extern "C" __global__ void divergent_exit_then_barrier(float *d, int n, int limit) {
    __shared__ float s[MAX_BLOCK];
    if (threadIdx.x >= limit)
        return;
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? d[i] : 0.0f;
    __syncthreads();
    if (i < n)
        d[i] = s[t] + 2.0f * s[limit - 1 - t];
}

int main() {
    const int block = 256, limit = 200; // 56 threads a block leave early, 7 warps stay
    const int n = block * 800 + 77;     // 801 blocks; the last has 77 elements
    const int grid = (n + block - 1) / block;

    float *h = (float *)malloc(sizeof(float) * n);
    float *out = (float *)malloc(sizeof(float) * n);
    if (!h || !out) {
        fprintf(stderr, "divergent_exit: out of host memory\n");
        return 2;
    }
    for (int i = 0; i < n; ++i)
        h[i] = (float)(1 + i % 251); // exact small integers, never 0

    float *d;
    CHECK("cudaMalloc", cudaMalloc(&d, sizeof(float) * n));
    CHECK("cudaMemcpy", cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice));
    divergent_exit_then_barrier<<<grid, block>>>(d, n, limit);
    CHECK("divergent_exit_then_barrier", cudaGetLastError());
    CHECK("divergent_exit_then_barrier", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(out, d, sizeof(float) * n, cudaMemcpyDeviceToHost));

    int bad = 0;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        int b = i / block, t = i % block;
        float want = h[i];
        if (t < limit) {
            int m = b * block + (limit - 1 - t);
            want = h[i] + 2.0f * (m < n ? h[m] : 0.0f);
        }
        if (out[i] != want && !bad) {
            fprintf(stderr, "divergent_exit_then_barrier: d[%d] = %g, want %g\n", i, out[i],
                    want);
            bad = 1;
        }
        sum += (double)out[i] * (double)(i % 5 + 1);
    }
    printf("result divergent_exit_then_barrier %s\n", bad ? "mismatch" : "ok");
    printf("checksum divergent_exit_then_barrier %.6e\n", sum);

    cudaFree(d);
    free(h);
    free(out);
    return bad;
}
