// SPDX-License-Identifier: Apache-2.0
//
// libbench_real.so: finds libcuda's own functions for bench_inproc, past the shim.
//
// bench_inproc links this library before libcuda, so in the program's search order it comes
// after the preloaded shim and right before libcuda: RTLD_NEXT from here means libcuda. The
// shim answers dlsym(RTLD_NEXT, "cuLaunchKernel") with its hook, whoever asks (so that no
// library escapes it that way), so this library asks libc's own dlsym, found with dlvsym: a
// deliberate way past the shim, for measuring it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

void *bench_real_symbol(const char *name) {
    void *(*libc_dlsym)(void *, const char *) = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!libc_dlsym) libc_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    void *p = libc_dlsym ? libc_dlsym(RTLD_NEXT, name) : NULL;
    // Keep the call out of tail position: the caller glibc sees must be this library.
    __asm__ volatile("" ::: "memory");
    return p;
}
