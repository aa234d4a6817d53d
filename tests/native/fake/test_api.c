/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): the test-only entry points (fake_cuda_*). */

/* ---- test-only entry points ------------------------------------------------------------------
 * Not part of CUDA: the test programs (via dlsym) and the Python tests (via ctypes) read the
 * driver's true counts with these. */

#define TEST_API __attribute__((visibility("default")))

TEST_API unsigned long fake_cuda_launch_count(const char *name);
TEST_API unsigned long fake_cuda_graph_launch_count(const char *name);
TEST_API unsigned long fake_cuda_total_launches(void);
TEST_API unsigned long fake_cuda_total_graph_launches(void);
TEST_API unsigned long fake_cuda_entry_count(const char *entry);
TEST_API const char *fake_cuda_entry_name(unsigned i);
TEST_API unsigned fake_cuda_kernel_count(void);
TEST_API const char *fake_cuda_kernel_name(unsigned i);
TEST_API unsigned long long fake_cuda_clock_ns(void);
TEST_API void fake_cuda_print_counts(FILE *out);
TEST_API void fake_cuda_observe_launches(int on);
TEST_API int fake_cuda_capture_param(unsigned index, unsigned bytes);
TEST_API int fake_cuda_last_launch(const char *name, const void **handle, const char **entry,
                                   unsigned dims[7], int *from_cubin);
TEST_API long fake_cuda_last_param(const char *name, unsigned index, void *buf, size_t cap);
TEST_API long fake_cuda_last_extra(const char *name, void *buf, size_t cap);
TEST_API int fake_cuda_device_allocation(CUdeviceptr p, CUdeviceptr *base, size_t *size);
TEST_API int fake_cuda_capture_unsafe_calls(void);
TEST_API int fake_cuda_last_green(const char *name, unsigned *first, unsigned *sms,
                                  int *ordered, unsigned long *green_launches);
TEST_API unsigned long fake_cuda_order_violations(void);
TEST_API void fake_cuda_green_counts(unsigned long *created, unsigned long *destroyed,
                                     unsigned long *streams, unsigned long *streams_destroyed);

static struct kname *lookup(const char *name);

/* Where the kernel's last launch ran (SMs [first, first + sms)), whether it was in its program
 * stream's order, and how many of its launches ran on green streams: 0, or -1 for an unknown
 * name. */
int fake_cuda_last_green(const char *name, unsigned *first, unsigned *sms, int *ordered,
                         unsigned long *green_launches)
{
    struct kname *k = lookup(name);
    unsigned where;
    if (!k)
        return -1;
    where = atomic_load(&k->where);
    *first = where == FAKE_SMS_ALL ? 0 : where >> 16;
    *sms = where == FAKE_SMS_ALL ? FAKE_SMS : where & 0xffff;
    *ordered = atomic_load(&k->ordered);
    *green_launches = atomic_load(&k->green);
    return 0;
}

/* Breaks of stream order seen (green contexts, above). */
unsigned long fake_cuda_order_violations(void) { return atomic_load(&g_order_violations); }

void fake_cuda_green_counts(unsigned long *created, unsigned long *destroyed,
                            unsigned long *streams, unsigned long *streams_destroyed)
{
    *created = atomic_load(&g_green_created);
    *destroyed = atomic_load(&g_green_destroyed);
    *streams = atomic_load(&g_green_streams);
    *streams_destroyed = atomic_load(&g_green_streams_destroyed);
}

/* How many potentially unsafe calls a global stream capture refused (stream capture, above). */
int fake_cuda_capture_unsafe_calls(void) { return atomic_load(&g_capture_unsafe_calls); }

static struct kname *lookup(const char *name)
{
    unsigned pos;
    struct kname *k;
    if (!name)
        return NULL;
    lock();
    k = find_name_locked(name, &pos);
    unlock();
    return k;
}

/* Direct launches (all cuLaunch* entry points) of the kernel with this mangled name. */
unsigned long fake_cuda_launch_count(const char *name)
{
    struct kname *k = lookup(name);
    return k ? atomic_load(&k->launches) : 0;
}

/* Runs of this kernel as a node of a launched graph. */
unsigned long fake_cuda_graph_launch_count(const char *name)
{
    struct kname *k = lookup(name);
    return k ? atomic_load(&k->graph) : 0;
}

