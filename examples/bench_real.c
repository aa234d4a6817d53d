// SPDX-License-Identifier: Apache-2.0
//
// libbench_real.so: finds libcuda's own functions for bench_inproc, past the shim.
//
// bench_inproc links this library before libcuda, so in the program's search order it comes
// after the preloaded shim and right before libcuda: dlsym(RTLD_NEXT) called from here finds
// libcuda's definition. The shim's dlsym passes RTLD_NEXT lookups on as a tail call, so glibc
// still sees this library as the caller.
#define _GNU_SOURCE
#include <dlfcn.h>

void *bench_real_symbol(const char *name) {
    void *p = dlsym(RTLD_NEXT, name);
    // Keep the call out of tail position: the caller glibc sees must be this library.
    __asm__ volatile("" ::: "memory");
    return p;
}
