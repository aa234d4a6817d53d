// SPDX-License-Identifier: Apache-2.0
//
// clc's wrapper runtime: the device side of a wrapped kernel, compiled by NVRTC (-rdc) and
// linked by nvJitLink with the kernel's spliced PTX (clc/splice.py).
//
// The spliced kernel runs its original body once per *virtual block* that it claims:
//
//     iter = 0; prev = -1
//     loop: v = clc_next(slot, grid, iter, prev) every thread of the block calls it
//           if v < 0: goto done
//           <body, its %ctaid/%nctaid reads taking v's coordinates and the virtual grid;
//            its ret/exit branch to step>
//     step: prev = v; iter += 1; goto loop      (a 1:1 remap, for a kernel whose body may
//     done: clc_finish(slot)                      not loop, runs the body once: no step)
//
// `arg` is the 32-byte parameter the shim appends to each launch (struct clc_launch_arg): the
// virtual grid, and the address of the launch's own slot (struct clc_slot) in a ring that the
// shim keeps per context, so that two launches in flight never share a block counter. The
// last hardware block to finish resets its slot for the launch that reuses it.
//
// Thread 0 decides and the block learns the answer through shared memory, one barrier per
// claim: clc_next is called by every thread at the loop head (the body's exits are branches
// to it), and its two answer words alternate so that a claim never overwrites an answer that
// a slow thread has still to read. clc_finish needs no barrier (threads reach it whenever
// they leave, as they would have left the kernel).
//
// Configuration (-D): CLC_DEADLINE_NS (deadline wrapper: virtual blocks not started within
// that many ns of the kernel's first block are skipped and counted), CLC_POLICY_DEMO (a user
// policy in the nvJitLink CLC demo interface: Policy_init / Policy_should_try_steal),
// CLC_POLICY_HOOKS (clc's own: clc_policy_init / clc_policy_begin / clc_policy_end).
// As with the hardware's Cluster Launch Control, a block always runs the first virtual block
// it claims; Policy_should_try_steal(state, the virtual block just run) decides whether it
// claims another. The launch has as many blocks as the original, so work a block declines
// is claimed by a block that starts later.
//
// Counters (clc_stats, a __managed__ variable the host reads with cuLibraryGetManaged):
// virtual blocks run and their threads, blocks skipped by a deadline, and the most hardware
// blocks resident at once (what sm_share caps).

struct clc_launch_arg {
    unsigned long long slot;            // struct clc_slot * in device memory
    unsigned int grid_x, grid_y, grid_z;
    unsigned int flags;
    unsigned long long reserved;
};

struct clc_slot {
    unsigned long long next;            // the next virtual block to claim
    unsigned long long start_ns;        // %globaltimer when the launch's first block claimed
    unsigned int finished;              // hardware blocks done
    unsigned int active;                // hardware blocks running now
    unsigned long long reserved;
};

struct clc_stats_t {
    unsigned long long blocks;          // virtual blocks run
    unsigned long long threads;         // their threads
    unsigned long long skipped;         // virtual blocks skipped (deadline)
    unsigned long long launches;        // launches finished
    unsigned int max_resident;          // most hardware blocks of one launch resident at once
    unsigned int reserved;
};

__managed__ clc_stats_t clc_stats;

__shared__ long long clc_answer[2];
__shared__ __align__(16) unsigned char clc_policy_state[64];

#if defined(CLC_POLICY_DEMO)
extern "C" __device__ void Policy_init(void *state);
extern "C" __device__ bool Policy_should_try_steal(void *state, int current_block);
#endif
#if defined(CLC_POLICY_HOOKS)
extern "C" __device__ void clc_policy_init(void *state);
extern "C" __device__ void clc_policy_begin(void *state, unsigned long long vblock);
extern "C" __device__ void clc_policy_end(void *state, unsigned long long vblock);
#endif

static __device__ __forceinline__ unsigned long long clc_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ bool clc_thread0() {
    return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

// Thread 0's claim: the next virtual block of the launch, or -1 when none is left.
static __device__ long long clc_claim(clc_slot *slot, unsigned long long total) {
    for (;;) {
        unsigned long long v = atomicAdd(&slot->next, 1ull);
        if (v >= total)
            return -1;
#if defined(CLC_DEADLINE_NS)
        unsigned long long now = clc_now();
        if (v == 0) {
            atomicCAS(&slot->start_ns, 0ull, now);
        } else {
            unsigned long long start = *(volatile unsigned long long *)&slot->start_ns;
            if (start != 0 && now > start && now - start > (unsigned long long)(CLC_DEADLINE_NS)) {
                atomicAdd(&clc_stats.skipped, 1ull);
                continue;
            }
        }
#endif
        return (long long)v;
    }
}

extern "C" __device__ long long clc_next(unsigned long long slot_address, unsigned int grid_x,
                                         unsigned int grid_y, unsigned int grid_z,
                                         unsigned int iter, long long prev) {
    if (clc_thread0()) {
        clc_slot *slot = (clc_slot *)slot_address;
        unsigned long long total = (unsigned long long)grid_x * grid_y * grid_z;
        bool claim = true;
        if (iter == 0) {
            unsigned int resident = atomicAdd(&slot->active, 1u) + 1;
            atomicMax(&clc_stats.max_resident, resident);
#if defined(CLC_POLICY_DEMO)
            Policy_init(clc_policy_state);
#elif defined(CLC_POLICY_HOOKS)
            clc_policy_init(clc_policy_state);
#endif
        } else {
#if defined(CLC_POLICY_HOOKS)
            clc_policy_end(clc_policy_state, (unsigned long long)prev);
#endif
#if defined(CLC_POLICY_DEMO)
            claim = Policy_should_try_steal(clc_policy_state, (int)prev);
#endif
        }
        long long v = claim ? clc_claim(slot, total) : -1;
        if (v >= 0) {
            atomicAdd(&clc_stats.blocks, 1ull);
            atomicAdd(&clc_stats.threads,
                      (unsigned long long)blockDim.x * blockDim.y * blockDim.z);
#if defined(CLC_POLICY_HOOKS)
            clc_policy_begin(clc_policy_state, (unsigned long long)v);
#endif
        }
        clc_answer[iter & 1] = v;
    }
    __syncthreads();
    return clc_answer[iter & 1];
}

extern "C" __device__ void clc_finish(unsigned long long slot_address) {
    if (!clc_thread0())
        return;
    clc_slot *slot = (clc_slot *)slot_address;
    unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    atomicSub(&slot->active, 1u);
    __threadfence();
    if (atomicAdd(&slot->finished, 1u) + 1 == blocks) {
        // Every block of the launch is past its last claim: ready the slot for reuse.
        slot->next = 0;
        slot->start_ns = 0;
        slot->active = 0;
        __threadfence();
        slot->finished = 0;
        atomicAdd(&clc_stats.launches, 1ull);
    }
}
