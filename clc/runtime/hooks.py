# SPDX-License-Identifier: Apache-2.0
"""Python hooks: functions a user writes to decide kernel launches (docs/hooks.md).

    import clc

    @clc.on_launch(kernel="*softmax*")
    def guard(launch):
        if launch.grid.blocks > 65536:
            return clc.deny("grid too large for this tenant")
        return clc.allow(record=True)

This module runs inside the traced program's Python (the engine imports it there), so it uses
the standard library only. Kernel matching is clc.policy's, so a hook's `kernel=` glob and a
policy rule's `kernel:` glob can never disagree about a name.

The API is this module's; what a hook sees of a launch is clc.runtime.hook_launch's, hook files
are loaded by this module, and what an exit function receives is clc.runtime.exit_stats':
all re-exported here.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.machinery
import importlib.util
import itertools
import os
import re
import reprlib
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from clc import abi
from clc.cuda_errors import CUDA_ERRORS, error_name
# glob_problem is the policy loader's own glob check: sharing it keeps a glob that a policy
# refuses from being accepted in a hook (and the other way round).
from clc.policy import (KernelInfo, Outcome, PolicyError, Rule, WrapRequest, glob_problem,
                        regex_problem)

from clc.runtime.exit_stats import ExitStats, HookStats, KernelStats
from clc.runtime.hook_errors import HookError, HookLoadError
from clc.runtime.hook_launch import (Dim3, Launch, Param, Params, QueryLaunch,  # noqa: F401
                                     checked_layout)

__all__ = [
    "on_launch", "on_exit", "allow", "deny", "wrap", "HookDecision", "HookError",
    "HookLoadError", "Dim3", "Param", "Params", "Launch", "Hook", "HookFile", "KernelStats",
    "HookStats", "ExitStats", "checked_layout", "load_hook_file",
    "import_hook_file", "resolve_hook_ref",
]

_INT32_MAX = 2**31 - 1
_HOOK_ATTR = "__clc_hook__"
_EXIT_ATTR = "__clc_on_exit__"


# ---- decisions --------------------------------------------------------------------------------

@dataclass(frozen=True)
class HookDecision:
    """What a hook answers: made by clc.allow() and clc.deny(), never built by hand."""

    action: int  # abi.ACTION_*
    flags: int = 0  # abi.FLAG_*
    error: int = 0  # the CUresult a denied launch returns, 0 for allow
    message: str = ""  # a deny's reason, printed once per kernel
    wrap: WrapRequest | None = None  # clc.wrap()'s wrapper

    @property
    def allowed(self) -> bool:
        return self.action == abi.ACTION_ALLOW

    @property
    def record(self) -> bool:
        return bool(self.flags & abi.FLAG_RECORD)

    @property
    def time(self) -> bool:
        return bool(self.flags & abi.FLAG_TIME)

    def outcome(self, rule_index: int) -> Outcome:
        """The clc_outcome the shim gets; rule_index says which rule (or hook) decided."""
        if self.wrap is not None:
            return self.wrap.outcome(self.flags, rule_index)
        return Outcome(self.action, self.flags, self.error, rule_index)

    def __repr__(self) -> str:
        if self.action == abi.ACTION_DENY:
            return f"clc.deny({self.message!r}, error={error_name(self.error)!r})"
        if self.wrap is not None:
            return f"clc.wrap({self.wrap.label}, on_unwrappable={self.wrap.on_unwrappable!r})"
        options = [name for name, on in (("record", self.record and not self.time),
                                         ("time", self.time)) if on]
        return "clc.allow(" + ", ".join(f"{name}=True" for name in options) + ")"


# allow() is called at every launch by every_launch hooks: its four possible answers are made
# once, so that answering costs a tuple index and no allocation.
_ALLOWS = (HookDecision(abi.ACTION_ALLOW, 0), HookDecision(abi.ACTION_ALLOW, abi.FLAG_RECORD),
           HookDecision(abi.ACTION_ALLOW, abi.FLAG_RECORD | abi.FLAG_TIME))
_NOT_PERMITTED = CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]
_DEFAULT_DENY = HookDecision(abi.ACTION_DENY, 0, _NOT_PERMITTED, "")


def allow(record: bool = False, time: bool = False) -> HookDecision:
    """Let the launch through; record=True writes it into the capture, time=True also times it
    on the GPU (and so implies record)."""
    return _ALLOWS[2 if time else 1 if record else 0]


def deny(message: str = "", error="CUDA_ERROR_NOT_PERMITTED") -> HookDecision:
    """Refuse the launch: the program's launch call returns `error` (a CUresult name or number)
    and `message` is printed once per kernel on the program's standard error."""
    if not isinstance(message, str):
        raise HookError(f"clc.deny(): message must be a string, got {type(message).__name__}")
    if error == "CUDA_ERROR_NOT_PERMITTED":
        return _DEFAULT_DENY if not message else \
            HookDecision(abi.ACTION_DENY, 0, _NOT_PERMITTED, message)
    return HookDecision(abi.ACTION_DENY, 0, _error_code(error), message)


