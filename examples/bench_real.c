// SPDX-License-Identifier: Apache-2.0
//
// libbench_real.so: finds libcuda's own functions for bench_inproc, past the shim.
//
// bench_inproc links this library before libcuda, so in the program's search order it comes
// after the preloaded shim and right before libcuda: RTLD_NEXT from here means libcuda. The
// shim answers every lookup of a name it exports with its own (dlsym(RTLD_NEXT,
// "cuLaunchKernel"), libc's dlsym taken by dlvsym or from libc's handle...), so that no library
// steps past it by the loader's ordinary means. This library does what code written to defeat
// clc would: it reads libc's own dlsym out of libc's dynamic symbol table, a deliberate way past
// the shim, for measuring it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uintptr_t base;
    void *found;
} lookup;

// libc's definition of "dlsym" (its default version), from libc's own symbol table.
static int find_dlsym(struct dl_phdr_info *info, size_t size, void *arg) {
    lookup *q = arg;
    if (info->dlpi_addr != q->base) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Half) *versym = NULL;
    size_t count = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
        for (const ElfW(Dyn) *d = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
             d->d_tag != DT_NULL; d++) {
            if (d->d_tag == DT_SYMTAB) symtab = (const void *)d->d_un.d_ptr;
            if (d->d_tag == DT_STRTAB) strtab = (const void *)d->d_un.d_ptr;
            if (d->d_tag == DT_VERSYM) versym = (const void *)d->d_un.d_ptr;
        }
    }
    // The symbol table ends where the string table begins, in glibc's layout.
    if (symtab && strtab && (const char *)symtab < strtab)
        count = (size_t)(strtab - (const char *)symtab) / sizeof *symtab;
    for (size_t i = 0; i < count; i++) {
        if (symtab[i].st_shndx == SHN_UNDEF || strcmp(strtab + symtab[i].st_name, "dlsym") != 0)
            continue;
        if (versym && (versym[i] & 0x8000)) continue; // a hidden, older version
        q->found = (void *)(info->dlpi_addr + symtab[i].st_value);
        return 1;
    }
    return 1;
}

void *bench_real_symbol(const char *name) {
    Dl_info where;
    lookup q = {0, NULL};
    // gnu_get_libc_version is libc's alone: where it lies is libc.
    if (dladdr((void *)&gnu_get_libc_version, &where)) q.base = (uintptr_t)where.dli_fbase;
    dl_iterate_phdr(find_dlsym, &q);
    void *(*libc_dlsym)(void *, const char *) = (void *(*)(void *, const char *))q.found;
    void *p = libc_dlsym ? libc_dlsym(RTLD_NEXT, name) : NULL;
    // Keep the call out of tail position: the caller glibc sees must be this library.
    __asm__ volatile("" ::: "memory");
    return p;
}
