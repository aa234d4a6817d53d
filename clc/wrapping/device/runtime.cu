// SPDX-License-Identifier: Apache-2.0
//
// clc's wrapper runtime: the device side of a wrapped kernel, compiled by NVRTC (-rdc) and
// linked by nvJitLink with the kernel's spliced PTX (clc/wrapping/splice.py).
//
// The spliced kernel calls these functions, with every thread of the block:
//
//   looped (sm_share, and a user policy when the body may loop): the launch has fewer
//   blocks than the program's grid; each block claims *batches* of virtual blocks and runs
//   the body once per virtual block, its ret/exit branching to the next one:
//       v = -1; end = -1; batch = 0
//       loop: v += 1
//             if v >= end: (v, end) = clc_claim(slot, grid, seq, batch, v - 1); batch += 1
//                          if v < 0: goto done
//             <body with %ctaid/%nctaid reading v's coordinates and the program's grid>
//             goto loop
//       done: clc_finish(slot, seq, v - 1)
//   1:1 (block_count, deadline, and kernels whose body may not loop): the launch keeps its
//   grid and each block runs the body once for its own index (%ctaid is not remapped):
//       v = clc_enter(slot, grid, seq); if v < 0: goto done    (deadline and policies only)
//       <body, its ret/exit branching to done>
//       done: if thread 0: clc_finish(slot, seq, v)
//   block_count calls nothing: each ret/exit of the body is replaced by a copy of the count
//   (thread 0 adds its block to a stripe of clc_stats; the others leave at once), so that
//   no warp waits at a shared epilogue (clc/wrapping/splice.py, _COUNT_TAIL).
//
// `slot` is the launch's own 32 bytes in a ring of device memory that the shim keeps per
// context, and `seq` the launch's lap of the ring (never 0; CLC_GRAPH_SEQ in a graph). A slot is never reset: its
// words carry the lap of the launch that last wrote them, so the first block of a new launch
// to touch one starts it afresh (a compare-and-swap), and two launches in flight never share
// a word (the shim hands out consecutive slots of a 16384-slot ring).
//
// Costs per virtual block are kept off the global atomics that thousands of short blocks
// would queue on: a looped block claims a batch of virtual blocks with one compare-and-swap
// (about total / (16 x resident blocks), at most 64; one at a time when a policy decides
// per block) and learns it through shared memory at one barrier per batch; a 1:1 block
// computes its index and needs no barrier unless a deadline or a policy decides for it. The
// counts are added once per hardware block, into 32 stripes.
//
// Configuration (-D): CLC_LOOPED (the claim loop is used), CLC_ENTER (1:1 kernels call
// clc_enter: deadline and policies), CLC_SM_SHARE (sm_share: only blocks on
// that share of the SMs work, see clc_on_share), CLC_DEADLINE_NS (deadline: a
// virtual block that would start more than that many ns after the launch's first is skipped
// and counted), CLC_POLICY_DEMO (a policy in the nvJitLink CLC demo interface:
// Policy_init / Policy_should_try_steal), CLC_POLICY_HOOKS (clc's own: clc_policy_init /
// clc_policy_begin / clc_policy_end). As with the hardware's Cluster Launch Control, a block
// always runs the first virtual block it claims; Policy_should_try_steal(state, the virtual
// block just run) decides whether it claims another; the launch then keeps the program's
// grid, so work a block declines is claimed by a block that starts later.
//
// Counts (clc_stats, a __managed__ variable the host reads with cuLibraryGetManaged): virtual
// blocks run and their threads, blocks skipped by a deadline, and the most hardware blocks
// of one launch working at once (looped wrappers: what sm_share caps).

// The layouts shared with the host are the ABI's (shim/clc_abi.h): the build passes them from
// clc.abi as -D options, and the static_asserts below hold this file to them.
#if !defined(CLC_STATS_STRIPES) || !defined(CLC_STATS_STRIPE_BYTES) || \
    !defined(CLC_STATS_BYTES) || !defined(CLC_SLOT_BYTES) || !defined(CLC_GRAPH_SEQ)
#error "runtime.cu is built by clc.wrapping.build, which defines the ABI's layouts"
#endif

struct clc_slot {
    unsigned long long claim;   // lap << 32 | the next virtual block to claim
    unsigned long long start;   // lap << 32 | (%globaltimer / 1000 of the 1st block) mod 2^32
    unsigned int active;        // hardware blocks working now (looped)
    unsigned int on_share;      // of them, on the SMs an SM share allows (CLC_SM_SHARE)
    unsigned int exited;        // a graph slot's hardware blocks done (CLC_GRAPH_SEQ)
    unsigned int reserved1;
};
static_assert(sizeof(clc_slot) == CLC_SLOT_BYTES, "clc_slot is CLC_SLOT_BYTES (clc_abi.h)");

// The lap of a launch in a CUDA graph (stream capture or a kernel node): its slot is its own
// and every replay runs with this same lap, so the last of its hardware blocks to finish sets
// the slot back to zero for the next replay (the shim also zeroes a captured launch's slot
// with a memset node before it). CLC_GRAPH_SEQ comes from the ABI.

