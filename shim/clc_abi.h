/* SPDX-License-Identifier: Apache-2.0
 *
 * clc_abi.h: everything the C shim and the Python side must agree on.
 *
 * Written once, here: shim/abi_gen.py turns its #defines, structs, X-macro lists and the
 * clc_shim_ prototypes into clc/_abi_generated.py when clc is built, and clc/abi.py builds the
 * Python layer on that. Bump CLC_CAPTURE_VERSION when a record's layout changes.
 *
 * All integers are little-endian, records are 8-byte aligned, and every struct here has an
 * explicit size with no implicit padding, so that Python can read it with struct.unpack.
 */
#ifndef CLC_ABI_H
#define CLC_ABI_H

#include <stdint.h>

/* ---- settings ----------------------------------------------------------------------------
 * What clc-run seals for the shim and the engine: "KEY=VALUE\0" records in a sealed memfd named
 * CLC_SETTINGS_NAME, whose descriptor the environment's CLC_SETTINGS_VAR names
 * (shim/core/settings.c reads it; clc/runtime/shim.py writes it, refusing any other key). Every
 * key, once: tests/unit/test_settings_keys.py holds the shim's and clc's uses to this list. */
#define CLC_SETTINGS_NAME "clc-settings"
#define CLC_SETTINGS_VAR "CLC_SETTINGS_FD"
/* Beside LD_PRELOAD in the environment of the program and of every process it starts (the shim
 * puts it back where the program left it out): "ON_ERROR STATUS", what a launch of the run gets
 * when clc cannot decide it ("allow" or "deny") and the run's status socket. A shim that starts
 * with it but finds no settings (a process started past clc's exec hooks after the settings'
 * descriptor was closed) is of the run all the same: its launches get that on_error, and it
 * tells clc-run (CLC_STATUS_NO_SETTINGS). Sealed too, under the same key, so that what the shim
 * puts back is clc-run's value, not the program's. */
#define CLC_FALLBACK_VAR "CLC_FALLBACK"
#define CLC_SETTING_KEYS \
    "CLC_BRIDGE CLC_CACHE_DIR CLC_CACHE_MAX_BYTES CLC_CACHE_SHARED_DIR CLC_CAPTURE_MAX_BYTES " \
    "CLC_CUPTI CLC_DECIDER CLC_DECIDER_PID CLC_DECIDER_UID CLC_FALLBACK CLC_FORCE " \
    "CLC_LAUNCH_COUNT CLC_LAUNCH_SKIP CLC_ON_ERROR CLC_OUTPUT " \
    "CLC_PKG_PATH CLC_POLICY CLC_POLICY_CONFINES CLC_POLICY_DECIDERS CLC_POLICY_PROGRAM " \
    "CLC_POLICY_WRAPS CLC_PRIORITY CLC_PRIORITY_BOARD CLC_PRIORITY_FLOOR " \
    "CLC_PRIORITY_HELD_SHARE CLC_PRIORITY_IDLE_MS CLC_PRIORITY_NAME CLC_PRIORITY_RESERVE " \
    "CLC_PRIORITY_RUN_AHEAD CLC_PRIORITY_SLO " \
    "CLC_PRIORITY_TRUST CLC_PYTHON_EXE CLC_PYTHON_LIB CLC_PYTHON_VERSION CLC_ROOT_PID " \
    "CLC_RUN CLC_STATUS CLC_SYS_PATH CLC_TENANT CLC_TIMING CLC_VERBOSE"

/* ---- decisions ------------------------------------------------------------------------ */

#define CLC_ACTION_ALLOW 0
#define CLC_ACTION_DENY 1
#define CLC_ACTION_REPLACE 2
#define CLC_ACTION_CONFINE 3 /* run the kernel on a green context's SMs (green.c) */

#define CLC_FLAG_RECORD 1 /* write a LAUNCH record for each launch */
#define CLC_FLAG_TIME 2   /* GPU time of each launch (implies a TIMING record) */
/* The shim's own: every outcome of a process in a priority class carries it, so that its
 * launches leave the gate's fast path (the class's work is out of line). Never the engine's:
 * an answer from clc-run with it is refused. */
#define CLC_FLAG_PRIORITY 4

#define CLC_RULE_DEFAULT (-1)  /* no rule matched: the policy's `default` decided */
#define CLC_RULE_ON_ERROR (-2) /* clc failed (no bridge, engine error): `on_error` decided */

#define CLC_MAX_CLAUSES 8

/* How often the engine is asked about a kernel's launches (clc_decision.mode). A Python hook
 * declared per_shape or every_launch makes its kernels leave the cached mode. */
#define CLC_MODE_CACHED 0       /* once per (kernel, context) */
#define CLC_MODE_PER_SHAPE 1    /* once per (kernel, context, grid, block, shared memory) */
#define CLC_MODE_EVERY_LAUNCH 2 /* at every launch */

