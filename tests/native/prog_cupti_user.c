/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_cupti_user [BEFORE AFTER]: a program that uses CUPTI itself, as torch.profiler does,
 * linked with -lcupti (the fake, fake_cupti.c) and -lcuda. It launches vecAdd BEFORE times
 * (20), then becomes CUPTI's client (cuptiSubscribe with a callback of its own on the driver's
 * launches, its own activity buffers, kernel records), launches vecAdd AFTER times (10),
 * flushes, and prints what CUPTI gave it: `records kernel=K callbacks=C`.
 */
#include "common.h"

#include <stdint.h>

typedef int CUptiResult;
typedef void (*callback_fn)(void *, uint32_t, uint32_t, const void *);
CUptiResult cuptiSubscribe(void **subscriber, callback_fn callback, void *userdata);
CUptiResult cuptiEnableCallback(uint32_t enable, void *subscriber, uint32_t domain,
                                uint32_t cbid);
CUptiResult cuptiActivityRegisterCallbacks(void (*)(uint8_t **, size_t *, size_t *),
                                           void (*)(CUcontext, uint32_t, uint8_t *, size_t,
                                                    size_t));
CUptiResult cuptiActivityEnable(uint32_t kind);
CUptiResult cuptiActivityFlushAll(uint32_t flag);
CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, uint32_t **record);

static long kernels, callbacks;

static void on_api(void *userdata, uint32_t domain, uint32_t cbid, const void *data)
{
    (void)userdata, (void)domain, (void)cbid;
    if (*(const uint32_t *)data == 0) /* CUPTI_API_ENTER */
        callbacks++;
}

static void requested(uint8_t **buffer, size_t *size, size_t *max)
{
    *size = 1 << 20;
    *buffer = aligned_alloc(8, *size);
    *max = 0;
}

static void completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    uint32_t *r = NULL;
    (void)ctx, (void)stream, (void)size;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == 0)
        if (r[0] == 10)
            kernels++;
    free(buffer);
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule app;
    CUfunction vecadd;
    void *subscriber;
    float a = 1.0f;
    int n = 1024;
    void *args[] = {&a, &a, &a, &n};
    long before = argc > 1 ? atol(argv[1]) : 20, after = argc > 2 ? atol(argv[2]) : 10;

    start_program();
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadFatBinary(&app, make_fatbin(APP_PTX)));
    CHECK(cuModuleGetFunction(&vecadd, app, K_VECADD));
    for (long i = 0; i < before; i++)
        CHECK(cuLaunchKernel(vecadd, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    if (cuptiSubscribe(&subscriber, on_api, NULL) != 0 ||
        cuptiEnableCallback(1, subscriber, 1, 307) != 0 ||
        cuptiActivityRegisterCallbacks(requested, completed) != 0 || cuptiActivityEnable(10)) {
        printf("FAILED: CUPTI refused the program\n");
        return 1;
    }
    for (long i = 0; i < after; i++)
        CHECK(cuLaunchKernel(vecadd, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CHECK(cuCtxSynchronize());
    cuptiActivityFlushAll(1);
    printf("records kernel=%ld callbacks=%ld\n", kernels, callbacks);
    CHECK(cuCtxDestroy(ctx));
    return 0;
}