// One stripe per 128-byte line, so that the blocks adding their counts at once spread over
// the L2's slices instead of queuing on one line.
struct __align__(CLC_STATS_STRIPE_BYTES) clc_stripe {
    unsigned long long blocks;   // virtual blocks run
    unsigned long long threads;  // their threads
    unsigned long long pad[(CLC_STATS_STRIPE_BYTES - 16) / 8];
};

struct clc_stats_t {
    clc_stripe stripes[CLC_STATS_STRIPES];
    unsigned long long skipped;  // virtual blocks skipped (deadline)
    unsigned int max_resident;   // most hardware blocks of a launch at once
    unsigned int share_sms;      // sm_share: how many SMs its share is (of %nsmid)
};
static_assert(sizeof(clc_stats_t) == CLC_STATS_BYTES, "clc_stats is CLC_STATS_BYTES (clc_abi.h)");

struct clc_range {
    long long base;   // the first virtual block of the batch, -1: none left
    long long end;    // one past its last
};

__managed__ clc_stats_t clc_stats;

__shared__ long long clc_answer[2][2];
__shared__ unsigned int clc_ran;          // thread 0's count of this block's virtual blocks
__shared__ unsigned int clc_role;         // bit 0: counted as working, bit 1: on an allowed SM
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
#if defined(CLC_POLICY_DEMO) || defined(CLC_POLICY_HOOKS)
#define CLC_ONE_AT_A_TIME 1
#endif