/* How a launch reached the driver. The low nibble is the API, CLC_ENTRY_PTSZ marks the
 * per-thread-default-stream variant. */
#define CLC_ENTRY_LAUNCH 0
#define CLC_ENTRY_LAUNCH_EX 1
#define CLC_ENTRY_LAUNCH_COOPERATIVE 2
#define CLC_ENTRY_GRAPH_ADD_NODE 3
#define CLC_ENTRY_GRAPH_NODE_SET 4
#define CLC_ENTRY_GRAPH_EXEC_NODE_SET 5
#define CLC_ENTRY_PTSZ 16

/* An inclusive range of a launch-shape quantity; [0, UINT64_MAX] matches anything. */
typedef struct clc_range {
    uint64_t lo;
    uint64_t hi;
} clc_range; /* 16 bytes */

typedef struct clc_outcome {
    uint32_t action;      /* CLC_ACTION_* */
    uint32_t flags;       /* CLC_FLAG_* */
    int32_t error;        /* CUresult returned for a deny */
    int32_t rule;         /* index into the policy's rules, or CLC_RULE_* */
    uint64_t replacement; /* const clc_replacement * (CLC_ACTION_REPLACE), else 0 */
} clc_outcome; /* 24 bytes */

/* A wrapped kernel (CLC_ACTION_REPLACE: clc_outcome.replacement points to one of these, made by
 * the engine for one (kernel, context) and kept for the life of the process). The shim
 * launches `function` with the program's arguments and one more, a clc_launch_arg naming the
 * launch's own slot in the context's ring and its lap of the ring (the slot's words carry the
 * lap that wrote them: never reset); a looped wrapper with a cap gets at most cap blocks,
 * which claim the program's grid. Grids of 2^31 blocks or more are launched unwrapped. */
#define CLC_CAP_NONE 0  /* the program's grid */
#define CLC_CAP_SHARE 1 /* a share of the SMs (cap_value / 1e6): the launch gets one wave,
                           sm_count x blocks per SM, and the kernel keeps its share's blocks */
#define CLC_CAP_SMS 2   /* cap_value SMs: the same */
#define CLC_REPLACE_LOOPED 1
#define CLC_REPLACE_SLOT 2 /* the wrapped kernel uses its slot (looped, deadline, policies) */
#define CLC_SLOT_BYTES 32
/* clc_outcome.replacement of CLC_ACTION_CONFINE: the share, CLC_CAP_SHARE (millionths of the
 * device's SMs) or CLC_CAP_SMS (a count of SMs) at CLC_CONFINE_KIND_SHIFT over the value; with
 * CLC_CONFINE_LAST the device's last SMs rather than its first; with CLC_CONFINE_DENY a launch
 * that cannot be confined is denied (else it runs on the whole device), said once. */
#define CLC_CONFINE_KIND_SHIFT 32
#define CLC_CONFINE_LAST 0x10000000000
#define CLC_CONFINE_DENY 0x20000000000
/* Launches captured into a CUDA graph (stream capture) cannot use the ring: a replayed node
 * keeps its slot and lap. Each gets a slot of its own, past the ring's n_slots, taken with the
 * cursor's second word (cursor + 8) and never reused; the shim zeroes it in the stream right
 * before the launch (a memset node), and the kernel zeroes it when it ends (CLC_GRAPH_SEQ), so
 * that each replay starts it afresh. When they are used up, such launches run the original
 * kernel. Kernel nodes made with the graph API (cuGraphAddKernelNode and its setters) get one
 * the same way, without the memset. */
#define CLC_GRAPH_SLOTS 4096
/* The lap (clc_launch_arg.seq) of every launch in a graph slot: the kernel's last hardware
 * block to finish zeroes the slot again, so that a replay starts afresh (runtime.cu). */
#define CLC_GRAPH_SEQ 0xffffffff
#define CLC_OCCUPANCY_WAYS 4
/* clc_stats, the wrapped library's __managed__ counts (clc/wrapping/device/runtime.cu), read by the
 * engine at exit: CLC_STATS_STRIPES stripes of CLC_STATS_STRIPE_BYTES (blocks and threads run,
 * two uint64_t), then skipped (uint64_t), max_resident and share_sms (uint32_t), the whole
 * aligned to a stripe: CLC_STATS_BYTES in all. */
#define CLC_STATS_STRIPES 32
#define CLC_STATS_STRIPE_BYTES 128
#define CLC_STATS_BYTES 4224

