// SPDX-License-Identifier: Apache-2.0
// green_smid: where a kernel's blocks ran, and whether the program's own stream order held.
//
//   green_smid MODE      MODE: legacy | stream | ex | graph | graphapi | reset | threads
//
// Each round: the program's stream fills `where` with 0xff (cudaMemsetAsync), `stamp` writes
// each block's %smid into it (every block spins ~20 us so that the work takes a while), and
// the program copies it back on the same stream and synchronizes that stream only. It prints
//
//   context sms=N
//   result MODE distinct=N unwritten=U max_smid=M smids=A,B,...
//
// context sms: the SMs the driver provisions to the context the program runs in (after its
// first cudaMalloc): a green context's partition, else the whole device. distinct: how many SMs
// ran stamp's blocks; unwritten: entries the copy found still 0xff,
// which only a stream order that did not hold can leave (the copy ran before stamp ended).
// Built twice by the GPU tests: as is, and with --default-stream per-thread (the _ptsz entry
// points).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
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

static const int kBlocks = 2048;

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

static void report(const char *mode, const unsigned *host) {
    std::vector<char> seen(1024, 0);
    int distinct = 0, unwritten = 0;
    unsigned max_smid = 0;
    for (int i = 0; i < kBlocks; i++) {
        if (host[i] == 0xffffffffu) {
            unwritten++;
            continue;
        }
        if (host[i] < seen.size() && !seen[host[i]]) {
            seen[host[i]] = 1;
            distinct++;
        }
        if (host[i] > max_smid) max_smid = host[i];
    }
    // One printf per line: the threads mode reports from four threads at once.
    std::string ids;
    for (unsigned s = 0; s < seen.size(); s++)
        if (seen[s]) ids += (ids.empty() ? "" : ",") + std::to_string(s);
    printf("result %s distinct=%d unwritten=%d max_smid=%u smids=%s\n", mode, distinct,
           unwritten, max_smid, ids.c_str());
}

// One round on `s`: fill, stamp (by `how`), copy back, synchronize the stream only.
static void round_on(const char *mode, cudaStream_t s, unsigned *where, unsigned *host,
                     int how) {
    CHECK(cudaMemsetAsync(where, 0xff, kBlocks * sizeof(unsigned), s));
    if (how == 0) {
        stamp<<<kBlocks, 32, 0, s>>>(where);
    } else {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(kBlocks);
        cfg.blockDim = dim3(32);
        cfg.stream = s;
        CHECK(cudaLaunchKernelEx(&cfg, stamp, where));
    }
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(host, where, kBlocks * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    report(mode, host);
}

// The SMs of the context the program runs in, as the driver provisions it (a green context's
// partition, else the whole device): -1 when the driver cannot say.
static int context_sms() {
    typedef int (*get_current_t)(void **);
    typedef int (*get_resource_t)(void *, void *, int);
    void *get_current = nullptr, *get_resource = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get_current, 12040,
                                         cudaEnableDefault, &q) !=
            cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuCtxGetDevResource", &get_resource, 12040,
                                         cudaEnableDefault, &q) !=
            cudaSuccess ||
        !get_current || !get_resource)
        return -1;
    void *ctx = nullptr;
    // CUdevResource (cuda.h 13.0): a type, 92 bytes of padding, then the SM count first.
    struct {
        int type;
        unsigned char pad[92];
        unsigned sm_count, rest[35];
    } res = {};
    if (((get_current_t)get_current)(&ctx) != 0 || !ctx ||
        ((get_resource_t)get_resource)(ctx, &res, 1 /* CU_DEV_RESOURCE_TYPE_SM */) != 0)
        return -1;
    return (int)res.sm_count;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "legacy";
    unsigned *where, *host;
    CHECK(cudaMalloc(&where, kBlocks * sizeof(unsigned)));
    printf("context sms=%d\n", context_sms());
    CHECK(cudaMallocHost(&host, kBlocks * sizeof(unsigned)));
    if (!strcmp(mode, "legacy")) {
        for (int r = 0; r < 3; r++) round_on(mode, 0, where, host, 0);
    } else if (!strcmp(mode, "stream") || !strcmp(mode, "ex")) {
        int lo, hi;
        CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        cudaStream_t s;
        CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
        for (int r = 0; r < 3; r++) round_on(mode, s, where, host, !strcmp(mode, "ex"));
        CHECK(cudaStreamDestroy(s));
    } else if (!strcmp(mode, "graph")) {
        // Captured on one stream; that stream destroyed; replayed on another.
        cudaStream_t s, t;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CHECK(cudaMemsetAsync(where, 0xff, kBlocks * sizeof(unsigned), s));
        stamp<<<kBlocks, 32, 0, s>>>(where);
        CHECK(cudaMemcpyAsync(host, where, kBlocks * sizeof(unsigned), cudaMemcpyDeviceToHost,
                              s));
        CHECK(cudaStreamEndCapture(s, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CHECK(cudaStreamDestroy(s));
        CHECK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
        for (int r = 0; r < 3; r++) {
            memset(host, 0, kBlocks * sizeof(unsigned));
            CHECK(cudaGraphLaunch(exec, t));
            CHECK(cudaStreamSynchronize(t));
            report(mode, host);
        }
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
        CHECK(cudaStreamDestroy(t));
    } else if (!strcmp(mode, "graphapi")) {
        // A kernel node made with the graph API (cudart gives the driver its CUkernel), run
        // twice: as added, then after cudaGraphExecKernelNodeSetParams gave it its parameters
        // again.
        cudaStream_t s;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        cudaGraphNode_t node;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CHECK(cudaGraphCreate(&graph, 0));
        void *args[] = {&where};
        cudaKernelNodeParams p = {};
        p.func = (void *)stamp;
        p.gridDim = dim3(kBlocks);
        p.blockDim = dim3(32);
        p.kernelParams = args;
        CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &p));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int r = 0; r < 2; r++) {
            if (r == 1) CHECK(cudaGraphExecKernelNodeSetParams(exec, node, &p));
            CHECK(cudaMemsetAsync(where, 0xff, kBlocks * sizeof(unsigned), s));
            CHECK(cudaGraphLaunch(exec, s));
            CHECK(cudaMemcpyAsync(host, where, kBlocks * sizeof(unsigned),
                                  cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            report(mode, host);
        }
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
        CHECK(cudaStreamDestroy(s));
    } else if (!strcmp(mode, "reset")) {
        round_on(mode, 0, where, host, 0);
        CHECK(cudaDeviceReset());
        CHECK(cudaMalloc(&where, kBlocks * sizeof(unsigned)));
        CHECK(cudaMallocHost(&host, kBlocks * sizeof(unsigned)));
        round_on(mode, 0, where, host, 0);
        cudaStream_t s;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        round_on(mode, s, where, host, 0);
    } else if (!strcmp(mode, "threads")) {
        // Four threads, each with its own stream and buffers, at once.
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; t++)
            threads.emplace_back([mode] {
                unsigned *w, *h;
                cudaStream_t s;
                CHECK(cudaMalloc(&w, kBlocks * sizeof(unsigned)));
                CHECK(cudaMallocHost(&h, kBlocks * sizeof(unsigned)));
                CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
                for (int r = 0; r < 3; r++) round_on(mode, s, w, h, 0);
            });
        for (auto &t : threads) t.join();
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    CHECK(cudaDeviceSynchronize());
    return 0;
}
