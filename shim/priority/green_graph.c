/* SPDX-License-Identifier: Apache-2.0
 *
 * green_graph.c: confined kernels in CUDA graphs: the conditional nodes' bodies a green
 * context's kernel cannot be in, and the kernels of confined graph nodes (green.c confines the
 * launches).
 */
#include <pthread.h>
#include <string.h>

#include "priority.h"
#include "green_internal.h"

/* ---- conditional nodes' bodies --------------------------------------------------------------
 * The driver requires every kernel of a conditional node's body (nested bodies and child graphs
 * too) to be in the conditional node's context: a body holding a green context's kernel node
 * fails to instantiate (cudaErrorInvalidValue, measured). So a confined kernel's node made in a
 * body, or its launch captured into one, keeps the program's context: it is not confined, and
 * gets its rule's on_unwrappable. The bodies are noted as their conditional nodes are made,
 * with the graph each node is in, and dropped when that graph is destroyed (cuGraphDestroy:
 * its nodes' bodies die with it, and theirs). */

#define BODY_BITS 12
#define BODY_SLOTS (1u << BODY_BITS)
#define BODY_GONE ((CUgraph)1) /* a dropped entry: probes go past it, inserts reuse it */
pthread_mutex_t g_body_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    CUgraph body;       /* NULL: never used; BODY_GONE: dropped */
    CUgraphNode parent; /* its conditional (or child graph) node */
    CUgraph owner;      /* the graph that node is in */
} g_bodies[BODY_SLOTS];
static _Atomic unsigned g_nbodies; /* live entries */
static unsigned g_body_slots_used; /* live and dropped entries (under the lock) */
static _Atomic int g_body_full;    /* the table filled: every graph may be one */

static uint32_t body_slot(CUgraph g) {
    return (uint32_t)(((uint64_t)(uintptr_t)g * 0x9e3779b97f4a7c15ull) >> (64 - BODY_BITS));
}

/* The entry of `graph`, or where it would go (under the lock). */
static uint32_t body_find(CUgraph graph, int *found) {
    uint32_t i = body_slot(graph), free_at = BODY_SLOTS;
    for (uint32_t n = 0; n < BODY_SLOTS; n++, i = (i + 1) & (BODY_SLOTS - 1)) {
        if (g_bodies[i].body == graph) {
            *found = 1;
            return i;
        }
        if (g_bodies[i].body == BODY_GONE && free_at == BODY_SLOTS) free_at = i;
        if (!g_bodies[i].body) break;
    }
    *found = 0;
    return free_at != BODY_SLOTS ? free_at : i;
}

/* Drops the dropped entries (under the lock): the live ones are put again. */
static void body_rehash(void) {
    static __typeof__(g_bodies) live;
    unsigned n = 0;
    for (uint32_t i = 0; i < BODY_SLOTS; i++)
        if (g_bodies[i].body && g_bodies[i].body != BODY_GONE) live[n++] = g_bodies[i];
    memset(g_bodies, 0, sizeof g_bodies);
    for (unsigned k = 0; k < n; k++) {
        int found;
        g_bodies[body_find(live[k].body, &found)] = live[k];
    }
    g_body_slots_used = n;
}

void clc_green_note_bodies(CUgraphNode parent, CUgraph owner, CUgraph *bodies, unsigned n) {
    pthread_mutex_lock(&g_body_lock);
    for (unsigned b = 0; bodies && b < n && !atomic_load(&g_body_full); b++) {
        if (!bodies[b] || bodies[b] == BODY_GONE) continue;
        if (g_body_slots_used >= BODY_SLOTS * 3 / 4) body_rehash();
        if (g_body_slots_used >= BODY_SLOTS * 3 / 4) {
            clc_log(CLC_MSG_WARNING,
                    "sm_share: more than %u conditional bodies alive: every graph is taken for "
                    "one from now on, and confined kernels' nodes and captured launches are not "
                    "confined",
                    BODY_SLOTS * 3 / 4);
            atomic_store(&g_body_full, 1);
            break;
        }
        int found;
        uint32_t i = body_find(bodies[b], &found);
        if (!found) {
            if (!g_bodies[i].body) g_body_slots_used++;
            g_bodies[i].body = bodies[b];
            atomic_fetch_add(&g_nbodies, 1);
        }
        g_bodies[i].parent = parent;
        g_bodies[i].owner = owner;
    }
    pthread_mutex_unlock(&g_body_lock);
}