typedef struct clc_replacement {
    uint64_t function;   /* CUfunction (of the decision's context) launched instead */
    uint64_t slots;      /* CUdeviceptr of n_slots + CLC_GRAPH_SLOTS zeroed slots of
                            CLC_SLOT_BYTES */
    uint64_t cursor;     /* address of the context's two uint64_t slot cursors (the ring's,
                            then the graph slots'), shared by all its wrapped kernels: the
                            shim adds 1 per launch, atomically */
    uint64_t arg_offset; /* where clc_launch_arg goes in an `extra` argument buffer */
    uint32_t n_slots;    /* a power of two */
    uint32_t n_params;   /* the kernel's own parameters (kernelParams has one more) */
    uint32_t cap_kind;   /* CLC_CAP_* */
    uint32_t cap_value;  /* millionths of the GPU (SHARE) or SMs (SMS) */
    uint32_t sm_count;
    uint32_t flags;      /* CLC_REPLACE_* */
    uint64_t occupancy[CLC_OCCUPANCY_WAYS]; /* the shim's: 1 | threads << 1 | shared << 12 |
                                                 blocks per SM << 48 */
} clc_replacement; /* 88 bytes */

/* The argument appended to a wrapped kernel's launch (struct clc_launch_arg in
 * clc/wrapping/device/runtime.cu; `__clc_arg` in the spliced PTX). */
typedef struct clc_launch_arg {
    uint64_t slot;    /* CUdeviceptr of the launch's slot */
    uint32_t grid[3]; /* the program's grid: the virtual blocks */
    uint32_t seq;     /* the launch's lap of the slot ring, from 1: tells launches apart */
    uint32_t share_sms; /* sm_share: the SMs of the share (blocks on SM ids below it work) */
    uint32_t batch;     /* looped: virtual blocks a block claims at once */
} clc_launch_arg; /* 32 bytes */

/* One rule whose match depends on the launch shape: the first clause whose three ranges all
 * contain the launch's values decides; when none does, `fallback` decides. */
typedef struct clc_clause {
    clc_range grid_blocks;   /* gridX * gridY * gridZ */
    clc_range block_threads; /* blockX * blockY * blockZ */
    clc_range shared_mem;    /* dynamic shared memory, bytes */
    clc_outcome outcome;
} clc_clause; /* 72 bytes */

typedef struct clc_decision {
    uint32_t n_clauses;
    uint32_t mode; /* CLC_MODE_*; in the other modes `fallback` decides the launch asked about */
    clc_clause clauses[CLC_MAX_CLAUSES];
    clc_outcome fallback;
} clc_decision;

/* One kernel parameter: where it lies in the kernel's parameter block, from the driver
 * (cuKernelGetParamInfo / cuFuncGetParamInfo, CUDA 12.4 and later). */
typedef struct clc_param_info {
    uint32_t offset;
    uint32_t size;
} clc_param_info; /* 8 bytes */

/* clc_kernel_query.args_status: whether the argument bytes that follow the query are the
 * launch's. */
#define CLC_ARGS_OK 0
#define CLC_ARGS_NONE 1         /* neither kernelParams nor extra: no arguments */
#define CLC_ARGS_NULL_ENTRY 2   /* a kernelParams entry is NULL */
#define CLC_ARGS_BAD_EXTRA 3    /* extra has an unknown key, no END, or no buffer pointer */
#define CLC_ARGS_NO_MEMORY 4    /* the shim could not allocate the copy */
#define CLC_ARGS_NO_LAYOUT 5    /* the driver gives no parameter layout (before CUDA 12.4) */

/* What a question to the engine (clc_kernel_query) or to clc-run (clc_decide_request) is about. */
#define CLC_ASK_KERNEL 0  /* a kernel: its first sight in a context, or one launch of it */
#define CLC_ASK_PROGRAM 1 /* the process: whether it is confined program-wide on the device (a
                             rule with scope: program); no kernel, and an empty name */

/* What the engine is told at the first sight of a kernel in a context, and at each launch it
 * is asked about (modes PER_SHAPE and EVERY_LAUNCH). The argument pointers are the program's
 * and valid only during the call. The shim copies the launch's arguments, laid out as the
 * kernel's parameter block (offsets from `layout`), into the args_size bytes that follow the
 * query in memory: the engine reads query and arguments as one block. */
typedef struct clc_kernel_query {
    uint64_t handle;  /* CUfunction or CUkernel as the program passed it */
    uint64_t ctx;     /* current CUcontext */
    int32_t device;   /* device ordinal of ctx, -1 when unknown */
    uint32_t entry;   /* CLC_ENTRY_* of the launch that first showed the kernel */
    uint32_t kernel_id;
    uint32_t args_status; /* CLC_ARGS_* */
    const char *name; /* mangled name as the driver reports it; never NULL */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_mem;
    uint32_t tid;   /* kernel thread id of the launching thread */
    uint64_t stream;
    void **params;  /* kernelParams as passed to the launch, or NULL */
    void **extra;   /* extra as passed to the launch, or NULL */
    const clc_param_info *layout; /* n_params entries; valid during the call */
    uint32_t n_params;
    uint32_t args_size; /* bytes of arguments after the query (an `extra` buffer may be short) */
    uint32_t question;  /* CLC_ASK_* */
    uint32_t reserved;
} clc_kernel_query; /* 120 bytes */

