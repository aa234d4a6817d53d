# SPDX-License-Identifier: Apache-2.0
"""The engine: runs inside the traced program and answers the shim's two questions.

"First sight of kernel K in context C": ask the deciders in order (the --hooks files' Python
hooks, then the policy's rules, a hook rule asking its function, then the default; the policy
comes from clc-run as JSON, through the shim's copy of its settings) and return the decision
that the C side caches for every later launch, or that it must ask again per shape or at every
launch. (A policy without Python hooks is decided by clc-run itself, clc.runtime.decider; the engine
then builds its wrapped kernels, and decides when clc-run cannot be asked.) "A module or
library was loaded": remember where its image is, for the wrap pipeline (clc.wrapping.engine,
imported only when a decision wraps), which turns a `wrap` outcome into the clc_replacement
the shim launches.

Only the standard library may be imported here: the program's Python may lack clc's
dependencies. Nothing here may raise into the shim: a failure is reported once and the shim
falls back to the policy's on_error.
"""

import atexit
import collections
import dataclasses
import os
import sys
import time
import traceback
from sys import getrefcount

from clc import abi
from clc.words import count
from clc.cuda_errors import CUDA_ERRORS
from clc.demangle import demangle
from clc.runtime.exit_stats import ExitStats
from clc.runtime.hook_launch import QueryLaunch, checked_layout
from clc.runtime.hooks import import_hook_file, load_hook_file, resolve_hook_ref
from clc.runtime.shim_calls import CACHE_SETTINGS as _CACHE_SETTINGS
from clc.runtime.shim_calls import shim_kernel_counts, shim_message, shim_settings
from clc.policy import Decision, KernelInfo, Outcome, Policy, process_identity
from clc.policy.names import process_names
from clc.runtime.wording import deny_announcements, describe, rule_name
from clc.runtime.wrap_exit import report_wrap_exit

__all__ = ["Engine", "shim_settings", "program_scope_decision", "report_engine_error",
           "process_names", "rule_name", "deny_announcements", "describe"]


class _HookFailed(Exception):
    """A hook raised: reported once, and the launch gets the policy's on_error."""


class _Raised:
    """What an every_launch hook raised, told apart from what it returned."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


_HOOK, _RULE, _HOOK_RULE = range(3)
# One decider of a kernel's plan: its kind, its index (a rule's, or past the rules for a
# --hooks hook), the rule, the hook, how often the hook is asked (a MODE_*), whether the rule
# has shape conditions, and a plain rule's (Outcome, clc_outcome bytes).
_Step = collections.namedtuple("_Step", "kind index rule hook mode has_shape outcome")


class _Kernel:
    """What the engine keeps about one (kernel, context): its names, the deciders that can
    apply to it (its plan), and its hooks' answers."""

    __slots__ = ("handle", "ctx", "info", "plan", "answers", "messages", "outcomes", "wraps",
                 "_layout", "views")

    def __init__(self, handle, info, plan, ctx=0, layout=()):
        self.handle = handle
        self.ctx = ctx
        self.wraps = {}  # (WrapRequest, flags, rule) -> the Outcome launches get
        self.info = info
        self.plan = plan
        self.answers = {}
        self.messages = {}  # decider index -> the message of a deny a hook returned
        self.outcomes = {}  # (id(answer), decider index) -> (answer, Outcome, clc_outcome bytes)
        self._layout = checked_layout(layout)
        self.views = []  # QueryLaunch objects free for the next launch asked about

    def layout(self):
        """The kernel's parameter layout, [(offset, size), ...], as the driver gave it to the
        shim at first sight ([] when the driver cannot say)."""
        return self._layout

    def new_view(self):
        """A Launch of this kernel to reuse for its launches; `refs` is what the references
        to it and its params count where it is checked (a caller's local variable and the
        argument of getrefcount) when nobody else holds them."""
        launch = QueryLaunch(self.info.mangled, self.info.demangled, self._layout)
        launch.refs = getrefcount(launch) + getrefcount(launch.params)
        return launch

    def ask(self, engine_walk, blob):
        """engine_walk(kernel, launch) for one query block, with a Launch of this kernel that
        is reused afterwards unless something kept it (a hook that stored the launch or its
        params: those keep refusing reads)."""
        views = self.views
        try:
            launch = views.pop()
        except IndexError:
            launch = self.new_view()
        launch.set(blob)
        try:
            return engine_walk(self, launch)
        finally:
            launch.clear()
            if getrefcount(launch) + getrefcount(launch.params) == launch.refs:
                views.append(launch)


