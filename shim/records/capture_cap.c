/* SPDX-License-Identifier: Apache-2.0
 *
 * capture_cap.c: the capture's size cap (--capture-limit): room claimed for each record, and
 * what found none said once.
 */
#define _GNU_SOURCE

#include "records.h"
#include "capture_internal.h"

/* The size cap (--capture-limit) holds for the whole file: every record is claimed against it
 * before it is written. The counts (COUNTS records, see "the counts" below) and the END record
 * have room set aside (g_reserve) as kernels appear; records a capture must keep (kernels, loads,
 * warnings) may use the rest; launch and timing records and info messages stop first. */
uint64_t g_max_bytes;
_Atomic uint64_t g_claimed, g_reserve;
/* The part of g_reserve kept for COUNTS records to come and the wrapped kernels' WRAP_STATS. */
_Atomic uint64_t g_counts_room;
_Atomic int g_end_room;         /* the first END record's room is still in g_reserve */
_Atomic uint64_t g_capped_bytes;
_Atomic int g_over_cap;   /* an ordinary record found no room: later ones are not tried */
_Atomic int g_truncated;  /* a record the capture keeps found no room */

/* ---- the size cap -----------------------------------------------------------------------------
 */

/* Claims n bytes of the cap, leaving `keep` bytes of it unclaimed: 1 when they fit. */
int claim(uint64_t n, uint64_t keep) {
    uint64_t have = atomic_load_explicit(&g_claimed, memory_order_relaxed);
    do {
        if (have + n + keep > g_max_bytes) return 0;
    } while (!atomic_compare_exchange_weak(&g_claimed, &have, have + n));
    return 1;
}

void capped(uint64_t n, int essential) {
    atomic_fetch_add_explicit(&g_capped_bytes, n, memory_order_relaxed);
    if (essential) {
        if (!atomic_exchange(&g_truncated, 1))
            say("clc: the capture %s reached its size limit (%llu bytes) before records it must "
                "keep (kernels, loads, warnings): those are dropped, and the capture cannot vouch "
                "for the run\n",
                g_path, (unsigned long long)g_max_bytes);
    } else if (!atomic_exchange(&g_over_cap, 1)) {
        say("clc: the capture %s reached its size limit (%llu bytes): later launch and timing "
            "records are dropped and counted; counts stay exact\n",
            g_path, (unsigned long long)g_max_bytes);
    }
}

/* Room under the cap for a record of n bytes (its padding included). A record the capture keeps
 * may use all but the room set aside (a kernel's also sets aside room for its counts); the others
 * come from the thread's claimed budget, refilled a chunk at a time. */
__attribute__((noinline)) int fits_slow(tbuf *b, uint64_t n, int essential, uint64_t also_reserve) {
    if (essential) {
        if (claim(n + also_reserve, atomic_load(&g_reserve))) {
            /* The room claimed for the kernel's counts goes back, set aside for them. */
            atomic_fetch_add(&g_counts_room, also_reserve);
            atomic_fetch_add(&g_reserve, also_reserve);
            atomic_fetch_sub(&g_claimed, also_reserve);
            return 1;
        }
        capped(n, 1);
        return 0;
    }
    if (!atomic_load_explicit(&g_over_cap, memory_order_relaxed)) {
        uint64_t left = g_max_bytes - atomic_load(&g_claimed), keep = atomic_load(&g_reserve);
        uint64_t chunk = left > keep ? (left - keep) / 16 : 0;
        if (chunk > CLAIM_CHUNK) chunk = CLAIM_CHUNK;
        if (chunk < n) chunk = n;
        if (claim(chunk, keep)) {
            b->budget += chunk - n;
            return 1;
        }
    }
    capped(n, 0);
    return 0;
}
