/* SPDX-License-Identifier: Apache-2.0
 *
 * leave.c: the ways a process leaves without exit()'s handlers, each of which keeps its capture:
 * _exit and _Exit (Python's os._exit, a multiprocessing worker's way out), exit_group called by
 * number through syscall(), and a signal whose default action ends the process (SIGSEGV,
 * SIGBUS, SIGABRT, SIGTERM, ...). The counts and the END record are written, then the process
 * leaves as it would have: the signal acts as its default action does (a fault is taken again,
 * other signals raised again), so the exit status, a core dump and a waiting parent see what
 * they would without clc. syscall() also hands execve called by number to the exec hooks.
 *
 * The signal handlers are clc's only where the program keeps the default action, and only in a
 * process that has a capture. The program sees the default there (sigaction and signal answer
 * with SIG_DFL), and whatever it installs replaces clc's; setting the default again puts clc's
 * back. A handler the program installs itself runs as the program wrote it: if it leaves with
 * _exit, that keeps the capture too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "hooks.h"

typedef void (*exit_fn)(int);
typedef long (*syscall_fn)(long, ...);
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);

static exit_fn g_real_exit, g_real_Exit;
static syscall_fn g_real_syscall;
static sigaction_fn g_real_sigaction;

/* Resolved at start: a vfork child that fails its exec calls _exit, and must not look symbols
 * up in its parent's memory. */
void clc_leave_start(void) {
    g_real_exit = (exit_fn)clc_next_symbol("_exit");
    g_real_Exit = (exit_fn)clc_next_symbol("_Exit");
    g_real_syscall = (syscall_fn)clc_next_symbol("syscall");
    g_real_sigaction = (sigaction_fn)clc_next_symbol("sigaction");
}

/* Pending GPU times are read back (not from a signal's handler: the thread it interrupted may
 * hold the timing state), then the counts and the END record written. */
void clc_leave(uint32_t how, int32_t status) {
    if (!g_cfg.pid || getpid() != g_cfg.pid) return;
    int was = t_in_clc;
    t_in_clc = 1;
    if (how != CLC_END_SIGNAL) clc_timing_drain_all();
    clc_priority_leave(how == CLC_END_SIGNAL);
    clc_capture_finish(how, status, how == CLC_END_SIGNAL);
    t_in_clc = was;
}

static __attribute__((noreturn)) void leave_now(exit_fn real, int status) {
    clc_leave(CLC_END_QUICK, status);
    if (!real) real = (exit_fn)clc_libc_symbol("_exit");
    real(status);
    __builtin_unreachable();
}

CLC_EXPORT __attribute__((noreturn)) void _exit(int status) {
    if (unlikely(!g_real_exit)) g_real_exit = (exit_fn)clc_next_symbol("_exit");
    leave_now(g_real_exit, status);
}

CLC_EXPORT __attribute__((noreturn)) void _Exit(int status) {
    if (unlikely(!g_real_Exit)) g_real_Exit = (exit_fn)clc_next_symbol("_Exit");
    leave_now(g_real_Exit, status);
}

/* libc's syscall(): exit_group called by number leaves as _exit does; execve and execveat
 * called by number go through the exec hooks (settings.c), which hand the new image the shim
 * and its settings, as the libc calls of the same name do; every other call passes on its six
 * possible arguments. */
CLC_EXPORT long syscall(long number, ...) {
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_execve)
        return execve((const char *)a[0], (char *const *)a[1], (char *const *)a[2]);
    if (number == SYS_execveat)
        return execveat((int)a[0], (const char *)a[1], (char *const *)a[2], (char *const *)a[3],
                        (int)a[4]);
    if (unlikely(!g_real_syscall)) g_real_syscall = (syscall_fn)clc_next_symbol("syscall");
    if (number == SYS_exit_group) clc_leave(CLC_END_QUICK, (int)a[0]);
    return g_real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* ---- fatal signals ----------------------------------------------------------------------------
 */

/* The signals whose default action ends the process (signal(7)), but SIGKILL and SIGSTOP, which
 * nothing can catch, and the real-time signals, some of which glibc keeps for itself. */
static const int g_fatal[] = {SIGHUP,  SIGINT,  SIGQUIT,   SIGILL,  SIGTRAP, SIGABRT,
                              SIGBUS,  SIGFPE,  SIGUSR1,   SIGSEGV, SIGUSR2, SIGPIPE,
                              SIGALRM, SIGTERM, SIGSTKFLT, SIGXCPU, SIGXFSZ, SIGVTALRM,
                              SIGPROF, SIGIO,   SIGPWR,    SIGSYS};

