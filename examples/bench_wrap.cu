// SPDX-License-Identifier: Apache-2.0
//
// bench_wrap: kernels that run for about a millisecond or more, timed with CUDA events, to
// measure what a wrapper costs (benchmarks/bench_wrap.py runs this natively and under wrap
// policies).
//
//   bench_wrap [repeats]            each kernel: 2 warm-up launches, then `repeats` timed ones
//   bench_wrap share [iters [1]]    the sharing benchmark's program (see below; 1: tenant_a
//                                   has static shared memory)
//
// Kernels (extern "C"):
//   saxpy_1to1   one element per thread, 3 << 27 elements: 1572864 blocks of 256; the worst
//                case for a per-block claim (its blocks are short)
//   fma_heavy    8192 dependent FMAs per thread, 65536 blocks of 256: compute bound
//   reduce_sum   shared-memory tree reduction with barriers, 3 << 27 elements, 1572864 blocks
// Each runs 1 ms or more on an H100/H200 (the issue's target is for such kernels).
// Output: time_ms <kernel> <median ms>, checksum <kernel> <value>.
//
// `share`: tenant_a and tenant_b (the same compute-bound kernel, 16 x SMs x 8 blocks each) are
// timed alone, then launched together on two streams, tenant_b first; each one's time from
// its own stream's events, alone and together:
//   solo_ms <kernel> <ms>
//   together_ms <kernel> <ms>
// A policy that wraps tenant_b with sm_share 0.25 should leave tenant_a most of the GPU.
//
//   bench_wrap proc a|b START_MS DURATION_MS [iters]
// One tenant per process, for two processes at once (under MPS, or time-sliced without it):
// waits until CLOCK_REALTIME reaches START_MS (ms since the epoch), then launches the tenant
// back to back on its own stream, each launch waited for, until DURATION_MS have passed:
//   proc_launches <kernel> <launches> <elapsed ms>
//   sms_used <kernel> <n> blocks_first_quarter <n> blocks_rest <n>   (over all its launches)

#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            printf("cuda_error %s %s\n", #call, cudaGetErrorName(e_));                   \
            exit(2);                                                                      \
        }                                                                                 \
    } while (0)

extern "C" __global__ void saxpy_1to1(int n, float a, const float *x, float *y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void fma_heavy(float *out, int iters) {
    float v = threadIdx.x * 1e-3f, w = blockIdx.x * 1e-6f;
    for (int k = 0; k < iters; ++k) v = fmaf(v, 0.999f, w);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

extern "C" __global__ void reduce_sum(const float *x, float *partial, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

// span[0]: the first block's start, span[1]: the last block's end (%globaltimer, ns): when a
// tenant really ran, next to the other; span[2 + smid]: how many of its blocks ran on each SM.
static __device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ void stamp_start(unsigned long long *span) {
    if (threadIdx.x == 0) {
        unsigned int smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        atomicMin(&span[0], now_ns());
        atomicAdd(&span[2 + (smid & 255)], 1ull);   // blocks that ran on each SM
    }
}
static __device__ __forceinline__ void stamp_end(unsigned long long *span) {
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&span[1], now_ns());
}

extern "C" __global__ void tenant_a(float *out, int iters, unsigned long long *span) {
    stamp_start(span);
    float v = threadIdx.x * 1e-3f;
    for (int k = 0; k < iters; ++k) v = fmaf(v, 0.999f, 1e-3f);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
    stamp_end(span);
}

// tenant_a with 128 bytes of static shared memory (the wrapper runtime's blocks have some):
// `bench_wrap share ITERS 1` runs this one as tenant_a.
extern "C" __global__ void tenant_a_smem(float *out, int iters, unsigned long long *span) {
    stamp_start(span);
    __shared__ float s[32];
    float v = threadIdx.x * 1e-3f;
    for (int k = 0; k < iters; ++k) v = fmaf(v, 0.999f, 1e-3f);
    if (threadIdx.x < 32) s[threadIdx.x] = v;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = v + 0.0f * s[threadIdx.x % 32];
    stamp_end(span);
}

extern "C" __global__ void tenant_b(float *out, int iters, unsigned long long *span) {
    stamp_start(span);
    float v = threadIdx.x * 1e-3f;
    for (int k = 0; k < iters; ++k) v = fmaf(v, 0.999f, 1e-3f);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
    stamp_end(span);
}

template <typename F> static float time_ms(F launch, cudaStream_t s = 0) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a, s));
    launch();
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return ms;
}