/* ---- the decider: first sights answered by clc-run, outside the program ----------------- */
/* For a policy without Python hooks, clc-run answers the first sight of each kernel itself
 * (clc/runtime/decider.py) over a SOCK_SEQPACKET Unix socket whose path is the CLC_DECIDER setting:
 * the program's interpreter (of whatever Python version, or none) is never entered and its GIL
 * never waited for, and forked children are decided like their parent. clc-run reads the
 * asking process's names and identity from the kernel (SO_PEERCRED, /proc), not from it; the
 * shim checks that the answering process is clc-run (its pid and uid are the sealed settings
 * CLC_DECIDER_PID and CLC_DECIDER_UID).
 * Request: a clc_decide_request, then name_size bytes of the mangled name (no NUL). Reply: a
 * clc_decide_reply, then a clc_decision, then text_size bytes for the program's stderr. */
#define CLC_DECIDE_MAGIC 0x44434c43 /* "CLCD" */
#define CLC_DECIDE_MAX_NAME 65536
#define CLC_DECIDE_MAX_TEXT 4096 /* bytes of text in a reply */
#define CLC_DECIDE_OK 0     /* the decision follows */
#define CLC_DECIDE_ENGINE 1 /* a wrap: the program's own engine builds it; the decision is what
                               to do should that engine not run (wraps as on_unwrappable) */
#define CLC_DECIDE_FAILED 2 /* the decider failed: the program's own engine decides */

typedef struct clc_decide_request {
    uint32_t magic;
    int32_t device;     /* device ordinal, -1 when unknown */
    uint32_t name_size; /* at most CLC_DECIDE_MAX_NAME */
    uint32_t seq;       /* the question's number in its connection, echoed by the reply */
    uint32_t question;  /* CLC_ASK_* */
    uint32_t reserved;
} clc_decide_request; /* 24 bytes */

typedef struct clc_decide_reply {
    uint32_t magic;
    uint32_t status; /* CLC_DECIDE_* */
    uint32_t text_size;
    uint32_t seq; /* the question's */
} clc_decide_reply; /* 16 bytes */

/* A kernel's counters, in the order clc_kernel_counts and clc_rec_kernel_stats hold them (each
 * a uint64_t), for code that does the same to every one: X(name) once per counter.
 *   launches     direct launches seen, denied ones included
 *   denied       launches refused by the policy
 *   failed       launches the driver itself refused (denies not counted)
 *   recorded     LAUNCH records written
 *   timed        TIMING records written
 *   graph_nodes  kernel nodes created or updated in graphs
 *   gpu_ns       sum of the TIMING records' gpu_ns */
#define CLC_KERNEL_COUNTERS(X) \
    X(launches) X(denied) X(failed) X(recorded) X(timed) X(graph_nodes) X(gpu_ns)

/* One kernel's counts so far, for the engine (clc_shim_kernel_counts, exported by stage 1). */
typedef struct clc_kernel_counts {
    uint32_t kernel_id;
    int32_t device;
    uint64_t handle;
    uint64_t ctx;
    uint64_t launches, denied, failed, recorded, timed, graph_nodes, gpu_ns; /* the counters */
    uint32_t confined_sms; /* as clc_rec_kernel_stats.confined_sms */
    uint32_t reserved;
} clc_kernel_counts; /* 88 bytes */

/* A hook (or the folded dispatcher around it) slower than this at one launch is reported
 * once: every launch that asks it waits for it (the bridge times it in C, the engine in
 * Python). */
#define CLC_SLOW_HOOK_NS 1000000

/* ---- module and library loads ------------------------------------------------------------ */

#define CLC_LOAD_MODULE_LOAD 1          /* cuModuleLoad(path) */
#define CLC_LOAD_MODULE_LOAD_DATA 2     /* cuModuleLoadData */
#define CLC_LOAD_MODULE_LOAD_DATA_EX 3  /* cuModuleLoadDataEx */
#define CLC_LOAD_MODULE_LOAD_FATBINARY 4 /* cuModuleLoadFatBinary */
#define CLC_LOAD_LIBRARY_LOAD_DATA 5    /* cuLibraryLoadData */
#define CLC_LOAD_LIBRARY_LOAD_FILE 6    /* cuLibraryLoadFromFile */
#define CLC_LOAD_MODULE_UNLOAD 7        /* cuModuleUnload */
#define CLC_LOAD_LIBRARY_UNLOAD 8       /* cuLibraryUnload */
#define CLC_LOAD_CONTEXT_DESTROYED 9    /* not a load: context `handle` was destroyed (cuCtxDestroy,
                                           the primary context's reset or last release); its
                                           kernels' entries now carry CLC_CTX_DESTROYED */
