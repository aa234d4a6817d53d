/* SPDX-License-Identifier: Apache-2.0
 *
 * replace.c: the launch of a wrapped kernel (CLC_ACTION_REPLACE), on the fast path.
 *
 * The engine made the clc_replacement once (clc/runtime/engine.py, clc/wrapping/engine.py); here,
 * per launch: take the next slot of the context's ring and its lap (one atomic add; a launch
 * captured into a CUDA graph takes a graph slot instead, see CLC_GRAPH_SLOTS), append the
 * clc_launch_arg to the program's arguments (a copy of kernelParams with one more pointer, or
 * of the `extra` buffer with the argument at arg_offset), and, for a looped wrapper with a cap,
 * launch min(one wave, virtual blocks) blocks. A wave needs the kernel's blocks per SM at the
 * launch's block size and shared memory: asked of the driver once per shape and kept in a
 * small lock-free cache in the replacement (a race only asks twice).
 */
#include "deciding.h"

#include <string.h>

static unsigned blocks_per_sm(clc_replacement *rep, unsigned threads, unsigned shmem) {
    uint64_t key = 1 | (uint64_t)(threads & 0x7ff) << 1 | (uint64_t)(shmem & 0xfffffffful) << 12;
    unsigned way = (threads * 31u + shmem) % CLC_OCCUPANCY_WAYS;
    _Atomic uint64_t *cell = (_Atomic uint64_t *)&rep->occupancy[way];
    uint64_t v = atomic_load_explicit(cell, memory_order_relaxed);
    if (v && (v & ((1ull << 48) - 1)) == key) return (unsigned)(v >> 48);
    int n = 0;
    if (!g_drv.occupancy ||
        g_drv.occupancy(&n, (CUfunction)(uintptr_t)rep->function, (int)threads, shmem) !=
            CUDA_SUCCESS ||
        n < 1)
        n = 1;
    atomic_store_explicit(cell, key | (uint64_t)n << 48, memory_order_relaxed);
    return (unsigned)n;
}

static unsigned launch_blocks(clc_replacement *rep, uint64_t total, unsigned threads,
                              unsigned shmem) {
    if (!(rep->flags & CLC_REPLACE_LOOPED) || rep->cap_kind == CLC_CAP_NONE) return 0;
    /* One wave: the wrapped kernel keeps the blocks on its share of the SMs and lets the
     * others leave (clc/wrapping/device/runtime.cu), so the launch must reach every SM. */
    uint64_t cap = (uint64_t)rep->sm_count * blocks_per_sm(rep, threads, shmem);
    if (cap < 1) cap = 1;
    return (unsigned)(cap < total ? cap : total);
}

