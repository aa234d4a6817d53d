// SPDX-License-Identifier: Apache-2.0
//
// templates: a function template kernel, instantiated for float and for int. Its PTX entry
// names are C++-mangled (the instantiations are told apart only by the mangling), so the
// analyser, clc's policies and the wrap's renaming must all handle names like
//   _Z7scale_tIfEvPT_S0_i   void scale_t<float>(float*, float, int)
//   _Z7scale_tIiEvPT_S0_i   void scale_t<int>(int*, int, int)
// The int instantiation does integer arithmetic (mul.lo.s32), the float one mul.f32.
//
// Expected loop verdict: both loopable.
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <%.6e or integer>, with <kernel> the
// demangled template name (scale_t<float>, scale_t<int>); exit 0 ok, 1 mismatch, 2 a CUDA
// call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

template <typename T>
__global__ void scale_t(T *v, T factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = v[i] * factor;
}

// Explicit instantiations: the two entries exist in the PTX whatever main() launches.
template __global__ void scale_t<float>(float *, float, int);
template __global__ void scale_t<int>(int *, int, int);

template <typename T>
static int run(const char *name, T factor, T (*init)(int), const char *fmt) {
    const int n = (1 << 20) + 3;
    const int block = 256;
    const int grid = (n + block - 1) / block; // 4097 blocks
    T *h = (T *)malloc(sizeof(T) * n);
    T *out = (T *)malloc(sizeof(T) * n);
    if (!h || !out) {
        fprintf(stderr, "templates: out of host memory\n");
        exit(2);
    }
    for (int i = 0; i < n; ++i)
        h[i] = init(i);
    T *d;
    CHECK("cudaMalloc", cudaMalloc(&d, sizeof(T) * n));
    CHECK("cudaMemcpy", cudaMemcpy(d, h, sizeof(T) * n, cudaMemcpyHostToDevice));
    scale_t<T><<<grid, block>>>(d, factor, n);
    CHECK(name, cudaGetLastError());
    CHECK(name, cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(out, d, sizeof(T) * n, cudaMemcpyDeviceToHost));
    int bad = 0;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        T want = h[i] * factor;
        if (out[i] != want && !bad) {
            fprintf(stderr, "%s: v[%d] = %g, want %g\n", name, i, (double)out[i], (double)want);
            bad = 1;
        }
        sum += (double)out[i];
    }
    printf("result %s %s\n", name, bad ? "mismatch" : "ok");
    printf(fmt, name, sum);
    cudaFree(d);
    free(h);
    free(out);
    return bad;
}

// Non-zero, exact: 0.5 * small integers is exact in float; 3 * (<= 1000) fits an int.
static float init_float(int i) { return (float)(1 + i % 211); }
static int init_int(int i) { return 1 + i % 1000; }

int main() {
    int bad = run<float>("scale_t<float>", 0.5f, init_float, "checksum %s %.6e\n");
    // The int sum (~1.6e9) is exact in a double; printed as an integer.
    bad |= run<int>("scale_t<int>", 3, init_int, "checksum %s %.0f\n");
    return bad;
}
