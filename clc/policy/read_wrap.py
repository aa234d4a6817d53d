# SPDX-License-Identifier: Apache-2.0
"""Reading a wrap rule's wrapper: `wrapper`, `params`, `on_unwrappable` and `mechanism`, checked
as the wrap pipeline will use them (clc.wrapping.spec, imported when a wrap rule is read).
"""

from __future__ import annotations

from clc.policy.decision import WrapRequest
from clc.policy.reader import _INVALID, _Reader, _Reported

__all__ = []

_UINT32_MAX = 2**32 - 1
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1

# Limits of the built-in wrappers' numbers that wrapper_spec does not check, as (lowest as
# written, lowest, highest, why): beyond them the value cannot reach the GPU as written.
_WRAPPER_LIMITS = {
    ("sm_share", "share"): ("0.000001", 1e-6, 1, "the shim keeps a share in millionths of the "
                                                 "GPU"),
    ("sm_share", "sms"): ("1", 1, _UINT32_MAX, "the shim keeps it in 32 bits"),
    ("deadline", "ms"): ("0.000001", 1e-6, 18_446_744_073_709,
                         "the device code counts it in nanoseconds, in 64 bits"),
}


class _WrapReader(_Reader):
    """Reads a wrap rule's wrapper."""

    def wrap(self, node, pairs, name, meant) -> WrapRequest:
        """`wrapper:` (a built-in or a .cu path relative to the policy), `params:`, and
        `on_unwrappable:`, checked as the wrap pipeline will use them."""
        from clc.wrapping.spec import (  # standard library only
            BUILTIN_WRAPPERS, WORD_PARAMS, mechanism_for, wrapper_spec)
        if "wrapper" not in pairs:
            if "wrapper" in meant:
                raise _Reported
            raise self.error(node, f"rule '{name}' has action: wrap but no 'wrapper' (expected "
                                   "sm_share, block_count, deadline or a .cu file)")
        before = len(self.errors)
        wrapper_node = pairs["wrapper"][1]
        wrapper = self.attempt(self.string, wrapper_node, "wrapper")
        params, value_nodes = {}, {}
        if "params" in pairs:
            params_node = pairs["params"][1]
            if params_node.id != "mapping":
                raise self.type_error(params_node, "params", "a mapping")
            for key_node, value_node in params_node.value:
                if key_node.id != "scalar":
                    self.attempt(self.not_a_key, key_node, "parameter name", "in params")
                    continue
                key = key_node.value
                if key in value_nodes:
                    first = value_nodes[key].start_mark.line + 1
                    self.report(key_node, f"duplicate parameter '{key}' in params (first at "
                                          f"line {first})")
                    continue
                value_nodes[key] = value_node
                # sm_share's place and scope are words; every other parameter a number.
                parse = self.string if wrapper == "sm_share" and key in WORD_PARAMS \
                    else self.number
                value = self.attempt(parse, value_node, f"params.{key}")
                if value is not _INVALID:
                    params[key] = value
        on_unwrappable = self.attempt(self.choice, pairs["on_unwrappable"][1], "on_unwrappable") \
            if "on_unwrappable" in pairs else "allow"
        mechanism = self.attempt(self.string, pairs["mechanism"][1], "mechanism") \
            if "mechanism" in pairs else None
        if len(self.errors) > before:
            raise _Reported
        try:
            spec = wrapper_spec(wrapper, params, self.directory)
        except ValueError as e:
            text = str(e)
            at = wrapper_node
            if "params" in pairs and not text.startswith("unknown wrapper") \
                    and "cannot read" not in text:
                at = pairs["params"][1]
                for key, value_node in value_nodes.items():     # the value the message names
                    if f" {key} must" in text:
                        at = value_node
            raise self.error(at, text) from None
        for key, value in params.items():
            if isinstance(value, (int, float)):
                self.attempt(self.wrapper_limit, wrapper, wrapper not in BUILTIN_WRAPPERS, key,
                             value, value_nodes[key])
        resolved = None
        if mechanism is not _INVALID:
            try:
                resolved = mechanism_for(spec.name if wrapper in BUILTIN_WRAPPERS else
                                         "a .cu policy", mechanism, spec.params)
            except ValueError as e:  # only a mechanism that was given can be refused
                self.report(pairs["mechanism"][1], str(e))
        if len(self.errors) > before:
            raise _Reported
        return WrapRequest(spec.name, spec.params, on_unwrappable, resolved, spec.source)

    def wrapper_limit(self, wrapper: str, custom: bool, key: str, value, node) -> None:
        """A parameter within what the shim and the device code can hold."""
        if (wrapper, key) in _WRAPPER_LIMITS:
            lowest_text, lowest, highest, why = _WRAPPER_LIMITS[(wrapper, key)]
            if value < lowest:
                raise self.error(node, f"wrapper {wrapper}: {key} must be at least {lowest_text} "
                                       f"({why}), got {node.value}")
            if value > highest:
                raise self.error(node, f"wrapper {wrapper}: {key} must be at most {highest} "
                                       f"({why}), got {node.value}")
        elif custom and isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            raise self.error(node, f"wrapper {wrapper}: parameter {key} must be between "
                                   f"{_INT64_MIN} and {_INT64_MAX} (the device code gets it as "
                                   f"a C integer constant), got {value}")
