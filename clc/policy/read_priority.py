# SPDX-License-Identifier: Apache-2.0
"""Reading the `priority:` section: the board, idle_after_ms, mps and the classes, each class's
keys and ranges as CLASS_KEYS gives them, its match read as a rule's is.
"""

from __future__ import annotations

from clc import abi
from clc.policy.keys import (BEST_EFFORT, CLASS_KEYS, CLASS_MATCH_KEYS, LATENCY_CRITICAL,
                             MPS_MODES, PRIORITY_CLASSES, PRIORITY_KEYS, only_on)
from clc.policy.priority import DEFAULT_BOARD, Priority, PriorityClass
from clc.policy.read_match import _MatchReader
from clc.policy.reader import _INVALID, _Reported, _suggestion

__all__ = []

_PRIORITY_KEYS = tuple(PRIORITY_KEYS)
_CLASS_KEYS = tuple(CLASS_KEYS)
_CLASS_MATCH_KEYS = tuple(CLASS_MATCH_KEYS)
_BEST_EFFORT_KEYS = only_on(CLASS_KEYS, BEST_EFFORT)
_IDLE = PRIORITY_KEYS["idle_after_ms"].value
_FLOOR = CLASS_KEYS["floor"].value
_RUN_AHEAD = CLASS_KEYS["run_ahead"].value
_HELD_SHARE = CLASS_KEYS["held_share"].value
_RESERVE = CLASS_KEYS["reserve"].value
_SLO = CLASS_KEYS["slo"].value