/* All direct launches; graph node runs are in fake_cuda_total_graph_launches. */
unsigned long fake_cuda_total_launches(void) { return atomic_load(&g_total_launches); }
unsigned long fake_cuda_total_graph_launches(void) { return atomic_load(&g_total_graph); }

/* Successful calls of one entry point, by exported name ("cuLaunchKernel_ptsz"). */
unsigned long fake_cuda_entry_count(const char *entry)
{
    unsigned i;
    for (i = 0; entry && i < E_COUNT; i++)
        if (strcmp(entry_names[i], entry) == 0)
            return atomic_load(&g_entry[i]);
    return 0;
}

/* The counted entry points in a fixed order; NULL past the end. */
const char *fake_cuda_entry_name(unsigned i) { return i < E_COUNT ? entry_names[i] : NULL; }

/* Every kernel name seen in a loaded image, launched or not, sorted by strcmp. */
unsigned fake_cuda_kernel_count(void)
{
    unsigned n;
    lock();
    n = g_nnames;
    unlock();
    return n;
}

const char *fake_cuda_kernel_name(unsigned i)
{
    const char *name;
    lock();
    name = i < g_nnames ? g_names[i]->name : NULL;
    unlock();
    return name;
}

unsigned long long fake_cuda_clock_ns(void) { return atomic_load(&g_clock_ns); }

/* The summary every test program ends with:
 *   fake: <name> launches=<n> graph=<n>      one per kernel, sorted by name
 *   fake-entry: <entry point> calls=<n>      one per counted entry point, fixed order */
void fake_cuda_print_counts(FILE *out)
{
    unsigned i, n = fake_cuda_kernel_count();
    for (i = 0; i < n; i++) {
        const char *name = fake_cuda_kernel_name(i);
        fprintf(out, "fake: %s launches=%lu graph=%lu\n", name, fake_cuda_launch_count(name),
                fake_cuda_graph_launch_count(name));
    }
    for (i = 0; i < E_COUNT; i++)
        fprintf(out, "fake-entry: %s calls=%lu\n", entry_names[i], atomic_load(&g_entry[i]));
    fflush(out);
}

/* Observing launches (see "observed launches"): on (1) or off (0); either way every kernel's
 * last launch is forgotten, so that a launch refused from now on leaves no stale record. */
void fake_cuda_observe_launches(int on)
{
    unsigned i;
    lock();
    for (i = 0; i < g_nnames; i++)
        if (g_names[i]->seen)
            g_names[i]->seen->valid = 0;
    unlock();
    atomic_store(&g_observe, on != 0);
}

/* Copy `bytes` (at most 64) of kernelParams[index] at each observed launch from now on; bytes 0
 * stops copying that index. Up to 8 indices at once. 0, or -1 when bytes is over 64 or the eight
 * are taken. */
int fake_cuda_capture_param(unsigned index, unsigned bytes)
{
    unsigned i;
    int rc = 0;
    if (bytes > CAPTURE_BYTES)
        return -1;
    lock();
    for (i = 0; i < g_ncapture && g_capture[i].index != index; i++)
        ;
    if (bytes == 0) {
        if (i < g_ncapture)
            g_capture[i] = g_capture[--g_ncapture];
    } else if (i < g_ncapture) {
        g_capture[i].bytes = bytes;
    } else if (g_ncapture < CAPTURE_SLOTS) {
        g_capture[g_ncapture].index = index;
        g_capture[g_ncapture++].bytes = bytes;
    } else {
        rc = -1;
    }
    unlock();
    return rc;
}

/* The last observed launch of the kernel `name`: the handle the launch passed, its entry point
 * ("cuLaunchKernelEx"), dims = grid x y z, block x y z, shared memory, and whether the function's
 * code was a cubin (any out-pointer may be NULL). Returns how its arguments came: 0 none,
 * 1 kernelParams, 2 extra; -1 when no launch of it was observed. */
int fake_cuda_last_launch(const char *name, const void **handle, const char **entry,
                          unsigned dims[7], int *from_cubin)
{
    struct kname *k = lookup(name);
    int form = -1;
    lock();
    if (k && k->seen && k->seen->valid) {
        const struct seen_launch *s = k->seen;
        form = (int)s->form;
        if (handle)
            *handle = s->handle;
        if (entry)
            *entry = entry_names[s->entry];
        if (dims)
            memcpy(dims, s->dims, sizeof s->dims);
        if (from_cubin)
            *from_cubin = s->from_cubin;
    }
    unlock();
    return form;
}

