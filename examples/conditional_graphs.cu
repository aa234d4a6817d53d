// SPDX-License-Identifier: Apache-2.0
// conditional_graphs: CUDA graphs with conditional nodes, their bodies filled every way a
// program can, for clc's tests of kernels confined by a green context (the driver requires every
// kernel of a body to be in the conditional node's context).
//
//   conditional_graphs
//
// Each case builds a graph whose body kernel `count` adds 1 to a counter per run of the body,
// instantiates it, launches it and reads the counter back:
//
//   cond LABEL instantiate=<cudaError_t> count=<counter> expected=<what it must be>
//
// while-api      a while node (5 rounds: `step` counts down and sets the condition), its body
//                made with cudaGraphAddKernelNode
// while-capture  the same, the body filled by capturing a stream into it
//                (cudaStreamBeginCaptureToGraph)
// if-else        an if node with two bodies, the condition set 0 by a kernel before it: the
//                else body runs
// switch         a switch node with three bodies, the condition set 2: the third runs
// nested         a while node inside an if node's body
// child          a graph made apart, put in a while node's body as a child graph node
// plain-generic  no conditional: a kernel node added by cudaGraphAddNode
//
// Build: nvcc -O2 -arch=sm_90 -o conditional_graphs examples/conditional_graphs.cu
// Exit status: 0 when every count is as expected, 1 otherwise.
#include <cstdio>
#include <cstring>

__global__ void count(int *counter) {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(counter, 1);
}

__global__ void step(int *rounds, cudaGraphConditionalHandle h) {
    int left = --*rounds;
    cudaGraphSetConditional(h, left > 0 ? 1 : 0);
}

__global__ void set_cond(cudaGraphConditionalHandle h, unsigned value) {
    cudaGraphSetConditional(h, value);
}

static int *g_counter, *g_rounds;
static int g_failures;

static cudaGraph_t conditional(cudaGraph_t graph, cudaGraphConditionalHandle *h,
                               cudaGraphConditionalNodeType type, unsigned size,
                               cudaGraphNode_t *node, const cudaGraphNode_t *dep, unsigned n_dep,
                               unsigned dflt, cudaGraph_t *second = nullptr) {
    cudaGraphConditionalHandleCreate(h, graph, dflt, cudaGraphCondAssignDefault);
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = *h;
    p.conditional.type = type;
    p.conditional.size = size;
    cudaError_t e = cudaGraphAddNode(node, graph, dep, nullptr, n_dep, &p);
    if (e != cudaSuccess) printf("add conditional: %s\n", cudaGetErrorName(e));
    if (second && size > 1) *second = p.conditional.phGraph_out[size - 1];
    return p.conditional.phGraph_out[0];
}

static cudaKernelNodeParams kparams(void *fn, void **args) {
    cudaKernelNodeParams k = {};
    k.func = fn;
    k.gridDim = dim3(4);
    k.blockDim = dim3(32);
    k.kernelParams = args;
    return k;
}

static void run(const char *label, cudaGraph_t graph, int rounds, int expected) {
    cudaMemset(g_counter, 0, sizeof(int));
    cudaMemcpy(g_rounds, &rounds, sizeof(int), cudaMemcpyHostToDevice);
    cudaGraphExec_t exec;
    cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    int got = -1;
    if (inst == cudaSuccess) {
        cudaGraphLaunch(exec, 0);
        cudaDeviceSynchronize();
        cudaMemcpy(&got, g_counter, sizeof(int), cudaMemcpyDeviceToHost);
        cudaGraphExecDestroy(exec);
    }
    if (inst != cudaSuccess || got != expected) g_failures++;
    printf("cond %s instantiate=%d count=%d expected=%d\n", label, (int)inst, got, expected);
}

// A while body: count, then step (which ends the loop after `rounds` runs).
static void fill_while_api(cudaGraph_t body, cudaGraphConditionalHandle *h) {
    void *cargs[] = {&g_counter};
    void *sargs[] = {&g_rounds, h};
    cudaKernelNodeParams kc = kparams((void *)count, cargs);
    cudaKernelNodeParams ks = kparams((void *)step, sargs);
    ks.gridDim = dim3(1);
    ks.blockDim = dim3(1);
    cudaGraphNode_t c = nullptr, s;
    // A count node the driver (or a policy) refuses leaves step alone in the body: the loop
    // still ends.
    bool counted = cudaGraphAddKernelNode(&c, body, nullptr, 0, &kc) == cudaSuccess;
    cudaGraphAddKernelNode(&s, body, counted ? &c : nullptr, counted ? 1 : 0, &ks);
}

// A conditional node of `type` with `size` bodies after a kernel that sets its condition to
// `value`; its bodies.
static cudaGraph_t *after_setter(cudaGraph_t g, cudaGraphConditionalHandle *h,
                                 cudaGraphConditionalNodeType type, unsigned size,
                                 unsigned value, cudaGraphNode_t *node) {
    static unsigned values[8];
    static int n_values;
    unsigned *v = &values[n_values++ % 8];
    *v = value;
    cudaGraphConditionalHandleCreate(h, g, 0, 0);
    void *args[] = {h, v};
    cudaKernelNodeParams ks = kparams((void *)set_cond, args);
    ks.gridDim = dim3(1);
    ks.blockDim = dim3(1);
    cudaGraphNode_t setter;
    cudaGraphAddKernelNode(&setter, g, nullptr, 0, &ks);
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = *h;
    p.conditional.type = type;
    p.conditional.size = size;
    cudaGraphAddNode(node, g, &setter, nullptr, 1, &p);
    return p.conditional.phGraph_out;
}