static __device__ __forceinline__ unsigned long long clc_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ bool clc_thread0() {
    return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

static __device__ __forceinline__ unsigned int clc_linear_block() {
    return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

// Whether a virtual block starting now is past the launch's deadline (thread 0 only). The
// slot's start word is the launch's whole lap (32 bits: a slot's lap comes round again only
// after 2^32 laps of its ring, about 7 x 10^13 wrapped launches in one context) and the first
// block's %globaltimer in microseconds modulo 2^32 (71 minutes): the time since is taken modulo
// 2^32 too, and a start another block set a moment after this block read the clock reads as 0.
// Deadlines are at most 30 minutes (clc.wrapping.spec), well inside that.
static __device__ bool clc_late(clc_slot *slot, unsigned int seq) {
#if defined(CLC_DEADLINE_NS)
    unsigned long long tag = (unsigned long long)seq << 32;
    unsigned int now = (unsigned int)(clc_now_ns() / 1000);   // us, modulo 2^32
    unsigned long long seen = *(volatile unsigned long long *)&slot->start;
    if ((seen & 0xffffffff00000000ull) != tag) {
        unsigned long long was = atomicCAS(&slot->start, seen, tag | now);
        seen = was == seen ? (tag | now) : was;
    }
    unsigned int since = now - (unsigned int)seen;
    if (since < 0x80000000u && (unsigned long long)since * 1000 > (unsigned long long)(CLC_DEADLINE_NS)) {
        atomicAdd(&clc_stats.skipped, 1ull);
        return true;
    }
#endif
    return false;
}

#if defined(CLC_SM_SHARE)
// An SM share (sm_share): the launch fills the GPU, and the blocks that the hardware placed on
// SMs outside the share leave at once, as soon as one block on an allowed SM is working (they
// wait up to CLC_SM_WAIT_NS for one; without one they work, so the launch always finishes).
// The share's SM count comes with the launch (the shim computes it from the SM count).
#ifndef CLC_SM_WAIT_NS
#define CLC_SM_WAIT_NS 20000ull
#endif
static __device__ bool clc_on_share(unsigned int allowed) {
    unsigned int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    if (smid == 0) atomicMax(&clc_stats.share_sms, allowed);
    return smid < allowed;
}

// Whether a block outside the share should leave: a block on the share is working.
static __device__ bool clc_share_covered(clc_slot *slot, bool wait) {
    unsigned long long start = clc_now_ns(), now = start;
    for (;;) {
        if (*(volatile unsigned int *)&slot->on_share > 0) return true;
        if (!wait || now - start > CLC_SM_WAIT_NS) return false;
        __nanosleep(500);
        now = clc_now_ns();
    }
}
#endif

// Thread 0's claim of up to `want` virtual blocks of the launch `seq`: [base, end), or base -1.
// The first block of a launch to find the word still carrying an older lap starts it at 0 for
// this lap (one compare-and-swap wins); claims are atomic adds (the GPU's L2 serves those to
// a thousand blocks far better than compare-and-swap loops).
static __device__ clc_range clc_take(clc_slot *slot, unsigned int seq, unsigned int total,
                                     unsigned int want) {
    unsigned long long lap = (unsigned long long)seq << 32;
    for (;;) {
        unsigned long long seen = *(volatile unsigned long long *)&slot->claim;
        if ((seen & 0xffffffff00000000ull) != lap) atomicCAS(&slot->claim, seen, lap);
        unsigned long long old = atomicAdd(&slot->claim, (unsigned long long)want);
        if ((old & 0xffffffff00000000ull) != lap) continue;   // raced a start: not this lap's
        unsigned int next = (unsigned int)old;
        if (next >= total) return clc_range{-1, -1};
        unsigned int end = total - next > want ? next + want : total;
        return clc_range{(long long)next, (long long)end};
    }
}

extern "C" __device__ clc_range clc_claim(unsigned long long slot_address, unsigned int total,
                                          unsigned int share_sms, unsigned int want_at_once,
                                          unsigned int seq, unsigned int batch, long long prev) {
    if (clc_thread0()) {
        clc_slot *slot = (clc_slot *)slot_address;
        bool claim = true;
        if (batch == 0) {
            clc_ran = 0;
            clc_role = 1;
#if defined(CLC_SM_SHARE)
            if (clc_on_share(share_sms)) {
                clc_role = 3;
                atomicAdd(&slot->on_share, 1u);
            } else if (clc_share_covered(slot, true)) {
                clc_role = 0;
                claim = false;
            }
#endif
            if (clc_role & 1) {
                unsigned int resident = atomicAdd(&slot->active, 1u) + 1;
                atomicMax(&clc_stats.max_resident, resident);
            }
#if defined(CLC_POLICY_DEMO)
            Policy_init(clc_policy_state);
#elif defined(CLC_POLICY_HOOKS)
            clc_policy_init(clc_policy_state);
#endif
        } else {
#if defined(CLC_SM_SHARE)
            // A block outside the share that had to work leaves once one on it works.
            if (clc_role == 1 && clc_share_covered(slot, false)) claim = false;
#endif
#if defined(CLC_POLICY_HOOKS)
            clc_policy_end(clc_policy_state, (unsigned long long)prev);
#endif
#if defined(CLC_POLICY_DEMO)
            claim = Policy_should_try_steal(clc_policy_state, (int)prev);
#endif
        }
#if defined(CLC_ONE_AT_A_TIME)
        unsigned int want = 1;
#else
        unsigned int want = want_at_once;   // computed by the shim per launch
#endif
        clc_range r = claim ? clc_take(slot, seq, total, want) : clc_range{-1, -1};
        if (r.base >= 0) {
            clc_ran += (unsigned int)(r.end - r.base);
#if defined(CLC_POLICY_HOOKS)
            clc_policy_begin(clc_policy_state, (unsigned long long)r.base);
#endif
        }
        clc_answer[batch & 1][0] = r.base;
        clc_answer[batch & 1][1] = r.end;
    }
    __syncthreads();
    return clc_range{clc_answer[batch & 1][0], clc_answer[batch & 1][1]};
}

extern "C" __device__ long long clc_enter(unsigned long long slot_address, unsigned int grid_x,
                                          unsigned int grid_y, unsigned int grid_z,
                                          unsigned int seq) {
    long long v = clc_linear_block();
#if defined(CLC_DEADLINE_NS) || defined(CLC_POLICY_DEMO) || defined(CLC_POLICY_HOOKS)
    if (clc_thread0()) {
        clc_slot *slot = (clc_slot *)slot_address;
        long long answer = clc_late(slot, seq) ? -1 : v;
#if defined(CLC_POLICY_DEMO)
        Policy_init(clc_policy_state);
#elif defined(CLC_POLICY_HOOKS)
        clc_policy_init(clc_policy_state);
        if (answer >= 0) clc_policy_begin(clc_policy_state, (unsigned long long)answer);
#endif
        clc_answer[0][0] = answer;
    }
    __syncthreads();
    v = clc_answer[0][0];
#endif
    if (clc_thread0()) clc_ran = v >= 0 ? 1 : 0;
    return v;
}

extern "C" __device__ void clc_finish(unsigned long long slot_address, unsigned int seq,
                                      long long last) {
    if (!clc_thread0()) return;   // (the splice calls it from thread 0 only)
    unsigned int stripe = clc_linear_block() % CLC_STATS_STRIPES;
#if defined(CLC_LOOPED) || defined(CLC_ENTER)
    unsigned long long ran = clc_ran;
#else
    unsigned long long ran = 1;   // 1:1 without clc_enter: the block ran its own index
#endif
    if (ran) {
        atomicAdd(&clc_stats.stripes[stripe].blocks, ran);
        atomicAdd(&clc_stats.stripes[stripe].threads,
                  ran * ((unsigned long long)blockDim.x * blockDim.y * blockDim.z));
    }
#if defined(CLC_LOOPED)
    // (a looped block's last virtual block was ended at its last claim)
    clc_slot *slot = (clc_slot *)slot_address;
    if (clc_role & 1) atomicSub(&slot->active, 1u);
    if (clc_role & 2) atomicSub(&slot->on_share, 1u);
#elif defined(CLC_POLICY_HOOKS)
    if (last >= 0) clc_policy_end(clc_policy_state, (unsigned long long)last);
#endif
    if (seq == CLC_GRAPH_SEQ) {
        clc_slot *gs = (clc_slot *)slot_address;
        __threadfence();
        if (atomicAdd(&gs->exited, 1u) + 1 == gridDim.x * gridDim.y * gridDim.z) {
            // every hardware block of this run has finished with the slot
            gs->claim = 0;
            gs->start = 0;
            gs->active = 0;
            gs->on_share = 0;
            gs->exited = 0;
            __threadfence();
        }
    }
}
