/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_priority: a program driven line by line from stdin, so that a test can play a
 * latency-critical and a best-effort process against each other. Entry points come from
 * cuGetProcAddress as in cudart 13 (cuCtxSynchronize names the context). Commands:
 *
 *   launch N [s]   N launches of vecAdd on the default stream, or with "s" on a stream of its own
 *   ptsz N         N launches through cuLaunchKernel_ptsz on the per-thread default stream
 *   sync ctx       cuCtxSynchronize(NULL)
 *   sync stream|s  cuStreamSynchronize of the default stream, or of its own stream
 *   query stream|s cuStreamQuery of one of them
 *   sleep MS
 *   exit
 *
 * After each command it prints "done <command word> <ms since start, 3 decimals> rc=<first
 * failing CUresult or 0>" and flushes, so that the test sees when a held launch returned. After
 * a launch command it prints first where the last launch ran (print_green: over the fake, the
 * first SM and how many).
 */
#include "common.h"

#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(void)
{
    struct cudart rt;
    char line[256], word[32], arg[32];
    CUstream own;
    double t0 = now_ms();

    start_program();
    cudart_start(&rt, CUDART_RETAIN | CUDART_SET_CURRENT | CUDART_CLEANUP);
    RESOLVE(launch, cuLaunchKernel, RT_VERSION, 0);
    __typeof__(&cuLaunchKernel) launch_ptsz = resolve("cuLaunchKernel", RT_VERSION, PTSZ);
    RESOLVE(stream_create, cuStreamCreate, RT_VERSION, 0);
    RESOLVE(stream_sync, cuStreamSynchronize, RT_VERSION, 0);
    RESOLVE(stream_query, cuStreamQuery, RT_VERSION, 0);
    CUfunction k = (CUfunction)cudart_kernel(&rt, K_VECADD);
    CHECK(stream_create(&own, 0));
    float a = 1.0f;
    int n = 256;
    void *args[] = {&a, &a, &a, &n};

    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        int count = 0, got = sscanf(line, "%31s %31s", word, arg);
        CUresult rc = CUDA_SUCCESS, r;
        if (got < 1)
            continue;
        if (strcmp(word, "launch") == 0 || strcmp(word, "ptsz") == 0) {
            int on_own = strstr(line + strlen(word) + 1, " s") != NULL;
            count = got > 1 ? atoi(arg) : 1;
            for (int i = 0; i < count; i++) {
                r = word[0] == 'p'
                        ? launch_ptsz(k, 2, 1, 1, 64, 1, 1, 0, NULL, args, NULL)
                        : launch(k, 2, 1, 1, 64, 1, 1, 0, on_own ? own : NULL, args, NULL);
                if (r != CUDA_SUCCESS && rc == CUDA_SUCCESS)
                    rc = r;
            }
        } else if (strcmp(word, "sync") == 0 && got > 1 && strcmp(arg, "ctx") == 0) {
            rc = rt.ctx_sync(NULL);
        } else if (strcmp(word, "sync") == 0) {
            rc = stream_sync(got > 1 && strcmp(arg, "s") == 0 ? own : NULL);
        } else if (strcmp(word, "query") == 0) {
            rc = stream_query(got > 1 && strcmp(arg, "s") == 0 ? own : NULL);
        } else if (strcmp(word, "sleep") == 0) {
            struct timespec t = {0, 0};
            long ms = got > 1 ? atol(arg) : 0;
            t.tv_sec = ms / 1000;
            t.tv_nsec = (ms % 1000) * 1000000L;
            nanosleep(&t, NULL);
        } else if (strcmp(word, "exit") == 0) {
            break;
        } else {
            printf("unknown %s\n", word);
            fflush(stdout);
            continue;
        }
        if (count)
            print_green(word, K_VECADD, rc);
        printf("done %s %.3f rc=%d\n", word, now_ms() - t0, (int)rc);
        fflush(stdout);
    }
    return 0;
}
