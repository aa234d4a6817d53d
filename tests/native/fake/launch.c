/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): launches, and what the tests observe of them. */

/* ---- launches -------------------------------------------------------------------------------- */

/* cuLaunchKernel and friends take a CUfunction or a CUkernel cast to one (as cudart passes). */
static struct CUfunc_st *launchable(const void *h)
{
    switch (tag_of(h)) {
    case TAG_FUNCTION:
        return (struct CUfunc_st *)h;
    case TAG_KERNEL:
        return &((struct CUkern_st *)h)->func;
    default:
        return NULL;
    }
}

static CUresult check_shape(const struct CUfunc_st *f, unsigned gx, unsigned gy, unsigned gz,
                            unsigned bx, unsigned by, unsigned bz, unsigned smem)
{
    if (!gx || !gy || !gz || !bx || !by || !bz)
        return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)bx * by * bz > MAX_BLOCK_THREADS)
        return CUDA_ERROR_INVALID_VALUE;
    if (smem > (unsigned)f->attrs[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES])
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* The arguments of a launch, as the real driver checks them: a kernel that takes parameters
 * needs kernelParams or extra, and extra is a list of (CU_LAUNCH_PARAM_BUFFER_POINTER, buffer),
 * (CU_LAUNCH_PARAM_BUFFER_SIZE, &size) pairs ended by CU_LAUNCH_PARAM_END whose buffer holds
 * the whole parameter layout. */
