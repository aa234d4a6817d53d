/* SPDX-License-Identifier: Apache-2.0
 *
 * elf_dynamic.h: what the shim reads from the dynamic section of a loaded object: its symbol
 * table (libc's own dlsym and dlvsym are found there, real.c) and its relocations (the GOT
 * entries of libraries opened with RTLD_DEEPBIND, dlopen.c). Header-only: both use this one copy.
 */
#ifndef CLC_ELF_DYNAMIC_H
#define CLC_ELF_DYNAMIC_H

#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const ElfW(Dyn) *dynamic;        /* the section itself (a link_map's l_ld) */
    const ElfW(Sym) *symtab;
    const char *strtab;
    const uint32_t *gnu_hash;
    const uint16_t *versym;
    const ElfW(Rela) *rela, *jmprel; /* DT_RELA; DT_JMPREL when DT_PLTREL says RELA, else NULL */
    size_t rela_size, jmprel_size;   /* bytes */
} clc_dynamic;

/* The object's dynamic section, from its program headers; NULL when it has none. */
static inline const ElfW(Dyn) *clc_dynamic_section(const struct dl_phdr_info *info) {
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            return (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    return NULL;
}

/* Reads the dynamic section `dyn` of the object loaded at `base`; 0 when it has no symbols. */
static inline int clc_read_dynamic(ElfW(Addr) base, const ElfW(Dyn) *dyn, clc_dynamic *d) {
    uintptr_t jmprel = 0;
    ElfW(Xword) pltrel = 0;
    memset(d, 0, sizeof *d);
    d->dynamic = dyn;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        uintptr_t v = dyn->d_un.d_ptr;
        if (v < base) v += base; /* not relocated in place (read-only) */
        switch (dyn->d_tag) {
        case DT_SYMTAB: d->symtab = (const ElfW(Sym) *)v; break;
        case DT_STRTAB: d->strtab = (const char *)v; break;
        case DT_GNU_HASH: d->gnu_hash = (const uint32_t *)v; break;
        case DT_VERSYM: d->versym = (const uint16_t *)v; break;
        case DT_RELA: d->rela = (const ElfW(Rela) *)v; break;
        case DT_RELASZ: d->rela_size = dyn->d_un.d_val; break;
        case DT_JMPREL: jmprel = v; break;
        case DT_PLTRELSZ: d->jmprel_size = dyn->d_un.d_val; break;
        case DT_PLTREL: pltrel = dyn->d_un.d_val; break;
        }
    }
    if (pltrel == DT_RELA)
        d->jmprel = (const ElfW(Rela) *)jmprel;
    else
        d->jmprel_size = 0;
    return d->symtab && d->strtab;
}

static inline uint32_t clc_gnu_hash(const char *s) {
    uint32_t h = 5381;
    for (; *s; s++) h = h * 33 + (unsigned char)*s;
    return h;
}

/* The index in d's symbol table of the definition of `name`, its default version where there
 * are several (the one a plain lookup binds to); 0 when the object does not define it. */
static inline uint32_t clc_gnu_lookup(const clc_dynamic *d, const char *name) {
    const uint32_t *h = d->gnu_hash;
    if (!h) return 0;
    enum { BITS = 8 * sizeof(ElfW(Addr)) };
    uint32_t nbuckets = h[0], symoffset = h[1], bloom_size = h[2], shift = h[3];
    const ElfW(Addr) *bloom = (const ElfW(Addr) *)(h + 4);
    const uint32_t *buckets = (const uint32_t *)(bloom + bloom_size);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t hash = clc_gnu_hash(name);
    ElfW(Addr) word = bloom[(hash / BITS) % bloom_size];
    if (!((word >> (hash % BITS)) & (word >> ((hash >> shift) % BITS)) & 1)) return 0;
    for (uint32_t i = buckets[hash % nbuckets]; i >= symoffset; i++) {
        uint32_t ch = chain[i - symoffset];
        const ElfW(Sym) *sym = &d->symtab[i];
        if ((ch | 1) == (hash | 1) && strcmp(d->strtab + sym->st_name, name) == 0 &&
            sym->st_value && !(d->versym && (d->versym[i] & 0x8000)))
            return i;
        if (ch & 1) break;
    }
    return 0;
}

/* One past the last symbol that d's GNU hash table holds (the defined ones start at h[1]). */
static inline uint32_t clc_gnu_symbol_count(const clc_dynamic *d) {
    const uint32_t *h = d->gnu_hash;
    if (!h) return 0;
    uint32_t nbuckets = h[0], symoffset = h[1];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(h + 4) + h[2]);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t b = 0; b < nbuckets; b++)
        if (buckets[b] > last) last = buckets[b];
    if (last < symoffset) return symoffset;
    while (!(chain[last - symoffset] & 1)) last++;
    return last + 1;
}

#endif /* CLC_ELF_DYNAMIC_H */
