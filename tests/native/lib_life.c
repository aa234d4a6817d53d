/* SPDX-License-Identifier: Apache-2.0 */
/*
 * liblife.so: a library of prog_life's whose constructor and destructor reach the driver, at
 * the edges of the program's life. glibc runs the constructors of a program's libraries before
 * those of LD_PRELOAD libraries, and their destructors after.
 *
 *   LIFE_CTOR=launch  the constructor loads a module and launches debug_kernel LIFE_CTOR_N times
 *   LIFE_CTOR=load    the constructor only loads a module
 *   LIFE_DTOR=launch  the destructor launches debug_kernel LIFE_DTOR_N times
 *
 * Each launch prints "launch debug_kernel via ctor|dtor -> <rc>".
 */
#include "common.h"

static CUfunction g_debug;

static int env_count(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : 0;
}

static void launch_debug(const char *via, int n)
{
    for (int i = 0; i < n; i++)
        report_launch("debug_kernel", via, cuLaunchKernel(g_debug, 1, 1, 1, 32, 1, 1, 0, NULL,
                                                          NULL, NULL));
}

__attribute__((constructor)) static void life_ctor(void)
{
    const char *mode = getenv("LIFE_CTOR");
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    if (!mode || !*mode)
        return;
    start_program();
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX_HEADER PTX_ENTRY("debug_kernel")));
    CHECK(cuModuleGetFunction(&g_debug, mod, "debug_kernel"));
    if (strcmp(mode, "launch") == 0)
        launch_debug("ctor", env_count("LIFE_CTOR_N"));
}

/* Called by prog_life once it has a context, for the destructor's launches. */
void life_set_function(CUfunction f) { g_debug = f; }

__attribute__((destructor)) static void life_dtor(void)
{
    const char *mode = getenv("LIFE_DTOR");
    if (mode && strcmp(mode, "launch") == 0 && g_debug)
        launch_debug("dtor", env_count("LIFE_DTOR_N"));
}
