/* SPDX-License-Identifier: Apache-2.0
 *
 * dlopen.c: libraries opened with RTLD_DEEPBIND reach the hooks too.
 *
 * A library opened with RTLD_DEEPBIND looks its symbols up in its own dependencies before the
 * global scope, so its references to cuLaunchKernel bind to libcuda and not to the hook that
 * LD_PRELOAD put first in that scope: its launches would never be decided (nor its dlsym
 * lookups answered with hooks, nor its children given clc's settings by the exec hooks). The
 * shim's dlopen lets libc do such a load as asked, then points every reference that deep binding
 * bound to the next definition of a symbol the shim exports back at the shim's own, as the global
 * scope would have: a walk over the relocations (GOT entries) of every object of the program.
 * Any other dlopen is libc's own, reached by a tail call.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/elf_dynamic.h"
#include "entry.h"

typedef void *(*dlopen_fn)(const char *, int);
static dlopen_fn real_dlopen;

__attribute__((noinline)) static dlopen_fn resolve_dlopen(void) {
    dlopen_fn f = (dlopen_fn)clc_next_symbol("dlopen");
    __atomic_store_n(&real_dlopen, f, __ATOMIC_RELEASE);
    return f;
}

#if defined(__x86_64__)
#define CLC_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define CLC_R_GLOB_DAT R_X86_64_GLOB_DAT
#define CLC_R_ABS R_X86_64_64
#define CLC_EM EM_X86_64
#elif defined(__aarch64__)
#define CLC_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define CLC_R_GLOB_DAT R_AARCH64_GLOB_DAT
#define CLC_R_ABS R_AARCH64_ABS64
#define CLC_EM EM_AARCH64
#endif
#if __ELF_NATIVE_CLASS == 64
#define CLC_R_TYPE ELF64_R_TYPE
#define CLC_R_SYM ELF64_R_SYM
#else
#define CLC_R_TYPE ELF32_R_TYPE
#define CLC_R_SYM ELF32_R_SYM
#endif

#ifdef CLC_EM
__attribute__((noinline)) static void *deep_open(dlopen_fn real, const char *file, int mode,
                                                 void *ret);
#else
/* Other architectures: their relocation types are not handled here. */
__attribute__((noinline)) static void deep_unhooked(void) {
    CLC_WARN_ONCE("a library opened with RTLD_DEEPBIND calls the driver directly "
                  "on this architecture: its launches are not hooked");
}
#endif

/* glibc's dlopen takes the object that called it from its return address (that object's RPATH
 * and RUNPATH, $ORIGIN, namespace), so a load without RTLD_DEEPBIND leaves as a tail call: libc
 * then sees the program's call, not the shim's. A deep-bound load is opened by deep_open, which
 * does the caller's part of the search itself. */
CLC_EXPORT void *dlopen(const char *file, int mode) {
    dlopen_fn real = __atomic_load_n(&real_dlopen, __ATOMIC_ACQUIRE);
    if (unlikely(!real) && !(real = resolve_dlopen())) return NULL;
#ifdef CLC_EM
    if (unlikely(mode & RTLD_DEEPBIND) && file && *file && !(mode & RTLD_NOLOAD))
        return deep_open(real, file, mode, __builtin_return_address(0));
#else
    if (unlikely(mode & RTLD_DEEPBIND)) deep_unhooked();
#endif
    return real(file, mode);
}

/* dlmopen into a namespace of its own makes a world the shim is not in: the objects there bind to
 * their own libc and driver, and their launches would never reach a hook. Under clc-run such a
 * load is refused (said once; dlerror says why); the program's own namespace is libc's to load
 * into as usual. */
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);
CLC_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode) {
    static dlmopen_fn real;
    if (unlikely(!real)) real = (dlmopen_fn)clc_next_symbol("dlmopen");
    if (lmid == LM_ID_BASE || !(g_cfg.configured || g_cfg.unsettled))
        return real ? real(lmid, file, mode) : NULL;
    CLC_WARN_ONCE("dlmopen of %s into a new link-map namespace was refused: clc's "
                  "hooks cannot reach a namespace of its own",
                  file ? file : "(null)");
    /* dlerror() then names the refusal. */
    clc_libc_dlopen("/clc: dlmopen into a new link-map namespace is refused (clc's hooks cannot "
                    "reach it)",
                    RTLD_LAZY | RTLD_NOLOAD);
    return NULL;
}

#ifdef CLC_EM

