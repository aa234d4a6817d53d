# SPDX-License-Identifier: Apache-2.0
"""Decisions in words: what decided a launch, who refuses a kernel's launches and why, a
decision for -v. Said alike by the engine inside the program and by clc-run's decider.
Standard library only (and clc's own standard-library modules)."""

from clc import abi
from clc.policy import ANY_RANGE

__all__ = ["rule_name", "deny_announcements", "describe"]


def rule_name(policy, rule, cli_hooks=()):
    """What decided: a rule's name, a --hooks hook, the default or on_error."""
    rules = policy.rules
    if 0 <= rule < len(rules):
        return rules[rule].name
    if rule >= len(rules) and rule - len(rules) < len(cli_hooks):
        return f"hook {cli_hooks[rule - len(rules)].name}"
    return "default" if rule == abi.RULE_DEFAULT else "on_error"


def _shape_text(clause):
    """The launches a shape clause holds, as a policy would say them ("grid_blocks >= 1000001")."""
    top = ANY_RANGE[1]
    parts = []
    for name, (lo, hi) in (("grid_blocks", clause.grid_blocks),
                           ("block_threads", clause.block_threads),
                           ("shared_mem", clause.shared_mem)):
        if lo == hi:
            parts.append(f"{name} = {lo}")
        elif lo > 0 and hi < top:
            parts.append(f"{name} in [{lo}, {hi}]")
        elif lo > 0:
            parts.append(f"{name} >= {lo}")
        elif hi < top:
            parts.append(f"{name} <= {hi}")
    return " and ".join(parts)


def deny_announcements(policy, info, decision, announced, name_of, messages=None):
    """The lines that say who refuses launches of a kernel and why, each once per (kernel,
    decider) in `announced`; a rule that depends on the launch shape says which launches."""
    lines = []
    rules = policy.rules
    shaped = [(c.outcome, _shape_text(c)) for c in decision.clauses]
    for outcome, shape in shaped + [(decision.fallback, "")]:
        if outcome.action != abi.ACTION_DENY or (info.mangled, outcome.rule) in announced:
            continue
        announced.add((info.mangled, outcome.rule))
        message = (messages or {}).get(outcome.rule, "")
        if 0 <= outcome.rule < len(rules):
            rule = rules[outcome.rule]
            why = f"rule '{rule.name}'" + (f" (hook {rule.hook.label})" if rule.hook else "")
            message = message or rule.message
        elif outcome.rule >= len(rules):
            why = name_of(outcome.rule)
        else:
            why = f"the policy's {name_of(outcome.rule)}"
        which = f" with {shape}" if shape else ""
        lines.append(f"clc: launches of {info.demangled}{which} are denied by {why}"
                     + (f": {message}" if message else "") + "\n")
    return lines


def describe(decision, mode, name_of):
    """A decision in words, for -v."""
    def one(outcome):
        flags = [name for bit, name in ((abi.FLAG_RECORD, "record"), (abi.FLAG_TIME, "time"))
                 if outcome.flags & bit]
        return (f"{abi.ACTION_NAMES[outcome.action]}"
                + (f" ({', '.join(flags)})" if flags else "")
                + f" by {name_of(outcome.rule)}")
    shaped = [f"{one(c.outcome)} when grid_blocks in {list(c.grid_blocks)}, block_threads "
              f"in {list(c.block_threads)}, shared_mem in {list(c.shared_mem)}"
              for c in decision.clauses]
    text = "; ".join(shaped + [("else " if shaped else "") + one(decision.fallback)])
    if mode == abi.MODE_PER_SHAPE:
        text += " (this launch; asked again per shape)"
    elif mode == abi.MODE_EVERY_LAUNCH:
        text += " (this launch; asked at every launch)"
    return text
