// SPDX-License-Identifier: Apache-2.0
// green_threads: many threads on the device's one primary context at once, each with a
// blocking and a non-blocking stream of its own, the legacy stream, events across its
// streams, cudaMalloc and cudaFree, and the legacy stream's implicit order with blocking
// streams; what a whole program confined by a green context (scope: program) must keep.
//
//   green_threads [THREADS [ROUNDS]]
//
// prints
//
//   threads=T rounds=R bad=B legacy_bad=L distinct_sms=D max_smid=M
//
// bad: rounds whose axpy chain (five launches on the non-blocking stream, one more on the
// blocking stream after an event) did not compute 11; legacy_bad: rounds in which a kernel on
// the legacy stream did not see what a long kernel queued before it on a blocking stream wrote
// (the legacy stream waits for blocking streams); distinct_sms: SMs a stamping kernel's blocks
// ran on, over every thread and round.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "FAILED %s: %s\n", #x, cudaGetErrorString(e_));               \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

__global__ void spin_write(int *x, int v, long long cycles) {
    long long s = clock64();
    while (clock64() - s < cycles) {
    }
    *x = v;
}
__global__ void copy1(const int *x, int *y) { *y = *x; }
__global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
__global__ void stamp(unsigned *where) {
    if (threadIdx.x == 0) {
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        long long start = clock64();
        while (clock64() - start < 20000) {
        }
        where[blockIdx.x] = s;
    }
}

int main(int argc, char **argv) {
    int nthreads = argc > 1 ? atoi(argv[1]) : 8, rounds = argc > 2 ? atoi(argv[2]) : 100;
    const int n = 1 << 16, stamps = 512;
    std::atomic<int> bad{0}, legacy_bad{0};
    std::atomic<unsigned> max_sm{0};
    std::vector<std::atomic<char>> seen(1024);
    std::vector<std::thread> threads;
    for (int t = 0; t < nthreads; t++)
        threads.emplace_back([&] {
            CHECK(cudaSetDevice(0));
            cudaStream_t blocking, nb;
            CHECK(cudaStreamCreate(&blocking));
            CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
            int *x, *y, hy;
            unsigned *where;
            std::vector<unsigned> hw(stamps);
            std::vector<float> ones(n, 1.0f);
            CHECK(cudaMalloc(&x, 4));
            CHECK(cudaMalloc(&y, 4));
            CHECK(cudaMalloc(&where, stamps * sizeof(unsigned)));
            for (int r = 0; r < rounds; r++) {
                float *a, *b, last;
                CHECK(cudaMalloc(&a, n * 4));
                CHECK(cudaMalloc(&b, n * 4));
                CHECK(cudaMemsetAsync(a, 0, n * 4, nb));
                CHECK(cudaMemcpyAsync(b, ones.data(), n * 4, cudaMemcpyHostToDevice, nb));
                for (int k = 0; k < 5; k++) axpy<<<n / 256, 256, 0, nb>>>(a, b, 2.0f, n);
                cudaEvent_t ev;
                CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
                CHECK(cudaEventRecord(ev, nb));
                CHECK(cudaStreamWaitEvent(blocking, ev, 0));
                axpy<<<n / 256, 256, 0, blocking>>>(a, b, 1.0f, n);
                CHECK(cudaMemcpyAsync(&last, a + n - 1, 4, cudaMemcpyDeviceToHost, blocking));
                CHECK(cudaStreamSynchronize(blocking));
                if (last != 11.0f) bad++;
                CHECK(cudaEventDestroy(ev));
                if (r % 10 == 0) {
                    CHECK(cudaMemsetAsync(x, 0, 4, blocking));
                    CHECK(cudaMemset(y, 0, 4));
                    spin_write<<<1, 1, 0, blocking>>>(x, r + 1, 2000000);
                    copy1<<<1, 1>>>(x, y);
                    CHECK(cudaMemcpy(&hy, y, 4, cudaMemcpyDeviceToHost));
                    if (hy != r + 1) legacy_bad++;
                    stamp<<<stamps, 32, 0, nb>>>(where);
                    CHECK(cudaMemcpyAsync(hw.data(), where, stamps * sizeof(unsigned),
                                          cudaMemcpyDeviceToHost, nb));
                    CHECK(cudaStreamSynchronize(nb));
                    for (unsigned s : hw) {
                        if (s < seen.size()) seen[s] = 1;
                        unsigned m = max_sm;
                        while (s > m && !max_sm.compare_exchange_weak(m, s)) {
                        }
                    }
                }
                CHECK(cudaFree(a));
                CHECK(cudaFree(b));
            }
            CHECK(cudaStreamDestroy(blocking));
            CHECK(cudaStreamDestroy(nb));
        });
    for (auto &t : threads) t.join();
    CHECK(cudaDeviceSynchronize());
    int distinct = 0;
    for (auto &c : seen) distinct += c;
    printf("threads=%d rounds=%d bad=%d legacy_bad=%d distinct_sms=%d max_smid=%u\n", nthreads,
           rounds, bad.load(), legacy_bad.load(), distinct, max_sm.load());
    return bad || legacy_bad;
}