/* ---- the caller's file: what libc would open had the program called it ------------------ */

/* The shim's own link map (never unloaded). */
static struct link_map *self_map(void) {
    static struct link_map *_Atomic self;
    struct link_map *m = atomic_load_explicit(&self, memory_order_acquire);
    Dl_info where;
    if (!m && dladdr1((void *)&self_map, &where, (void **)&m, RTLD_DL_LINKMAP) && m)
        atomic_store_explicit(&self, m, memory_order_release);
    return m;
}

/* An object's library search list (RTLD_DI_SERINFO), malloc'd; NULL when unknown. */
static Dl_serinfo *search_list(struct link_map *map) {
    Dl_serinfo size, *list;
    if (dlinfo(map, RTLD_DI_SERINFOSIZE, &size) != 0 || !(list = malloc(size.dls_size)))
        return NULL;
    list->dls_size = size.dls_size;
    list->dls_cnt = size.dls_cnt;
    if (dlinfo(map, RTLD_DI_SERINFO, list) == 0) return list;
    free(list);
    return NULL;
}

/* Whether libc's search would take this file: an ELF object of the shim's class and machine
 * (it passes over a library built for another, a 32-bit one say, and searches on). */
static int loadable(const char *path) {
    ElfW(Ehdr) eh;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = pread(fd, &eh, sizeof eh, 0);
    close(fd);
    return n == (ssize_t)sizeof eh && memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
           eh.e_ident[EI_CLASS] == (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) &&
           eh.e_machine == CLC_EM;
}

/* `file` with $ORIGIN and ${ORIGIN} replaced by the caller's directory (for the program, whose
 * link map has no name, the executable's). */
static const char *expand_origin(const char *file, const struct link_map *caller, char *buf,
                                 size_t size) {
    char dir[PATH_MAX];
    ssize_t n = caller->l_name && caller->l_name[0]
                    ? snprintf(dir, sizeof dir, "%s", caller->l_name)
                    : readlink("/proc/self/exe", dir, sizeof dir - 1);
    char *slash;
    if (n <= 0 || (size_t)n >= sizeof dir) return file;
    dir[n] = '\0';
    if (!(slash = strrchr(dir, '/'))) return file;
    slash[slash == dir] = '\0'; /* "/libx.so" lies in "/" */
    size_t out = 0;
    for (const char *p = file; *p;) {
        size_t token =
            strncmp(p, "${ORIGIN}", 9) == 0                                                 ? 9
            : strncmp(p, "$ORIGIN", 7) == 0 && !isalnum((unsigned char)p[7]) && p[7] != '_' ? 7
                                                                                            : 0;
        size_t len = token ? strlen(dir) : 1;
        if (out + len >= size) return file;
        memcpy(buf + out, token ? dir : p, len);
        out += len;
        p += token ? token : 1;
    }
    buf[out] = '\0';
    return buf;
}

/* libc searches for a bare name in the calling object's RPATH, LD_LIBRARY_PATH and RUNPATH, then
 * in ld.so.cache and the default directories. Here libc sees the shim as its caller, so the shim
 * probes the caller's directories itself, up to those that its own list ends with as well (the
 * default ones): for those it passes the name as given, and libc searches the cache first, as it
 * would have. A name already loaded is passed as given: libc matches it before any search. */
static const char *caller_file(dlopen_fn real, const char *file, struct link_map *caller, char *buf,
                               size_t size) {
    if (strchr(file, '/')) return strchr(file, '$') ? expand_origin(file, caller, buf, size) : file;
    void *loaded = real(file, RTLD_LAZY | RTLD_NOLOAD);
    if (loaded) {
        dlclose(loaded);
        return file;
    }
    struct link_map *self = self_map();
    Dl_serinfo *mine = search_list(caller), *ours = self ? search_list(self) : NULL;
    const char *found = file;
    if (mine) {
        unsigned n = mine->dls_cnt, k = ours ? ours->dls_cnt : 0;
        while (n && k &&
               strcmp(mine->dls_serpath[n - 1].dls_name, ours->dls_serpath[k - 1].dls_name) == 0)
            n--, k--;
        for (unsigned i = 0; i < n && found == file; i++) {
            int len = snprintf(buf, size, "%s/%s", mine->dls_serpath[i].dls_name, file);
            if (len > 0 && (size_t)len < size && loadable(buf)) found = buf;
        }
    }
    free(mine);
    free(ours);
    return found;
}

/* ---- what deep binding bound, and what the global scope would have ------------------------ */