def _error_code(error) -> int:
    if isinstance(error, str):
        code = CUDA_ERRORS.get(error)
        if code is None:
            close = difflib.get_close_matches(error.upper(), list(CUDA_ERRORS), n=1)
            hint = f"did you mean '{close[0]}'?" if close else \
                "expected a CUresult name such as CUDA_ERROR_NOT_PERMITTED, or its number"
            raise HookError(f"clc.deny(): unknown CUDA error '{error}' ({hint})")
    elif isinstance(error, int) and not isinstance(error, bool):
        code = error
        if not 0 <= code <= _INT32_MAX:
            raise HookError(f"clc.deny(): error must be a CUresult between 1 and {_INT32_MAX}, "
                            f"got {code}")
    else:
        raise HookError("clc.deny(): error must be a CUresult name or number, got "
                        f"{type(error).__name__}")
    if code == 0:
        raise HookError("clc.deny(): error must not be CUDA_SUCCESS: a denied launch has to fail")
    return code


def wrap(wrapper, *, on_unwrappable="allow", record=False, time=False, mechanism=None,
         **params) -> HookDecision:
    """Run the kernel's launches wrapped: `wrapper` is sm_share, block_count, deadline or a .cu
    device policy (a relative path is taken from the directory of the hook's file), `params`
    its parameters (share=0.25, ms=5, ...). sm_share confines the kernel with a green context
    unless mechanism="splice". A kernel that cannot be wrapped gets on_unwrappable ("allow" or
    "deny"), said once."""
    from clc.wrapping.spec import BUILTIN_WRAPPERS, mechanism_for, wrapper_spec
    if on_unwrappable not in ("allow", "deny"):
        raise HookError(f"clc.wrap(): on_unwrappable must be 'allow' or 'deny', got "
                        f"{on_unwrappable!r}")
    if wrapper == "sm_share" and params.get("scope", "kernel") != "kernel":
        raise HookError("clc.wrap(): a hook answers for one kernel: scope='program' (the whole "
                        "process) is for policy rules")
    base = None
    if isinstance(wrapper, (str, os.PathLike)) and str(wrapper).endswith(".cu"):
        base = os.path.dirname(os.path.abspath(sys._getframe(1).f_code.co_filename))
    try:
        spec = wrapper_spec(str(wrapper) if isinstance(wrapper, os.PathLike) else wrapper,
                            params, base)
        mechanism = mechanism_for(spec.name if spec.name in BUILTIN_WRAPPERS else "a .cu policy",
                                  mechanism, spec.params)
    except ValueError as e:
        raise HookError(f"clc.wrap(): {e}") from None
    flags = (abi.FLAG_RECORD | abi.FLAG_TIME) if time else abi.FLAG_RECORD if record else 0
    request = WrapRequest(spec.name, spec.params, on_unwrappable, mechanism, spec.source)
    return HookDecision(request.outcome(0, 0).action, flags, 0, "", request)