CUresult clc_replace_begin(clc_replaced *r, const clc_replacement *crep, const clc_launch *l,
                           int graph) {
    clc_replacement *rep = (clc_replacement *)crep;
    unsigned gx = l->grid[0], gy = l->grid[1], gz = l->grid[2];
    void **params = l->params, **extra = l->extra;
    r->heap = NULL;
    r->f = (CUfunction)(uintptr_t)rep->function;
    uint64_t total = (uint64_t)gx * gy * gz;
    if (total >= (1ull << 31)) return CUDA_ERROR_INVALID_VALUE; /* the runtime counts in 32 bits */
    if (graph) {
        /* A slot of its own for good, and the graph lap: each replay starts it afresh. */
        uint64_t k = atomic_fetch_add_explicit((_Atomic uint64_t *)(uintptr_t)rep->cursor + 1, 1,
                                               memory_order_relaxed);
        if (k >= CLC_GRAPH_SLOTS) return CLC_NO_GRAPH_SLOT;
        r->arg =
            (clc_launch_arg){.slot = rep->slots + ((uint64_t)rep->n_slots + k) * CLC_SLOT_BYTES,
                             .grid = {gx, gy, gz},
                             .seq = CLC_GRAPH_SEQ};
    } else {
        uint64_t i = atomic_fetch_add_explicit((_Atomic uint64_t *)(uintptr_t)rep->cursor, 1,
                                               memory_order_relaxed);
        r->arg = (clc_launch_arg){.slot = rep->slots + (i & (rep->n_slots - 1)) * CLC_SLOT_BYTES,
                                  .grid = {gx, gy, gz},
                                  .seq = (uint32_t)(i / rep->n_slots) + 1};
    }
    unsigned n = launch_blocks(rep, total, l->block[0] * l->block[1] * l->block[2], l->shmem);
    if (n) {
        r->grid[0] = n, r->grid[1] = 1, r->grid[2] = 1;
    } else {
        r->grid[0] = gx, r->grid[1] = gy, r->grid[2] = gz;
    }
    if (rep->flags & CLC_REPLACE_LOOPED) {
        /* About 16 batches per block, at most 64 virtual blocks each: the division is done
         * here, once per launch, rather than in every block. */
        uint64_t blocks = (uint64_t)r->grid[0] * r->grid[1] * r->grid[2];
        uint64_t batch = total / (blocks * 16);
        r->arg.batch = batch < 1 ? 1 : batch > 64 ? 64 : (uint32_t)batch;
        if (rep->cap_kind == CLC_CAP_SHARE)
            r->arg.share_sms =
                (uint32_t)(((uint64_t)rep->cap_value * rep->sm_count + 999999) / 1000000);
        else if (rep->cap_kind == CLC_CAP_SMS)
            r->arg.share_sms = rep->cap_value;
    }
    if (params) {
        uint32_t np = rep->n_params;
        void **p = r->small;
        if (np + 1 > sizeof r->small / sizeof r->small[0]) {
            p = r->heap = malloc((np + 1) * sizeof *p);
            if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (np) memcpy(p, params, np * sizeof *p);
        p[np] = &r->arg;
        r->params = p;
        r->extra = NULL;
        return CUDA_SUCCESS;
    }
    if (!extra) return CUDA_ERROR_INVALID_VALUE;
    void *buffer;
    size_t size;
    if (clc_parse_extra(extra, &buffer, &size) != 0 || (!buffer && size))
        return CUDA_ERROR_INVALID_VALUE;
    if (rep->n_params && !rep->arg_offset) return CUDA_ERROR_INVALID_VALUE; /* layout unknown */
    /* A buffer may be longer than the parameters (a padded struct): the kernel reads only
     * up to arg_offset, where the launch argument goes. */
    size_t keep = size < rep->arg_offset ? size : rep->arg_offset;
    r->extra_size = rep->arg_offset + sizeof r->arg;
    unsigned char *b = r->heap = calloc(1, r->extra_size);
    if (!b) return CUDA_ERROR_OUT_OF_MEMORY;
    if (keep) memcpy(b, buffer, keep);
    memcpy(b + rep->arg_offset, &r->arg, sizeof r->arg);
    r->extra_pairs[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
    r->extra_pairs[1] = b;
    r->extra_pairs[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
    r->extra_pairs[3] = &r->extra_size;
    r->extra_pairs[4] = CU_LAUNCH_PARAM_END;
    r->params = NULL;
    r->extra = r->extra_pairs;
    return CUDA_SUCCESS;
}

typedef struct {
    int attrib, value;
    const clc_replacement *done[8]; /* an entry's outcomes often share one replacement */
    unsigned n_done;
} attribute_set;

static void set_on_replacement(const clc_outcome *o, void *arg) {
    attribute_set *a = arg;
    if (o->action != CLC_ACTION_REPLACE || !o->replacement) return;
    const clc_replacement *rep = (const clc_replacement *)(uintptr_t)o->replacement;
    for (unsigned i = 0; i < a->n_done; i++)
        if (a->done[i] == rep) return;
    if (a->n_done < sizeof a->done / sizeof a->done[0]) a->done[a->n_done++] = rep;
    pfn_cuFuncSetAttribute set = (pfn_cuFuncSetAttribute)clc_real(CLC_SYM_cuFuncSetAttribute);
    CUresult r = set ? set((CUfunction)(uintptr_t)rep->function, a->attrib, a->value)
                     : CUDA_ERROR_NOT_INITIALIZED;
    if (r != CUDA_SUCCESS) {
        CLC_WARN_ONCE("function attribute %d = %d, set on a wrapped kernel, could not be set on "
                      "its replacement (CUresult %d): its launches that need it run the original",
                      a->attrib, a->value, (int)r);
    }
}

void clc_replace_set_attribute(uint64_t handle, int attrib, int value, int device) {
    CUcontext ctx = NULL;
    if (!g_drv.ctx_get_current || g_drv.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx) return;
    clc_entry *e = clc_cache_find(handle, (uint64_t)(uintptr_t)ctx);
    if (!e || (device >= 0 && e->device != device)) return;
    attribute_set a = {.attrib = attrib, .value = value};
    clc_entry_outcomes(e, set_on_replacement, &a);
}
