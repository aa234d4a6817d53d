/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_stdin_thread: a program with a thread blocked reading stdin (holding stdin's lock) when
 * main returns after one launch. Whatever clc does at exit must not wait for that lock.
 */
#include "common.h"

#include <pthread.h>
#include <unistd.h>

static void *reader(void *arg)
{
    char buf[64];
    (void)arg;
    if (!fgets(buf, sizeof buf, stdin))
        return NULL;
    return NULL;
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule app;
    CUfunction vecadd;
    float a = 1.0f;
    int n = 16;
    void *args[] = {&a, &a, &a, &n};
    pthread_t t;
    start_program();
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadFatBinary(&app, make_fatbin(APP_PTX)));
    CHECK(cuModuleGetFunction(&vecadd, app, K_VECADD));
    if (pthread_create(&t, NULL, reader, NULL))
        return 1;
    usleep(100000);
    report("launch", K_VECADD, "cuLaunchKernel",
           cuLaunchKernel(vecadd, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    printf("main returns\n");
    return 0;
}
