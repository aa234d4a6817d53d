# SPDX-License-Identifier: Apache-2.0
"""Policies that are hostile or broken in size rather than in meaning: alias bombs, numbers of
thousands of digits, nesting tens of thousands deep, tens of thousands of rules, regexes that
Python's own parser chokes on. Each gives a clean PolicyError at its position (or loads), in
time and memory in proportion to the file; `clc policy check` lists every error of a file at
once, hook files and functions included; a hook file is one file however it is spelled.
"""

import json
import os
import pathlib
import random
import textwrap
import time

import pytest

from alarms import deadline
from clc.cli.main import main
from clc.cli.run import load_policy_and_hooks
from clc.policy import HookRef, PolicyError, load_policy, parse_policy
from clc.policy import loader

GUARD = "import clc\n\n@clc.on_launch(kernel='*')\ndef guard(launch):\n    return None\n"


@pytest.fixture
def alarm():
    """Fail instead of running for minutes: a guard, far above what each test needs."""
    with deadline(60, TimeoutError("the policy took more than 60 s")):
        yield


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    return [f"{e.line}:{e.column}: {e.message}" for e in caught.value.errors]


def billion_laughs(levels: int = 9) -> str:
    """Anchors nested `levels` deep, each a list of nine aliases of the one before."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefghijklmnop", "bcdefghijklmnop"[:levels - 1]):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines)


# ---- aliases -------------------------------------------------------------------------------

def test_alias_bomb_is_refused_at_the_alias_that_passes_the_limit(tmp_path, alarm, capsys):
    # GIVEN a policy of a few hundred bytes whose anchors nest nine deep, used as the rules
    bomb = "version: 1\nx:\n" + textwrap.indent(billion_laughs(), "  ") + "\nrules: *i\n"
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    assert len(bomb) < 600
    # WHEN clc policy check reads it
    started = time.monotonic()
    code = main(["policy", "check", str(path)])
    err = capsys.readouterr().err
    # THEN it is refused at the first alias that takes the expansion past the limit, with
    # how much the aliases stand for
    assert err.splitlines() == [
        f"{path}:8:10: too much aliasing: with alias *e (66430 nodes) the document's aliases "
        f"stand for 141148 nodes, more than the 100000 a policy may expand to",
        f"{path}: 1 error"]
    assert code == 2
    # AND at once (a guard: the limit is on nodes, not on time)
    assert time.monotonic() - started < 10


def test_alias_count_is_the_nodes_written_out():
    # GIVEN an anchored list of 999 items (1000 nodes with the list)
    items = "[" + ", ".join(["x"] * 999) + "]"
    for uses, fine in ((100, True), (101, False)):
        text = (f"version: 1\nx: &big {items}\ny: [" + ", ".join(["*big"] * uses) + "]\n")
        # WHEN it is used 100 times (100000 nodes stood for), or 101 times
        if fine:
            # THEN 100 times is at the limit: the policy loads (with x and y unknown keys)
            assert [e.split(": ", 1)[1][:14] for e in errors_of(text)] == [
                "unknown key 'x", "unknown key 'y"]
        else:
            # AND the 101st alias passes it, and is named with its position
            (error,) = errors_of(text)
            column = len("y: [") + 1 + 100 * len("*big, ")
            assert error == (f"3:{column}: too much aliasing: with alias *big (1000 nodes) "
                             "the document's aliases stand for 101000 nodes, more than the "
                             "100000 a policy may expand to")


def test_plain_anchors_and_aliases_still_work():
    # GIVEN a match block and a tenant list shared through anchors, by many rules
    rules = "".join(f"  - name: r{i}\n    match: *gemm\n    action: deny\n" for i in range(500))
    text = ("version: 1\non_error: deny\nrules:\n"
            "  - name: first\n    match: &gemm {kernel: \"*gemm*\", tenant: &t [a, b]}\n"
            "    action: allow\n"
            "  - name: by-tenant\n    match: {tenant: *t, device: 0}\n    action: deny\n"
            + rules)
    # WHEN it is loaded
    policy = parse_policy(text, "p.yaml")
    # THEN every alias reads as its anchor's value
    assert len(policy.rules) == 502
    assert policy.rules[0].kernel == policy.rules[2].kernel == ("*gemm*",)
    assert policy.rules[1].tenant == policy.rules[501].tenant == ("a", "b")
    # AND the repeated rules are warned as unreachable, as if written out
    assert policy.warnings[0].message.startswith("rule 'by-tenant' is never reached") is False
    assert sum("is never reached: rule 'first'" in w.message for w in policy.warnings) == 500


def test_alias_inside_its_own_anchor_is_refused():
    # GIVEN a list that holds an alias of itself (a graph with a cycle, an infinite tree)
    # WHEN it is loaded THEN the alias is refused, where it is
    assert errors_of("version: 1\nrules: &r [*r]\n") == [
        "2:12: alias *r is inside the node it names: the document would be infinite"]
    assert errors_of("version: 1\nrules:\n  - &rule\n    match: *rule\n") == [
        "4:12: alias *rule is inside the node it names: the document would be infinite"]


def test_anchor_mistakes_keep_pyyaml_descriptions():
    # GIVEN an alias of no anchor, and an anchor given twice
    # THEN the errors are PyYAML's, at the alias and at the second anchor
    assert errors_of("version: 1\ndefault: *nope\n") == [
        "2:10: invalid YAML: found undefined alias 'nope'"]
    assert errors_of("version: 1\ndefault: &a allow\non_error: &a deny\n") == [
        "3:11: invalid YAML: found duplicate anchor 'a'; first occurrence, second occurrence"]


# ---- numbers -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["9" * 5000, "0x" + "f" * 4000, "-" + "1" * 4301,
                                   "1_" * 3000 + "1"])
def test_overlong_numbers_are_errors_at_their_position(value, tmp_path, capsys):
    # GIVEN integers of thousands of digits where a number is expected, and where a string is
    path = tmp_path / "p.yaml"
    path.write_text(f"version: 1\nrules:\n  - match: {{grid_blocks: {value}}}\n"
                    f"    action: deny\n  - match: {{tenant: {value}}}\n    action: deny\n")
    # WHEN the policy is checked
    code = main(["policy", "check", str(path)])
    err = capsys.readouterr().err.splitlines()
    # THEN each is one clean error at its line and column, saying how long it is
    digits = value.replace("_", "")
    message = (f"the number {digits[:20]}... is {len(digits)} characters long: a number here "
               "has at most 100 (quote it to mean the text)")
    assert err == [f"{path}:3:26: {message}", f"{path}:5:21: {message}", f"{path}: 2 errors"]
    assert code == 2


def test_numbers_up_to_the_limit_get_their_range_errors():
    # GIVEN a 100-digit integer (the longest read) where an unsigned 64-bit one is expected
    (error,) = errors_of(f"version: 1\nrules:\n  - match: {{shared_mem: {'9' * 100}}}\n"
                         "    action: deny\n")
    # THEN the error is the range's
    assert error == f"3:25: shared_mem must be at most {2**64 - 1}, got {'9' * 100}"


# ---- nesting -------------------------------------------------------------------------------

def test_deep_flow_nesting_is_refused_where_the_limit_is_passed(alarm):
    # GIVEN 50,000 nested '['
    started = time.monotonic()
    errors = errors_of("version: 1\nrules: " + "[" * 50_000 + "]" * 50_000 + "\n")
    # THEN the error is at the '[' that is the 65th level (the top mapping is the first)
    assert errors == ["2:71: the document nests deeper than 64 levels here (a policy needs 5)"]
    assert time.monotonic() - started < 10       # a guard


def test_deep_block_nesting_is_refused_where_the_limit_is_passed():
    # GIVEN block mappings nested a hundred deep
    text = "version: 1\n" + "".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "1\n"
    # THEN the error is at the 64th mapping under the top one, and nothing else is checked
    assert errors_of(text) == [
        "66:65: the document nests deeper than 64 levels here (a policy needs 5)"]


def test_nesting_up_to_the_limit_loads_as_usual():
    # GIVEN 63 nested lists under the top mapping (64 levels)
    errors = errors_of("version: 1\nrules: " + "[" * 63 + "]" * 63 + "\n")
    # THEN it is read, and only what the rules hold is wrong
    assert errors == ["2:9: rule 1 must be a mapping with at least 'action', got a list"]


# ---- size ----------------------------------------------------------------------------------

def test_file_larger_than_the_limit_is_refused(tmp_path):
    # GIVEN a policy file of one byte more than the limit, and /dev/zero, which never ends
    path = tmp_path / "big.yaml"
    path.write_bytes(b"version: 1\n" + b"#" * (loader.MAX_POLICY_BYTES - 11) + b"\n")
    for source in (path, "/dev/zero"):
        # WHEN it is loaded
        with pytest.raises(PolicyError) as caught:
            load_policy(source)
        # THEN it is refused at 1:1, the limit said, without reading further
        assert str(caught.value) == (f"{source}:1:1: the policy is larger than 4 MiB (a policy "
                                     "of 20,000 rules takes 2 MiB)")


def test_syntax_error_of_a_large_file_is_described_quickly(alarm):
    # GIVEN a policy of 5,000 rules (past the size PyYAML's parser describes) cut off at the end
    text = many_rules(5000) + "x: [\n"
    assert len(text) > loader.PYYAML_DESCRIBES_CHARS
    # WHEN it is loaded THEN the syntax error is at its end, in libyaml's words
    (error,) = errors_of(text)
    assert error.startswith(f"{text.count(chr(10)) + 1}:1: invalid YAML: ")


# ---- many rules ----------------------------------------------------------------------------

def many_rules(count: int) -> str:
    """A policy of `count` rules in block style, each on its own kernel and two tenants."""
    rules = "".join(f"  - name: rule-{i}\n    match:\n      kernel: \"*kernel_{i}*\"\n"
                    f"      tenant: [t{i % 7}, u{i % 13}]\n    action: {('allow', 'deny')[i % 2]}\n"
                    for i in range(count))
    return "version: 1\non_error: deny\nrules:\n" + rules


def test_unreachable_rules_are_found_without_comparing_every_pair(monkeypatch):
    # GIVEN 2,000 rules, and the check of one rule against an earlier one, counted
    calls = 0
    decides = loader._decides_first

    def counted(earlier, later):
        nonlocal calls
        calls += 1
        return decides(earlier, later)

    monkeypatch.setattr(loader, "_decides_first", counted)
    # WHEN they are loaded
    policy = parse_policy(many_rules(2000), "p.yaml")
    # THEN far fewer than the 2 million pairs are compared: a few per rule
    assert len(policy.rules) == 2000 and policy.warnings == []
    assert calls <= 4 * 2000


@pytest.mark.parametrize("count", [10_000, 20_000])
def test_tens_of_thousands_of_rules_load_in_seconds(count, tmp_path, alarm, capsys):
    # GIVEN a policy of 10,000 or 20,000 rules, in block style
    path = tmp_path / "many.yaml"
    path.write_text(many_rules(count))
    # WHEN clc policy check reads it
    started = time.monotonic()
    code = main(["policy", "check", str(path)])
    # THEN it is ok, within a generous guard (about 3 s for 20,000 on a slow machine)
    assert capsys.readouterr().out == f"{path}: ok ({count} rules, default allow, on_error deny)\n"
    assert code == 0
    assert time.monotonic() - started < 60


def random_rules(rng: random.Random, count: int) -> str:
    """Rules drawn from few values, so that earlier rules often cover later ones; at most 8
    with launch-shape conditions."""
    shaped = 0
    out = []
    for i in range(count):
        match = {}
        for key, values in (("kernel", ['"*"', '"*gemm*"', '"*conv*"', '"k1"']),
                            ("tenant", ["a", "b", '"*"']), ("device", ["0", "1"]),
                            ("user", ["alice", "1000", '"*"']),
                            ("kernel_regex", ['"gemm"', '"^k"'])):
            roll = rng.random()
            if roll < 0.25:
                match[key] = rng.choice(values)
            elif roll < 0.35 and key != "kernel_regex":
                match[key] = "[" + ", ".join(rng.sample(values, 2)) + "]"
        if shaped < 8 and rng.random() < 0.3:
            shaped += 1
            match["grid_blocks"] = rng.choice(["{gt: 10}", "{lt: 100}", "{ge: 5, le: 50}", "7"])
        action = rng.choice(["allow", "deny", "deny", "hook"])
        text = f"  - name: r{i}\n    action: {action}\n"
        if action == "hook":
            text += "    hook: guard.py:guard\n"
        if match:
            text += "    match: {" + ", ".join(f"{k}: {v}" for k, v in match.items()) + "}\n"
        out.append(text)
    return "version: 1\non_error: deny\nrules:\n" + "".join(out)


def test_unreachable_warnings_are_those_of_comparing_every_pair(tmp_path):
    # GIVEN random policies whose rules often cover one another, hook rules among them
    (tmp_path / "guard.py").write_text(GUARD)
    rng = random.Random(11)
    warned = 0
    for _ in range(60):
        path = tmp_path / "p.yaml"
        path.write_text(random_rules(rng, rng.randint(2, 40)))
        # WHEN each is loaded
        policy = load_policy(path)
        # THEN each rule is warned about exactly when an earlier rule decides it, and the
        # warning names the first such rule
        expected = []
        for i, later in enumerate(policy.rules):
            first = next((e for e in policy.rules[:i] if loader._decides_first(e, later)), None)
            if first is not None:
                expected.append((later.name, first.name))
        found = [(w.message.split("'")[1], w.message.split("'")[3]) for w in policy.warnings
                 if "is never reached" in w.message]
        assert found == expected
        warned += len(found)
    assert warned > 100


# ---- kernel_regex --------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, message", [
    ("a{99999999999}", "invalid regex 'a{99999999999}' in kernel_regex: the repetition number "
                       "is too large"),
    ("a{" + "9" * 5000 + "}", "invalid regex 'a{" + "9" * 5000 + "}' in kernel_regex: a number "
                              "in it has too many digits"),
    ("(?:" * 500 + "a" + ")" * 500, "unsupported regex '" + "(?:" * 500 + "a" + ")" * 500
     + "' in kernel_regex: groups nested 500 deep (at most 100)"),
    ("a{2}" * 5000, "unsupported regex 'a{2}a{2}a{2}a{2}a{2}a{2}a{2}a{2}a{2}a{2}...' in "
                    "kernel_regex: 20000 characters long (at most 10000)"),
])
def test_regexes_python_cannot_parse_are_clean_errors(pattern, message):
    # GIVEN a kernel_regex whose repeat count overflows, has thousands of digits, nests
    # thousands deep, or is very long
    # WHEN the policy is loaded THEN it is one error at the pattern, saying why
    assert errors_of(f"version: 1\nrules:\n  - match: {{kernel_regex: '{pattern}'}}\n"
                     "    action: deny\n") == [f"3:27: {message}"]


def test_groups_inside_sets_escapes_and_comments_do_not_count_as_nesting():
    # GIVEN parentheses in sets, escaped, and in a comment, 150 of each
    pattern = "[(]" * 150 + r"\(" * 150 + "(?#" + "(" * 150 + ")x"
    # THEN the pattern is read as it is: no group nests
    policy = parse_policy(f"version: 1\nrules:\n  - match: {{kernel_regex: '{pattern}'}}\n"
                          "    action: deny\n", "p.yaml")
    assert policy.rules[0].kernel_regex == pattern


# ---- every error at once -------------------------------------------------------------------

HOOK_RULES = """\
version: 1
default: maybe
rules:
  - match: {kernel: "*a*"}
    action: hook
    hook: missing.py:f
  - match: {kernel: "*b*"}
    action: hook
    hook: present.py:nope
  - match: {kernel: "*c*"}
    action: hook
    hook: present.py:guard
  - match: {kernel: "*d*"}
    action: hook
    hook: gone.py:g
  - match: {kernel: "*e*"}
    action: hook
    hook: broken.py:f
  - match: {kernel: "*f*"}
    action: hook
    hook: broken.py:g