void clc_green_forget_graph(CUgraph graph) {
    if (!graph || !atomic_load_explicit(&g_nbodies, memory_order_acquire)) return;
    pthread_mutex_lock(&g_body_lock);
    /* The graph's own entry (a body destroyed on its own), then every body owned by a graph
     * dropped so far, until none is left (a depth-first walk without recursion: the table is
     * small and this is rare). */
    CUgraph gone[64];
    unsigned n_gone = 0;
    gone[n_gone++] = graph;
    for (unsigned k = 0; k < n_gone; k++) {
        for (uint32_t i = 0; i < BODY_SLOTS; i++) {
            CUgraph b = g_bodies[i].body;
            if (!b || b == BODY_GONE || (b != gone[k] && g_bodies[i].owner != gone[k])) continue;
            g_bodies[i].body = BODY_GONE;
            atomic_fetch_sub(&g_nbodies, 1);
            if (b != gone[k] && n_gone < 64) gone[n_gone++] = b;
        }
    }
    pthread_mutex_unlock(&g_body_lock);
}

int clc_green_is_body(CUgraph graph) {
    if (!graph || !atomic_load_explicit(&g_nbodies, memory_order_acquire)) return 0;
    if (atomic_load(&g_body_full)) return 1;
    pthread_mutex_lock(&g_body_lock);
    int found;
    body_find(graph, &found);
    pthread_mutex_unlock(&g_body_lock);
    return found;
}

unsigned clc_green_bodies_of(CUgraphNode parent, CUgraph *out, unsigned max) {
    unsigned n = 0;
    if (!parent || !atomic_load_explicit(&g_nbodies, memory_order_acquire)) return 0;
    pthread_mutex_lock(&g_body_lock);
    for (unsigned i = 0; i < BODY_SLOTS && n < max; i++)
        if (g_bodies[i].body && g_bodies[i].body != BODY_GONE && g_bodies[i].parent == parent)
            out[n++] = g_bodies[i].body;
    pthread_mutex_unlock(&g_body_lock);
    return n;
}

/* ---- what confined graph nodes' kernels are to get when their node cannot stay confined ------
 * Per kernel (its CUkernel), the outcome word its nodes were confined with: CLC_CONFINE_DENY
 * says its rule's on_unwrappable is deny. */
#define NODE_KERNELS 1024
static struct {
    CUkernel kern;
    uint64_t word;
} g_node_kernels[NODE_KERNELS];
static unsigned g_n_node_kernels;
pthread_mutex_t g_node_kernel_lock = PTHREAD_MUTEX_INITIALIZER;

void clc_green_note_node_kernel(CUkernel kern, uint64_t word) {
    pthread_mutex_lock(&g_node_kernel_lock);
    unsigned i = 0;
    while (i < g_n_node_kernels && g_node_kernels[i].kern != kern) i++;
    if (i < NODE_KERNELS) {
        g_node_kernels[i].kern = kern;
        g_node_kernels[i].word = word;
        if (i == g_n_node_kernels) g_n_node_kernels++;
    } else {
        CLC_WARN_ONCE(
            "sm_share: more than %u kernels with confined graph nodes: a graph the driver "
            "will not instantiate with later ones' nodes confined is not made again with "
            "them unconfined",
            NODE_KERNELS);
    }
    pthread_mutex_unlock(&g_node_kernel_lock);
}

int clc_green_node_kernel_movable(CUkernel kern) {
    int movable = 0;
    pthread_mutex_lock(&g_node_kernel_lock);
    for (unsigned i = 0; i < g_n_node_kernels; i++)
        if (g_node_kernels[i].kern == kern) {
            movable = !(g_node_kernels[i].word & CLC_CONFINE_DENY);
            break;
        }
    pthread_mutex_unlock(&g_node_kernel_lock);
    return movable;
}

int clc_green_capturing_into_body(CUstream stream, int ptsz) {
    if (!atomic_load_explicit(&g_nbodies, memory_order_relaxed) && !atomic_load(&g_body_full))
        return 0;
    int status = 0;
    CUgraph graph = NULL;
    CUresult (*info)(CUstream, int *, cuuint64_t *, CUgraph *, const CUgraphNode **, const void **,
                     size_t *) = ptsz ? g_drv.green.capture_info_ptsz : g_drv.green.capture_info;
    CUresult r =
        info ? info(stream, &status, NULL, &graph, NULL, NULL, NULL) : CUDA_ERROR_NOT_SUPPORTED;
    /* A capture that cannot be asked about is taken for one into a body: unconfined, never a
     * graph that fails to instantiate. */
    if (r != CUDA_SUCCESS) {
        clc_debug("cuStreamGetCaptureInfo: CUresult %d", (int)r);
        return 1;
    }
    if (status == CU_STREAM_CAPTURE_STATUS_NONE) return 0;
    int body = clc_green_is_body(graph);
    clc_debug("a confined launch captured into graph %p (%s)", graph,
              body ? "a conditional node's body" : "not a body");
    return body;
}