#define CLC_LOAD_KERNEL_FORGOTTEN 10   /* not a load: the decision of kernel `handle` in context
                                          `ctx` (the shim's `kernel_id`) was forgotten, because
                                          its module or library was unloaded or its context
                                          destroyed; the driver may give its handle to another
                                          kernel, which is decided anew */
/* Set in the engine's records of a destroyed context's kernels, and the context of a forgotten
 * entry of the shim's table: no live context has this bit, so such an entry matches no launch,
 * and a new context the driver gives the same address is a new one, whose kernels are decided
 * (and wrapped) anew. */
#define CLC_CTX_DESTROYED 0x8000000000000000
/* The kernel id of launches decided without a cache entry (the decision table is full of live
 * kernels, or the kernel's module is being unloaded): decided at each of their launches, and
 * counted together as one kernel of this id, whose KERNEL record names no kernel. */
#define CLC_KERNEL_UNCACHED 0xffffffff

#define CLC_IMAGE_UNKNOWN 0
#define CLC_IMAGE_FATBIN_WRAPPER 1 /* magic 0x466243b1 */
#define CLC_IMAGE_FATBIN 2         /* magic 0xBA55ED50 */
#define CLC_IMAGE_ELF 3            /* cubin */
#define CLC_IMAGE_PTX 4            /* NUL-terminated text */
#define CLC_IMAGE_FILE 5           /* loaded from a path: image_ptr is 0 */

typedef struct clc_module_event {
    uint32_t api;        /* CLC_LOAD_* */
    uint32_t image_kind; /* CLC_IMAGE_* */
    uint64_t handle;     /* CUmodule or CUlibrary produced (or unloaded) */
    uint64_t image_ptr;
    uint64_t image_size; /* bytes, 0 when unknown */
    uint32_t preserved;  /* 1: the bytes stay valid after the call (BINARY_IS_PRESERVED) */
    int32_t result;      /* CUresult of the real call */
    const char *path;    /* file loads only, else NULL */
    uint64_t ctx;        /* CLC_LOAD_KERNEL_FORGOTTEN: the kernel's context */
    uint32_t kernel_id;  /* CLC_LOAD_KERNEL_FORGOTTEN: the shim's id of the forgotten entry */
    uint32_t reserved;
} clc_module_event;

/* ---- the capture file --------------------------------------------------------------------- */

#define CLC_CAPTURE_MAGIC "CLCCAPT1" /* 8 bytes, no terminator in the file */
#define CLC_CAPTURE_VERSION 4

typedef struct clc_capture_header {
    char magic[8];
    uint32_t version;
    uint32_t header_size; /* sizeof(clc_capture_header) */
    uint32_t pid;
    uint32_t ppid;
    uint64_t start_monotonic_ns; /* CLOCK_MONOTONIC; every t_ns below is on this clock */
    uint64_t start_realtime_ns;  /* CLOCK_REALTIME at the same moment */
    uint64_t reserved[2];
} clc_capture_header; /* 56 bytes */

/* Every record starts with this header; size covers the header, the body and the padding
 * that rounds it up to a multiple of 8. Strings follow the fixed body, NUL-terminated. */
typedef struct clc_record_header {
    uint16_t type;
    uint16_t reserved;
    uint32_t size;
} clc_record_header; /* 8 bytes */

#define CLC_REC_PAD 0          /* no body: fills a writer's buffer up to its end; skip it */
#define CLC_REC_PROCESS 1      /* body: clc_rec_process, then the command line (args joined by ' ') */
#define CLC_REC_POLICY 2       /* body: the compiled policy as JSON text */
#define CLC_REC_KERNEL 3       /* body: clc_rec_kernel, then the mangled name */
#define CLC_REC_LAUNCH 4       /* body: clc_rec_launch */
#define CLC_REC_TIMING 5       /* body: clc_rec_timing */
#define CLC_REC_MODULE 6       /* body: clc_rec_module, then the path (file loads) or "" */
#define CLC_REC_KERNEL_STATS 7 /* body: clc_rec_kernel_stats; a kernel's counts so far, held in
                                  a COUNTS record's copies, not on its own */
#define CLC_REC_MESSAGE 8      /* body: clc_rec_message, then the text */
#define CLC_REC_END 9          /* body: clc_rec_end; the last record of a complete capture */
#define CLC_REC_RULE_STATS 10  /* body: clc_rec_rule_stats; as KERNEL_STATS, one per rule that
                                  denied launches, in COUNTS records */
#define CLC_REC_HOLD 11        /* body: clc_rec_hold; a best-effort launch held */
#define CLC_REC_RUN 12         /* body: what clc-run says of the run as JSON text (the tenant, the
                                  user's uid, labels such as a Slurm job's), after POLICY */
#define CLC_REC_WRAP_STATS 13  /* body: clc_rec_wrap_stats, then the kernel's name and the wrapper
                                  (its file and parameters), each NUL-terminated; one per wrapped
                                  kernel, at exit */
#define CLC_REC_DEVICE 14      /* body: clc_rec_device; a device's UUID, once per device of the
                                  process's kernels, before or after their KERNEL records */