# ---- hooks ---------------------------------------------------------------------------------------

_perf_ns = time.perf_counter_ns
_MODE_NAMES = {abi.MODE_CACHED: "cached", abi.MODE_PER_SHAPE: "per_shape",
               abi.MODE_EVERY_LAUNCH: "every_launch"}


class Hook:
    """A function that decides launches, with the kernels it is asked about and how often.

    calls, total_ns, max_ns and last_ns are the time spent in the function (perf_counter_ns).
    """

    __slots__ = ("fn", "name", "file", "kernel", "kernel_regex", "every_launch", "per_shape",
                 "_rule", "_matches", "calls", "total_ns", "max_ns", "last_ns")

    def __init__(self, fn, name: str, *, kernel=None, kernel_regex: str | None = None,
                 every_launch: bool = False, per_shape: bool = False, file: str = ""):
        self.fn = fn
        self.name = name
        self.file = file
        self.kernel = _checked_globs(kernel, name)
        self.kernel_regex = _checked_regex(kernel_regex, name)
        for option, value in (("every_launch", every_launch), ("per_shape", per_shape)):
            if not isinstance(value, bool):
                raise HookError(f"@clc.on_launch on {name}: {option} must be True or False, got "
                                f"{value!r}")
        if every_launch and per_shape:
            raise HookError(f"@clc.on_launch on {name}: every_launch=True and per_shape=True "
                            "together: every_launch already asks at every shape; use one")
        self.every_launch = every_launch
        self.per_shape = per_shape
        # A Rule with only name conditions: matching is then exactly the policy's.
        self._rule = Rule(name=name, kernel=self.kernel, kernel_regex=self.kernel_regex) \
            if self.kernel is not None or self.kernel_regex is not None else None
        self._matches: dict[tuple[str, str], bool] = {}
        self.calls = 0
        self.total_ns = 0
        self.max_ns = 0
        self.last_ns = 0

    @property
    def mode(self) -> int:
        """abi.MODE_*: how often clc asks this hook about a kernel's launches."""
        if self.every_launch:
            return abi.MODE_EVERY_LAUNCH
        return abi.MODE_PER_SHAPE if self.per_shape else abi.MODE_CACHED

    def matches(self, info: KernelInfo) -> bool:
        """Whether this hook is asked about the kernel (a policy rule's kernel/kernel_regex)."""
        if self._rule is None:
            return True
        key = (info.mangled, info.demangled)
        hit = self._matches.get(key)
        if hit is None:
            hit = self._matches[key] = self._rule.check_static(info)[0]
        return hit

    def call(self, launch: Launch) -> HookDecision | None:
        """The function's answer; its exceptions propagate (clc reports them)."""
        start = _perf_ns()
        try:
            result = self.fn(launch)
        finally:
            # Unlocked: under the GIL a rare lost update of a statistic is cheaper than a lock
            # on every call.
            elapsed = _perf_ns() - start
            self.calls += 1
            self.total_ns += elapsed
            self.last_ns = elapsed
            if elapsed > self.max_ns:
                self.max_ns = elapsed
        return self.checked(result)

    def checked(self, result) -> HookDecision | None:
        """The function's result if it is an answer, else HookError."""
        if result is None or type(result) is HookDecision:
            return result
        raise HookError(f"hook {self.name} returned {reprlib.repr(result)}; expected "
                        "clc.allow(...), clc.deny(...), clc.wrap(...) or None")

    def __repr__(self) -> str:
        what = []
        if self.kernel is not None:
            what.append(f"kernel={list(self.kernel)!r}")
        if self.kernel_regex is not None:
            what.append(f"kernel_regex={self.kernel_regex!r}")
        what.append(_MODE_NAMES[self.mode])
        return f"Hook({self.name}, {', '.join(what)})"


