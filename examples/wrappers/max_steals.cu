// SPDX-License-Identifier: Apache-2.0
//
// A device policy in the interface of the published nvJitLink Cluster Launch Control demos:
// each block runs its own virtual block, then may claim ("steal") at most MAX_STEALS more
// before it leaves. Used unchanged by clc:
//
//     action: wrap
//     wrapper: examples/wrappers/max_steals.cu
//     params: {MAX_STEALS: 8}          # given to this file as -DCLC_PARAM_MAX_STEALS=8
//
// The state lives in 64 bytes of shared memory that clc's runtime keeps per block; thread 0
// calls both functions and the block follows its answer.

#ifndef CLC_PARAM_MAX_STEALS
#define CLC_PARAM_MAX_STEALS 8
#endif

struct MaxStealsState {
    int steals_done;
};

extern "C" __device__ void Policy_init(void *state_ptr) {
    MaxStealsState *s = (MaxStealsState *)state_ptr;
    s->steals_done = 0;
}

extern "C" __device__ bool Policy_should_try_steal(void *state_ptr, int current_block) {
    MaxStealsState *s = (MaxStealsState *)state_ptr;
    if (s->steals_done >= CLC_PARAM_MAX_STEALS) return false;
    s->steals_done++;
    return true;
}