#define CLC_REC_COUNTS 15      /* body: clc_rec_counts, then its two copies (see below) */

typedef struct clc_rec_process {
    uint32_t pid;
    uint32_t ppid;
} clc_rec_process;

typedef struct clc_rec_kernel {
    uint32_t kernel_id; /* from 0, per process; a new one for each (kernel, context) decided */
    int32_t device;
    uint64_t handle;
    uint64_t ctx;
    uint64_t t_ns;
} clc_rec_kernel; /* 32 bytes */

/* The GPU behind a device ordinal of the process (clc_rec_kernel.device), as the driver
 * names it (cuDeviceGetUuid_v2): the ordinal depends on CUDA_VISIBLE_DEVICES, the UUID is the
 * one nvidia-smi and DCGM give the GPU (a MIG instance's own UUID under MIG). */
typedef struct clc_rec_device {
    int32_t device;
    uint32_t reserved;
    char uuid[16];
} clc_rec_device; /* 24 bytes */

typedef struct clc_rec_launch {
    uint64_t seq;    /* per-process launch number, matches clc_rec_timing.seq */
    uint64_t t_ns;   /* CPU time at the hook's entry */
    uint64_t stream; /* CUstream as passed (0: default stream) */
    uint32_t kernel_id;
    uint32_t entry; /* CLC_ENTRY_* */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_mem;
    uint32_t tid;    /* kernel thread id of the launching thread */
    uint32_t action; /* CLC_ACTION_* applied */
    int32_t rule;
    int32_t result; /* CUresult the program got back */
    uint32_t flags; /* CLC_LAUNCH_TIMED */
} clc_rec_launch; /* 80 bytes */

/* clc_rec_launch.flags: its GPU time was measured, and a TIMING record of the same seq follows
 * (written by the launching thread at one of its later timed launches, or at exit). */
#define CLC_LAUNCH_TIMED 1

typedef struct clc_rec_timing {
    uint64_t seq;
    uint32_t kernel_id;
    uint32_t source; /* CLC_TIMING_*: where gpu_ns comes from */
    uint64_t gpu_ns;
} clc_rec_timing; /* 24 bytes */

#define CLC_TIMING_EVENTS 0 /* CUDA events recorded on the stream around the launch */
#define CLC_TIMING_CUPTI 1  /* CUPTI's kernel activity record: the kernel's own start and end */

typedef struct clc_rec_module {
    uint64_t t_ns;
    uint32_t api;
    uint32_t image_kind;
    uint64_t handle;
    uint64_t image_ptr;
    uint64_t image_size;
    uint32_t preserved;
    int32_t result;
} clc_rec_module; /* 48 bytes */

typedef struct clc_rec_kernel_stats {
    uint32_t kernel_id;
    uint32_t confined_sms; /* the SMs of the green context its launches ran on (sm_share by a
                              green context); 0: never confined */
    uint64_t launches, denied, failed, recorded, timed, graph_nodes, gpu_ns; /* the counters */
} clc_rec_kernel_stats; /* 64 bytes */

/* The counts, kept where a size cap or SIGKILL cannot take them: a COUNTS record holds two
 * copies of `capacity` bytes each, overwritten in place in turn (the older one each time), so
 * that a write cut short (SIGKILL, a crash) spoils only the copy it was writing, which its
 * checksum then gives away: the valid copy of the higher generation holds. A copy is a
 * clc_counts_copy, then `length` bytes of records (KERNEL_STATS, RULE_STATS; PAD for room not
 * in use). The shim writes the copies every second when a count changed, and at exit. A
 * process has one COUNTS record for its rules, the capture's own counts and its first kernels,
 * and one more each time its kernels outgrow those it has (each for as many kernels again as
 * there were): each kernel's counts are in one of them, their newest valid copy. */
typedef struct clc_rec_counts {
    uint32_t capacity; /* bytes of each copy, its header included */
    uint32_t reserved;
} clc_rec_counts; /* 8 bytes */

typedef struct clc_counts_copy {
    uint64_t generation;       /* from 1, per process; 0: never written */
    uint64_t t_ns;             /* when it was written */
    uint64_t dropped;          /* as clc_rec_end's, so far */
    uint64_t write_lost_bytes; /* as clc_rec_end's, so far */
    uint64_t capped_bytes;     /* as clc_rec_end's, so far */
    uint64_t undecided;        /* as clc_rec_end's, so far */
    int32_t write_errno;       /* as clc_rec_end's */
    uint32_t flags;            /* as clc_rec_end's: CLC_END_TABLE_FULL, CLC_END_TRUNCATED */
    uint32_t length;           /* bytes of records after this header */
    uint32_t checksum;         /* CRC-32 (zlib's crc32) of those records, then of this header
                                  with checksum 0 */
} clc_counts_copy; /* 64 bytes */

/* A wrapped kernel's counts, as its wrapper counted them on the GPU (clc_stats) over the
 * process. */