class _PriorityReader(_MatchReader):
    """Reads the priority section."""

    def priority(self, node) -> Priority:
        """`priority:`: classes of processes (latency-critical, best-effort), the board's
        directory, idle_after_ms and mps."""
        if node.id != "mapping":
            raise self.type_error(node, "priority", "a mapping with 'classes'")
        before = len(self.errors)
        meant = set()
        pairs = self.mapping(node, _PRIORITY_KEYS, "in priority", meant=meant)
        board, idle = DEFAULT_BOARD, float(abi.PRIORITY_IDLE_MS_DEFAULT)
        if "board" in pairs:
            board = self.attempt(self.board, pairs["board"][1])
        if "idle_after_ms" in pairs:
            idle = self.attempt(self.number, pairs["idle_after_ms"][1], "idle_after_ms")
            if idle is not _INVALID and not _IDLE.holds(idle):
                low, high = _IDLE.words()
                self.report(pairs["idle_after_ms"][1], f"idle_after_ms must be {low} and "
                                                       f"{high}, got {idle}")
        mps = "off"
        if "mps" in pairs:
            mps = self.attempt(self.mps, pairs["mps"][1])
        classes = []
        if "classes" in pairs:
            classes = self.attempt(self.classes, pairs["classes"][1])
        elif "classes" not in meant:
            self.report(node, "priority has no 'classes' (expected a list of classes, each "
                              "with a name, a class (latency-critical or best-effort) and a "
                              "match)")
        if len(self.errors) > before:
            raise _Reported
        return Priority(tuple(classes), board, float(idle), mps)

    def mps(self, node) -> str:
        kind, value = self.kind(node)
        if kind != "str" or value not in MPS_MODES:
            raise self.error(node, f"mps must be {', '.join(MPS_MODES[:-1])} or {MPS_MODES[-1]}"
                                   f" (whether clc-run joins or starts this user's MPS control "
                                   f"daemon), got {self.describe(node)}")
        return value

    def board(self, node) -> str:
        path = self.string(node, "board")
        if not path.startswith("/"):
            raise self.error(node, f"board must be an absolute path (a directory every "
                                   f"process of the machine can reach), got '{path}'")
        if "\0" in path or len(path) > 200:
            raise self.error(node, "board must be a path of at most 200 characters")
        return path

    def classes(self, node) -> list[PriorityClass]:
        if node.id != "sequence":
            raise self.type_error(node, "classes", "a list of classes")
        if not node.value:
            raise self.error(node, "classes must not be an empty list")
        classes, first_use = [], {}
        for index, class_node in enumerate(node.value):
            c = self.attempt(self.priority_class, class_node, index, first_use)
            if c is _INVALID:
                continue
            every = next((e for e in classes if all(getattr(e, key) is None
                                                    for key in _CLASS_MATCH_KEYS)), None)
            if every is not None:
                self.warn(class_node, f"class '{c.name}' is never reached: class "
                                      f"'{every.name}' (line {every.line}) has no match, so "
                                      "every process is of that class")
            classes.append(c)
        return classes

    def priority_class(self, node, index: int, first_use: dict) -> PriorityClass:
        if node.id != "mapping":
            raise self.type_error(node, f"class {index + 1}",
                                  "a mapping with 'name', 'class' and 'match'")
        before = len(self.errors)
        meant = set()
        pairs = self.mapping(node, _CLASS_KEYS, f"in class {index + 1}", meant=meant)
        name = f"class-{index + 1}"
        if "name" in pairs:
            written = self.attempt(self.string, pairs["name"][1], "name")
            if written is not _INVALID:
                if not written:
                    self.report(pairs["name"][1], "a class name must not be empty")
                elif written in first_use:
                    self.report(pairs["name"][1], f"duplicate class name '{written}' (first "
                                                  f"used at line {first_use[written]})")
                name = written or name
        elif "name" not in meant:
            self.report(node, f"class {index + 1} has no 'name'")
        first_use.setdefault(name, node.start_mark.line + 1)
        kind = None
        if "class" in pairs:
            written = self.attempt(self.string, pairs["class"][1], "class")
            if written is not _INVALID and written not in PRIORITY_CLASSES:
                self.report(pairs["class"][1], f"unknown class '{written}' "
                                               f"({_suggestion(written, PRIORITY_CLASSES)})")
            elif written is not _INVALID:
                kind = written
        elif "class" not in meant:
            self.report(node, f"class '{name}' has no 'class' (expected latency-critical or "
                              "best-effort)")
        fields = {}
        if "match" in pairs:
            match = pairs["match"][1]
            if match.id != "mapping":
                self.errors.append(self.type_error(match, "match", "a mapping"))
            else:
                for key, (_, value) in self.mapping(
                        match, _CLASS_MATCH_KEYS, f"in the match of class '{name}' (a class "
                        "holds for whole processes: it may match only "
                        + ", ".join(_CLASS_MATCH_KEYS) + ")").items():
                    fields[key] = self.attempt(self.condition, key, value)
        floor, run_ahead, held_share, reserve = self.best_effort(pairs, name, kind)
        slo = 0.0
        if "slo" in pairs and kind == BEST_EFFORT:
            self.report(pairs["slo"][0], f"'slo' is only allowed on a latency-critical class "
                                         f"(class '{name}' is best-effort)")
        elif "slo" in pairs:
            slo = self.bounded_number(pairs, "slo", _SLO, " (the p99 of its busy periods "
                                      "against their p99 while best-effort work is held)")
        if len(self.errors) > before or kind is None:
            raise _Reported
        return PriorityClass(name, kind, float(floor), int(run_ahead),
                             node.start_mark.line + 1, held_share=float(held_share),
                             reserve=float(reserve), slo=float(slo), **fields)

    def best_effort(self, pairs: dict, name: str, kind: str | None) -> tuple:
        """A class's floor, run_ahead, held_share and reserve: their defaults unless it gives
        them, only a best-effort class may."""
        floor, run_ahead = abi.PRIORITY_FLOOR_DEFAULT, abi.PRIORITY_RUN_AHEAD_DEFAULT
        held_share = reserve = 0.0
        for key in _BEST_EFFORT_KEYS:
            if key in pairs and kind == LATENCY_CRITICAL:
                self.report(pairs[key][0], f"'{key}' is only allowed on a best-effort class "
                                           f"(class '{name}' is latency-critical)")
        if "floor" in pairs and kind != LATENCY_CRITICAL:
            floor = self.bounded_number(pairs, "floor", _FLOOR, " (a best-effort process held "
                                        "without a floor could starve)")
        if "run_ahead" in pairs and kind != LATENCY_CRITICAL:
            run_ahead = self.attempt(self.unsigned, pairs["run_ahead"][1], "run_ahead",
                                     _RUN_AHEAD.hi)
            if run_ahead is not _INVALID and not _RUN_AHEAD.holds(run_ahead):
                self.report(pairs["run_ahead"][1], f"run_ahead must be {_RUN_AHEAD.words()[0]}, "
                                                   f"got {run_ahead}")
        if "held_share" in pairs and kind != LATENCY_CRITICAL:
            held_share = self.bounded_number(pairs, "held_share", _HELD_SHARE,
                                             " (0: held launches wait)")
            if (held_share is not _INVALID and _HELD_SHARE.holds(held_share)
                    and "floor" in pairs and held_share > 0):
                self.warn(pairs["floor"][0], f"floor on class '{name}' has no effect: with "
                                             "held_share its held launches run on a share of "
                                             "the SMs, they do not wait")
        if "reserve" in pairs and kind != LATENCY_CRITICAL:
            reserve = self.bounded_number(pairs, "reserve", _RESERVE, " (0: none)")
            if (reserve is not _INVALID and held_share is not _INVALID and reserve > 0
                    and held_share > 1 - reserve):
                self.warn(pairs["held_share"][0], f"held_share on class '{name}' is more than "
                                                  f"the {1 - reserve:g} of the SMs its reserve "
                                                  "leaves it: it gets more while the "
                                                  "latency-critical work is busy than while it "
                                                  "is idle")
        return floor, run_ahead, held_share, reserve

    def bounded_number(self, pairs: dict, key: str, bounds, why: str):
        """The number pairs[key] gives, reported when outside bounds (`why` said after the
        lower end); _INVALID where it is not a number."""
        value = self.attempt(self.number, pairs[key][1], key)
        if value is not _INVALID and not bounds.holds(value):
            low, high = bounds.words()
            self.report(pairs[key][1], f"{key} must be {low}{why} and {high}, got {value}")
        return value
