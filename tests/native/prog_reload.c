/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_reload: loads a kernel, launches it, unloads it, and again, CYCLES times, alternating
 * two kernels that each write their own value (ok_kernel 1, debug_kernel 2) into a buffer. The
 * driver gives the next load the unloaded kernel's handle, so a decision kept by handle would
 * apply to the wrong kernel. Built against the fake driver for CI and against the real one on
 * the GPU (tests/gpu), from this one source.
 *
 *   prog_reload module|library|keep CYCLES [debug-first] [check] [own-file=PATH]
 *
 * module: cuModuleLoadData / cuModuleGetFunction / cuModuleUnload; library: cuLibraryLoadData /
 * cuLibraryGetKernel (the CUkernel launched, as cudart does) / cuLibraryUnload; keep: modules
 * that are never unloaded (CYCLES live kernels). `check` reads the buffer back after each
 * launch (a real GPU runs the kernels; the fake does not). `own-file=PATH`: halfway, the program
 * closes descriptors 3..1023 (as daemons do), opens PATH as its own file, writes 8 bytes, and
 * waits 300 ms (long enough for clc to flush), then carries on; at exit it prints PATH's size
 * (own-file-size=N). Prints one line per launch of the
 * first 8 cycles and a summary:
 *
 *   summary cycles=N reused=R ok_ran=A ok_refused=B debug_ran=C debug_refused=D wrong=W
 *
 * reused: cycles whose handle was the previous cycle's; wrong: launches that returned success
 * but left another value than their kernel's (checked runs only).
 */
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define N 256

#define PTX_KERNEL(name, value)                                                                    \
    ".version 8.0\n.target sm_90\n.address_size 64\n"                                              \
    ".visible .entry " name "(\n\t.param .u64 out,\n\t.param .u32 n\n)\n{\n"                       \
    "\t.reg .pred %p<2>;\n\t.reg .b32 %r<6>;\n\t.reg .b64 %rd<5>;\n"                              \
    "\tld.param.u64 %rd1, [out];\n\tld.param.u32 %r1, [n];\n"                                      \
    "\tmov.u32 %r2, %ctaid.x;\n\tmov.u32 %r3, %ntid.x;\n\tmov.u32 %r4, %tid.x;\n"                  \
    "\tmad.lo.s32 %r5, %r2, %r3, %r4;\n\tsetp.ge.s32 %p1, %r5, %r1;\n\t@%p1 bra DONE;\n"           \
    "\tcvta.to.global.u64 %rd2, %rd1;\n\tmul.wide.s32 %rd3, %r5, 4;\n"                             \
    "\tadd.s64 %rd4, %rd2, %rd3;\n\tst.global.u32 [%rd4], " #value ";\n"                           \
    "DONE:\n\tret;\n}\n"

static const char *const PTX[2] = {PTX_KERNEL("ok_kernel", 1), PTX_KERNEL("debug_kernel", 2)};
static const char *const NAMES[2] = {"ok_kernel", "debug_kernel"};

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            printf("FAILED %s -> %d (line %d)\n", #call, (int)rc_, __LINE__);                      \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s module|library|keep CYCLES [debug-first] [check]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    long cycles = atol(argv[2]);
    int first = 0, check = 0, own = -1;
    const char *own_path = NULL;
    for (int i = 3; i < argc; i++) {
        if (strncmp(argv[i], "own-file=", 9) == 0)
            own_path = argv[i] + 9;
        else if (strcmp(argv[i], "debug-first") == 0)
            first = 1;
        else if (strcmp(argv[i], "check") == 0)
            check = 1;
    }
    int library = strcmp(mode, "library") == 0, keep = strcmp(mode, "keep") == 0;
    setvbuf(stdout, NULL, _IOLBF, 0);

    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr buf;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&buf, N * sizeof(int)));

    long ran[2] = {0, 0}, refused[2] = {0, 0}, wrong = 0, reused = 0;
    void *prev = NULL;
    int host[N];
    for (long c = 0; c < cycles; c++) {
        int k = (int)((c + first) % 2);
        if (own_path && c == cycles / 2) {
            for (int fd = 3; fd < 1024; fd++)
                close(fd);
            own = open(own_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (own < 0 || write(own, "my data\n", 8) != 8) {
                printf("FAILED opening %s\n", own_path);
                return 1;
            }
            struct timespec pause = {0, 300 * 1000000L};
            nanosleep(&pause, NULL);
        }
        CUmodule mod = NULL;
        CUlibrary lib = NULL;
        CUfunction f;
        if (library) {
            CUkernel kern;
            CHECK(cuLibraryLoadData(&lib, PTX[k], NULL, NULL, 0, NULL, NULL, 0));
            CHECK(cuLibraryGetKernel(&kern, lib, NAMES[k]));
            f = (CUfunction)kern;
        } else {
            CHECK(cuModuleLoadData(&mod, PTX[k]));
            CHECK(cuModuleGetFunction(&f, mod, NAMES[k]));
        }
        reused += c > 0 && (void *)f == prev;
        prev = (void *)f;
        CHECK(cuMemsetD32(buf, 0, N));
        int n = N;
        void *args[] = {&buf, &n};
        CUresult rc = cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL);
        int value = -1;
        if (rc == CUDA_SUCCESS) {
            ran[k]++;
            if (check) {
                CHECK(cuCtxSynchronize());
                CHECK(cuMemcpyDtoH(host, buf, sizeof host));
                value = host[0];
                for (int i = 0; i < N; i++)
                    if (host[i] != k + 1) {
                        wrong++;
                        value = host[i];
                        break;
                    }
            }
        } else {
            refused[k]++;
        }
        if (c < 8)
            printf("launch %ld %s handle=%p rc=%d value=%d\n", c, NAMES[k], prev, (int)rc, value);
        if (library)
            CHECK(cuLibraryUnload(lib));
        else if (!keep)
            CHECK(cuModuleUnload(mod));
    }
    CHECK(cuCtxSynchronize());
    printf("summary cycles=%ld reused=%ld ok_ran=%ld ok_refused=%ld debug_ran=%ld "
           "debug_refused=%ld wrong=%ld\n",
           cycles, reused, ran[0], refused[0], ran[1], refused[1], wrong);
    CHECK(cuMemFree(buf));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    if (own >= 0) {
        struct stat st;
        fstat(own, &st);
        printf("own-file-size=%lld\n", (long long)st.st_size);
    }
    return 0;
}
