# SPDX-License-Identifier: Apache-2.0
"""A policy file's YAML document, read within bounds: the node graph PyYAML's composer would
make of it, built without recursion, refusing a document that nests too deep or whose aliases
stand for too many nodes, each at the place that passes the limit.

The limits (MAX_*, PYYAML_DESCRIBES_CHARS; MAX_NUMBER_CHARS is the reader's) are what a policy
file may make the loader do, whatever its bytes: each is far beyond what any policy needs, and
each keeps a hostile or broken file from costing minutes or gigabytes (docs/policies.md,
"Limits"). The caller imports PyYAML and passes it in.
"""

from __future__ import annotations

from clc.policy.errors import PolicyError

__all__ = ["MAX_POLICY_BYTES", "PYYAML_DESCRIBES_CHARS", "MAX_DEPTH", "MAX_ALIASED_NODES",
           "yaml_document"]

# Twice a policy of 20,000 rules written out in block style; such a file loads in seconds.
MAX_POLICY_BYTES = 4 << 20
# PyYAML's own parser takes seconds a MiB: it describes the syntax errors of files up to this
# size (a policy of some 2,500 rules), libyaml those of larger ones (yaml_document).
PYYAML_DESCRIBES_CHARS = 256 << 10
# A policy nests 5 deep (the top mapping, rules, a rule, its match, a range); the loader walks
# the document without recursion, and PyYAML's parser keeps a stack per level.
MAX_DEPTH = 64
# The nodes that aliases stand for, counted as if written out: a policy that shares a match
# block among thousands of rules stays far below; nine levels of nine aliases ("billion
# laughs", a few hundred bytes) stand for 387 million.
MAX_ALIASED_NODES = 100_000


def _at(path: str, mark, message: str) -> PolicyError:
    return PolicyError(path, mark.line + 1, mark.column + 1, message)


class _Anchors:
    """A document's anchors: which node each names, how many nodes each anchored node stands
    for written out, which are still open, and how many nodes the aliases so far stand for."""

    def __init__(self, path: str):
        self.path = path
        self.anchors = {}
        # The nodes each node stands for, written out, by identity: an alias counts what its
        # anchor's node holds without walking it again.
        self.sizes = {}
        self.aliased = 0
        self.open_anchors = set()

    def anchor(self, event, node) -> None:
        if event.anchor in self.anchors:
            from yaml.composer import ComposerError
            raise ComposerError(f"found duplicate anchor {event.anchor!r}; first occurrence",
                                self.anchors[event.anchor].start_mark, "second occurrence",
                                event.start_mark)
        self.anchors[event.anchor] = node

    def scalar(self, event, node) -> None:
        self.anchor(event, node)
        self.sizes[id(node)] = 1

    def opened(self, event, node) -> None:
        self.anchor(event, node)
        self.open_anchors.add(event.anchor)

    def closed(self, anchor: str, node, size: int) -> None:
        self.open_anchors.discard(anchor)
        self.sizes[id(node)] = size

    def alias(self, event):
        """(the node an alias names, the nodes it stands for)."""
        anchor = event.anchor
        if anchor not in self.anchors:
            from yaml.composer import ComposerError
            raise ComposerError(None, None, f"found undefined alias {anchor!r}", event.start_mark)
        if anchor in self.open_anchors:
            raise _at(self.path, event.start_mark, f"alias *{anchor} is inside the node it "
                                                   "names: the document would be infinite")
        node = self.anchors[anchor]
        size = self.sizes[id(node)]
        self.aliased += size
        if self.aliased > MAX_ALIASED_NODES:
            raise _at(self.path, event.start_mark,
                      f"too much aliasing: with alias *{anchor} ({size} nodes) the "
                      f"document's aliases stand for {self.aliased} nodes, more than the "
                      f"{MAX_ALIASED_NODES} a policy may expand to")
        return node, size


def _compose(yaml, events, path: str):
    """The one document of a YAML event stream as the node graph yaml.compose makes of it, or
    None for an empty stream. Built without recursion, it refuses a document nested deeper
    than MAX_DEPTH and aliases that stand for more than MAX_ALIASED_NODES nodes (a YAML alias
    bomb), each at the event that passes the limit; PyYAML's own mistakes (an undefined or
    repeated anchor, a second document) raise its ComposerError, worded as yaml.compose's."""
    from yaml import events as ev
    from yaml.composer import ComposerError
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode
    next(events)                         # the stream's start
    if type(next(events)) is ev.StreamEndEvent:
        return None
    resolve = yaml.resolver.Resolver().resolve
    anchors = _Anchors(path)
    # The collections being read, innermost last: [node, its anchor, a mapping's pending key
    # node or None, the nodes it stands for so far].
    stack = []
    ends = (ev.SequenceEndEvent, ev.MappingEndEvent)
    for event in events:
        kind = type(event)
        if kind is ev.ScalarEvent:
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolve(ScalarNode, event.value, event.implicit)
            # libyaml calls a plain scalar's style '', PyYAML None.
            node = ScalarNode(tag, event.value, event.start_mark, event.end_mark,
                              style=event.style or None)
            size = 1
            if event.anchor is not None:
                anchors.scalar(event, node)
        elif kind in ends:
            node, anchor, _, size = stack.pop()
            node.end_mark = event.end_mark
            if anchor is not None:
                anchors.closed(anchor, node, size)
        elif kind is ev.AliasEvent:
            node, size = anchors.alias(event)
        elif kind is ev.DocumentEndEvent:
            break
        else:                           # a sequence or a mapping starts
            if len(stack) == MAX_DEPTH:
                raise _at(path, event.start_mark, f"the document nests deeper than "
                                                  f"{MAX_DEPTH} levels here (a policy needs 5)")
            collection = SequenceNode if kind is ev.SequenceStartEvent else MappingNode
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolve(collection, None, event.implicit)
            node = collection(tag, [], event.start_mark, None, flow_style=event.flow_style)
            if event.anchor is not None:
                anchors.opened(event, node)
            stack.append([node, event.anchor, None, 1])
            continue
        if not stack:
            root = node
            continue
        top = stack[-1]
        top[3] += size
        if type(top[0]) is SequenceNode:
            top[0].value.append(node)
        elif top[2] is None:
            top[2] = node
        else:
            top[0].value.append((top[2], node))
            top[2] = None
    event = next(events)
    if type(event) is not ev.StreamEndEvent:
        raise ComposerError("expected a single document in the stream", root.start_mark,
                            "but found another document", event.start_mark)
    return root


def yaml_document(yaml, text: str, path: str):
    """The policy's YAML document (see _compose).

    libyaml's parser, which PyYAML's wheels carry, reads a policy twenty times faster than
    PyYAML's own. A file it refuses is read again by PyYAML's parser, whose descriptions of
    mistakes are the documented ones, unless it is larger than PYYAML_DESCRIBES_CHARS: then
    libyaml's description stands. PyYAML's parser also reads a file with characters it does
    not accept (its error says which), and every file where libyaml is missing.
    """
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None and not yaml.reader.Reader.NON_PRINTABLE.search(text):
        try:
            return _compose(yaml, yaml.parse(text, Loader=fast), path)
        except yaml.YAMLError:
            if len(text) > PYYAML_DESCRIBES_CHARS:
                raise
    return _compose(yaml, yaml.parse(text, Loader=yaml.SafeLoader), path)
