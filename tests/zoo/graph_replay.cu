// SPDX-License-Identifier: Apache-2.0
//
// graph_replay: a kernel captured into a CUDA graph (stream capture, as PyTorch's CUDA graphs
// and most cudaGraph users make them) and the graph replayed; then a graph built with the graph
// API (cudaGraphAddKernelNode, two nodes in a chain) and replayed. Each replay must run every
// block again: a wrapped kernel that keeps per-launch state (sm_share's claim counter, a
// deadline's start time) must start that state afresh at every replay, not find it used up
// by the previous one.
//
// Expected loop verdict: loopable (no barrier).
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <%.6e>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

extern "C" __global__ void graph_accumulate(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

int main() {
    const int n = (1 << 22) + 37;
    const int block = 256;
    const int grid = (n + block - 1) / block; // 16385 blocks
    const int replays = 5, api_replays = 3;

    float *hx = (float *)malloc(sizeof(float) * n);
    float *hy = (float *)malloc(sizeof(float) * n);
    float *out = (float *)malloc(sizeof(float) * n);
    if (!hx || !hy || !out) {
        fprintf(stderr, "graph_replay: out of host memory\n");
        return 2;
    }
    for (int i = 0; i < n; ++i) {
        hx[i] = (float)(1 + i % 13);
        hy[i] = 0.5f * (float)(1 + i % 7);
    }
    float *dx, *dy;
    CHECK("cudaMalloc", cudaMalloc(&dx, sizeof(float) * n));
    CHECK("cudaMalloc", cudaMalloc(&dy, sizeof(float) * n));
    CHECK("cudaMemcpy", cudaMemcpy(dx, hx, sizeof(float) * n, cudaMemcpyHostToDevice));
    CHECK("cudaMemcpy", cudaMemcpy(dy, hy, sizeof(float) * n, cudaMemcpyHostToDevice));

    cudaStream_t s;
    CHECK("cudaStreamCreate", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // One launch before the capture (a warm-up, as CUDA-graph users do), two in the graph,
    // the graph replayed `replays` times, the API graph's two nodes `api_replays` times, one
    // launch after: 1 + 2 x replays + 2 x api_replays + 1 additions.
    graph_accumulate<<<grid, block, 0, s>>>(dx, dy, n);
    CHECK("graph_accumulate", cudaGetLastError());
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK("cudaStreamBeginCapture", cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    graph_accumulate<<<grid, block, 0, s>>>(dx, dy, n);
    CHECK("graph_accumulate", cudaGetLastError());
    graph_accumulate<<<grid, block, 0, s>>>(dx, dy, n);
    CHECK("graph_accumulate", cudaGetLastError());
    CHECK("cudaStreamEndCapture", cudaStreamEndCapture(s, &graph));
    CHECK("cudaGraphInstantiate", cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < replays; ++r) CHECK("cudaGraphLaunch", cudaGraphLaunch(exec, s));
    // The graph API: two kernel nodes, the second after the first.
    cudaGraph_t api;
    cudaGraphExec_t api_exec;
    cudaGraphNode_t first, second;
    void *args[] = {&dx, &dy, (void *)&n};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)graph_accumulate;
    kp.gridDim = dim3(grid);
    kp.blockDim = dim3(block);
    kp.kernelParams = args;
    CHECK("cudaGraphCreate", cudaGraphCreate(&api, 0));
    CHECK("cudaGraphAddKernelNode", cudaGraphAddKernelNode(&first, api, NULL, 0, &kp));
    CHECK("cudaGraphAddKernelNode", cudaGraphAddKernelNode(&second, api, &first, 1, &kp));
    CHECK("cudaGraphInstantiate", cudaGraphInstantiate(&api_exec, api, 0));
    for (int r = 0; r < api_replays; ++r) CHECK("cudaGraphLaunch", cudaGraphLaunch(api_exec, s));
    graph_accumulate<<<grid, block, 0, s>>>(dx, dy, n);
    CHECK("graph_accumulate", cudaGetLastError());
    CHECK("cudaStreamSynchronize", cudaStreamSynchronize(s));
    CHECK("cudaMemcpy", cudaMemcpy(out, dy, sizeof(float) * n, cudaMemcpyDeviceToHost));

    const int adds = 2 + 2 * replays + 2 * api_replays;
    int bad = 0;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        float want = hy[i] + (float)adds * hx[i];
        if (out[i] != want && !bad) {
            fprintf(stderr, "graph_accumulate: y[%d] = %g, want %g\n", i, out[i], want);
            bad = 1;
        }
        sum += out[i];
    }
    printf("result graph_accumulate %s\n", bad ? "mismatch" : "ok");
    printf("checksum graph_accumulate %.6e\n", sum);

    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaGraphExecDestroy(api_exec);
    cudaGraphDestroy(api);
    cudaStreamDestroy(s);
    cudaFree(dx);
    cudaFree(dy);
    free(hx);
    free(hy);
    free(out);
    return bad;
}
