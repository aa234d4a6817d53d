/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_teardown [LAUNCHES]: tears its context down right after its last launch, without ever
 * synchronizing. Reaches the driver the way libcudart does (see prog_cudart.c): retains the
 * primary context, loads a library, launches vecAdd LAUNCHES times (default 10) through
 * cuLaunchKernel, then at once calls cuDevicePrimaryCtxRelease, asked for with version 12000
 * (the _v2 ABI), which destroys the context.
 *
 * On a real GPU, or over the fake driver with FAKE_CUDA_LAZY_EVENTS=1, that release also
 * destroys every event of the context: whatever a preloaded shim recorded around the launches
 * and did not read back before the release is gone (CUDA_ERROR_CONTEXT_IS_DESTROYED).
 *
 * With ROUNDS > 1 it retains the context again after each release (the same handle comes
 * back), so that events pooled from a torn-down context must not be reused.
 *
 * Output: one `launch ... -> <rc>` line per launch, `release -> <rc>` per round, the fake
 * counts.
 * Driver counts without a shim: vecAdd launches=LAUNCHES.
 */
#include "common.h"

int main(int argc, char **argv)
{
    struct cudart rt;
    CUcontext ctx;
    CUkernel k_vecadd;
    float a = 1.0f;
    int n = 1024, i, round, launches = 10, rounds = 1;
    void *args[] = {&a, &a, &a, &n};

    if ((argc > 1 && (launches = atoi(argv[1])) < 0) ||
        (argc > 2 && (rounds = atoi(argv[2])) < 1)) {
        fprintf(stderr, "usage: %s [LAUNCHES [ROUNDS]]\n", argv[0]);
        return 2;
    }
    start_program();
    /* No context yet: each round below retains the primary context itself. */
    cudart_start(&rt, 0);
    RESOLVE(launch, cuLaunchKernel, RT_VERSION, 0);
    /* cuDevicePrimaryCtxRelease is cuDevicePrimaryCtxRelease_v2 from CUDA 11.0 on. */
    RESOLVE(primary_release, cuDevicePrimaryCtxRelease, ABI_VERSION, 0);
    k_vecadd = cudart_kernel(&rt, K_VECADD);

    /* Each round retains the primary context again: the same handle, a new context. */
    for (round = 0; round < rounds; round++) {
        CHECK(rt.primary_retain(&ctx, rt.dev));
        CHECK(rt.set_current(ctx));
        for (i = 0; i < launches; i++)
            report_launch(K_VECADD, "cuLaunchKernel",
                          launch((CUfunction)k_vecadd, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
        /* No synchronization: the launches may still be running when the context goes. */
        printf("release -> %d\n", (int)primary_release(rt.dev));
    }
    print_fake_counts();
    return 0;
}