/* 1: clc's handler is there, the program keeps the default. */
static _Atomic int g_managed[NSIG];
static _Atomic int g_started;
static _Atomic int g_leaving; /* 0, then 1 while the first fatal signal writes, 2 once done */

/* g_managed[sig], and clc_default_signals (core.h) with it */
static void managed(int sig, int on) {
    atomic_store(&g_managed[sig], on);
    uint64_t bit = sig >= 1 && sig <= 64 ? 1ull << (sig - 1) : 0;
    if (on)
        atomic_fetch_or(&clc_default_signals, bit);
    else
        atomic_fetch_and(&clc_default_signals, ~bit);
}

static int fatal(int sig) {
    for (size_t i = 0; i < sizeof g_fatal / sizeof g_fatal[0]; i++)
        if (g_fatal[i] == sig) return 1;
    return 0;
}

static int real_sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (unlikely(!g_real_sigaction)) g_real_sigaction = (sigaction_fn)clc_next_symbol("sigaction");
    if (!g_real_sigaction) {
        errno = ENOSYS;
        return -1;
    }
    return g_real_sigaction(sig, act, old);
}

/* A fault the kernel raised is taken again when the handler returns; any other signal is raised
 * again, and acts once the handler has returned and unblocked it. */
static int synchronous(int sig, const siginfo_t *info) {
    return info && info->si_code > 0 &&
           (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP);
}

static void on_fatal(int sig, siginfo_t *info, void *context) {
    (void)context;
    int saved = errno;
    int expected = 0;
    if (atomic_compare_exchange_strong(&g_leaving, &expected, 1)) {
        clc_leave(CLC_END_SIGNAL, sig);
        atomic_store(&g_leaving, 2);
    } else {
        /* Another thread is writing the capture: give it time to finish before this signal
         * ends the process. */
        for (int i = 0; i < 5000 && atomic_load(&g_leaving) == 1; i++) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    managed(sig, 0);
    real_sigaction(sig, &dfl, NULL);
    if (!synchronous(sig, info)) raise(sig);
    errno = saved;
}

static int install(int sig) {
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_fatal;
    act.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigfillset(&act.sa_mask); /* one fatal signal at a time on this thread */
    if (real_sigaction(sig, &act, NULL) != 0) return 0;
    managed(sig, 1);
    return 1;
}

void clc_signals_start(void) {
    if (atomic_exchange(&g_started, 1)) return;
    for (size_t i = 0; i < sizeof g_fatal / sizeof g_fatal[0]; i++) {
        struct sigaction old;
        if (real_sigaction(g_fatal[i], NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
            old.sa_handler == SIG_DFL)
            install(g_fatal[i]);
    }
}

/* What the program sees of a signal whose default clc keeps: the default. */
static void default_view(struct sigaction *old) {
    memset(old, 0, sizeof *old);
    old->sa_handler = SIG_DFL;
}

CLC_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (sig <= 0 || sig >= NSIG || !atomic_load(&g_started) || !fatal(sig))
        return real_sigaction(sig, act, old);
    int is_default = act && !(act->sa_flags & SA_SIGINFO) && act->sa_handler == SIG_DFL;
    if (atomic_load(&g_managed[sig])) {
        if (act && !is_default) {
            managed(sig, 0);
            if (real_sigaction(sig, act, NULL) != 0) {
                managed(sig, 1);
                return -1;
            }
        }
        if (old) default_view(old);
        return 0;
    }
    if (is_default) {
        if (real_sigaction(sig, NULL, old) != 0) return -1;
        if (atomic_load(&g_leaving) == 0 && install(sig)) return 0;
    }
    return real_sigaction(sig, act, old);
}

/* signal() of glibc (BSD semantics), through sigaction above: glibc's own calls sigaction
 * inside libc, where the shim's does not reach. */
static __sighandler_t set_handler(int sig, __sighandler_t handler, int flags) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = flags;
    sigemptyset(&act.sa_mask);
    if (sig > 0 && sig < NSIG && !(flags & SA_NODEFER)) sigaddset(&act.sa_mask, sig);
    if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

CLC_EXPORT __sighandler_t signal(int sig, __sighandler_t handler) {
    return set_handler(sig, handler, SA_RESTART);
}

CLC_EXPORT __sighandler_t bsd_signal(int sig, __sighandler_t handler) {
    return set_handler(sig, handler, SA_RESTART);
}

CLC_EXPORT __sighandler_t sysv_signal(int sig, __sighandler_t handler) {
    return set_handler(sig, handler, SA_RESETHAND | SA_NODEFER);
}
