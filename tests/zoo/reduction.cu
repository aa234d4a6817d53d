// SPDX-License-Identifier: Apache-2.0
//
// reduction: the classic shared-memory tree reduction, one partial sum per block, with
//   - a __syncthreads inside a loop (the loop's trip count depends only on blockDim, so all
//     threads reach every barrier), and
//   - a block-uniform early exit at the top, `if (blockIdx.x * blockDim.x >= n) return;`:
//     it depends only on blockIdx, blockDim and a parameter, so a whole block leaves
//     together and no barrier is left waiting. In a persistent loop that exit becomes
//     "go on to the next virtual block", which is safe precisely because it is uniform;
//     the analyser must tell this apart from divergent_exit.cu's threadIdx-dependent exit.
// The launch asks for 200 more blocks than the data needs, so the early exit is taken, and
// their partial slots, preset to a sentinel, must come back untouched.
//
// Expected loop verdict: loopable.
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <%.6e>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

#define MAX_BLOCK 1024 // blockDim.x must be a power of two, at most this

extern "C" __global__ void block_reduce_sum(const float *in, float *partial, int n) {
    if (blockIdx.x * blockDim.x >= n)
        return;
    __shared__ float s[MAX_BLOCK];
    unsigned t = threadIdx.x;
    unsigned i = blockIdx.x * blockDim.x + t;
    s[t] = i < (unsigned)n ? in[i] : 0.0f;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride)
            s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0)
        partial[blockIdx.x] = s[0];
}

int main() {
    const int n = (1 << 22) + 100; // the last useful block is partly filled
    const int block = 256;
    const int needed = (n + block - 1) / block; // 16385
    const int grid = needed + 200;              // 200 blocks take the early exit
    const float sentinel = -7.0f;               // no partial sum is negative

    float *h = (float *)malloc(sizeof(float) * n);
    float *hp = (float *)malloc(sizeof(float) * grid);
    if (!h || !hp) {
        fprintf(stderr, "reduction: out of host memory\n");
        return 2;
    }
    // Quarters of small integers: any order of adding 256 of them is exact in float, so the
    // tree's result equals the CPU's sequential sum exactly.
    for (int i = 0; i < n; ++i)
        h[i] = 0.25f * (float)(1 + i % 13);
    for (int b = 0; b < grid; ++b)
        hp[b] = sentinel;

    float *din, *dp;
    CHECK("cudaMalloc", cudaMalloc(&din, sizeof(float) * n));
    CHECK("cudaMalloc", cudaMalloc(&dp, sizeof(float) * grid));
    CHECK("cudaMemcpy", cudaMemcpy(din, h, sizeof(float) * n, cudaMemcpyHostToDevice));
    CHECK("cudaMemcpy", cudaMemcpy(dp, hp, sizeof(float) * grid, cudaMemcpyHostToDevice));
    block_reduce_sum<<<grid, block>>>(din, dp, n);
    CHECK("block_reduce_sum", cudaGetLastError());
    CHECK("block_reduce_sum", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(hp, dp, sizeof(float) * grid, cudaMemcpyDeviceToHost));

    int bad = 0;
    double sum = 0.0;
    for (int b = 0; b < grid; ++b) {
        float want = sentinel;
        if (b < needed) {
            want = 0.0f;
            for (int i = b * block; i < n && i < (b + 1) * block; ++i)
                want += h[i];
        }
        if (hp[b] != want && !bad) {
            fprintf(stderr, "block_reduce_sum: partial[%d] = %g, want %g\n", b, hp[b], want);
            bad = 1;
        }
        if (b < needed)
            sum += hp[b];
    }
    printf("result block_reduce_sum %s\n", bad ? "mismatch" : "ok");
    printf("checksum block_reduce_sum %.6e\n", sum);

    cudaFree(din);
    cudaFree(dp);
    free(h);
    free(hp);
    return bad;
}
