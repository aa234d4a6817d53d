// SPDX-License-Identifier: Apache-2.0
// short_nvrtc: a short driver-API program whose only kernel is compiled by NVRTC to a cubin
// (no PTX) at run time, in a context it makes (cuCtxCreate), launched once; it ends right after.
//
//   short_nvrtc
//
// Prints `sum N` (N = 32 + 0 + 1 + ... + 31 = 528).
//
// Build: g++ -O2 -o short_nvrtc examples/short_nvrtc.cpp -I$CUDA_HOME/include \
//            -L$CUDA_HOME/lib64 -lnvrtc -lcuda
// Exit status: 0, 2 when NVRTC fails, 3 when a driver call fails.
#include <cstdio>
#include <vector>

#include <cuda.h>
#include <nvrtc.h>

static const char *kSource =
    "extern \"C\" __global__ void add_index(int *p) { p[threadIdx.x] += threadIdx.x; }";

int main() {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate(&ctx, nullptr, 0, dev)) return 3;
    int major = 0, minor = 0;
    cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    char arch[32];
    snprintf(arch, sizeof arch, "-arch=sm_%d%d", major, minor);
    nvrtcProgram prog;
    nvrtcCreateProgram(&prog, kSource, "add_index.cu", 0, nullptr, nullptr);
    const char *opts[] = {arch};
    if (nvrtcCompileProgram(prog, 1, opts) != NVRTC_SUCCESS) {
        printf("nvrtc compile failed\n");
        return 2;
    }
    size_t n = 0;
    nvrtcGetCUBINSize(prog, &n);
    std::vector<char> cubin(n);
    nvrtcGetCUBIN(prog, cubin.data());
    nvrtcDestroyProgram(&prog);
    CUmodule mod;
    CUfunction f;
    CUdeviceptr d;
    if (cuModuleLoadData(&mod, cubin.data()) || cuModuleGetFunction(&f, mod, "add_index") ||
        cuMemAlloc(&d, 32 * sizeof(int)) || cuMemsetD32(d, 1, 32))
        return 3;
    void *args[] = {&d};
    CUresult r = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr);
    if (r != CUDA_SUCCESS) {
        printf("launch failed: %d\n", (int)r);
        return 3;
    }
    int h[32];
    cuMemcpyDtoH(h, d, sizeof h);
    long sum = 0;
    for (int i = 0; i < 32; i++) sum += h[i];
    printf("sum %ld\n", sum);
    return 0;
}
