/* SPDX-License-Identifier: Apache-2.0
 *
 * fake_cupti.c: the part of CUPTI that clc uses (the callback API's subscriber, the activity
 * API's kernel records), for the CPU tests, beside the fake driver (fake_cuda.c). Never a
 * stand-in for the GPU: tests/gpu checks clc against the real CUPTI.
 *
 * The fake driver tells it of each launch that ran, inside the call, and through which entry
 * point (fake_cuda_set_cupti). Each gets a new correlation id; the subscriber, when it enabled
 * the driver callback of that entry point's id (CUPTI_DRIVER_TRACE_CBID_*), is called with it
 * (enter, then exit); with kernel records enabled, a record of the same correlation id and GPU
 * time FAKE_CUPTI_NS + grid x + block x ns (default 1000 + ...) waits in a list until a flush
 * (cuptiActivityFlushAll, a buffer's worth waiting, or every FlushPeriod ms on a thread of the
 * fake's own, as CUPTI's worker does) hands it over in a buffer from the client. It says
 * `fake_cupti: loaded` on stderr when loaded.
 *
 *   FAKE_CUPTI_REFUSE=1  cuptiSubscribe fails: another tool holds CUPTI
 *   FAKE_CUPTI_LOSE=N    every Nth kernel record is never delivered
 *   FAKE_CUPTI_ZERO=N    every Nth kernel record has no timestamps (0), as CUPTI's when it could
 *                        not take them
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cupti_abi.h"

typedef int CUptiResult;
typedef void (*requested_fn)(uint8_t **, size_t *, size_t *);
typedef void (*completed_fn)(void *, uint32_t, uint8_t *, size_t, size_t);
typedef void (*callback_fn)(void *, uint32_t, uint32_t, const void *);

/* CUPTI's structures as the shim declares them (tests/unit/test_cupti_abi.py holds those to
 * NVIDIA's headers); a kernel record as long as CUpti_ActivityKernel10 */
typedef struct {
    clc_cupti_kernel k;
    uint8_t rest[120];
} kernel_record;
typedef clc_cupti_callback_data callback_data;

typedef struct rec {
    struct rec *next;
    kernel_record k;
} rec;

static requested_fn g_requested;
static completed_fn g_completed;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static rec *g_head, **g_tail = &g_head;
static uint32_t g_correlation;
static uint64_t g_clock = 1000000, g_made, g_pending;
static int g_kernels, g_subscribed;
static unsigned char g_driver_callbacks[1024]; /* by driver callback id: enabled */
/* fake_cuda.c's entry points, in its enum's order: their callback ids */
static const int g_cbid_of_entry[] = {307, 442, 652, 653, 477, 478};

__attribute__((constructor)) static void say_loaded(void)
{
    fputs("fake_cupti: loaded\n", stderr);
}
static callback_fn g_callback;
static void *g_userdata;

CUptiResult cuptiActivityFlushAll(uint32_t flag);

static void launched(unsigned gx, unsigned bx, int entry)
{
    const char *base = getenv("FAKE_CUPTI_NS"), *lose = getenv("FAKE_CUPTI_LOSE");
    const char *zero = getenv("FAKE_CUPTI_ZERO");
    int cbid = entry >= 0 && entry < (int)(sizeof g_cbid_of_entry / sizeof *g_cbid_of_entry)
                   ? g_cbid_of_entry[entry]
                   : 0;
    uint64_t ns = (base ? strtoull(base, NULL, 10) : 1000) + gx + bx;
    pthread_mutex_lock(&g_lock);
    callback_data d = {.correlation = ++g_correlation, .function_name = "cuLaunchKernel"};
    callback_fn callback = g_subscribed && cbid && g_driver_callbacks[cbid] ? g_callback : NULL;
    void *userdata = g_userdata;
    rec *k = NULL;
    if (g_kernels && !(lose && (g_made + 1) % strtoull(lose, NULL, 10) == 0)) {
        k = calloc(1, sizeof *k);
        k->k.k.kind = CLC_CUPTI_KIND_CONCURRENT_KERNEL;
        k->k.k.start = g_clock;
        k->k.k.end = g_clock += ns;
        k->k.k.grid[0] = (int32_t)gx;
        k->k.k.block[0] = (int32_t)bx;
        k->k.k.correlation = d.correlation;
        if (zero && (g_made + 1) % strtoull(zero, NULL, 10) == 0)
            k->k.k.start = k->k.k.end = 0;
    }
    if (g_kernels)
        g_made++;
    pthread_mutex_unlock(&g_lock);
    if (callback) {
        d.site = CLC_CUPTI_API_ENTER;
        callback(userdata, CLC_CUPTI_DOMAIN_DRIVER, (uint32_t)cbid, &d);
        d.site = CLC_CUPTI_API_EXIT;
        callback(userdata, CLC_CUPTI_DOMAIN_DRIVER, (uint32_t)cbid, &d);
    }
    if (!k)
        return;
    pthread_mutex_lock(&g_lock);
    k->next = NULL;
    *g_tail = k;
    g_tail = &k->next;
    int full = ++g_pending >= 4096; /* a buffer's worth: CUPTI hands a full buffer back */
    pthread_mutex_unlock(&g_lock);
    if (full)
        cuptiActivityFlushAll(0);
}

