/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fake_cuda.c: a stand-in for the NVIDIA driver library, built as libcuda.so.1, so that clc's
 * shim can be tested on CI machines without a GPU.
 *
 * Nothing runs on a device: a launch is validated the way the real driver validates it (handle
 * types, current context, launch shape, stream) and then only counted. The counters are exact
 * and per kernel name, so a test can compare what the driver really received with what clc
 * recorded, allowed or denied. The behaviour the shim depends on is modelled after the real
 * driver: typed handles, a thread-local current context, images that name their kernels, and
 * cuGetProcAddress handing out per-thread-stream (_ptsz) and ABI-versioned (_v2) variants.
 *
 * Kernel parameters: each image entry's PTX parameter list gives its layout (offsets and sizes
 * as nvcc lays them out), which cuKernelGetParamInfo/cuFuncGetParamInfo report and launches are
 * checked against: a kernel that takes parameters needs kernelParams or a well-formed `extra`
 * whose buffer holds them all. Entries declared `NAME(\n)` or without a list take none.
 *
 * Cubins (ELF for the GPU, such as clc's wrapped kernels linked by nvJitLink) load too: their
 * kernels are the symbol table's entry functions, with no parameter layout (launches of them
 * take any arguments), and their managed variables are zeroed host buffers. Device memory
 * (cuMemAlloc) is host memory too, so that memsets really write it; a test reads it back.
 *
 * Events complete instantly by default. With FAKE_CUDA_LAZY_EVENTS=1 in the environment (read
 * once, when the library is loaded) they behave like a real GPU's instead: see fake/event.c.
 *
 * The parts are in tests/native/fake/, one file per API family, included below; the test-only
 * entry points (fake_cuda_*) are in fake/test_api.c.
 */
#define _GNU_SOURCE /* memmem */
/* Declare every variant the real library exports (legacy names, _v2, _ptsz) with its exact
 * signature: this is the mode the driver itself is built in, so the compiler checks each
 * definition below against the real header. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAKE_DRIVER_VERSION 13000
#define FAKE_NS_PER_LAUNCH 5000ull /* the fake GPU clock advances this much per kernel run */
#define FATBIN_WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xBA55ED50u
#define MAX_BLOCK_THREADS 1024u
#define DEFAULT_DYN_SMEM 49152 /* what a kernel may use before cuFuncSetAttribute raises it */
#define MAX_DYN_SMEM 232448    /* the opt-in ceiling of an sm_90 part */
#define MAX_KERNEL_NAMES 4096
#define FAKE_SMS 132          /* the device's SMs, for green contexts */
#define FAKE_SMS_ALL FAKE_SMS /* where a launch off a green stream runs: SMs [0, FAKE_SMS) */
/* Occupancy, cuOccupancyMaxActiveBlocksPerMultiprocessor: an SM holds this many threads and at
 * most this many blocks (an sm_90 part's limits), and MAX_DYN_SMEM of shared memory. */
#define SM_THREADS 2048
#define SM_BLOCKS 32

/* The driver's parts, by API family, in this order: one translation unit (the parts share
 * the state and helpers of the first ones). */
#include "fake/state.c"
#include "fake/context.c"
#include "fake/stream.c"
#include "fake/memory.c"
#include "fake/module.c"
#include "fake/launch.c"
#include "fake/graph.c"
#include "fake/green.c"
#include "fake/event.c"
#include "fake/error.c"
#include "fake/proc_address.c"
#include "fake/test_api.c"
