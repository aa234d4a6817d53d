// SPDX-License-Identifier: Apache-2.0
//
// The two kernels of examples/reload.c, one per module, built to PTX at build time:
//   nvcc -ptx -arch=sm_90 examples/reload_kernels.cu -o reload_ok.ptx
//   nvcc -ptx -arch=sm_90 -DRELOAD_DEBUG examples/reload_kernels.cu -o reload_debug.ptx
// extern "C" keeps the names unmangled, so cuModuleGetFunction, cuLibraryGetKernel and clc
// policies can use the plain names. Each kernel writes its own value, so the buffer says which
// kernel ran.

#ifdef RELOAD_DEBUG
extern "C" __global__ void debug_kernel(int *out) {
    out[threadIdx.x + blockIdx.x * blockDim.x] = 2;
}
#else
extern "C" __global__ void ok_kernel(int *out) {
    out[threadIdx.x + blockIdx.x * blockDim.x] = 1;
}
#endif
