/* SPDX-License-Identifier: Apache-2.0
 *
 * priority.h: the priority layer of stage 1 (shim/priority/: green.c priority.c): how the GPU
 * is shared, kernels confined to green contexts, priority classes.
 */
#ifndef CLC_PRIORITY_H
#define CLC_PRIORITY_H

#include "records/records.h"

/* ---- confined kernels: launched on a green context's stream (green.c) --------------------- */
typedef struct {
    void *entry;            /* the green stream's entry, locked until clc_green_end */
    CUstream stream;        /* where to launch */
    unsigned sms;           /* the partition's SMs */
    CUstream program_stream;
    CUresult (*record)(CUevent, CUstream);
    CUresult (*wait)(CUstream, CUevent, unsigned);
} clc_green_launch;
/* Orders the green stream after the program's `stream` for a launch confined as `word`
 * (clc_outcome.replacement); CUDA_SUCCESS, or why the launch cannot be confined. */
CUresult clc_green_begin(clc_green_launch *gl, uint64_t word, CUstream stream, int ptsz);
/* The context of the green context a graph kernel node confined as `word` runs in (the v2
 * node parameters' ctx), made if need be. */
CUresult clc_green_context(uint64_t word, CUcontext *out, unsigned *sms);
/* Orders the program's stream after the launch (made or refused). */
CUresult clc_green_end(clc_green_launch *gl, CUresult launched);
/* A launch that cannot be confined, for one of these reasons: 1 when it is to be denied (the
 * rule's on_unwrappable), else it runs on the whole GPU; said once per reason. */
#define CLC_UNCONFINED_NO_PARTITION 0 /* the partition or its stream could not be made (`why`) */
#define CLC_UNCONFINED_GRAPH_NODE 1   /* a graph kernel node made with the graph API */
#define CLC_UNCONFINED_MULTI_DEVICE 2 /* cuLaunchCooperativeKernelMultiDevice */
#define CLC_UNCONFINED_REFUSED 3      /* the driver refused the launch on the green stream */
#define CLC_UNCONFINED_CONDITIONAL 4  /* a node or captured launch in a conditional node's body */
#define CLC_UNCONFINED_COOPERATIVE 5  /* a cooperative grid larger than the partition holds */
int clc_green_unconfined(uint64_t word, CUresult why, int reason);
/* Cooperative grids: the numbers of one the partition cannot hold, said once with them. */
void clc_green_cooperative_too_large(unsigned blocks, unsigned sms, unsigned per_sm);
/* Conditional nodes' bodies: every kernel in one must be in the conditional node's context, so
 * a green context's cannot be there. The bodies the driver made for a new conditional node
 * (graph.c) are noted; whether `graph` is one (1 too when the table filled and it cannot be
 * told); whether a launch on `stream` is being captured into one. */
void clc_green_note_bodies(CUgraphNode parent, CUgraph owner, CUgraph *bodies, unsigned n);
/* A graph the program destroys: the bodies it holds (and theirs) are dropped. */
void clc_green_forget_graph(CUgraph graph);
int clc_green_is_body(CUgraph graph);
/* The bodies noted for a conditional or child graph node (at most `max`). */
unsigned clc_green_bodies_of(CUgraphNode parent, CUgraph *out, unsigned max);
/* A confined graph node's kernel and its outcome word (clc_green_note_node_kernel), and whether
 * its nodes may be put back in the program's context when the driver will not have them
 * confined: not where its rule's on_unwrappable is deny, nor for a kernel never noted. */
void clc_green_note_node_kernel(CUkernel kern, uint64_t word);
int clc_green_node_kernel_movable(CUkernel kern);
/* Whether `ctx` is a partition's context that clc put graph nodes in (clc_green_context). */
int clc_green_is_node_context(CUcontext ctx);
int clc_green_any_node_context(void);
int clc_green_capturing_into_body(CUstream stream, int ptsz);
/* Contexts the program makes (cuCtxCreate) under a policy that confines: a green context of
 * their own, over the partition (`word`, scope: program) or all the device's SMs (word 0),
 * made current as cuCtxCreate's is. CUDA_SUCCESS with *out, or why not. */
CUresult clc_green_create_context(CUdevice dev, uint64_t word, unsigned flags, CUcontext *out);
/* The program destroys a context: -1 when clc did not make it, else the green context's
 * destruction's result. */