"""


def test_check_lists_hook_files_and_functions_with_the_other_errors(tmp_path, capsys):
    # GIVEN a policy with a wrong value, two missing hook files, a hook file without the
    # function named, one that raises on import (named twice) and one that is fine
    (tmp_path / "present.py").write_text(GUARD)
    imports = tmp_path / "imports"
    (tmp_path / "broken.py").write_text(f"open({str(imports)!r}, 'a').write('x')\n"
                                        "raise RuntimeError('no')\n")
    path = tmp_path / "p.yaml"
    path.write_text(HOOK_RULES)
    # WHEN it is checked
    code = main(["policy", "check", str(path)])
    # (an import failure's message goes on with the lines of its traceback)
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(" ")]
    # THEN every error is listed in order of position: the value, each missing file, the
    # missing function, and the import failure at both of its references
    assert [line.split(": ")[0] for line in err] == [
        f"{path}:2:10", f"{path}:6:11", f"{path}:9:11", f"{path}:15:11", f"{path}:18:11",
        f"{path}:21:11", f"{path}"]
    assert "hook file 'missing.py' not found" in err[1]
    assert "hook 'present.py:nope': " in err[2] and "has no function 'nope'" in err[2]
    assert "hook file 'gone.py' not found" in err[3]
    assert err[4].endswith("hook 'broken.py:f': cannot import: RuntimeError: no")
    assert err[5].endswith("hook 'broken.py:g': cannot import: RuntimeError: no")
    assert err[-1] == f"{path}: 6 errors"
    assert code == 2
    # AND the failing file was imported once
    assert imports.read_text() == "x"


# ---- a hook file is one file -----------------------------------------------------------------

HOOKED = """\
version: 1
rules:
  - match: {kernel: "*vecAdd*"}
    action: hook
    hook: rules/guard.py:guard
