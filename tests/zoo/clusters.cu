// SPDX-License-Identifier: Apache-2.0
//
// clusters: a thread-block cluster of 2 (Hopper, sm_90), declared at compile time with
// __cluster_dims__(2, 1, 1), so a plain <<<grid, block>>> launch forms the clusters. The two
// blocks of a cluster exchange data through distributed shared memory
// (cluster.map_shared_rank) between two cluster.sync() barriers. A wrap cannot loop this:
// the pairing of blocks into clusters is done by the hardware when it launches the grid, and
// a persistent block that moved on to another virtual block would leave its partner waiting
// at cluster.sync() or reading shared memory that now belongs to a different virtual block.
//
// Block b (rank r = b % 2 in its cluster) computes, for each of its elements,
//   d[i] = own[t] + (r + 1) * partner[t]
// where own and partner are the block's and the other block's elements at the same thread
// index (0 past the end of d). The first cluster.sync() makes the partner's shared stores
// visible; the second keeps each block's shared memory alive until its partner has read it.
//
// Expected loop verdict: refused (clusters). README.md in this folder quotes the PTX.
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <%.6e>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>) or the device has no clusters.

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

namespace cg = cooperative_groups;

#define BLOCK 256 // blockDim.x must be this

extern "C" __global__ void __cluster_dims__(2, 1, 1) cluster_kernel(float *d, int n) {
    __shared__ float s[BLOCK];
    cg::cluster_group cluster = cg::this_cluster();
    unsigned rank = cluster.block_rank();
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? d[i] : 0.0f;
    cluster.sync();
    float *peer = cluster.map_shared_rank(s, rank ^ 1);
    float other = peer[t];
    cluster.sync();
    if (i < n)
        d[i] = s[t] + (float)(rank + 1) * other;
}

int main() {
    const int n = BLOCK * 1000 + 50;
    // A cluster launch needs the grid to be a multiple of the cluster size: 1001 blocks of
    // data, rounded up to 1002 (the last block has no elements but still pairs up).
    int grid = (n + BLOCK - 1) / BLOCK;
    grid = (grid + 1) / 2 * 2;

    int dev = 0, cluster_ok = 0;
    CHECK("cudaGetDevice", cudaGetDevice(&dev));
    CHECK("cudaDeviceGetAttribute",
          cudaDeviceGetAttribute(&cluster_ok, cudaDevAttrClusterLaunch, dev));
    if (!cluster_ok) {
        printf("cuda_error cudaDevAttrClusterLaunch not_supported\n");
        return 2;
    }

    float *h = (float *)malloc(sizeof(float) * n);
    float *out = (float *)malloc(sizeof(float) * n);
    if (!h || !out) {
        fprintf(stderr, "clusters: out of host memory\n");
        return 2;
    }
    for (int i = 0; i < n; ++i)
        h[i] = (float)(1 + i % 331); // exact small integers, never 0

    float *d;
    CHECK("cudaMalloc", cudaMalloc(&d, sizeof(float) * n));
    CHECK("cudaMemcpy", cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice));
    cluster_kernel<<<grid, BLOCK>>>(d, n);
    CHECK("cluster_kernel", cudaGetLastError());
    CHECK("cluster_kernel", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(out, d, sizeof(float) * n, cudaMemcpyDeviceToHost));

    int bad = 0;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        int b = i / BLOCK, t = i % BLOCK;
        int rank = b % 2; // cluster dims (2,1,1) on a 1D grid: rank = blockIdx.x % 2
        int j = (b ^ 1) * BLOCK + t;
        float want = h[i] + (float)(rank + 1) * (j < n ? h[j] : 0.0f);
        if (out[i] != want && !bad) {
            fprintf(stderr, "cluster_kernel: d[%d] = %g, want %g\n", i, out[i], want);
            bad = 1;
        }
        sum += out[i];
    }
    printf("result cluster_kernel %s\n", bad ? "mismatch" : "ok");
    printf("checksum cluster_kernel %.6e\n", sum);

    cudaFree(d);
    free(h);
    free(out);
    return bad;
}