int clc_green_destroy_created(CUcontext ctx, CUresult *result);
void clc_green_forget_context(CUcontext ctx);
void clc_green_forget_stream(CUstream stream);
/* scope: program. The partition's context (cuCtxFromGreenCtx) handed to the program as the
 * device's primary context, counted as one of the program's retains. */
CUresult clc_green_program_retain(CUdevice device, uint64_t word, CUcontext *out);
/* The SMs of the partition whose program context `ctx` is, with its word; 0 when it is none. */
unsigned clc_green_program_sms(CUcontext ctx, uint64_t *word);
/* The program releases the device's primary context: 1 when the device's green contexts were
 * destroyed (its last release, or no program context: the release goes on as without green
 * contexts), with *program the program context that died with them (NULL: none); 0 when the
 * program still holds its program context. */
int clc_green_release(CUdevice device, CUcontext *program);
/* The device's primary context is reset: its green contexts are destroyed (*program as above). */
void clc_green_reset(CUdevice device, CUcontext *program);
void clc_green_after_fork_child(void);

/* ---- priority classes (priority.c) --------------------------------------------------------- */
#define CLC_PRIORITY_LC 1 /* latency-critical: its launches mark its GPU busy on the board */
#define CLC_PRIORITY_BE 2 /* best-effort: its launches wait while a latency-critical GPU is busy */
/* The class clc-run gave the process (CLC_PRIORITY), with its board opened (and, for a
 * latency-critical process, its slot made): 0 when it has none. Once, at start. */
int clc_priority_start(void);
/* A latency-critical launch on `device`, and the stream it went to (`ptsz`: by a per-thread
 * entry point). */
void clc_priority_lc_launch(int device, CUstream stream, int ptsz);
/* A best-effort launch: held while a latency-critical process is busy on the GPU (down to the
 * floor), and kept from running far ahead of it while one runs on the machine. With held_share,
 * a held launch does not wait: the CLC_ACTION_CONFINE word it is to run under is returned
 * (else 0). */
uint64_t clc_priority_be_launch(int device, CUcontext ctx, CUstream stream, int per_thread);
/* Around a synchronization of a latency-critical process (its GPU counts as busy meanwhile):
 * what was launched before it (begin); once it returned (end, `done`: successfully) the work
 * of the whole device, or of `stream`, is done up to then: the GPU is idle once every stream's
 * work is done (latency_critical.c keeps up to 16 streams per GPU). A blocking wait (not a
 * query) marks the GPU busy while it lasts, whatever is settled. */
#define SYNC_WAITING 1 /* a wait that blocks: the GPU counts as busy while it lasts */
#define SYNC_QUERY 2   /* a query: it settles, it does not wait */
uint64_t clc_priority_sync_begin(int device, int blocking, int *counted);
/* The launches counted on `device` so far (0 without a slot). */
uint64_t clc_priority_launched(int device);
void clc_priority_sync_end(int device, uint64_t launched, int whole_context, CUstream stream,
                           int ptsz, int counted, int done);
/* Events of a latency-critical process (settle.c): one recorded on `stream` on `device` keeps
 * the stream and how many launches the device had then; covers gives them back for a kept
 * event (the device, or -1: none kept); settle, after a wait on it that was counted (as
 * clc_priority_sync_begin counts), settles that stream's work up to then when the wait `done`
 * (successfully); forget: the event is destroyed. At most CLC_LC_EVENTS are kept: an event
 * whose place another took settles nothing (its waits still mark the GPU busy). */
#define CLC_LC_EVENTS 256
void clc_priority_event_record(int device, CUevent ev, CUstream stream, int ptsz,
                               uint64_t launched);
int clc_priority_event_covers(CUevent ev, CUstream *key, uint64_t *launched);
void clc_priority_event_settle(int device, CUstream key, uint64_t launched, int counted, int done);
void clc_priority_event_forget(CUevent ev);
/* A best-effort graph replay: held as a launch is (the graph cannot be confined to a share: it
 * waits, down to the floor, where a launch would run on the held share). */
void clc_priority_be_graph_launch(int device, CUcontext ctx, CUstream stream, int per_thread);
/* A context torn down, a stream destroyed: the run-ahead events kept for them are forgotten. */
void clc_priority_forget_context(CUcontext ctx);
void clc_priority_forget_stream(CUstream stream);
/* The process is leaving: its slot removed (from a fatal signal's handler too). */
void clc_priority_leave(int in_signal);
void clc_priority_after_fork_child(void);

#endif /* CLC_PRIORITY_H */
