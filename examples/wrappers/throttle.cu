// SPDX-License-Identifier: Apache-2.0
//
// A device policy in clc's own interface: each virtual block starts DELAY_NS nanoseconds late
// (a kernel that yields SM time to others, block by block). clc_policy_init is called once
// per hardware block, clc_policy_begin / clc_policy_end around each virtual block it runs,
// all by thread 0 with the block's 64 bytes of policy state; define any of the three.
//
//     action: wrap
//     wrapper: examples/wrappers/throttle.cu
//     params: {DELAY_NS: 2000}         # -DCLC_PARAM_DELAY_NS=2000

#ifndef CLC_PARAM_DELAY_NS
#define CLC_PARAM_DELAY_NS 1000
#endif

extern "C" __device__ void clc_policy_begin(void *state, unsigned long long vblock) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned long long now = start;
    while (now - start < (unsigned long long)(CLC_PARAM_DELAY_NS)) {
        __nanosleep(256);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    }
}
