// SPDX-License-Identifier: Apache-2.0
//
// struct_param: a kernel whose only parameter is a struct passed by value. In PTX this is one
// byte-array parameter (`.param .align 8 .b8 axpy_struct_param_0[32]`) read piecewise with
// ld.param at offsets 0, 4, 8, 16, 24. A wrap that adds its own parameters (a counter for the
// virtual block indices, say) must append them after this one without disturbing its
// alignment or offsets, and clc's argument reading must see 32 bytes, not five values.
// The members are mixed on purpose: a float and an int (together 8 bytes, so no padding), a
// double (it makes the whole parameter 8-byte aligned) and two pointers.
//
// Expected loop verdict: loopable.
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <%.6e>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

struct Params {
    float a;
    int n;
    double b;
    const float *x;
    float *y;
};
static_assert(sizeof(Params) == 32, "Params: a@0 n@4 b@8 x@16 y@24, 32 bytes");

// y = a*x + b*y, computed in double so that b is used as a double.
extern "C" __global__ void axpy_struct(Params p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n)
        p.y[i] = (float)((double)p.a * (double)p.x[i] + p.b * (double)p.y[i]);
}

int main() {
    const int n = (1 << 20) + 77;
    const int block = 256;
    const int grid = (n + block - 1) / block; // 4097 blocks, one element per thread

    float *hx = (float *)malloc(sizeof(float) * n);
    float *hy = (float *)malloc(sizeof(float) * n);
    float *out = (float *)malloc(sizeof(float) * n);
    if (!hx || !hy || !out) {
        fprintf(stderr, "struct_param: out of host memory\n");
        return 2;
    }
    // Small integers; a = 1.5, b = 0.25: every result is exact in float, so equality holds.
    for (int i = 0; i < n; ++i) {
        hx[i] = (float)(1 + i % 101);
        hy[i] = (float)(1 + i % 67);
    }

    float *dx, *dy;
    CHECK("cudaMalloc", cudaMalloc(&dx, sizeof(float) * n));
    CHECK("cudaMalloc", cudaMalloc(&dy, sizeof(float) * n));
    CHECK("cudaMemcpy", cudaMemcpy(dx, hx, sizeof(float) * n, cudaMemcpyHostToDevice));
    CHECK("cudaMemcpy", cudaMemcpy(dy, hy, sizeof(float) * n, cudaMemcpyHostToDevice));

    Params p;
    p.a = 1.5f;
    p.n = n;
    p.b = 0.25;
    p.x = dx;
    p.y = dy;
    axpy_struct<<<grid, block>>>(p);
    CHECK("axpy_struct", cudaGetLastError());
    CHECK("axpy_struct", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(out, dy, sizeof(float) * n, cudaMemcpyDeviceToHost));

    int bad = 0;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        float want = (float)((double)p.a * (double)hx[i] + p.b * (double)hy[i]);
        if (out[i] != want && !bad) {
            fprintf(stderr, "axpy_struct: y[%d] = %g, want %g\n", i, out[i], want);
            bad = 1;
        }
        sum += out[i];
    }
    printf("result axpy_struct %s\n", bad ? "mismatch" : "ok");
    printf("checksum axpy_struct %.6e\n", sum);

    cudaFree(dx);
    cudaFree(dy);
    free(hx);
    free(hy);
    free(out);
    return bad;
}