static CUresult check_args(const struct CUfunc_st *f, void **params, void **extra)
{
    size_t need = f->params ? f->params->total : 0;
    const void *buf = NULL;
    const size_t *size = NULL;
    unsigned i;

    if (params && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (!extra)
        return params || need == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (i >= 64)
            return CUDA_ERROR_INVALID_VALUE;
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
            size = extra[i + 1];
        else
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (need == 0 && !buf && !size)
        return CUDA_SUCCESS;
    if (!buf || !size || *size < need)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* ---- observed launches -----------------------------------------------------------------------
 * Off until a test program turns it on (fake_cuda_observe_launches). Then each successful direct
 * launch is kept as its kernel name's last launch: the handle as passed, the entry point, grid,
 * block, shared memory, whether the code came from a cubin, and copies of its arguments made
 * during the call (a caller's arrays often live on its stack): the kernelParams entries the
 * program asked for beforehand (fake_cuda_capture_param), or the whole `extra` buffer. */

#define CAPTURE_SLOTS 8
#define CAPTURE_BYTES 64
#define EXTRA_BYTES 4096

enum arg_form { FORM_NONE, FORM_PARAMS, FORM_EXTRA };

struct seen_launch {
    int valid;
    const void *handle;
    int from_cubin;
    enum entry entry;
    unsigned dims[7]; /* grid x y z, block x y z, shared memory */
    enum arg_form form;
    unsigned n_params;  /* capture slots filled (FORM_PARAMS) */
    unsigned param_index[CAPTURE_SLOTS];
    long param_len[CAPTURE_SLOTS]; /* -1: the launch had no such argument */
    unsigned char param[CAPTURE_SLOTS][CAPTURE_BYTES];
    size_t extra_size; /* what CU_LAUNCH_PARAM_BUFFER_SIZE said (FORM_EXTRA) */
    unsigned char extra[EXTRA_BYTES];
};

static atomic_int g_observe;
static struct {
    unsigned index, bytes;
} g_capture[CAPTURE_SLOTS]; /* which kernelParams entries to copy; under g_lock */
static unsigned g_ncapture;

/* Copies what fn's launch was given into its name's record. Only called while observing, after
 * check_args accepted the arguments. */
static void observe(enum entry e, const void *handle, const struct CUfunc_st *f,
                    const unsigned dims[7], void **params, void **extra)
{
    struct seen_launch *s;
    unsigned i;
    lock();
    if (!(s = f->k->seen) && !(s = f->k->seen = malloc(sizeof *s))) {
        unlock();
        return;
    }
    memset(s, 0, sizeof *s);
    s->valid = 1;
    s->handle = handle;
    s->from_cubin = f->from_cubin;
    s->entry = e;
    memcpy(s->dims, dims, sizeof s->dims);
    if (params) {
        s->form = FORM_PARAMS;
        for (i = 0; i < g_ncapture; i++) {
            unsigned index = g_capture[i].index;
            size_t bytes = g_capture[i].bytes;
            s->param_index[i] = index;
            s->param_len[i] = -1;
            /* With a known layout, only the kernel's own arguments exist; a cubin's kernel has
             * none known, so the program's word is taken for how many it passes. */
            if (f->params && index >= f->params->n)
                continue;
            if (f->params && bytes > f->params->p[index].size)
                bytes = f->params->p[index].size;
            if (!params[index])
                continue;
            memcpy(s->param[i], params[index], bytes);
            s->param_len[i] = (long)bytes;
        }
        s->n_params = g_ncapture;
    } else if (extra) {
        const void *buf = NULL;
        const size_t *size = NULL;
        s->form = FORM_EXTRA;
        for (i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
                size = extra[i + 1];
        }
        s->extra_size = size ? *size : 0;
        if (buf)
            memcpy(s->extra, buf, s->extra_size < EXTRA_BYTES ? s->extra_size : EXTRA_BYTES);
    }
    unlock();
}

/* Where the kernel of the node last checked by this thread runs: a v2 node naming its kernel
 * by `kern` in a context converted from a green context runs on that partition's SMs. */
static __thread unsigned tls_node_where = FAKE_SMS_ALL;
/* And the context it runs in (the conditional node's for a conditional node), and its
 * parameters as the v2 struct holds them. */
static __thread const struct CUctx_st *tls_node_ctx;
static __thread CUDA_KERNEL_NODE_PARAMS tls_node_params;
static CUresult add_node(enum entry e, CUgraphNode *phGraphNode, CUgraph g,
                         const CUgraphNode *deps, size_t ndeps, CUgraphNodeType type,
                         struct kname *k);

static unsigned queue_launch(CUstream hs, int *ordered);

/* A cooperative grid must be resident at once: on its partition's SMs for a green stream. */
static int coop_fits(CUstream s, unsigned long long blocks, unsigned threads)
{
    unsigned per_sm = SM_THREADS / threads;
    unsigned sms = tag_of(s) == TAG_STREAM && s->green ? s->green->sms : FAKE_SMS;
    if (per_sm > SM_BLOCKS)
        per_sm = SM_BLOCKS;
    return blocks <= (unsigned long long)sms * per_sm;
}

static CUresult launch(enum entry e, CUfunction fn, unsigned gx, unsigned gy, unsigned gz,
                       unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream s,
                       void **params, void **extra)
{
    struct CUfunc_st *f;
    TRY(need_ctx());
    if (!(f = launchable(fn)))
        return CUDA_ERROR_INVALID_HANDLE;
    TRY(check_args(f, params, extra));
    TRY(check_shape(f, gx, gy, gz, bx, by, bz, smem));
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    /* As the real driver: no function of a context the program made (not a primary context,
     * not one converted from a green context) launches on a green context's stream. */
    if (tag_of(s) == TAG_STREAM && s->green && f->module && f->module->ctx &&
        !f->module->ctx->primary && !f->module->ctx->green)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((e == E_COOP || e == E_COOP_PTSZ) && !coop_fits(s, gx * gy * gz, bx * by * bz))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    /* Captured into a graph the program made: a node of it, in the stream's context. */
    if (tag_of(s) == TAG_STREAM && s->capture_graph &&
        s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        CUgraphNode n;
        tls_node_ctx = s->ctx;
        tls_node_where = s->green ? s->green->first << 16 | s->green->sms : FAKE_SMS_ALL;
        return add_node(e, &n, s->capture_graph, NULL, 0, CU_GRAPH_NODE_TYPE_KERNEL, f->k);
    }
    /* FAKE_CUDA_GREEN_REFUSE: a partition too small for every launch (a cooperative grid that
     * does not fit, say). */
    if (tag_of(s) == TAG_STREAM && s->green && getenv("FAKE_CUDA_GREEN_REFUSE"))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    if (atomic_load_explicit(&g_observe, memory_order_relaxed)) {
        const unsigned dims[7] = {gx, gy, gz, bx, by, bz, smem};
        observe(e, fn, f, dims, params, extra);
    }
    {
        int ordered;
        unsigned where = queue_launch(s, &ordered);
        atomic_store(&f->k->where, where);
        atomic_store(&f->k->ordered, ordered);
        if (where != FAKE_SMS_ALL)
            atomic_fetch_add(&f->k->green, 1);
    }
    atomic_fetch_add(&f->k->launches, 1);
    atomic_fetch_add(&g_entry[e], 1);
    atomic_fetch_add(&g_total_launches, 1);
    atomic_fetch_add(&g_clock_ns, FAKE_NS_PER_LAUNCH);
    {
        void (*cupti)(unsigned, unsigned, int) = atomic_load(&g_cupti_launched);
        if (cupti)
            cupti(gx, bx, (int)e);
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream,
                                void **kernelParams, void **extra)
{
    return launch(E_LAUNCH, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX,
                                     unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream,
                                     void **kernelParams, void **extra)
{
    return launch(E_LAUNCH_PTSZ, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                  blockDimZ, sharedMemBytes, hStream, kernelParams, extra);
}

static CUresult launch_ex(enum entry e, const CUlaunchConfig *c, CUfunction f, void **params,
                          void **extra)
{
    unsigned i;
    if (!c || (c->numAttrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && c->attrs[i].value.cooperative &&
            c->blockDimX && c->blockDimY && c->blockDimZ &&
            !coop_fits(c->hStream, (unsigned long long)c->gridDimX * c->gridDimY * c->gridDimZ,
                       c->blockDimX * c->blockDimY * c->blockDimZ))
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    return launch(e, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                  c->blockDimZ, c->sharedMemBytes, c->hStream, params, extra);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                  void **extra)
{
    return launch_ex(E_LAUNCH_EX, config, f, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                       void **kernelParams, void **extra)
{
    return launch_ex(E_LAUNCH_EX_PTSZ, config, f, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                           unsigned int gridDimY, unsigned int gridDimZ,
                                           unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes,
                                           CUstream hStream, void **kernelParams)
{
    return launch(E_COOP, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, NULL);
}

/* Each device's launch in turn (one fake device: the same one each time). */
CUresult CUDAAPI cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list,
                                                      unsigned int numDevices, unsigned int flags)
{
    unsigned i;
    (void)flags;
    if (!list || numDevices == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < numDevices; i++)
        TRY(launch(E_COOP, list[i].function, list[i].gridDimX, list[i].gridDimY,
                   list[i].gridDimZ, list[i].blockDimX, list[i].blockDimY, list[i].blockDimZ,
                   list[i].sharedMemBytes, list[i].hStream, list[i].kernelParams, NULL));
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                unsigned int gridDimY, unsigned int gridDimZ,
                                                unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ,
                                                unsigned int sharedMemBytes, CUstream hStream,
                                                void **kernelParams)
{
    return launch(E_COOP_PTSZ, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, NULL);
}