int main() {
    cudaMalloc(&g_counter, sizeof(int));
    cudaMalloc(&g_rounds, sizeof(int));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaGraphNode_t node;

    {  // while-api
        cudaGraph_t g;
        cudaGraphCreate(&g, 0);
        static cudaGraphConditionalHandle h;
        cudaGraph_t body = conditional(g, &h, cudaGraphCondTypeWhile, 1, &node, nullptr, 0, 1);
        fill_while_api(body, &h);
        run("while-api", g, 5, 5);
    }
    {  // while-capture
        cudaGraph_t g;
        cudaGraphCreate(&g, 0);
        static cudaGraphConditionalHandle h;
        cudaGraph_t body = conditional(g, &h, cudaGraphCondTypeWhile, 1, &node, nullptr, 0, 1);
        cudaError_t e = cudaStreamBeginCaptureToGraph(s, body, nullptr, nullptr, 0,
                                                      cudaStreamCaptureModeRelaxed);
        if (e != cudaSuccess) printf("begin capture: %s\n", cudaGetErrorName(e));
        count<<<4, 32, 0, s>>>(g_counter);
        step<<<1, 1, 0, s>>>(g_rounds, h);
        cudaGraph_t out;
        e = cudaStreamEndCapture(s, &out);
        if (e != cudaSuccess) printf("end capture: %s\n", cudaGetErrorName(e));
        run("while-capture", g, 5, 5);
    }
    {  // if-else: the condition set to 0 before the node, the else body runs
        cudaGraph_t g;
        cudaGraphCreate(&g, 0);
        static cudaGraphConditionalHandle h;
        cudaGraph_t *bodies = after_setter(g, &h, cudaGraphCondTypeIf, 2, 0, &node);
        void *cargs[] = {&g_counter};
        cudaKernelNodeParams kc = kparams((void *)count, cargs);
        cudaGraphNode_t c;
        cudaGraphAddKernelNode(&c, bodies[1], nullptr, 0, &kc);
        run("if-else", g, 1, 1);
    }
    {  // switch: the condition set to 2, the third body runs (twice: two count nodes)
        cudaGraph_t g;
        cudaGraphCreate(&g, 0);
        static cudaGraphConditionalHandle h;
        cudaGraph_t *bodies = after_setter(g, &h, cudaGraphCondTypeSwitch, 3, 2, &node);
        void *cargs[] = {&g_counter};
        cudaKernelNodeParams kc = kparams((void *)count, cargs);
        cudaGraphNode_t c1, c2;
        cudaGraphAddKernelNode(&c1, bodies[2], nullptr, 0, &kc);
        cudaGraphAddKernelNode(&c2, bodies[2], &c1, 1, &kc);
        cudaGraphAddKernelNode(&c1, bodies[0], nullptr, 0, &kc);
        run("switch", g, 1, 2);
    }
    {  // nested: an if node (default 1) whose body holds a while node
        cudaGraph_t g;
        cudaGraphCreate(&g, 0);
        static cudaGraphConditionalHandle hif, hwhile;
        cudaGraph_t outer = conditional(g, &hif, cudaGraphCondTypeIf, 1, &node, nullptr, 0, 1);
        cudaGraphNode_t inner_node;
        cudaGraph_t inner =
            conditional(outer, &hwhile, cudaGraphCondTypeWhile, 1, &inner_node, nullptr, 0, 1);
        fill_while_api(inner, &hwhile);
        run("nested", g, 3, 3);
    }
    {  // child: a graph made apart, put in a while body as a child graph node
        cudaGraph_t apart;
        cudaGraphCreate(&apart, 0);
        void *cargs[] = {&g_counter};
        cudaKernelNodeParams kc = kparams((void *)count, cargs);
        cudaGraphNode_t c;
        cudaGraphAddKernelNode(&c, apart, nullptr, 0, &kc);
        cudaGraph_t g;
        cudaGraphCreate(&g, 0);
        static cudaGraphConditionalHandle h;
        cudaGraph_t body = conditional(g, &h, cudaGraphCondTypeWhile, 1, &node, nullptr, 0, 1);
        cudaGraphNode_t child = nullptr;
        bool added = cudaGraphAddChildGraphNode(&child, body, nullptr, 0, apart) == cudaSuccess;
        void *sargs[] = {&g_rounds, &h};
        cudaKernelNodeParams ks = kparams((void *)step, sargs);
        ks.gridDim = dim3(1);
        ks.blockDim = dim3(1);
        cudaGraphNode_t st;
        cudaGraphAddKernelNode(&st, body, added ? &child : nullptr, added ? 1 : 0, &ks);
        run("child", g, 4, 4);
    }
    {  // plain-generic
        cudaGraph_t g;
        cudaGraphCreate(&g, 0);
        void *cargs[] = {&g_counter};
        cudaGraphNodeParams p = {};
        p.type = cudaGraphNodeTypeKernel;
        p.kernel.func = (void *)count;
        p.kernel.gridDim = dim3(4);
        p.kernel.blockDim = dim3(32);
        p.kernel.kernelParams = cargs;
        cudaGraphAddNode(&node, g, nullptr, nullptr, 0, &p);
        run("plain-generic", g, 1, 1);
    }
    cudaError_t last = cudaDeviceSynchronize();
    printf("done failures=%d last=%s\n", g_failures, cudaGetErrorName(last));
    return g_failures ? 1 : 0;
}