def _checked_globs(kernel, name: str) -> tuple[str, ...] | None:
    if kernel is None:
        return None
    globs = (kernel,) if isinstance(kernel, str) else kernel
    if not isinstance(globs, (list, tuple)):
        raise HookError(f"@clc.on_launch on {name}: kernel must be a glob or a list of globs, "
                        f"got {type(kernel).__name__}")
    if not globs:
        raise HookError(f"@clc.on_launch on {name}: kernel must not be an empty list")
    for glob in globs:
        if not isinstance(glob, str):
            raise HookError(f"@clc.on_launch on {name}: each kernel glob must be a string, got "
                            f"{glob!r}")
        if not glob:
            raise HookError(f"@clc.on_launch on {name}: a kernel glob must not be empty")
        problem = glob_problem(glob)
        if problem:
            raise HookError(f"@clc.on_launch on {name}: invalid glob '{glob}' in kernel: "
                            f"{problem}")
    return tuple(globs)


def _checked_regex(pattern, name: str) -> str | None:
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise HookError(f"@clc.on_launch on {name}: kernel_regex must be a string, got "
                        f"{type(pattern).__name__}")
    problem = regex_problem(pattern)
    if problem is not None:
        raise HookError(f"@clc.on_launch on {name}: {problem}")
    return pattern


class _Collector:
    """What the decorators of one hook file register while it is imported."""

    def __init__(self, path: str):
        self.path = path
        self.hooks: list[Hook] = []
        self.exit_functions: list = []


# Per thread: only the thread importing a hook file collects, so a module that another thread
# imports at the same time cannot slip its decorated functions into that file's hooks.
_local = threading.local()


def _collector() -> _Collector | None:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def _function_name(fn) -> str:
    """`file.py:function`, the name reports and error messages give a hook."""
    code = getattr(fn, "__code__", None)
    if code is not None:
        file = os.path.basename(code.co_filename)
    else:
        collector = _collector()
        file = os.path.basename(collector.path) if collector else "?"
    function = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or \
        type(fn).__name__
    return f"{file}:{function}"


def _register_launch_hook(fn, kernel, kernel_regex, every_launch, per_shape):
    name = _function_name(fn) if callable(fn) else repr(fn)
    if not callable(fn):
        raise HookError(f"@clc.on_launch must decorate a function, got {reprlib.repr(fn)}")
    if isinstance(getattr(fn, _HOOK_ATTR, None), Hook):
        raise HookError(f"@clc.on_launch on {name}: the function is already a hook; give one "
                        "decorator a list of globs (kernel=[...]) or write two functions")
    collector = _collector()
    hook = Hook(fn, name, kernel=kernel, kernel_regex=kernel_regex, every_launch=every_launch,
                per_shape=per_shape, file=collector.path if collector else "")
    try:
        setattr(fn, _HOOK_ATTR, hook)
    except (AttributeError, TypeError):
        pass  # a callable that takes no attributes: only resolve_hook_ref loses the link
    if collector is not None:
        collector.hooks.append(hook)
    return fn


def on_launch(fn=None, *, kernel=None, kernel_regex: str | None = None,
              every_launch: bool = False, per_shape: bool = False):
    """Declare a launch hook: `@clc.on_launch` or `@clc.on_launch(kernel=..., ...)`.

    kernel: a glob or a list of globs; kernel_regex: a regex (re.search syntax, run in linear
    time: no backreferences or lookarounds); both are tried on
    the mangled name, the demangled name and the bare name, as policy rules do. Without them
    every kernel is asked about. The hook is asked once per kernel and context, or once per
    launch shape (per_shape=True), or at every launch (every_launch=True). Returns the
    function unchanged.
    """
    if fn is not None:
        if isinstance(fn, str):
            raise HookError(f"@clc.on_launch takes the kernel glob as a keyword: write "
                            f"@clc.on_launch(kernel={fn!r})")
        return _register_launch_hook(fn, kernel, kernel_regex, every_launch, per_shape)

    def decorate(function):
        return _register_launch_hook(function, kernel, kernel_regex, every_launch, per_shape)
    return decorate


