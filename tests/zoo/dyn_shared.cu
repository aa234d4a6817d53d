// SPDX-License-Identifier: Apache-2.0
//
// dyn_shared: dynamic shared memory (`extern __shared__`, its size given at launch). A wrap
// that loops one physical block over several virtual blocks reuses the same shared memory
// for each: the last load of one virtual block and the first store of the next must not
// overlap, so the analyser has to see the barrier and shared-memory use here. Two launches:
//   1. a few KB of dynamic shared memory, 1024 blocks
//   2. 96 KB, above the 48 KB that needs an opt-in: cudaFuncSetAttribute(
//      cudaFuncAttributeMaxDynamicSharedMemorySize) first, as real programs must
//
// reverse_dynamic_smem reverses, in place, each block's chunk of ceil(n / gridDim.x) ints:
// the block copies its chunk into shared memory, __syncthreads, writes it back reversed.
// The chunk comes from gridDim.x (the signature has no room for it), so the launch must give
// at least chunk * sizeof(int) bytes of dynamic shared memory. Threads past the chunk's end
// skip the loops but still reach the barrier: there is no return before it.
//
// Expected loop verdict: loopable.
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <integer>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

extern "C" __global__ void reverse_dynamic_smem(int *d, int n) {
    extern __shared__ int s[];
    int chunk = (n + gridDim.x - 1) / gridDim.x;
    int base = blockIdx.x * chunk;
    int len = n - base < chunk ? n - base : chunk; // the last chunk may be short (or empty)
    for (int t = threadIdx.x; t < len; t += blockDim.x)
        s[t] = d[base + t];
    __syncthreads();
    for (int t = threadIdx.x; t < len; t += blockDim.x)
        d[base + t] = s[len - 1 - t];
}

static void reverse_chunks(int *v, int n, int grid) {
    int chunk = (n + grid - 1) / grid;
    for (int base = 0; base < n; base += chunk) {
        int len = n - base < chunk ? n - base : chunk;
        for (int a = 0, b = len - 1; a < b; ++a, --b) {
            int tmp = v[base + a];
            v[base + a] = v[base + b];
            v[base + b] = tmp;
        }
    }
}

// One launch of n ints in `grid` blocks of `block` threads; adds to *checksum; returns 1 on
// a mismatch.
static int run_case(const char *label, int n, int grid, int block, long long *checksum) {
    int chunk = (n + grid - 1) / grid;
    size_t smem = (size_t)chunk * sizeof(int);
    int *h = (int *)malloc(sizeof(int) * n);
    int *out = (int *)malloc(sizeof(int) * n);
    if (!h || !out) {
        fprintf(stderr, "dyn_shared: out of host memory\n");
        exit(2);
    }
    for (int i = 0; i < n; ++i)
        h[i] = 1 + (int)(((unsigned)i * 2654435761u) % 1000003u); // distinct-ish, never 0

    int *d;
    CHECK("cudaMalloc", cudaMalloc(&d, sizeof(int) * n));
    CHECK("cudaMemcpy", cudaMemcpy(d, h, sizeof(int) * n, cudaMemcpyHostToDevice));
    reverse_dynamic_smem<<<grid, block, smem>>>(d, n);
    CHECK("reverse_dynamic_smem", cudaGetLastError());
    CHECK("reverse_dynamic_smem", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(out, d, sizeof(int) * n, cudaMemcpyDeviceToHost));

    reverse_chunks(h, n, grid);
    int bad = 0;
    long long sum = 0;
    for (int i = 0; i < n; ++i) {
        if (out[i] != h[i] && !bad) {
            fprintf(stderr, "reverse_dynamic_smem (%s): d[%d] = %d, want %d\n", label, i, out[i],
                    h[i]);
            bad = 1;
        }
        sum += (long long)out[i] * (i % 7 + 1); // position-weighted: order matters
    }
    fprintf(stderr, "reverse_dynamic_smem (%s): n=%d grid=%d block=%d dynamic_smem=%zu\n", label,
            n, grid, block, smem);
    *checksum += sum;
    cudaFree(d);
    free(h);
    free(out);
    return bad;
}

int main() {
    int bad = 0;
    long long checksum = 0;
    // 1. chunk 1025 ints (4100 bytes); the last block's chunk is short.
    bad |= run_case("small", (1 << 20) + 123, 1024, 256, &checksum);

    // 2. chunk 24576 ints = 96 KB; the last chunk is 200 ints short. Without the attribute the
    // launch fails with cudaErrorInvalidValue.
    const int big_chunk = 24576, big_grid = 320;
    const int big_smem = big_chunk * (int)sizeof(int);
    int dev = 0, optin = 0;
    CHECK("cudaGetDevice", cudaGetDevice(&dev));
    CHECK("cudaDeviceGetAttribute",
          cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (optin < big_smem) {
        fprintf(stderr, "dyn_shared: the device allows %d bytes of shared memory per block, "
                        "%d are needed\n", optin, big_smem);
        printf("cuda_error cudaDevAttrMaxSharedMemoryPerBlockOptin too_small\n");
        return 2;
    }
    CHECK("cudaFuncSetAttribute",
          cudaFuncSetAttribute(reverse_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               big_smem));
    bad |= run_case("96KB", big_chunk * big_grid - 200, big_grid, 1024, &checksum);

    printf("result reverse_dynamic_smem %s\n", bad ? "mismatch" : "ok");
    printf("checksum reverse_dynamic_smem %lld\n", checksum);
    return bad;
}
