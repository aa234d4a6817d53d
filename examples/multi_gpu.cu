// SPDX-License-Identifier: Apache-2.0
// multi_gpu: one program on every GPU of the machine, for clc's tests of partitions per
// device, wrapped kernels' libraries shared by every device's context, and threads that move
// between devices.
//
//   multi_gpu each|threads [ROUNDS]
//
// each: for each device in turn, `stamp` (every block spins ~20 us, then writes its %smid)
// runs 2048 blocks and `scale` doubles a vector, then both are checked. threads: four threads,
// each going round the devices ROUNDS times (default 20), doing the same on each. Prints, per
// device and round checked:
//
//   device D distinct=N unwritten=U scale=ok|bad
//
// distinct: how many SMs ran stamp's blocks; unwritten: entries still 0xff after the program's
// copy on the same stream (a stream order that did not hold); scale: the doubled vector's
// check. Then `devices=N failures=F`.
//
// Build: nvcc -O2 -arch=sm_90 -o multi_gpu examples/multi_gpu.cu
// Exit status: 0 when every check held, 1 otherwise.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

static const int kBlocks = 2048;
static const int kN = 1 << 16;
static std::atomic<int> g_failures{0};

__global__ void stamp(unsigned *where) {
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        long long start = clock64();
        while (clock64() - start < 40000) {
        }
        where[blockIdx.x] = smid;
    }
}

__global__ void scale(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}

static bool ok(cudaError_t e, const char *what, int dev) {
    if (e == cudaSuccess) return true;
    fprintf(stderr, "FAILED %s on device %d: %s\n", what, dev, cudaGetErrorString(e));
    g_failures++;
    return false;
}

// One round on device `dev`: stamp and scale on a stream of its own, checked.
static void round_on(int dev) {
    if (!ok(cudaSetDevice(dev), "cudaSetDevice", dev)) return;
    cudaStream_t s;
    unsigned *where, *host;
    float *x;
    std::vector<float> hx(kN, 1.5f);
    if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream", dev) ||
        !ok(cudaMalloc(&where, kBlocks * sizeof(unsigned)), "malloc", dev) ||
        !ok(cudaMallocHost(&host, kBlocks * sizeof(unsigned)), "malloc host", dev) ||
        !ok(cudaMalloc(&x, kN * sizeof(float)), "malloc", dev))
        return;
    ok(cudaMemsetAsync(where, 0xff, kBlocks * sizeof(unsigned), s), "memset", dev);
    stamp<<<kBlocks, 32, 0, s>>>(where);
    ok(cudaGetLastError(), "stamp", dev);
    ok(cudaMemcpyAsync(host, where, kBlocks * sizeof(unsigned), cudaMemcpyDeviceToHost, s),
       "copy", dev);
    ok(cudaMemcpyAsync(x, hx.data(), kN * sizeof(float), cudaMemcpyHostToDevice, s), "copy", dev);
    scale<<<(kN + 255) / 256, 256, 0, s>>>(x, kN);
    ok(cudaGetLastError(), "scale", dev);
    ok(cudaMemcpyAsync(hx.data(), x, kN * sizeof(float), cudaMemcpyDeviceToHost, s), "copy", dev);
    ok(cudaStreamSynchronize(s), "sync", dev);
    std::vector<char> seen(1024, 0);
    int distinct = 0, unwritten = 0;
    for (int i = 0; i < kBlocks; i++) {
        if (host[i] == 0xffffffffu) {
            unwritten++;
        } else if (host[i] < seen.size() && !seen[host[i]]) {
            seen[host[i]] = 1;
            distinct++;
        }
    }
    bool scaled = true;
    for (int i = 0; i < kN; i++) scaled = scaled && hx[i] == 3.0f;
    if (unwritten || !scaled) g_failures++;
    printf("device %d distinct=%d unwritten=%d scale=%s\n", dev, distinct, unwritten,
           scaled ? "ok" : "bad");
    cudaFree(x);
    cudaFreeHost(host);
    cudaFree(where);
    cudaStreamDestroy(s);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "each";
    int rounds = argc > 2 ? atoi(argv[2]) : 20;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    if (strcmp(mode, "threads") == 0) {
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; t++)
            threads.emplace_back([=] {
                for (int r = 0; r < rounds; r++) round_on((t + r) % devices);
            });
        for (auto &t : threads) t.join();
    } else {
        for (int d = 0; d < devices; d++) round_on(d);
    }
    printf("devices=%d failures=%d\n", devices, g_failures.load());
    return g_failures ? 1 : 0;
}