def on_exit(fn=None):
    """Declare a function called once when the program ends, with an ExitStats."""
    if fn is None:
        return on_exit
    if not callable(fn):
        raise HookError(f"@clc.on_exit must decorate a function, got {reprlib.repr(fn)}")
    try:
        setattr(fn, _EXIT_ATTR, True)
    except (AttributeError, TypeError):
        pass
    collector = _collector()
    if collector is not None:
        collector.exit_functions.append(fn)
    return fn


# ---- hook files ----------------------------------------------------------------------------------

@dataclass
class HookFile:
    """A hook file, imported once: its launch hooks and exit functions in definition order."""

    path: str  # as given
    real_path: str
    module: object
    hooks: list[Hook] = field(default_factory=list)
    exit_functions: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return os.path.basename(self.real_path)


_load_lock = threading.RLock()
_files: dict[str, HookFile] = {}
_plain_hooks: dict[tuple[str, str], Hook] = {}
_module_numbers = itertools.count(1)
_IMPORT_FRAMES = 3


def _import_failure(error: BaseException, real_path: str, shown: str) -> str:
    lines = [f"cannot import: {type(error).__name__}: {error}"]
    frames = traceback.extract_tb(error.__traceback__)
    # The lines of the hook file itself say where the import went wrong in the user's terms;
    # the innermost frame, when it lies elsewhere (a neighbour module), says where it failed.
    mine = [frame for frame in frames if frame.filename == real_path][-_IMPORT_FRAMES:]
    shown_frames = list(mine)
    if frames and frames[-1].filename != real_path and \
            not frames[-1].filename.startswith("<frozen"):
        shown_frames.append(frames[-1])
    for frame in shown_frames:
        where = shown if frame.filename == real_path else frame.filename
        lines.append(f"  {where}, line {frame.lineno}, in {frame.name}")
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
    if isinstance(error, SyntaxError) and error.lineno:
        where = shown if error.filename == real_path else error.filename
        lines.append(f"  {where}, line {error.lineno}")
        if error.text:
            lines.append(f"    {error.text.strip()}")
    return "\n".join(lines)


def _remove_from_path(directory: str) -> None:
    if sys.path and sys.path[0] == directory:
        del sys.path[0]
    else:  # the file moved entries itself; take out the one inserted for it
        try:
            sys.path.remove(directory)
        except ValueError:
            pass


