// SPDX-License-Identifier: Apache-2.0
// short_lived: programs that end within a millisecond of their first launch, for clc's tests
// that no policy makes a program crash at exit. Built for sm_90 SASS only (no PTX), so that a
// wrap rule finds nothing to wrap.
//
//   short_lived sync|nosync|thread|_exit|dp
//
// sync: one launch, a copy back, return from main; nosync: one launch, return at once; thread:
// a thread launches, synchronizes and calls exit() while main waits to join it; _exit: one
// launch then _exit(0); dp: a kernel that launches a child kernel (dynamic parallelism; built
// with -rdc=true). Prints `ok` (and `sum N` where there is one).
//
// Build: nvcc -O2 -gencode arch=compute_90,code=sm_90 -rdc=true -o short_lived \
//            examples/short_lived.cu -lcudadevrt
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unistd.h>

__global__ void fill(int *p, int v) { p[blockIdx.x * blockDim.x + threadIdx.x] = v; }
__global__ void child(int *p) { p[threadIdx.x] += 1; }
__global__ void parent(int *p) {
    if (threadIdx.x == 0) child<<<1, 32>>>(p);
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "sync";
    int *d;
    cudaMalloc(&d, 1024 * sizeof(int));
    cudaMemset(d, 0, 1024 * sizeof(int));
    if (strcmp(how, "thread") == 0) {
        std::thread t([&] {
            fill<<<4, 256>>>(d, 7);
            cudaDeviceSynchronize();
            printf("ok\n");
            fflush(stdout);
            exit(0);
        });
        t.join();
    }
    if (strcmp(how, "dp") == 0)
        parent<<<1, 32>>>(d);
    else
        fill<<<4, 256>>>(d, 7);
    if (strcmp(how, "nosync") == 0) {
        printf("ok\n");
        return 0;
    }
    if (strcmp(how, "_exit") == 0) {
        printf("ok\n");
        fflush(stdout);
        _exit(0);
    }
    int h[1024];
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    long sum = 0;
    for (int i = 0; i < 1024; i++) sum += h[i];
    printf("ok\nsum %ld\n", sum);
    return 0;
}