_NOT_PERMITTED = CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]
# A hook slower than this is reported once: every launch that asks it waits for it.
SLOW_HOOK_NS = abi.SLOW_HOOK_NS

# For the code that runs at every launch asked about: globals, not attribute lookups.
_ALLOW, _DENY, _REPLACE = abi.ACTION_ALLOW, abi.ACTION_DENY, abi.ACTION_REPLACE
_PER_SHAPE, _EVERY_LAUNCH = abi.MODE_PER_SHAPE, abi.MODE_EVERY_LAUNCH
_SLOW = SLOW_HOOK_NS
_STATUS_AT = abi.QUERY_ARGS_STATUS_AT  # clc_kernel_query.args_status, one byte




class Engine:
    def __init__(self, settings=None):
        sealed = settings is None
        settings = shim_settings() if sealed else settings
        if "CLC_POLICY" not in settings:
            raise RuntimeError("no policy: clc-run's settings were not found (run the program "
                               "under clc-run)")
        self.policy = Policy.from_json(settings["CLC_POLICY"])
        self.tenant = settings.get("CLC_TENANT", "")
        self.process_names = process_names()
        self._credentials = None
        self.identity = self._identity()  # from the kernel, never from the environment
        self.verbose = settings.get("CLC_VERBOSE", "0") not in ("", "0")
        self._announced = set()
        self._reported = set()
        self.kernels = {}
        self.names = {}  # the shim's kernel id -> demangled name, for the exit statistics
        # The deciders, in the order they are asked: the --hooks files' hooks, then the rules
        # (a hook rule asks its function), then the default.
        self.cli_hooks = []
        self.exit_functions = []
        for ref in self.policy.hooks:
            hook_file = load_hook_file(ref.path)
            self.cli_hooks.extend(hook_file.hooks)
            self._add_exit_functions(hook_file)
        self.rule_hooks = {}
        for index, rule in enumerate(self.policy.rules):
            if rule.hook is not None:
                self.rule_hooks[index] = resolve_hook_ref(
                    f"{rule.hook.path}:{rule.hook.function}", os.sep)
                self._add_exit_functions(import_hook_file(rule.hook.path))
        self._exited = False
        if self.exit_functions or self.cli_hooks or self.rule_hooks:
            atexit.register(self.run_exit)
        # Any hook may answer clc.wrap(): then, as with a splicing rule, loads are remembered.
        self.may_wrap = bool(self.cli_hooks or self.rule_hooks or self.policy.splices)
        self._wrapping = None
        # The disk cache is clc-run's choice, never the program's: sealed settings without it
        # turn the cache off (said at the first build) rather than fall back on the
        # environment, which the program controls. Settings handed in without it (tests)
        # leave it to the environment.
        cache = {key: settings[key] for key in _CACHE_SETTINGS if key in settings}
        self._cache_settings = cache if cache or sealed else None
        self._default = outcome_with_bytes(self.policy.default_outcome())
        self.walk = self._walk  # bound once: used at every launch asked about
        self._bridge_timed = {}  # kernel id -> (kernel, hook) of dispatchers the bridge times
        self._on_error = outcome_with_bytes(self.policy.on_error_outcome())

    def _add_exit_functions(self, hook_file):
        for fn in hook_file.exit_functions:
            if fn not in self.exit_functions:
                self.exit_functions.append(fn)

    def _identity(self):
        """This process's identity, read again once its user or groups changed (setuid and the
        like; the shim then forgets its decisions, so that each kernel is decided anew)."""
        credentials = (os.getresuid(), os.getresgid(), tuple(os.getgroups()))
        if credentials != self._credentials:
            self._credentials = credentials
            self.identity = process_identity()
        return self.identity

    # ---- the two questions --------------------------------------------------------------

    def kernel(self, handle, ctx, mangled, device, layout=(), kernel_id=None):
        """The engine's record of a (kernel, context), made at its first sight; layout is its
        parameters' [(offset, size), ...]. A record under the same handle but another name is
        a kernel the driver gave a reused handle: a new record."""
        key = (handle, ctx)
        kernel = self.kernels.get(key)
        if kernel is None or kernel.info.mangled != mangled:
            info = KernelInfo(mangled=mangled, demangled=demangle(mangled), device=device,
                              process_names=self.process_names, tenant=self.tenant,
                              identity=self._identity())
            kernel = self.kernels[key] = _Kernel(handle, info, self._plan(info), ctx, layout)
        if kernel_id is not None and kernel_id != abi.KERNEL_UNCACHED:
            self.names[kernel_id] = kernel.info.demangled
        return kernel

    def _plan(self, info):
        """The deciders that can apply to a kernel, in order, each a _Step: the --hooks hooks that
        match it,
        then the rules whose kernel, device, process and tenant conditions hold (their shape
        conditions are checked per launch)."""
        rules = self.policy.rules
        plan = [_Step(_HOOK, len(rules) + k, None, hook, hook.mode, False, None)
                for k, hook in enumerate(self.cli_hooks) if hook.matches(info)]
        for index, rule in enumerate(rules):
            if rule.check_static(info)[0]:
                if rule.hook is None:
                    plan.append(_Step(_RULE, index, rule, None, 0, rule.has_shape,
                                      outcome_with_bytes(rule.outcome(index))))
                else:
                    hook = self.rule_hooks[index]
                    plan.append(_Step(_HOOK_RULE, index, rule, hook, hook.mode, rule.has_shape,
                                      None))
        return tuple(plan)

    def first_sight(self, kernel, blob):
        """The decision for a new (kernel, context), asked about with its first launch's query
        block, and how often to ask again (a mode)."""
        info = kernel.info
        mode = self._mode(kernel)
        try:
            if mode != abi.MODE_CACHED:
                decision = Decision([], kernel.ask(self._walk, blob)[0])
            else:
                decision = kernel.ask(self._cached_decision, blob)
        except _HookFailed:
            decision = Decision([], self.policy.on_error_outcome())
        self._announce_denies(kernel, decision)
        if self.verbose:
            self.message(abi.MSG_INFO, f"first sight of {info.demangled} on device "
                         f"{info.device}: {self._describe(decision, mode)}", stderr=True)
        return decision, mode

    def program_decision(self, device):
        """Whether this process is confined program-wide on `device` (program_scope_decision)."""
        info = KernelInfo(mangled="", demangled="", device=device,
                          process_names=self.process_names, tenant=self.tenant,
                          identity=self._identity())
        return program_scope_decision(self.policy, info)

    def launch(self, kernel, blob):
        """One launch (its query block) of a kernel whose hooks are asked per shape or at
        every launch: its outcome as clc_outcome bytes."""
        try:
            outcome, data = kernel.ask(self.walk, blob)
        except _HookFailed:
            return self._on_error[1]
        return data if outcome.action == _ALLOW else self._not_allowed(kernel, outcome, data)

    def dispatcher(self, kernel):
        """f(query block) -> clc_outcome bytes for the launches of `kernel` asked about: what
        launch() does; for the common case, a kernel decided by one every_launch hook (no
        shape conditions) followed only by rules without shape conditions whose first one (or
        the default) allows, the same folded into one function (a call into Python at every
        launch pays for each frame and each attribute read). Never raises."""
        plan = kernel.plan
        first = plan[0] if plan else None
        rest = plan[1].outcome if len(plan) > 1 else self._default  # what "no opinion" gets
        if first is None or first.hook is None or first.mode != _EVERY_LAUNCH or \
                first.has_shape or any(step.hook is not None or step.has_shape
                                       for step in plan[1:]) or rest[0].action != _ALLOW:
            def generic(blob):
                try:
                    return self.launch(kernel, blob)
                except BaseException:
                    report_engine_error()
                    return self._on_error[1]
            return generic
        _, index, _, hook, _, _, _ = first
        fn = hook.fn
        views = kernel.views
        new_view = kernel.new_view
        no_opinion = rest[1]
        on_error = self._on_error[1]
        answered = self._answered

        def every_launch(blob):
            # kernel.ask(), _walk(), _ask() and Hook.call(), folded: keep them in step. The
            # bridge times this function for the hook (bridge_launch, bridge_slow).
            try:
                try:
                    launch = views.pop()
                except IndexError:
                    launch = new_view()
                args = launch._args
                launch._blob = args.blob = blob
                status = args.status = blob[_STATUS_AT]
                args.limit = -1 if status else len(blob)
                try:
                    answer = fn(launch)
                except BaseException as e:  # sys.exit() too: a hook cannot end the program
                    answer = _Raised(e)
                args.blob, args.limit = None, -1  # launch.clear(), inlined
                if getrefcount(launch) + getrefcount(launch.params) == launch.refs:
                    views.append(launch)
                if answer is None:
                    return no_opinion
                return answered(kernel, hook, index, answer, no_opinion)
            except BaseException:
                report_engine_error()
                return on_error
        every_launch.hook = hook
        return every_launch

    def _answered(self, kernel, hook, index, answer, no_opinion):
        """The clc_outcome bytes for what an every_launch hook returned (or raised), with the
        reports _ask makes."""
        try:
            if type(answer) is _Raised:
                raise answer.error
            answer = hook.checked(answer)
        except BaseException as e:
            self._hook_failed(kernel, hook, e)
            return self._on_error[1]
        if answer is None:
            return no_opinion
        outcome, data = _answer_outcome(kernel, answer, index)
        return data if outcome.action == _ALLOW else self._not_allowed(kernel, outcome, data)

    def timed_by_bridge(self, kernel_id, kernel, dispatch):
        """Whether the bridge is to time `dispatch` (a folded every_launch dispatcher) for its
        hook; kept to add those times to the hook's at exit."""
        hook = getattr(dispatch, "hook", None)
        if hook is None:
            return False
        self._bridge_timed[kernel_id] = (kernel, hook)
        return True

    def slow_dispatch(self, kernel_id, ns):
        """The bridge timed a folded dispatcher over SLOW_HOOK_NS: report its hook."""
        kernel, hook = self._bridge_timed[kernel_id]
        hook.last_ns = ns
        self._check_slow(kernel, hook)

    def _bridge_times(self):
        """Add what the bridge timed to the hooks' calls and times (once, at exit)."""
        try:
            from clc.runtime._bridge import ffi, lib
        except ImportError:  # no bridge: nothing was timed there
            return
        out = ffi.new("uint64_t[3]")
        for kernel_id, (_, hook) in self._bridge_timed.items():
            if lib.clc_bridge_dispatch_time(kernel_id, out) == 0:
                hook.calls += out[0]
                hook.total_ns += out[1]
                hook.max_ns = max(hook.max_ns, out[2])

    def _not_allowed(self, kernel, outcome, data):
        if outcome.action == _REPLACE:
            outcome = self.resolve_wrap(kernel, outcome)
            data = outcome_with_bytes(outcome)[1]
        if outcome.action == _DENY:
            self._announce_denies(kernel, Decision([], outcome))
        return data

    # ---- wrapping ---------------------------------------------------------------------------

    def wrapping(self):
        if self._wrapping is None:
            from clc.wrapping.engine import WrapEngine
            # A policy with rules that splice will build: start loading the toolchain now.
            # Hooks only may answer clc.wrap(), and most never do; a green context builds
            # nothing.
            self._wrapping = WrapEngine(self.message, warm=self.policy.splices,
                                        cache_settings=self._cache_settings)
        return self._wrapping

    def resolve_decision(self, kernel, decision):
        """The decision with each wrap outcome made launchable (or replaced by what a kernel
        that cannot be wrapped gets)."""
        if decision.fallback.action != abi.ACTION_REPLACE and all(
                c.outcome.action != abi.ACTION_REPLACE for c in decision.clauses):
            return decision
        clauses = [dataclasses.replace(c, outcome=self.resolve_wrap(kernel, c.outcome))
                   for c in decision.clauses]
        return dataclasses.replace(decision, clauses=clauses,
                                   fallback=self.resolve_wrap(kernel, decision.fallback))

    def resolve_wrap(self, kernel, outcome):
        """A wrap Outcome with its clc_replacement (built, loaded, made once per kernel,
        context and request); on_unwrappable or on_error when that cannot be."""
        if outcome.action != abi.ACTION_REPLACE or outcome.replacement:
            return outcome
        key = (outcome.wrap, outcome.flags, outcome.rule)
        hit = kernel.wraps.get(key)
        if hit is None:
            hit = kernel.wraps[key] = self._wrap(kernel, outcome)
        return hit

    def _wrap(self, kernel, outcome):
        from clc.wrapping.splice import Unwrappable
        from clc.wrapping.engine import spec_for
        info, request = kernel.info, outcome.wrap
        label = request.label if request is not None else "?"
        try:
            if request is None:
                raise RuntimeError("a wrap outcome without its wrapper")
            start = time.perf_counter()
            address = self.wrapping().replacement(
                mangled=info.mangled, name=info.demangled, ctx=kernel.ctx, device=info.device,
                spec=spec_for(request), layout=kernel.layout(), original=kernel.handle)
            if self.verbose:
                self.message(abi.MSG_INFO, f"wrapped {info.demangled} with {label} in "
                             f"{(time.perf_counter() - start) * 1e3:.1f} ms", stderr=True)
            return dataclasses.replace(outcome, replacement=address)
        except Unwrappable as e:
            deny = request.on_unwrappable == "deny"
            self._report_once(("unwrappable", info.mangled, label),
                              f"{info.demangled} cannot be wrapped with {label}: {e}; its "
                              f"launches are {'denied' if deny else 'let through unwrapped'} "
                              f"(on_unwrappable: {request.on_unwrappable})")
            return Outcome(abi.ACTION_DENY if deny else abi.ACTION_ALLOW, outcome.flags,
                           _NOT_PERMITTED if deny else 0, outcome.rule)
        except Exception as e:
            self._report_once(("wrap-failed", info.mangled, label),
                              f"wrapping {info.demangled} with {label} failed: "
                              f"{type(e).__name__}: {e}; its launches get on_error="
                              f"{self.policy.on_error}")
            return self.policy.on_error_outcome()

    # ---- the walk -------------------------------------------------------------------------

    @staticmethod
    def _mode(kernel):
        """Cached, unless a hook that could decide this kernel is asked per shape or at every
        launch (a hook rule with shape conditions is asked per shape)."""
        mode = abi.MODE_CACHED
        for kind, _, _, hook, hook_mode, has_shape, _ in kernel.plan:
            if hook is not None:
                mode = max(mode, hook_mode, abi.MODE_PER_SHAPE if has_shape else 0)
        return mode

    def _cached_decision(self, kernel, launch):
        """Asked once per kernel: the --hooks hooks, then the policy (its hook rules asked as
        Policy.decide reaches them); what they answer holds for every later launch."""
        for kind, index, _, hook, mode, _, _ in kernel.plan:
            if kind != _HOOK:  # the plan lists the matching --hooks hooks first
                break
            answer = self._ask(kernel, hook, mode, launch)
            if answer is not None:
                return Decision([], _answer_outcome(kernel, answer, index)[0])
        decision = self.policy.decide(kernel.info)
        while decision.pending_hook is not None:
            index = decision.pending_hook
            hook = self.rule_hooks[index]
            answer = self._ask(kernel, hook, hook.mode, launch)
            decision = self.policy.resume(
                kernel.info, decision,
                _answer_outcome(kernel, answer, index)[0] if answer else None)
        return decision

    def _walk(self, kernel, launch):
        """One launch's (Outcome, clc_outcome bytes), the kernel's deciders asked in order
        (answers of hooks that are asked per kernel or per shape are remembered)."""
        for kind, index, rule, hook, mode, has_shape, rule_outcome in kernel.plan:
            if has_shape and not rule.check_shape(
                    launch.grid.blocks, launch.block.threads, launch.shared_mem)[0]:
                continue
            if rule_outcome is not None:  # a rule (not a hook rule) decides
                return rule_outcome
            answer = self._ask(kernel, hook, mode, launch)
            if answer is not None:
                return _answer_outcome(kernel, answer, index)
        return self._default

    def _ask(self, kernel, hook, mode, launch):
        if mode == _EVERY_LAUNCH:
            key = None
        elif mode == _PER_SHAPE:
            key = (hook, launch.grid, launch.block, launch.shared_mem)
        else:
            key = hook
        if key is not None and key in kernel.answers:
            return kernel.answers[key]
        try:
            answer = hook.call(launch)
        except BaseException as e:  # sys.exit() too: a hook cannot end the program
            self._hook_failed(kernel, hook, e)
            raise _HookFailed from e
        self._check_slow(kernel, hook)
        if key is not None:
            kernel.answers[key] = answer
        return answer

    def _hook_failed(self, kernel, hook, e):
        self._report_once(("raised", hook.name),
                          f"hook {hook.name} {_failure(e)} at a launch of "
                          f"{kernel.info.demangled}; its launches get on_error="
                          f"{self.policy.on_error}{_NOT_THE_END if _ends(e) else ''}\n"
                          + "".join(traceback.format_exception(e, limit=-3)))

    def _check_slow(self, kernel, hook):
        if hook.last_ns > _SLOW:
            self._report_once(("slow", hook.name),
                              f"hook {hook.name} took {hook.last_ns / 1e6:.1f} ms at a launch "
                              f"of {kernel.info.demangled} (launches wait for their hooks)")

    # ---- what the engine says -------------------------------------------------------------

    def message(self, level, text, stderr=False):
        """Into the capture (through the shim), and on stderr from warnings up."""
        if not shim_message(level, text) or stderr and level == abi.MSG_INFO:
            sys.stderr.write(f"clc: {text}\n")

    def _report_once(self, key, text):
        if key not in self._reported:
            self._reported.add(key)
            self.message(abi.MSG_ERROR if key[0] == "raised" else abi.MSG_WARNING, text)

    def _announce_denies(self, kernel, decision):
        """Say once per kernel and decider, on the program's stderr, who refuses its launches
        and why (the rule's message, or the one its hook gave)."""
        sys.stderr.write("".join(deny_announcements(self.policy, kernel.info, decision,
                                                    self._announced, self._rule_name,
                                                    kernel.messages)))

    def _rule_name(self, rule):
        return rule_name(self.policy, rule, self.cli_hooks)

    def _describe(self, decision, mode):
        return describe(decision, mode, self._rule_name)

    # ---- loads and exit --------------------------------------------------------------------

    def module_event(self, api, handle, image_kind, image_ptr, image_size, preserved, path,
                     ctx=0):
        if api == abi.LOAD_CONTEXT_DESTROYED:
            self.forget_context(handle)
            return
        if api == abi.LOAD_KERNEL_FORGOTTEN:
            # Its module or library is gone: the handle may come back as another kernel.
            self.kernels.pop((handle, ctx), None)
            return
        if abi.LOAD_NAMES.get(api, "").endswith("Unload"):
            if self._wrapping is not None:
                self._wrapping.forget(handle)
            return
        if self.may_wrap:
            self.wrapping().note_load(handle, image_kind, image_ptr, image_size, preserved, path)

    def forget_context(self, ctx):
        """Context `ctx` was destroyed: the shim's entries for it now carry CTX_DESTROYED, and
        so do the records here (their counts are reported at exit under the kernel's name); a
        context later made at the same address is a new one, its kernels decided anew."""
        dead = ctx | abi.CTX_DESTROYED
        for key in [k for k in self.kernels if k[1] == ctx]:
            kernel = self.kernels.pop(key)
            kernel.ctx = dead
            self.kernels[(key[0], dead)] = kernel
        if self._wrapping is not None:
            self._wrapping.forget_context(ctx)

    def run_exit(self):
        """Once: the on_exit hooks get the counts so far, and each hook's time is reported."""
        if self._wrapping is not None:
            self._wrapping.finish_warm_up()
        if self._exited:
            return
        self._exited = True
        self._bridge_times()
        names = self.names
        rows = [(names.get(c.kernel_id, f"<kernel {c.kernel_id}>"),
                 *(getattr(c, counter) for counter in abi.KERNEL_COUNTERS))
                for c in shim_kernel_counts()]
        if self._wrapping is not None:
            report_wrap_exit(self._wrapping, self.message)
        hooks = list(dict.fromkeys(self.cli_hooks + list(self.rule_hooks.values())))
        stats = ExitStats.from_rows(rows, hooks)
        for fn in self.exit_functions:
            try:
                fn(stats)
            except BaseException as e:  # sys.exit() too: the program's exit status stays its own
                self.message(abi.MSG_ERROR, f"on_exit hook {_exit_hook_name(fn)} {_failure(e)}"
                             f"{_NOT_THE_STATUS if _ends(e) else ''}\n"
                             + "".join(traceback.format_exception(e, limit=-3)))
        # What the exit hooks printed: in a C or C++ program nothing else flushes clc's Python
        # (its interpreter is never finalized), and a pipe or a file buffers it.
        flush_std()
        for hook in hooks:
            if hook.calls:
                self.message(abi.MSG_INFO, f"hook {hook.name}: {count(hook.calls, 'call')}, "
                             f"{hook.total_ns / 1e6:.3f} ms in all, mean "
                             f"{hook.total_ns / hook.calls / 1e3:.1f} us, max "
                             f"{hook.max_ns / 1e3:.1f} us")