typedef struct clc_rec_wrap_stats {
    uint64_t t_ns;
    uint64_t blocks;       /* virtual blocks run */
    uint64_t threads;      /* the threads of those blocks */
    uint64_t skipped;      /* virtual blocks the deadline wrapper skipped */
    uint32_t max_resident; /* the most blocks resident at once */
    uint32_t share_sms;    /* sm_share: the SMs of its share (the last launch's); 0: none */
} clc_rec_wrap_stats; /* 40 bytes */

#define CLC_MSG_INFO 0
#define CLC_MSG_WARNING 1
#define CLC_MSG_ERROR 2

typedef struct clc_rec_message {
    uint32_t level;
    uint32_t reserved;
    uint64_t t_ns;
} clc_rec_message; /* 16 bytes */

/* The last record of a complete capture, written after the counts' last copies. A process may
 * write several: each one closes what came before it (launches made later, in an exit handler
 * or a destructor, are followed by another), and the last one's counts are the process's. */
typedef struct clc_rec_end {
    uint64_t t_ns;
    uint64_t dropped;          /* records lost because a buffer was full */
    uint64_t write_lost_bytes; /* bytes the file refused (write errors: ENOSPC, EIO, ...) */
    uint64_t capped_bytes;     /* bytes not written because the capture reached its size cap */
    int32_t write_errno;       /* the first write error, 0 when none */
    uint32_t how;              /* CLC_END_*: how the process was leaving */
    int32_t status;            /* _exit's status, or the signal's number; 0 for exit() */
    uint32_t flags;            /* CLC_END_TABLE_FULL, CLC_END_TRUNCATED */
    uint64_t undecided;        /* launches no kernel entry could hold (the driver could not be
                                  placed, a signal handler's launch of a kernel not decided
                                  yet): on_error decided them, without a LAUNCH record */
} clc_rec_end; /* 56 bytes */

#define CLC_END_EXIT 0   /* exit() or main's return: exit handlers and destructors ran */
#define CLC_END_QUICK 1  /* _exit, _Exit or exit_group: no exit handler ran */
#define CLC_END_SIGNAL 2 /* a fatal signal (status: its number), then its own action */
/* clc_rec_end.flags */
#define CLC_END_TABLE_FULL 1 /* the decision table filled: later kernels were decided at each
                                launch (their counts are the CLC_KERNEL_UNCACHED kernel's) */
#define CLC_END_TRUNCATED 2  /* records every capture keeps (kernels, loads, messages) were
                                dropped at the size cap */

/* How many launches each rule denied (all of them, recorded or not), per process. `rule` is
 * the decider's index as in clc_outcome.rule (CLC_RULE_DEFAULT, CLC_RULE_ON_ERROR included). */
typedef struct clc_rec_rule_stats {
    int32_t rule;
    uint32_t reserved;
    uint64_t denied;
} clc_rec_rule_stats; /* 16 bytes */

/* A best-effort process's launch held while a latency-critical process was busy on its GPU
 * (priority classes): when, for how long, and how long after that process went busy. */
typedef struct clc_rec_hold {
    uint64_t t_ns;    /* CLOCK_MONOTONIC when the hold began */
    uint64_t held_ns; /* how long the launch waited */
    uint64_t lag_ns;  /* from the latency-critical GPU going busy to the hold; 0: unknown */
    int32_t device;
    uint32_t why; /* CLC_HOLD_BUSY or CLC_HOLD_NO_BOARD, with CLC_HOLD_FLOOR, CLC_HOLD_SHARED,
                     CLC_HOLD_RESERVE or CLC_HOLD_SLO */
} clc_rec_hold; /* 32 bytes */

#define CLC_HOLD_BUSY 0     /* a latency-critical process was busy on the GPU */
#define CLC_HOLD_NO_BOARD 1 /* the board could not be read (or its slots overflowed) */
#define CLC_HOLD_FLOOR 16   /* let go by the floor, not by the GPU going idle */
#define CLC_HOLD_SHARED 32  /* not a wait: a busy period whose launches ran on the held share
                               (held_share), from its first launch to the first found idle */
#define CLC_HOLD_RESERVE 64 /* not a wait: a period whose launches left the reserve free
                               (reserve), from its first launch to the first that found no
                               latency-critical process living on the GPU */
#define CLC_HOLD_SLO 128    /* not a wait: a period in which a latency-critical class's slo
                               kept the launches below the class's own bounds (a smaller share
                               or none, a shorter run-ahead), from its first launch so kept to
                               the first launch with the class's bounds again */