/* The shim's exports and, per symbol, the definition that deep binding gives instead of the
 * shim's: the next one (libc's for dlopen, dlsym and the exec family; the driver's for the hooked
 * entry points, once it is loaded). Found before a walk: these lookups take the loader's lock,
 * which the walk, inside dl_iterate_phdr, must not wait for. */
typedef struct {
    ElfW(Addr) base;
    clc_dynamic dyn;
    uint32_t first, count; /* the symbols in the GNU hash table: the defined ones */
    void *_Atomic *next;   /* per symbol; NULL: none known */
} exports;

static exports *_Atomic g_exports;
static const void *_Atomic g_cuda_dynamic; /* libcuda's dynamic section, once it is loaded */
static _Atomic int g_next_libc, g_next_driver;

static exports *load_exports(void) {
    exports *e = atomic_load_explicit(&g_exports, memory_order_acquire), *none = NULL;
    struct link_map *self;
    if (e || !(self = self_map()) || !(e = calloc(1, sizeof *e))) return e;
    e->base = self->l_addr;
    if (clc_read_dynamic(self->l_addr, self->l_ld, &e->dyn) && e->dyn.gnu_hash &&
        (e->count = clc_gnu_symbol_count(&e->dyn)) &&
        (e->next = calloc(e->count, sizeof *e->next))) {
        e->first = e->dyn.gnu_hash[1];
        if (atomic_compare_exchange_strong(&g_exports, &none, e)) return e;
    }
    free(e->next);
    free(e);
    return none;
}

static void prepare(dlopen_fn real) {
    exports *e = load_exports();
    if (!e) return;
    /* The driver's definitions only once it is loaded: a library that does not use the driver
     * must not load it. */
    void *cuda = NULL, *probe = real("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    struct link_map *cuda_map;
    if (probe) {
        dlclose(probe);
        cuda = clc_libcuda_handle();
    }
    int libc_done = atomic_load(&g_next_libc), driver_done = atomic_load(&g_next_driver);
    if (libc_done && (driver_done || !cuda)) return;
    void *(*sym)(void *, const char *) = (void *(*)(void *, const char *))clc_next_symbol("dlsym");
    for (uint32_t i = e->first; i < e->count; i++) {
        const char *name = e->dyn.strtab + e->dyn.symtab[i].st_name;
        int slot = clc_symbol_by_name(name);
        void *next = NULL;
        if (slot >= 0 && cuda && !driver_done && sym) {
            clc_real(slot); /* the pointer the hook calls: known before any call reaches it */
            next = sym(cuda, name);
        } else if (slot < 0 && !libc_done) {
            next = clc_next_symbol(name);
        }
        if (next) atomic_store_explicit(&e->next[i], next, memory_order_release);
    }
    atomic_store(&g_next_libc, 1);
    if (cuda && dlinfo(cuda, RTLD_DI_LINKMAP, &cuda_map) == 0) {
        atomic_store(&g_cuda_dynamic, cuda_map->l_ld);
        atomic_store(&g_next_driver, 1);
    }
}

/* ---- the walk --------------------------------------------------------------------------------
 * Over dl_iterate_phdr rather than the link map's l_next: it holds the loader's list lock (no
 * dlclose unmaps an object under the walk) and gives each object's program headers. */

/* A definition that deep binding may have given in place of the shim's, and the shim's own. */
typedef struct {
    ElfW(Addr) next, own;
} swap;

typedef struct {
    const exports *e;
    const void *cuda_dynamic;
    const struct link_map *first; /* the program's namespace, from its first object */
    uintptr_t page;
    unsigned written, failed;
    swap *swaps; /* sorted by next */
    size_t n_swaps;
} walk;

static int inside(const struct dl_phdr_info *info, ElfW(Addr) a) {
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type == PT_LOAD && a - (info->dlpi_addr + p->p_vaddr) < p->p_memsz) return 1;
    }
    return 0;
}

/* Objects of another namespace (dlmopen) bind to their own libc and driver: not the shim's. */
static int in_namespace(const struct link_map *first, const void *dynamic) {
    for (const struct link_map *m = first; m; m = m->l_next)
        if (m->l_ld == dynamic) return 1;
    return 0;
}

/* Writes a GOT entry. The page's protection comes from the program headers: its segment's, or
 * read-only where PT_GNU_RELRO covers the whole page (the loader protects those pages once it
 * has relocated the object, and leaves a last, partial one writable). */