# Said of a hook that raised SystemExit, KeyboardInterrupt or another BaseException.
_NOT_THE_END = " (a hook cannot end the program: it goes on)"
_NOT_THE_STATUS = " (ignored: the program's exit status stays its own)"


def _ends(e):
    """Whether a hook's exception is one that would end a program (sys.exit(), Ctrl-C)."""
    return not isinstance(e, Exception)


def _failure(e):
    """What a hook did, as a report says it: `called sys.exit(3)`, `raised ValueError: boom`."""
    if isinstance(e, SystemExit):
        return f"called sys.exit({'' if e.code is None else repr(e.code)})"
    text = str(e)
    return f"raised {type(e).__name__}" + (f": {text}" if text else "")


def _exit_hook_name(fn):
    """An @clc.on_exit function as the reports name hooks: `hooks.py:summary`."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    code = getattr(fn, "__code__", None)
    return f"{os.path.basename(code.co_filename)}:{name}" if code is not None else name


def flush_std():
    """Flush Python's sys.stdout and sys.stderr (what hooks printed); never raises."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:  # a closed stream, a pipe whose reader left, a stream replaced
            pass


def outcome_with_bytes(outcome):
    return outcome, abi.OUTCOME.pack(outcome.action, outcome.flags, outcome.error, outcome.rule,
                                  outcome.replacement)


