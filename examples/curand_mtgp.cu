// SPDX-License-Identifier: Apache-2.0
// curand_mtgp: random numbers by cuRAND's MTGP32 generator (as the CUDA sample
// MersenneTwisterGP11213), whose kernels ship as machine code only: no PTX that clc could wrap.
//
//   curand_mtgp CALLS HOW
//
// CALLS curandGenerateUniform calls of 65,536 floats each, then the mean of the last batch is
// printed (`mean M`, the same for every run: the seed is fixed) and the program leaves by HOW:
// `return` (status 3), `exit` (exit(4)) or `thread-exit` (a second thread makes the calls and
// calls exit(5) while main waits to join it).
//
// Build: nvcc -O2 -arch=sm_90 -o curand_mtgp examples/curand_mtgp.cu -lcurand
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <curand.h>

static const size_t kBatch = 1 << 16;

static int generate(long calls) {
    curandGenerator_t gen;
    float *d = nullptr;
    if (cudaMalloc(&d, kBatch * sizeof(float)) != cudaSuccess) return 10;
    if (curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_MTGP32) != CURAND_STATUS_SUCCESS) return 11;
    if (curandSetPseudoRandomGeneratorSeed(gen, 1234) != CURAND_STATUS_SUCCESS) return 12;
    for (long i = 0; i < calls; i++)
        if (curandGenerateUniform(gen, d, kBatch) != CURAND_STATUS_SUCCESS) return 13;
    std::vector<float> h(kBatch);
    if (cudaMemcpy(h.data(), d, kBatch * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
        return 14;
    double sum = 0;
    for (float x : h) sum += x;
    std::printf("calls %ld\nmean %.6f\n", calls, sum / kBatch);
    std::fflush(stdout);
    curandDestroyGenerator(gen);
    cudaFree(d);
    return 0;
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? std::atol(argv[1]) : -1;
    const char *how = argc > 2 ? argv[2] : "";
    if (calls < 1 || (std::strcmp(how, "return") && std::strcmp(how, "exit") &&
                      std::strcmp(how, "thread-exit"))) {
        std::fprintf(stderr, "usage: %s CALLS return|exit|thread-exit\n", argv[0]);
        return 2;
    }
    if (std::strcmp(how, "thread-exit") == 0) {
        std::thread t([calls] {
            int rc = generate(calls);
            std::exit(rc ? rc : 5);
        });
        t.join();
        return 1;  // not reached: the thread's exit() ends the process
    }
    int rc = generate(calls);
    if (rc) return rc;
    if (std::strcmp(how, "exit") == 0) std::exit(4);
    return 3;
}