static int write_got(const struct dl_phdr_info *info, ElfW(Addr) *got, ElfW(Addr) value,
                     uintptr_t pagesize) {
    uintptr_t a = (uintptr_t)got, page = a & ~(pagesize - 1);
    int prot = -1, relro = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + p->p_vaddr, end = start + p->p_memsz;
        if (p->p_type == PT_LOAD && a >= start && a < end)
            prot = (p->p_flags & PF_R ? PROT_READ : 0) | (p->p_flags & PF_W ? PROT_WRITE : 0) |
                   (p->p_flags & PF_X ? PROT_EXEC : 0);
        else if (p->p_type == PT_GNU_RELRO && page >= (start & ~(pagesize - 1)) &&
                 page < (end & ~(pagesize - 1)))
            relro = 1;
    }
    if (prot < 0) return 0;
    if (relro) prot = PROT_READ;
    int locked = !(prot & PROT_WRITE);
    if (locked && mprotect((void *)page, pagesize, prot | PROT_WRITE) != 0) return 0;
    __atomic_store_n(got, value, __ATOMIC_RELAXED);
    if (locked) mprotect((void *)page, pagesize, prot);
    return 1;
}

static void patch_relocs(const struct dl_phdr_info *info, const clc_dynamic *d,
                         const ElfW(Rela) *rel, size_t bytes, walk *w, int *ours) {
    const exports *e = w->e;
    for (size_t k = 0; rel && k < bytes / sizeof *rel; k++) {
        const ElfW(Rela) *r = &rel[k];
        ElfW(Xword) type = CLC_R_TYPE(r->r_info), index = CLC_R_SYM(r->r_info);
        if (!index || (type != CLC_R_JUMP_SLOT && type != CLC_R_GLOB_DAT && type != CLC_R_ABS))
            continue;
        const ElfW(Sym) *s = &d->symtab[index];
        if (s->st_shndx != SHN_UNDEF)
            continue; /* its own definition: deep binding changed nothing */
        uint32_t i = clc_gnu_lookup(&e->dyn, d->strtab + s->st_name);
        void *next = i ? atomic_load_explicit(&e->next[i], memory_order_acquire) : NULL;
        if (!next) continue;
        ElfW(Addr) *got = (ElfW(Addr) *)(info->dlpi_addr + r->r_offset);
        ElfW(Addr) v = __atomic_load_n(got, __ATOMIC_RELAXED);
        ElfW(Addr) to = e->base + e->dyn.symtab[i].st_value + r->r_addend;
        /* Bound to the next definition, or a PLT entry that lazy binding has not bound yet (it
         * still points into the object's own PLT). Any other value is left alone: bound
         * elsewhere on purpose, or not relocated yet (a plain load under way in another thread). */
        if (v == to ||
            (v != (ElfW(Addr))next + r->r_addend && !(type == CLC_R_JUMP_SLOT && inside(info, v))))
            continue;
        if (*ours < 0) *ours = in_namespace(w->first, d->dynamic);
        if (!*ours) return;
        if (write_got(info, got, to, w->page))
            w->written++;
        else
            w->failed++;
    }
}

static int by_next(const void *a, const void *b) {
    ElfW(Addr) x = ((const swap *)a)->next, y = ((const swap *)b)->next;
    return x < y ? -1 : x > y;
}

/* Every next definition known, with the shim's own: the values a deep-bound library may hold. */
static void collect_swaps(walk *w) {
    const exports *e = w->e;
    w->n_swaps = 0;
    if (!(w->swaps = malloc((e->count - e->first) * sizeof *w->swaps))) return;
    for (uint32_t i = e->first; i < e->count; i++) {
        void *next = atomic_load_explicit(&e->next[i], memory_order_acquire);
        if (next)
            w->swaps[w->n_swaps++] = (swap){(ElfW(Addr))next, e->base + e->dyn.symtab[i].st_value};
    }
    qsort(w->swaps, w->n_swaps, sizeof *w->swaps, by_next);
}

/* A pointer that a deep-bound library saved before the walk (its constructor runs inside
 * dlopen, while its references still lead past the shim) lies in its data: every word of its
 * writable segments that holds a definition the shim stands in for is pointed at the shim's. A
 * copy kept on the heap is not found. */