def _answer_outcome(kernel, answer, index):
    """A hook's answer as decider `index`'s (Outcome, clc_outcome bytes), made once per answer
    object (clc.allow() returns shared ones; keeping the answer keeps its id unique), and a
    deny's message kept to be said."""
    key = (id(answer), index)
    hit = kernel.outcomes.get(key)
    if hit is None or hit[0] is not answer:
        if answer.action == abi.ACTION_DENY and answer.message:
            kernel.messages.setdefault(index, answer.message)
        outcome = answer.outcome(index)
        hit = kernel.outcomes[key] = (answer,) + outcome_with_bytes(outcome)
        if len(kernel.outcomes) > 1024:  # answers made afresh at each launch: keep a few
            kernel.outcomes.clear()
    return hit[1:]


_reported = set()


def report_engine_error():
    """Report the exception being handled, once per kind and message: a broken engine is
    asked at every launch of some kernels, and a traceback is costly to format."""
    kind, value, _ = sys.exc_info()
    key = (kind, str(value))
    if key in _reported:
        return
    _reported.add(key)
    sys.stderr.write(f"clc: engine error, launches get on_error: "
                     f"{traceback.format_exc(limit=4)}\n")


def program_scope_decision(policy, info):
    """The answer to the shim's question about the program (ASK_PROGRAM), asked when the
    program retains a device's primary context: the outcome of the policy's first scope:
    program rule for this process and device (a confine), else an allow."""
    outcome = policy.program_scope(info)
    return Decision([], outcome if outcome is not None else
                    Outcome(abi.ACTION_ALLOW, 0, 0, abi.RULE_DEFAULT))