def import_hook_file(path) -> HookFile:
    """Import a file of hooks once per resolved path, whatever it holds."""
    shown = os.fsdecode(path)
    real_path = os.path.realpath(shown)
    with _load_lock:
        cached = _files.get(real_path)
        if cached is not None:
            return cached
        if not os.path.exists(real_path):
            raise HookLoadError(shown, "no such file")
        if not os.path.isfile(real_path):
            raise HookLoadError(shown, "not a file")
        stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(real_path))[0])
        module_name = f"_clc_hooks_{next(_module_numbers)}_{stem}"
        # An explicit source loader: a hook file need not end in .py.
        loader = importlib.machinery.SourceFileLoader(module_name, real_path)
        spec = importlib.util.spec_from_file_location(module_name, real_path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        collector = _Collector(real_path)
        stack = _local.__dict__.setdefault("stack", [])
        directory = os.path.dirname(real_path)
        sys.path.insert(0, directory)
        importlib.invalidate_caches()
        stack.append(collector)
        # In sys.modules during its import, as a normal import is: dataclasses and pickle look
        # their module up there.
        sys.modules[module_name] = module
        imported = False
        try:
            loader.exec_module(module)
            imported = True
        except (Exception, SystemExit) as e:
            # SystemExit too: a hook file that calls sys.exit() must not end the program.
            raise HookLoadError(shown, _import_failure(e, real_path, shown)) from e
        finally:
            stack.pop()
            _remove_from_path(directory)
            if not imported:
                sys.modules.pop(module_name, None)
        hook_file = HookFile(shown, real_path, module, collector.hooks, collector.exit_functions)
        _files[real_path] = hook_file
        return hook_file


def load_hook_file(path) -> HookFile:
    """Import a hook file given to clc-run --hooks (once per resolved path) and return its
    hooks in definition order; a file without any is an error. A file that a policy rule
    names (hook: FILE:FUNCTION) may hold plain functions only: see import_hook_file."""
    hook_file = import_hook_file(path)
    if not hook_file.hooks and not hook_file.exit_functions:
        raise HookLoadError(hook_file.path, "defines no @clc.on_launch or @clc.on_exit hook")
    return hook_file


def hook_rule_errors(policy) -> list:
    """What clc-run would find wrong with the policy's hook rules, each as a PolicyError at its
    `hook:` value: a hook file that does not import, a function it lacks or that cannot be a
    hook. The files are imported (their module code runs), as clc-run does."""
    return hook_ref_errors(policy.path, [rule.hook for rule in policy.rules
                                         if rule.hook is not None])


def hook_ref_errors(path, refs) -> list:
    """hook_rule_errors for the hook references `refs` of the policy file `path`, which may
    have other errors (PolicyError.hooks): every reference is checked, a file that does not
    import reported at each reference to it, imported once."""
    errors = []
    failed = {}  # a file that did not import -> why
    for ref in refs:
        message = failed.get(ref.path)
        if message is None:
            try:
                import_hook_file(ref.path)
            except HookLoadError as e:
                message = failed[ref.path] = e.message
        if message is None:
            try:
                resolve_hook_ref(f"{ref.path}:{ref.function}", os.sep)
            except HookError as e:
                message = e.message if isinstance(e, HookLoadError) else str(e)
        if message is not None:
            errors.append(PolicyError(path, ref.line, ref.column,
                                      f"hook '{ref.text}': {message}"))
    return errors


def resolve_hook_ref(ref: str, base_dir) -> Hook:
    """The Hook of a policy rule's `hook: FILE:FUNCTION` (FILE relative to base_dir).

    A decorated function keeps its options; a plain one becomes a hook for every kernel it
    is asked about, cached per kernel.
    """
    if not isinstance(ref, str) or ":" not in ref:
        raise HookLoadError(str(ref), "a hook reference is FILE:FUNCTION, for example "
                                      "hooks.py:guard")
    file_part, _, function_name = ref.rpartition(":")
    if not file_part or not function_name:
        raise HookLoadError(ref, "a hook reference is FILE:FUNCTION, for example hooks.py:guard")
    path = file_part if os.path.isabs(file_part) else \
        os.path.join(os.fsdecode(base_dir), file_part)
    hook_file = import_hook_file(path)
    target = hook_file.module
    for part in function_name.split("."):
        target = getattr(target, part, _MISSING)
        if target is _MISSING:
            functions = [name for name, value in vars(hook_file.module).items()
                         if callable(value) and not name.startswith("_")]
            close = difflib.get_close_matches(function_name, functions, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise HookLoadError(hook_file.path, f"has no function '{function_name}' (hook "
                                                f"'{ref}'){hint}")
    if not callable(target):
        raise HookLoadError(hook_file.path, f"'{function_name}' is not a function, it is a "
                                            f"{type(target).__name__} (hook '{ref}')")
    hook = getattr(target, _HOOK_ATTR, None)
    if isinstance(hook, Hook):
        return hook
    if getattr(target, _EXIT_ATTR, False):
        raise HookLoadError(hook_file.path, f"'{function_name}' is an @clc.on_exit function, "
                                            f"not a launch hook (hook '{ref}')")
    key = (hook_file.real_path, function_name)
    with _load_lock:
        hook = _plain_hooks.get(key)
        if hook is None:
            hook = _plain_hooks[key] = Hook(target, f"{hook_file.name}:{function_name}",
                                            file=hook_file.real_path)
    return hook


_MISSING = object()