/* The bytes of kernelParams[index] that the last observed launch of `name` passed, as many as
 * fake_cuda_capture_param asked for (fewer for a smaller parameter of a known layout), copied
 * into buf (cap bytes at most). Returns their number, or -1 when they were not copied (no
 * kernelParams, an index past the kernel's parameters, or not asked for). */
long fake_cuda_last_param(const char *name, unsigned index, void *buf, size_t cap)
{
    struct kname *k = lookup(name);
    long n = -1;
    unsigned i;
    lock();
    if (k && k->seen && k->seen->valid && k->seen->form == FORM_PARAMS) {
        const struct seen_launch *s = k->seen;
        for (i = 0; i < s->n_params; i++) {
            if (s->param_index[i] == index && s->param_len[i] >= 0) {
                n = s->param_len[i];
                memcpy(buf, s->param[i], (size_t)n < cap ? (size_t)n : cap);
                break;
            }
        }
    }
    unlock();
    return n;
}

/* The `extra` argument buffer of the last observed launch of `name`: copied into buf (at most
 * cap, and at most its first 4096 bytes), its size as CU_LAUNCH_PARAM_BUFFER_SIZE gave it
 * returned; -1 when that launch had no `extra`. */
long fake_cuda_last_extra(const char *name, void *buf, size_t cap)
{
    struct kname *k = lookup(name);
    long n = -1;
    lock();
    if (k && k->seen && k->seen->valid && k->seen->form == FORM_EXTRA) {
        const struct seen_launch *s = k->seen;
        size_t have = s->extra_size < EXTRA_BYTES ? s->extra_size : EXTRA_BYTES;
        memcpy(buf, s->extra, have < cap ? have : cap);
        n = (long)s->extra_size;
    }
    unlock();
    return n;
}

/* Whether the device address p lies in a live cuMemAlloc allocation: 1 with its base and size
 * (either pointer may be NULL), else 0. The memory is host memory: a test may read it through
 * p directly once it knows the range is allocated. */
int fake_cuda_device_allocation(CUdeviceptr p, CUdeviceptr *base, size_t *size)
{
    struct allocation *a;
    int found = 0;
    lock();
    if ((a = allocation_of_locked((uintptr_t)p, 1))) {
        found = 1;
        if (base)
            *base = (CUdeviceptr)a->base;
        if (size)
            *size = a->size;
    }
    unlock();
    return found;
}

/* ---- a launch while the caller holds something (tests of first sight under a held GIL) ----
 * fake_cuda_launch_when_held starts a thread that, once fake_cuda_hold is called, launches f
 * in ctx through the process's cuLaunchKernel (a preloaded shim's, if any). fake_cuda_hold
 * waits up to timeout_ms for that launch to return: 1 if it did (its CUresult in *result). A
 * Python caller reaching fake_cuda_hold through ctypes.PyDLL keeps the GIL all the while. */
static atomic_int g_hold_on, g_hold_done, g_hold_result;

struct hold_launch {
    CUcontext ctx;
    CUfunction f;
};

static void *launch_when_held(void *arg)
{
    struct hold_launch job = *(struct hold_launch *)arg;
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    free(arg);
    while (!atomic_load(&g_hold_on))
        usleep(1000);
    *(void **)&launch = dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    cuCtxSetCurrent(job.ctx);
    atomic_store(&g_hold_result, launch(job.f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    atomic_store(&g_hold_done, 1);
    return NULL;
}

int fake_cuda_launch_when_held(CUcontext ctx, CUfunction f)
{
    pthread_t t;
    struct hold_launch *job = malloc(sizeof *job);
    if (!job)
        return -1;
    job->ctx = ctx;
    job->f = f;
    if (pthread_create(&t, NULL, launch_when_held, job)) {
        free(job);
        return -1;
    }
    pthread_detach(t);
    return 0;
}

int fake_cuda_hold(unsigned timeout_ms, int *result)
{
    unsigned waited = 0;
    atomic_store(&g_hold_on, 1);
    while (!atomic_load(&g_hold_done) && waited < timeout_ms) {
        usleep(1000);
        waited++;
    }
    *result = atomic_load(&g_hold_result);
    return atomic_load(&g_hold_done);
}