"""


@pytest.fixture
def hook_dir(tmp_path, monkeypatch):
    """The current directory: h.py, a symbolic and a hard link to it, and rules/guard.py with
    a hard link to it; its resolved path."""
    (tmp_path / "h.py").write_text(GUARD)
    os.symlink("h.py", tmp_path / "sym.py")
    os.link(tmp_path / "h.py", tmp_path / "hard.py")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "guard.py").write_text(GUARD)
    os.link(tmp_path / "rules" / "guard.py", tmp_path / "guard-link.py")
    (tmp_path / "p.yaml").write_text(HOOKED)
    monkeypatch.chdir(tmp_path)
    return os.path.realpath(tmp_path)


def test_the_same_hook_file_given_again_is_asked_once(hook_dir):
    # GIVEN a policy, and h.py given as itself, as ./h.py, through a symbolic and a hard link
    policy = load_policy("p.yaml")
    # WHEN they are added as --hooks files, in two goes
    once = policy.with_cli_hooks(["h.py", "./h.py", "sym.py"])
    twice = once.with_cli_hooks(["hard.py", pathlib.Path("h.py")])
    # THEN the file is there once, as first given
    expected = [HookRef(os.path.join(hook_dir, "h.py"), None, "h.py")]
    assert once.hooks == twice.hooks == expected


def test_a_hook_file_the_policy_names_is_imported_as_one(hook_dir):
    # GIVEN a --hooks file that is a hard link to the file a hook rule names
    policy = load_policy("p.yaml").with_cli_hooks(["guard-link.py", "h.py"])
    # THEN it is kept, under the rule's path, so that both are one module
    rule_path = os.path.join(hook_dir, "rules", "guard.py")
    assert policy.rules[0].hook.path == rule_path
    assert policy.hooks == [HookRef(rule_path, None, "guard-link.py"),
                            HookRef(os.path.join(hook_dir, "h.py"), None, "h.py")]


def test_clc_run_names_each_hook_once(hook_dir):
    # GIVEN the same hook file twice on clc-run's command line
    _, policy_json = load_policy_and_hooks(None, ["h.py", "./hard.py"])
    # THEN the program's policy names its one hook once
    assert json.loads(policy_json)["hook_deciders"] == ["h.py:guard"]
