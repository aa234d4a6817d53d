// SPDX-License-Identifier: Apache-2.0
// spin_timed [SHORT_US LONG_US N]: kernels of known length, for checking GPU times. `spin_short`
// holds one block for SHORT_US microseconds of the GPU's own clock (%globaltimer), N times;
// `spin_long` holds LONG_US, N/10 times; one stream, one after another. Prints each kernel's
// length and launches, then "ok".
#include <cstdio>
#include <cstdlib>

__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void spin_short(unsigned long long ns, int *done) {
    unsigned long long end = now_ns() + ns;
    while (now_ns() < end) {
    }
    if (threadIdx.x == 0) atomicAdd(done, 1);
}

__global__ void spin_long(unsigned long long ns, int *done) {
    unsigned long long end = now_ns() + ns;
    while (now_ns() < end) {
    }
    if (threadIdx.x == 0) atomicAdd(done, 1);
}

int main(int argc, char **argv) {
    long short_us = argc > 1 ? atol(argv[1]) : 20, long_us = argc > 2 ? atol(argv[2]) : 1000;
    int n = argc > 3 ? atoi(argv[3]) : 200;
    int *done, got = 0;
    if (cudaMalloc(&done, sizeof *done) != cudaSuccess) return 1;
    cudaMemset(done, 0, sizeof *done);
    for (int i = 0; i < n; i++) {
        spin_short<<<1, 32>>>(short_us * 1000ull, done);
        if (i % 10 == 0) spin_long<<<1, 32>>>(long_us * 1000ull, done);
    }
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(&got, done, sizeof got, cudaMemcpyDeviceToHost);
    printf("spin_short %ld us x %d\nspin_long %ld us x %d\n", short_us, n, long_us, (n + 9) / 10);
    if (e != cudaSuccess || got != n + (n + 9) / 10) {
        printf("failed: %s, %d kernels ran\n", cudaGetErrorString(e), got);
        return 1;
    }
    printf("ok\n");
    return 0;
}