/* Tells the fake driver to call `launched`, once there is a client. */
static void hook_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void (*set)(void (*)(unsigned, unsigned, int)) =
        h ? (void (*)(void (*)(unsigned, unsigned, int)))dlsym(h, "fake_cuda_set_cupti") : NULL;
    if (set)
        set(launched);
}

CUptiResult cuptiSubscribe(void **subscriber, callback_fn callback, void *userdata)
{
    if (getenv("FAKE_CUPTI_REFUSE") || g_subscribed)
        return 39; /* CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED */
    g_subscribed = 1;
    g_callback = callback;
    g_userdata = userdata;
    *subscriber = &g_subscribed;
    hook_driver();
    return 0;
}

CUptiResult cuptiUnsubscribe(void *subscriber)
{
    if (subscriber != &g_subscribed || !g_subscribed)
        return 1;
    g_subscribed = 0;
    memset(g_driver_callbacks, 0, sizeof g_driver_callbacks);
    return 0;
}

CUptiResult cuptiEnableCallback(uint32_t enable, void *subscriber, uint32_t domain, uint32_t cbid)
{
    if (subscriber != &g_subscribed || !g_subscribed)
        return 1;
    if (domain == CLC_CUPTI_DOMAIN_DRIVER && cbid < sizeof g_driver_callbacks)
        g_driver_callbacks[cbid] = (unsigned char)enable;
    return 0;
}

CUptiResult cuptiActivityRegisterCallbacks(requested_fn requested, completed_fn completed)
{
    g_requested = requested;
    g_completed = completed;
    return 0;
}

CUptiResult cuptiActivityEnable(uint32_t kind)
{
    if (kind == 10)
        g_kernels = 1;
    hook_driver();
    return 0;
}

CUptiResult cuptiActivityDisable(uint32_t kind)
{
    if (kind == 10)
        g_kernels = 0;
    return 0;
}

CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    pthread_mutex_lock(&g_lock);
    rec *list = g_head;
    g_head = NULL;
    g_tail = &g_head;
    g_pending = 0;
    requested_fn requested = g_requested;
    completed_fn completed = g_completed;
    pthread_mutex_unlock(&g_lock);
    while (list && requested) {
        uint8_t *buf;
        size_t size, max, used = 0;
        requested(&buf, &size, &max);
        while (list && used + sizeof list->k <= size) {
            memcpy(buf + used, &list->k, sizeof list->k);
            used += sizeof list->k;
            rec *next = list->next;
            free(list);
            list = next;
        }
        completed(NULL, 0, buf, size, used);
    }
    return 0;
}

static unsigned g_period_ms;
static void *flusher(void *arg)
{
    for (;;) {
        usleep(g_period_ms * 1000);
        cuptiActivityFlushAll(0);
    }
    return arg;
}

CUptiResult cuptiActivityFlushPeriod(uint32_t ms)
{
    pthread_t t;
    if (!ms || g_period_ms)
        return 0;
    g_period_ms = ms;
    return pthread_create(&t, NULL, flusher, NULL) ? 1 : 0;
}

/* Records follow one another, each a kernel record. */
CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, uint32_t **record)
{
    size_t at = *record ? (size_t)((uint8_t *)*record - buffer) + sizeof(kernel_record) : 0;
    if (at >= valid)
        return 3; /* CUPTI_ERROR_MAX_LIMIT_REACHED */
    *record = (uint32_t *)(buffer + at);
    return 0;
}

CUptiResult cuptiActivityGetNumDroppedRecords(void *ctx, uint32_t stream, size_t *dropped)
{
    *dropped = 0;
    return 0;
}
