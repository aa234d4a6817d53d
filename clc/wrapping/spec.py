# SPDX-License-Identifier: Apache-2.0
"""The wrappers a policy may name, and their parameters, checked: `wrapper: sm_share` with
`params: {share: 0.25}` becomes a Wrapper that the build (clc.wrapping.build) turns into device
code. Standard library only, so that the policy model and the hook API can check a wrap rule
without importing the build pipeline.
"""

import dataclasses
import pathlib
import re

__all__ = ["Wrapper", "BUILTIN_WRAPPERS", "INSPECTED_WRAPPERS", "MECHANISMS", "PLACES",
           "SCOPES", "WORD_PARAMS", "wrapper_spec", "mechanism_for"]

# How sm_share keeps a kernel to its share: a green context (an SM partition of the driver: no
# build, the kernel untouched) or the splice (the kernel's PTX runs under a claim loop).
MECHANISMS = ("green", "splice")
# Which SMs a green context's share takes: the device's first or its last (tenants placed at
# opposite ends do not overlap while their shares add up to at most the device).
PLACES = ("first", "last")
# What a green context's share confines: each launch of the rule's kernels (redirected to a
# stream of the partition), or the whole process (its primary contexts are the partition's).
SCOPES = ("kernel", "program")
# sm_share's parameters that are words, not numbers.
WORD_PARAMS = ("place", "scope")

BUILTIN_WRAPPERS = ("sm_share", "block_count", "deadline")
# The longest deadline: the wrapped kernel keeps its launch's start in microseconds modulo
# 2^32 (71 minutes), beside the launch's lap (clc/wrapping/device/runtime.cu, clc_late).
DEADLINE_MAX_MS = 1_800_000

_PARAM_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclasses.dataclass(frozen=True)
class Wrapper:
    """A wrapper and its parameters, checked. `cap` is how the shim sizes a launch:
    ("share", x) or ("sms", n) for sm_share, None to keep the program's grid."""

    name: str                        # "sm_share" | "block_count" | "deadline" | the .cu path
    params: tuple                    # ((name, value), ...) sorted
    loop: str                        # "required" | "optional" | "never"
    defines: tuple                   # -D options for runtime.cu
    cap: tuple | None = None
    source: str | None = None        # a user policy's text
    enter: bool = False              # a 1:1 kernel asks clc_enter whether to run (deadline,
                                     # policies)

    @property
    def key_text(self):
        return repr((self.name, self.params, self.loop, self.defines, self.cap, self.source,
                     self.enter))


def _number(wrapper, name, value, lo, hi, integer=False, lo_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"wrapper {wrapper}: {name} must be {kind}, got {value!r}")
    if value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
        bound = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise ValueError(f"wrapper {wrapper}: {name} must be {bound}, got {value!r}")
    return value


def wrapper_spec(name, params=None, base_dir=None, source=None):
    """A checked Wrapper for `wrapper:` `name` with `params:` (ValueError says what is wrong).
    A name that is not built in is a .cu path, relative to `base_dir`, read unless its text is
    given as `source`."""
    params = dict(params or {})
    if name == "sm_share":
        place = params.get("place", "first")
        if place not in PLACES:
            raise ValueError(f"wrapper sm_share: place must be first or last (which end of the "
                             f"device's SMs the share takes), got {place!r}")
        scope = params.get("scope", "kernel")
        if scope not in SCOPES:
            raise ValueError(f"wrapper sm_share: scope must be kernel or program (each launch of "
                             f"the rule's kernels, or the whole process), got {scope!r}")
        size = {k: v for k, v in params.items() if k not in WORD_PARAMS}
        unknown = set(size) - {"share", "sms"}
        if unknown or len(size) != 1:
            raise ValueError("wrapper sm_share: give exactly one of share (0 < share <= 1, of "
                             f"the GPU's SMs) or sms (a count of SMs), and place and scope if "
                             f"you like; got {sorted(params) or 'neither'}")
        if "share" in params:
            cap = ("share", float(_number(name, "share", params["share"], 0, 1, lo_open=True)))
        else:
            cap = ("sms", _number(name, "sms", params["sms"], 1, None, integer=True))
        defines = ("-DCLC_SM_SHARE",)   # the share's SM count comes with each launch
        return Wrapper(name, tuple(sorted(params.items())), "required", defines, cap)
    if name == "block_count":
        if params:
            raise ValueError(f"wrapper block_count takes no params, got {sorted(params)}")
        return Wrapper(name, (), "never", ())
    if name == "deadline":
        if set(params) != {"ms"}:
            raise ValueError(f"wrapper deadline: params must be {{ms: N}} (milliseconds after the "
                             f"launch's first block), got {sorted(params) or 'none'}")
        ms = _number(name, "ms", params["ms"], 0, None, lo_open=True)
        if ms > DEADLINE_MAX_MS:
            raise ValueError(f"wrapper deadline: ms must be at most {DEADLINE_MAX_MS} (30 "
                             f"minutes: the wrapped kernel keeps a launch's start in "
                             f"microseconds modulo 2^32), got {params['ms']!r}")
        return Wrapper(name, (("ms", ms),), "never",
                       (f"-DCLC_DEADLINE_NS={int(ms * 1_000_000)}ull",), enter=True)
    if not str(name).endswith(".cu"):
        raise ValueError(f"unknown wrapper {name!r}: expected one of {', '.join(BUILTIN_WRAPPERS)}"
                         " or the path of a .cu file with a device policy")
    path = pathlib.Path(name)
    if base_dir is not None and not path.is_absolute():
        path = pathlib.Path(base_dir) / path
    try:
        if source is None:
            source = path.read_text()
    except OSError as e:
        raise ValueError(f"wrapper {name}: cannot read {path}: {e.strerror}") from None
    for key, value in params.items():
        if not _PARAM_NAME.fullmatch(str(key)):
            raise ValueError(f"wrapper {name}: parameter name {key!r} is not a C identifier")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"wrapper {name}: parameter {key} must be a number, got {value!r}")
    defines = tuple(f"-DCLC_PARAM_{k}={v!r}" for k, v in sorted(params.items()))
    return Wrapper(str(path), tuple(sorted(params.items())), "optional", defines, None, source,
                   enter=True)


# Each built-in wrapper, with sample params (check_wrap's verdict does not depend on them):
# what `clc inspect` judges each kernel against.
INSPECTED_WRAPPERS = tuple(wrapper_spec(name, params) for name, params in (
    ("sm_share", {"share": 0.5}), ("block_count", {}), ("deadline", {"ms": 1})))


def mechanism_for(name, mechanism=None, params=()):
    """The mechanism a wrapper runs by: sm_share by a green context unless `mechanism` says
    splice; every other wrapper needs device code, so the splice (ValueError for green)."""
    if mechanism is not None and mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    if name == "sm_share":
        if mechanism == "splice" and dict(params).get("place", "first") != "first":
            raise ValueError("place: last needs a green context (mechanism: green): the splice "
                             "keeps a share on the device's first SMs")
        if mechanism == "splice" and dict(params).get("scope", "kernel") != "kernel":
            raise ValueError("scope: program needs a green context (mechanism: green): the "
                             "splice wraps kernels one by one")
        return mechanism or "green"
    if mechanism == "green":
        raise ValueError(f"mechanism green confines sm_share only: {name} runs device code, "
                         "which only the splice adds")
    return "splice"
