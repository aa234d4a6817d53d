// SPDX-License-Identifier: Apache-2.0
//
// bench_empty: the cost of a kernel launch, as a program sees it through cudart.
//
//   bench_empty [bursts [burst_size]]
//
// An empty kernel does no GPU work, so the time per launch is the host-side launch path, the
// part clc's shim adds to. Each burst issues burst_size launches and then waits for the GPU;
// the wait is included so that work queued but not yet submitted is paid for inside the burst
// that queued it. The median over bursts resists the odd slow burst (page faults, a preempted
// thread).
//
// Output:
//   info bench_empty bursts=<b> burst_size=<s>
//   us_per_launch <median over bursts>
//   us_per_launch_min <fastest burst>
//   us_per_launch_max <slowest burst>
// Exit status 0, 1 if any launch failed, 2 on bad usage.

#include <cuda_runtime.h>


#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"

__global__ void empty_kernel() {}

static int check(const char *what) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess)
        err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        fprintf(stderr, "bench_empty: %s: %s (%s)\n", what, cudaGetErrorName(err),
                cudaGetErrorString(err));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int bursts = argc > 1 ? atoi(argv[1]) : 100;
    int burst_size = argc > 2 ? atoi(argv[2]) : 1000;
    if (bursts < 1 || burst_size < 1) {
        fprintf(stderr, "usage: bench_empty [bursts>=1 [burst_size>=1]]\n");
        return 2;
    }
    printf("info bench_empty bursts=%d burst_size=%d\n", bursts, burst_size);

    // Warm-up: context creation, module load, the shim's first-sight work for the kernel and
    // the launch path's caches all happen here, outside the measured bursts.
    for (int i = 0; i < 2000; ++i)
        empty_kernel<<<1, 1>>>();
    if (check("warm-up"))
        return 1;

    double *per = (double *)malloc(sizeof(double) * bursts);
    if (!per)
        return 1;
    for (int b = 0; b < bursts; ++b) {
        double t0 = bench_now_us();
        for (int i = 0; i < burst_size; ++i)
            empty_kernel<<<1, 1>>>();
        cudaDeviceSynchronize();
        double t1 = bench_now_us();
        per[b] = (t1 - t0) / burst_size;
        // Checked outside the timed span: a failed launch makes the number meaningless.
        if (check("burst"))
            return 1;
    }
    qsort(per, bursts, sizeof(double), bench_cmp_double);
    double median = bursts % 2 ? per[bursts / 2] : 0.5 * (per[bursts / 2 - 1] + per[bursts / 2]);
    printf("us_per_launch %.4f\n", median);
    printf("us_per_launch_min %.4f\n", per[0]);
    printf("us_per_launch_max %.4f\n", per[bursts - 1]);
    free(per);
    return 0;
}
