// SPDX-License-Identifier: Apache-2.0
//
// printf_kernel: device-side printf. In PTX it is a call to the external function vprintf
// (`.extern .func (.param .b32 func_retval0) vprintf(...)`) with the arguments packed into a
// local-memory buffer (a `.local` frame, %SP/%SPL). A wrap that puts the body in a loop must
// keep that call, its .extern declaration and the local frame working, and the output must
// stay the same: it depends on blockIdx.x, which the wrap must virtualize.
//
// Only thread 0 of blocks 0 and 1 prints (two lines a launch, in either order: blocks run
// in any order). So that the host can still check that every block of the grid ran, thread
// 0 of each block records `tag + blockIdx.x` in a __device__ array, and the two printing
// threads record printf's return value (the number of arguments it formatted, 2).
//
// Expected loop verdict: loopable.
//
// Output: two device lines `hello_printf tag=<tag> block=<0|1>`, then result <kernel>
// ok|mismatch, checksum <kernel> <integer>; exit 0 ok, 1 mismatch, 2 a CUDA call failed
// (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

#define MAX_GRID 4096
__device__ int g_seen[MAX_GRID];
__device__ int g_printed[2];

extern "C" __global__ void hello_printf(int tag) {
    if (threadIdx.x != 0)
        return;
    if (blockIdx.x < 2)
        g_printed[blockIdx.x] = printf("hello_printf tag=%d block=%d\n", tag, (int)blockIdx.x);
    if (blockIdx.x < MAX_GRID)
        g_seen[blockIdx.x] = tag + (int)blockIdx.x;
}

int main() {
    const int grid = 512, block = 64, tag = 42;
    static int seen[MAX_GRID];
    int printed[2] = {-5, -5};
    // Preset to values the kernel never writes: a block that did not run is caught.
    for (int b = 0; b < MAX_GRID; ++b)
        seen[b] = -1;
    CHECK("cudaMemcpyToSymbol", cudaMemcpyToSymbol(g_seen, seen, sizeof(seen)));
    CHECK("cudaMemcpyToSymbol", cudaMemcpyToSymbol(g_printed, printed, sizeof(printed)));

    // The device's lines are flushed to stdout at the synchronization; flushing ours first
    // keeps the two streams in order.
    fflush(stdout);
    hello_printf<<<grid, block>>>(tag);
    CHECK("hello_printf", cudaGetLastError());
    CHECK("hello_printf", cudaDeviceSynchronize());
    fflush(stdout);
    CHECK("cudaMemcpyFromSymbol", cudaMemcpyFromSymbol(seen, g_seen, sizeof(seen)));
    CHECK("cudaMemcpyFromSymbol", cudaMemcpyFromSymbol(printed, g_printed, sizeof(printed)));

    int bad = 0;
    long long sum = 0;
    for (int b = 0; b < MAX_GRID; ++b) {
        int want = b < grid ? tag + b : -1;
        if (seen[b] != want && !bad) {
            fprintf(stderr, "hello_printf: block %d recorded %d, want %d\n", b, seen[b], want);
            bad = 1;
        }
        if (b < grid)
            sum += seen[b];
    }
    for (int b = 0; b < 2; ++b)
        if (printed[b] != 2 && !bad) {
            fprintf(stderr, "hello_printf: printf in block %d returned %d, want 2\n", b,
                    printed[b]);
            bad = 1;
        }
    printf("result hello_printf %s\n", bad ? "mismatch" : "ok");
    printf("checksum hello_printf %lld\n", sum);
    return bad;
}