static void scan_data(const struct dl_phdr_info *info, walk *w) {
    for (int k = 0; k < info->dlpi_phnum && w->n_swaps; k++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[k];
        if (p->p_type != PT_LOAD || !(p->p_flags & PF_W)) continue;
        ElfW(Addr) *word = (ElfW(Addr) *)((info->dlpi_addr + p->p_vaddr + 7) & ~(uintptr_t)7);
        ElfW(Addr) *end = (ElfW(Addr) *)(info->dlpi_addr + p->p_vaddr + p->p_memsz);
        for (; word + 1 <= end; word++) {
            ElfW(Addr) v = __atomic_load_n(word, __ATOMIC_RELAXED);
            if (v < w->swaps[0].next || v > w->swaps[w->n_swaps - 1].next) continue;
            swap key = {v, 0};
            const swap *hit = bsearch(&key, w->swaps, w->n_swaps, sizeof key, by_next);
            if (!hit) continue;
            if (write_got(info, word, hit->own, w->page))
                w->written++;
            else
                w->failed++;
        }
    }
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *arg) {
    walk *w = arg;
    clc_dynamic d;
    int ours = -1; /* in the program's namespace: asked at the first entry to change */
    if (!clc_read_dynamic(info->dlpi_addr, clc_dynamic_section(info), &d) ||
        d.dynamic == w->e->dyn.dynamic || d.dynamic == w->cuda_dynamic)
        return 0;
    unsigned before = w->written;
    patch_relocs(info, &d, d.jmprel, d.jmprel_size, w, &ours);
    patch_relocs(info, &d, d.rela, d.rela_size, w, &ours);
    /* Deep binding bound this object past the shim: what it saved meanwhile is found too. */
    if (w->written > before) scan_data(info, w);
    return 0;
}

/* ---- deep-bound loads ------------------------------------------------------------------------
 * A walk must not meet a deep-bound load still inside libc's dlopen: that load's objects may be
 * half relocated, their RELRO pages not yet protected, and protecting one early would make the
 * loader fault. So the last such load to end walks, for all that ended before it; loads of this
 * very thread still under way (a constructor opening another library) are relocated already. */
static pthread_mutex_t g_walk_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_loading;         /* deep-bound loads inside libc's dlopen, all threads */
static int g_walk_owed;            /* one of them has ended since the last walk */
static CLC_TLS unsigned t_loading; /* this thread's */

static void after_fork_child(void) {
    pthread_mutex_init(&g_walk_lock, NULL);
    g_loading = t_loading; /* other threads' loads did not come along */
}

static void register_fork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

static void load_begins(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork);
    pthread_mutex_lock(&g_walk_lock);
    g_loading++;
    pthread_mutex_unlock(&g_walk_lock);
    t_loading++;
}

static void load_ends(int loaded) {
    struct link_map *first = self_map();
    walk w = {.page = (uintptr_t)sysconf(_SC_PAGESIZE)};
    while (first && first->l_prev) first = first->l_prev;
    w.first = first;
    t_loading--;
    pthread_mutex_lock(&g_walk_lock);
    g_loading--;
    g_walk_owed |= loaded;
    if (g_walk_owed && g_loading == t_loading) {
        g_walk_owed = 0;
        w.e = atomic_load_explicit(&g_exports, memory_order_acquire);
        w.cuda_dynamic = atomic_load(&g_cuda_dynamic);
        if (w.e && w.first) {
            collect_swaps(&w);
            dl_iterate_phdr(patch_object, &w);
            free(w.swaps);
        } else {
            w.failed = 1; /* the shim's own symbol table could not be read */
        }
    }
    pthread_mutex_unlock(&g_walk_lock);
    if (w.failed) {
        CLC_WARN_ONCE("some references of libraries opened with RTLD_DEEPBIND could "
                      "not be pointed at clc's hooks: launches through them are "
                      "not decided");
    }
    if (w.written) clc_debug("%u references of deep-bound libraries now reach clc", w.written);
}

/* A deep-bound load: the file the caller's own call would open, libc's dlopen, the walk. */
static void *deep_open(dlopen_fn real, const char *file, int mode, void *ret) {
    char buf[PATH_MAX];
    Dl_info where;
    struct link_map *caller = NULL;
    if (dladdr1(ret, &where, (void **)&caller, RTLD_DL_LINKMAP) && caller)
        file = caller_file(real, file, caller, buf, sizeof buf);
    load_begins();
    void *h = real(file, mode);
    if (h) prepare(real);
    load_ends(h != NULL);
    if (h) (void)dlerror(); /* the probes' failures are not the program's: dlopen succeeded */
    return h;
}

#endif /* CLC_EM */
