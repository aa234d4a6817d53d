// SPDX-License-Identifier: Apache-2.0
//
// atomics: a histogram with atomicAdd on global memory, the simplest kernel whose blocks
// interact: every block adds into the same bins, in no particular order. Integer addition
// commutes, so the result is the same whatever order blocks (or a persistent loop's virtual
// blocks) run in; that is what makes it loopable, and the zoo has it so that the analyser
// does not mistake a global atomic for a grid-wide synchronization (cooperative.cu's grid
// barrier is built from atomics too). Although the return value is unused, nvcc 13.0 emits
// `atom.global.add.u32 %r9, [%rd8], 1;` in the PTX (ptxas may turn it into a RED).
//
// Expected loop verdict: loopable.
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <integer>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

// in[] holds non-negative values; each adds 1 to bins[in[i] % nbins].
extern "C" __global__ void histogram_atomic(const int *in, int *bins, int n, int nbins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        atomicAdd(&bins[in[i] % nbins], 1);
}

int main() {
    const int n = (1 << 22) + 11;
    const int nbins = 1000;
    const int block = 256;
    const int grid = (n + block - 1) / block; // 16385 blocks

    int *hin = (int *)malloc(sizeof(int) * n);
    int *hbins = (int *)malloc(sizeof(int) * nbins);
    int *want = (int *)malloc(sizeof(int) * nbins);
    if (!hin || !hbins || !want) {
        fprintf(stderr, "atomics: out of host memory\n");
        return 2;
    }
    // A multiplicative hash spreads the values over the bins unevenly enough that some bins
    // see heavy contention; never 0.
    for (int i = 0; i < n; ++i)
        hin[i] = 1 + (int)(((unsigned)i * 2654435761u) % 100003u);
    // The bins start non-zero too (b + 1), so the check also catches a kernel that
    // overwrote a bin instead of adding to it.
    for (int b = 0; b < nbins; ++b)
        hbins[b] = want[b] = b + 1;
    for (int i = 0; i < n; ++i)
        want[hin[i] % nbins]++;

    int *din, *dbins;
    CHECK("cudaMalloc", cudaMalloc(&din, sizeof(int) * n));
    CHECK("cudaMalloc", cudaMalloc(&dbins, sizeof(int) * nbins));
    CHECK("cudaMemcpy", cudaMemcpy(din, hin, sizeof(int) * n, cudaMemcpyHostToDevice));
    CHECK("cudaMemcpy", cudaMemcpy(dbins, hbins, sizeof(int) * nbins, cudaMemcpyHostToDevice));
    histogram_atomic<<<grid, block>>>(din, dbins, n, nbins);
    CHECK("histogram_atomic", cudaGetLastError());
    CHECK("histogram_atomic", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(hbins, dbins, sizeof(int) * nbins, cudaMemcpyDeviceToHost));

    int bad = 0;
    long long sum = 0;
    for (int b = 0; b < nbins; ++b) {
        if (hbins[b] != want[b] && !bad) {
            fprintf(stderr, "histogram_atomic: bins[%d] = %d, want %d\n", b, hbins[b], want[b]);
            bad = 1;
        }
        sum += (long long)hbins[b] * (b % 7 + 1); // position-weighted
    }
    printf("result histogram_atomic %s\n", bad ? "mismatch" : "ok");
    printf("checksum histogram_atomic %lld\n", sum);

    cudaFree(din);
    cudaFree(dbins);
    free(hin);
    free(hbins);
    free(want);
    return bad;
}
