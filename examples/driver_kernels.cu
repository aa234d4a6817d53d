// SPDX-License-Identifier: Apache-2.0
//
// Kernels for examples/driver_api.c, built to PTX at build time:
//   nvcc -ptx -arch=sm_90 examples/driver_kernels.cu -o driver_kernels.ptx
// extern "C" keeps the names unmangled, so cuModuleGetFunction and clc policies can use the
// plain names `saxpy` and `fill`.

// Out of place (out = a*x + y, inputs untouched), so repeated launches give the same result
// and the check does not depend on how many of them ran.
extern "C" __global__ void saxpy(float a, const float *x, const float *y, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = a * x[i] + y[i];
}

extern "C" __global__ void fill(int *d, int value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        d[i] = value + (i % 13);
}