/* ---- priority classes: what clc-run seals for shim/priority/ (docs/priority.md) ----------- */
/* CLC_PRIORITY's value: the process's class */
#define CLC_PRIORITY_WORD_LC "lc" /* latency-critical */
#define CLC_PRIORITY_WORD_BE "be" /* best-effort */
/* The board's directory when the policy names none (CLC_PRIORITY_BOARD) */
#define CLC_PRIORITY_BOARD_DEFAULT "/dev/shm/clc-board"
/* The users whose board directories a best-effort process reads: its own and root's, and at
 * most CLC_PRIORITY_MAX_TRUSTED - 2 more that the policy's latency-critical classes name
 * (CLC_PRIORITY_TRUST); clc-run refuses a policy that names more. */
#define CLC_PRIORITY_MAX_TRUSTED 256
/* The classes' settings: the policy loader refuses values outside these ranges, and the shim
 * puts the default in their place whatever clc-run sealed. */
#define CLC_PRIORITY_FLOOR_MIN 0.001 /* CLC_PRIORITY_FLOOR: the share of time a held process runs */
#define CLC_PRIORITY_FLOOR_MAX 1
#define CLC_PRIORITY_FLOOR_DEFAULT 0.1
#define CLC_PRIORITY_RUN_AHEAD_MIN 4 /* CLC_PRIORITY_RUN_AHEAD: launches ahead of the GPU */
#define CLC_PRIORITY_RUN_AHEAD_MAX 256
#define CLC_PRIORITY_RUN_AHEAD_DEFAULT 32
/* CLC_PRIORITY_IDLE_MS: milliseconds without a launch after which a latency-critical GPU is
 * idle; more than 0 (the range is open there), at most the maximum */
#define CLC_PRIORITY_IDLE_MS_MAX 10000
#define CLC_PRIORITY_IDLE_MS_DEFAULT 20
/* CLC_PRIORITY_RESERVE: the share of the SMs a best-effort process leaves free while a
 * latency-critical process lives on its GPU, which it does while it launched there in the last
 * CLC_PRIORITY_RESERVE_KEEP_MS (then the whole GPU is the best-effort process's again) */
#define CLC_PRIORITY_RESERVE_KEEP_MS 1000
/* CLC_PRIORITY_SLO: a latency-critical class's target: the p99 of its busy periods at most
 * this many times their p99 while best-effort work is held; more than 1 (open), at most the
 * maximum */
#define CLC_PRIORITY_SLO_MAX 10

/* ---- the status socket: what each process tells clc-run (CLC_STATUS) ------------------------ */
/* One datagram per message: a word below, a space, then the text (clc/runtime/status.py). */
#define CLC_STATUS_START "start"                   /* the shim started: the process's name */
#define CLC_STATUS_EXEC "exec"                     /* it is about to execute: the path */
#define CLC_STATUS_EXEC_FAILED "exec-failed"       /* the execution failed: why */
#define CLC_STATUS_SPAWN "spawn"                   /* it spawned a child: "PID PATH" */
#define CLC_STATUS_CAPTURE "capture"               /* it opened its capture: the path */
#define CLC_STATUS_CAPTURE_FAILED "capture-failed" /* it could not: the path */
#define CLC_STATUS_NO_SETTINGS "no-settings" /* the shim started without its settings: the name */

/* ---- stage 1's exports, called by the engine in the program's Python --------------------- */
/* Python calls them through ctypes with the types of these prototypes (clc.abi.SHIM_EXPORTS,
 * generated from them). */

/* A sealed setting's value (CLC_SETTING_KEYS), or NULL when clc-run gave none. */
const char *clc_shim_setting(const char *key);
/* A message (CLC_MSG_*) into the capture, and on stderr from warnings up. */
void clc_shim_message(int level, const char *text);
/* Every kernel's counts so far into out[max]; returns how many. */
int clc_shim_kernel_counts(clc_kernel_counts *out, int max);
/* A WRAP_STATS record (t_ns is the shim's) of the wrapped kernel `kernel` and its `wrapper`. */
void clc_shim_wrap_stats(const clc_rec_wrap_stats *stats, const char *kernel, const char *wrapper);

/* ---- stage 2's exports (clc.runtime._bridge), which stage 1 finds with dlsym --------------- */
/* bridge_loader.c calls them through these types, and shim/bridge/bridge.c declares them with them:
 * cffi's definitions of the embedding API's three (shim/bridge_build.py) and bridge.c's own
 * two must agree with them, or stage 2 does not compile. Each returns 0 when done. */
typedef int (*clc_bridge_decide_fn)(const clc_kernel_query *q, clc_decision *out);
typedef int (*clc_bridge_launch_fn)(const clc_kernel_query *q, clc_outcome *out);
typedef int (*clc_bridge_module_fn)(const clc_module_event *ev);
typedef int (*clc_bridge_exit_fn)(void);
typedef int (*clc_bridge_start_fn)(const char *executable, const char *search_path);

/* The first CLC_DENIED_RECORDED denied launches of each kernel get a LAUNCH record even when
 * their outcome does not ask for one (an audit trail in allow-all captures). */
#define CLC_DENIED_RECORDED 16

#endif /* CLC_ABI_H */
