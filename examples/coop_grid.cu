// SPDX-License-Identifier: Apache-2.0
// coop_grid: a cooperative kernel (grid-wide sync) launched with a grid of a given size, for
// clc's tests of kernels confined to part of the GPU (a cooperative grid must be resident at
// once, so one sized for the whole GPU cannot run on a partition).
//
//   coop_grid small|whole launch|ex
//
// small: 16 blocks; whole: as many blocks as the whole GPU holds at once (the occupancy API's
// blocks per SM times the SM count). launch: cudaLaunchCooperativeKernel; ex: cudaLaunchKernelEx
// with the cooperative attribute. Each block adds its number + 1 to a sum, the grid syncs, and
// block 0 copies the sum out. Prints:
//
//   coop MODE blocks=<n> rc=<cudaError_t> sum=<sum> expected=<n(n+1)/2>
//
// Build: nvcc -O2 -arch=sm_90 -o coop_grid examples/coop_grid.cu
// Exit status: 0 when the sum is right, 1 otherwise.
#include <cooperative_groups.h>
#include <cstdio>
#include <cstring>

namespace cg = cooperative_groups;

__global__ void grid_sum(unsigned long long *sum, unsigned long long *out) {
    if (threadIdx.x == 0) atomicAdd(sum, (unsigned long long)blockIdx.x + 1);
    cg::this_grid().sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) *out = *sum;
}

int main(int argc, char **argv) {
    const char *size = argc > 1 ? argv[1] : "small";
    const char *how = argc > 2 ? argv[2] : "launch";
    int per_sm = 0, sms = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_sum, 256, 0);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    unsigned blocks = strcmp(size, "whole") == 0 ? (unsigned)(per_sm * sms) : 16u;
    unsigned long long *sum, *out, got = 0;
    cudaMalloc(&sum, sizeof *sum);
    cudaMalloc(&out, sizeof *out);
    cudaMemset(sum, 0, sizeof *sum);
    cudaMemset(out, 0, sizeof *out);
    cudaError_t rc;
    if (strcmp(how, "ex") == 0) {
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeCooperative;
        attr.val.cooperative = 1;
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(256);
        config.attrs = &attr;
        config.numAttrs = 1;
        rc = cudaLaunchKernelEx(&config, grid_sum, sum, out);
    } else {
        void *args[] = {&sum, &out};
        rc = cudaLaunchCooperativeKernel((void *)grid_sum, dim3(blocks), dim3(256), args, 0, 0);
    }
    cudaError_t synced = cudaDeviceSynchronize();
    if (rc == cudaSuccess) rc = synced;
    cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost);
    unsigned long long expected = (unsigned long long)blocks * (blocks + 1) / 2;
    printf("coop %s blocks=%u rc=%d sum=%llu expected=%llu\n", size, blocks, (int)rc, got,
           expected);
    return got == expected ? 0 : 1;
}
