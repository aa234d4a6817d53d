// SPDX-License-Identifier: Apache-2.0
// coop_multi: cooperative kernels launched on every device at once by
// cuLaunchCooperativeKernelMultiDevice (deprecated by CUDA, still in the driver), found the way a
// cudart program finds a driver function (cudaGetDriverEntryPointByVersion, which asks the
// driver's cuGetProcAddress).
//
//   coop_multi KERNEL...        KERNEL: ok_kernel or debug_kernel
//
// Each KERNEL is launched in one call on every device: 8 blocks of 64 threads on a stream of
// the device's own. Each block adds the kernel's code (ok_kernel 1, debug_kernel 2) to a sum,
// the grid syncs, and block 0 copies the sum out. Prints, per call:
//
//   multi KERNEL devices=<n> rc=<CUresult> sums=<sum on device 0>,<sum on device 1>,...
//
// (8 or 16 per device when the kernel ran, 0 when it did not), or, where the driver does not
// have the function or refuses it for these devices:
//
//   multi unsupported: <why>
//
// Build: nvcc -O2 -arch=sm_90 -o coop_multi examples/coop_multi.cu
// Exit status: 0 when every call that returned success left the right sums (or unsupported),
// 1 otherwise.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

namespace cg = cooperative_groups;

#define BLOCKS 8
#define MAX_DEVICES 16

typedef CUresult (*multi_fn)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);

__device__ void add_and_copy(int code, int *sum, int *out) {
    if (threadIdx.x == 0) atomicAdd(sum, code);
    cg::this_grid().sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) *out = *sum;
}

extern "C" __global__ void ok_kernel(int *sum, int *out) { add_and_copy(1, sum, out); }
extern "C" __global__ void debug_kernel(int *sum, int *out) { add_and_copy(2, sum, out); }

int main(int argc, char **argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "coop_multi: no device\n");
        return 1;
    }
    if (n > MAX_DEVICES) n = MAX_DEVICES;
    multi_fn multi = nullptr;
    cudaDriverEntryPointQueryResult found;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuLaunchCooperativeKernelMultiDevice",
                                                     (void **)&multi, 9000, cudaEnableDefault,
                                                     &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !multi) {
        printf("multi unsupported: cuLaunchCooperativeKernelMultiDevice not found (%s, %d)\n",
               cudaGetErrorName(e), (int)found);
        return 0;
    }
    int *sum[MAX_DEVICES], *out[MAX_DEVICES];
    cudaStream_t stream[MAX_DEVICES];
    for (int d = 0; d < n; d++) {
        int coop = 0;
        cudaSetDevice(d);
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, d);
        if (!coop) {
            printf("multi unsupported: device %d has no cooperative launch\n", d);
            return 0;
        }
        if (cudaMalloc(&sum[d], sizeof(int)) != cudaSuccess ||
            cudaMalloc(&out[d], sizeof(int)) != cudaSuccess ||
            cudaStreamCreate(&stream[d]) != cudaSuccess) {
            fprintf(stderr, "coop_multi: device %d: setup failed\n", d);
            return 1;
        }
    }
    int failed = 0;
    for (int a = 1; a < argc; a++) {
        const void *kernel = strcmp(argv[a], "debug_kernel") == 0 ? (const void *)debug_kernel
                             : strcmp(argv[a], "ok_kernel") == 0  ? (const void *)ok_kernel
                                                                  : nullptr;
        if (!kernel) {
            fprintf(stderr, "coop_multi: unknown kernel %s\n", argv[a]);
            return 1;
        }
        int code = kernel == (const void *)ok_kernel ? 1 : 2;
        CUDA_LAUNCH_PARAMS p[MAX_DEVICES];
        void *args[MAX_DEVICES][2];
        for (int d = 0; d < n; d++) {
            cudaSetDevice(d);
            cudaMemset(sum[d], 0, sizeof(int));
            cudaMemset(out[d], 0, sizeof(int));
            cudaDeviceSynchronize();
            cudaFunction_t f;
            if (cudaGetFuncBySymbol(&f, kernel) != cudaSuccess) {
                fprintf(stderr, "coop_multi: cudaGetFuncBySymbol failed on device %d\n", d);
                return 1;
            }
            args[d][0] = &sum[d];
            args[d][1] = &out[d];
            memset(&p[d], 0, sizeof p[d]);
            p[d].function = (CUfunction)f;
            p[d].gridDimX = BLOCKS;
            p[d].gridDimY = p[d].gridDimZ = 1;
            p[d].blockDimX = 64;
            p[d].blockDimY = p[d].blockDimZ = 1;
            p[d].hStream = (CUstream)stream[d];
            p[d].kernelParams = args[d];
        }
        CUresult rc = multi(p, (unsigned)n, 0);
        if (rc == CUDA_ERROR_NOT_SUPPORTED && a == 1) {
            printf("multi unsupported: the driver returned CUDA_ERROR_NOT_SUPPORTED\n");
            return 0;
        }
        printf("multi %s devices=%d rc=%d sums=", argv[a], n, (int)rc);
        for (int d = 0; d < n; d++) {
            int got = -1;
            cudaSetDevice(d);
            cudaStreamSynchronize(stream[d]);
            cudaMemcpy(&got, out[d], sizeof got, cudaMemcpyDeviceToHost);
            printf("%s%d", d ? "," : "", got);
            if (rc == CUDA_SUCCESS && got != code * BLOCKS) failed = 1;
        }
        printf("\n");
    }
    return failed;
}