template <typename F> static void bench(const char *name, int repeats, F launch) {
    launch();
    launch();
    CHECK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < repeats; ++r) t.push_back(time_ms(launch));
    std::sort(t.begin(), t.end());
    printf("time_ms %s %.4f\n", name, t[t.size() / 2]);
}

static double checksum(const float *d, int n) {
    std::vector<float> h(n);
    CHECK(cudaMemcpy(h.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    double s = 0;
    for (int i = 0; i < n; ++i) s += h[i];
    return s;
}

// Where a tenant's blocks ran (span[2 + smid] counts them): the SMs it used, and its blocks
// on the first quarter of SM ids (where a 0.25 share of tenant_b runs) and on the rest.
static void print_sms(const char *name, const unsigned long long *span, int sms) {
    int used = 0;
    unsigned long long low = 0, high = 0;
    for (int sm = 0; sm < 256; ++sm) {
        used += span[2 + sm] > 0;
        (sm < (sms + 3) / 4 ? low : high) += span[2 + sm];
    }
    printf("sms_used %s %d blocks_first_quarter %llu blocks_rest %llu\n", name, used, low, high);
}

static int share(int iters, int smem) {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int blocks = 16 * sms * 8, threads = 256;
    float *oa, *ob;
    CHECK(cudaMalloc(&oa, sizeof(float) * blocks * threads));
    CHECK(cudaMalloc(&ob, sizeof(float) * blocks * threads));
    cudaStream_t sa, sb;
    CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    const int span_words = 2 + 256;
    unsigned long long *span;  // a's span and SM counts, then b's
    CHECK(cudaMalloc(&span, 2 * span_words * sizeof(unsigned long long)));
    std::vector<unsigned long long> fresh(2 * span_words, 0);
    fresh[0] = fresh[span_words] = ~0ull;
    auto reset = [&] {
        CHECK(cudaMemcpy(span, fresh.data(), fresh.size() * sizeof(unsigned long long),
                         cudaMemcpyHostToDevice));
    };
    auto run_a = [&] {
        if (smem)
            tenant_a_smem<<<blocks, threads, 0, sa>>>(oa, iters, span);
        else
            tenant_a<<<blocks, threads, 0, sa>>>(oa, iters, span);
    };
    auto run_b = [&] { tenant_b<<<blocks, threads, 0, sb>>>(ob, iters, span + span_words); };
    run_a();
    run_b();
    CHECK(cudaDeviceSynchronize());
    printf("solo_ms tenant_a %.3f\n", time_ms(run_a, sa));
    printf("solo_ms tenant_b %.3f\n", time_ms(run_b, sb));
    reset();
    cudaEvent_t a0, a1, b0, b1;
    CHECK(cudaEventCreate(&a0));
    CHECK(cudaEventCreate(&a1));
    CHECK(cudaEventCreate(&b0));
    CHECK(cudaEventCreate(&b1));
    // tenant_b first: unwrapped, it takes the whole GPU before tenant_a's blocks can start.
    CHECK(cudaEventRecord(b0, sb));
    run_b();
    CHECK(cudaEventRecord(b1, sb));
    CHECK(cudaEventRecord(a0, sa));
    run_a();
    CHECK(cudaEventRecord(a1, sa));
    CHECK(cudaDeviceSynchronize());
    float ta, tb;
    CHECK(cudaEventElapsedTime(&ta, a0, a1));
    CHECK(cudaEventElapsedTime(&tb, b0, b1));
    printf("together_ms tenant_a %.3f\ntogether_ms tenant_b %.3f\n", ta, tb);
    std::vector<unsigned long long> sp(2 * span_words);
    CHECK(cudaMemcpy(sp.data(), span, sp.size() * sizeof(unsigned long long),
                     cudaMemcpyDeviceToHost));
    const unsigned long long *a = sp.data(), *b = sp.data() + span_words;
    unsigned long long t0 = a[0] < b[0] ? a[0] : b[0];
    printf("span_ms tenant_a %.3f %.3f\nspan_ms tenant_b %.3f %.3f\n", (a[0] - t0) / 1e6,
           (a[1] - t0) / 1e6, (b[0] - t0) / 1e6, (b[1] - t0) / 1e6);
    print_sms("tenant_a", a, sms);
    print_sms("tenant_b", b, sms);
    printf("checksum tenant_a %.6e\nchecksum tenant_b %.6e\n", checksum(oa, blocks * threads),
           checksum(ob, blocks * threads));
    return 0;
}

static double realtime_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int one_tenant(const char *which, double start_ms, double duration_ms, int iters) {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int blocks = 16 * sms * 8, threads = 256;
    float *o;
    unsigned long long *span;
    CHECK(cudaMalloc(&o, sizeof(float) * blocks * threads));
    CHECK(cudaMalloc(&span, (2 + 256) * sizeof(unsigned long long)));
    CHECK(cudaMemset(span, 0, (2 + 256) * sizeof(unsigned long long)));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int b = !strcmp(which, "b");
    auto run = [&] {
        if (b)
            tenant_b<<<blocks, threads, 0, st>>>(o, iters, span);
        else
            tenant_a<<<blocks, threads, 0, st>>>(o, iters, span);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(st));
    };
    run(); // first sight (and, under clc, the wrapped kernel's build) before the clock starts
    while (realtime_ms() < start_ms) usleep(200);
    double t0 = realtime_ms(), t1 = t0;
    long n = 0;
    while (t1 - t0 < duration_ms) {
        run();
        ++n;
        t1 = realtime_ms();
    }
    printf("proc_launches %s %ld %.3f\n", b ? "tenant_b" : "tenant_a", n, t1 - t0);
    // Where its blocks ran, over all its launches (the span's SM counts accumulate).
    std::vector<unsigned long long> sp(2 + 256);
    CHECK(cudaMemcpy(sp.data(), span, sp.size() * sizeof(unsigned long long),
                     cudaMemcpyDeviceToHost));
    print_sms(b ? "tenant_b" : "tenant_a", sp.data(), sms);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 4 && !strcmp(argv[1], "proc"))
        return one_tenant(argv[2], atof(argv[3]), atof(argv[4]), argc > 5 ? atoi(argv[5]) : 20000);
    if (argc > 1 && !strcmp(argv[1], "share"))
        return share(argc > 2 ? atoi(argv[2]) : 20000, argc > 3 ? atoi(argv[3]) : 0);
    int repeats = argc > 1 ? atoi(argv[1]) : 20;
    const int n = 3 << 27, threads = 256, blocks = n / threads;
    float *x, *y, *out, *partial;
    CHECK(cudaMalloc(&x, sizeof(float) * n));
    CHECK(cudaMalloc(&y, sizeof(float) * n));
    CHECK(cudaMalloc(&out, sizeof(float) * 65536 * threads));
    CHECK(cudaMalloc(&partial, sizeof(float) * blocks));
    std::vector<float> h(n);
    for (int i = 0; i < n; ++i) h[i] = (float)(1 + i % 7);
    CHECK(cudaMemcpy(x, h.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(y, 0, sizeof(float) * n));

    bench("saxpy_1to1", repeats, [&] { saxpy_1to1<<<blocks, threads>>>(n, 0.5f, x, y); });
    bench("fma_heavy", repeats, [&] { fma_heavy<<<65536, threads>>>(out, 8192); });
    bench("reduce_sum", repeats, [&] { reduce_sum<<<blocks, threads>>>(x, partial, n); });
    CHECK(cudaDeviceSynchronize());
    printf("checksum fma_heavy %.6e\n", checksum(out, 65536 * threads));
    printf("checksum reduce_sum %.6e\n", checksum(partial, blocks));
    return 0;
}
