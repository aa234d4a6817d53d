# SPDX-License-Identifier: Apache-2.0
"""Every example of the README and docs/ is run, so that none can drift from what clc does:
each YAML block is a policy (or a part of one, completed the way the text around it says) that
clc's policy loader takes without an error; each Python block is a hook file (or a part of one)
that imports, whose decorators accept their options, and whose hooks read nothing that changes
between the launches they are asked about. The README's hook example is also run over the fake
driver: it judges every launch it claims to."""

import re
import textwrap

import pytest

from clc.policy import PolicyError, parse_policy
from clc.runtime.hook_reads import stale_read_warning
from clc.runtime.hooks import load_hook_file

from harness import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# A block that is not clc's to check: a manifest for another tool.
FOREIGN = ("apiVersion:",)
POLICY_KEYS = ("version", "default", "on_error", "rules", "priority")


def blocks(language):
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            if m[1] == language:
                line = text.count("\n", 0, m.start()) + 2
                found.append(pytest.param(m[2], id=f"{doc.relative_to(ROOT)}:{line}"))
    return found


def as_policy(block):
    """The block as a whole policy: a part of one is completed as its section says."""
    body = textwrap.dedent(block)
    keys = re.findall(r"^(\w+):", body, re.M)
    if "version" in keys:
        return body
    if keys and all(k in POLICY_KEYS for k in keys):
        return "version: 1\n" + body
    if body.lstrip().startswith("- "):  # rules
        if not re.search(r"^\s+action:", body, re.M):
            body += "  action: allow\n"
        return "version: 1\nrules:\n" + textwrap.indent(body, "  ")
    rule = body if "action" in keys else body + "action: allow\n"
    if "match" not in keys:
        rule = "match: {}\n" + rule
    return "version: 1\nrules:\n  - name: example\n" + textwrap.indent(rule, "    ")


@pytest.mark.parametrize("block", [b for b in blocks("yaml")
                                   if not any(word in b.values[0] for word in FOREIGN)])
def test_every_yaml_example_is_a_policy_clc_takes(block, tmp_path):
    text = as_policy(block)
    # a hook rule names a file relative to the policy's directory: the repository's own where
    # it names one from docs/, else a file of that name holding the function
    for ref in re.findall(r"hook: *(\S+?):(\w+)", text):
        path, function = ref
        shipped = (ROOT / "docs" / path).resolve()
        if shipped.is_file():
            text = text.replace(f"hook: {path}:", f"hook: {shipped}:")
        else:
            stub = tmp_path / path
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text(f"def {function}(launch):\n    return None\n")
    try:
        parse_policy(text, str(tmp_path / "policy.yaml"))
    except PolicyError as e:
        pytest.fail(f"{e}\n--- the example as checked:\n{text}")


def as_hook_file(block):
    """The block as a hook file: `import clc` first, and a part of a hook body put in one."""
    if re.search(r"^(@|def |class )", block, re.M):
        return "import clc\n" + block
    return ("import clc\n\n@clc.on_launch(every_launch=True)\ndef example(launch):\n"
            + textwrap.indent(block, "    ") + "    return None\n")


@pytest.mark.parametrize("block", blocks("python"))
def test_every_python_example_is_a_hook_file_that_judges_what_it_reads(block, tmp_path):
    path = tmp_path / "hooks.py"
    path.write_text(as_hook_file(block))
    hook_file = load_hook_file(path)
    warnings = [w for w in map(stale_read_warning, hook_file.hooks) if w]
    assert warnings == []


def readme_hooks():
    (block,) = [m[2] for m in FENCE.finditer((ROOT / "README.md").read_text())
                if m[1] == "python"]
    return block


def test_the_readmes_hook_judges_every_launch_by_its_grid(run_params, tmp_path):
    # GIVEN the README's hook file, aimed at the test program's vecAdd with a limit of 5 blocks
    hooks = readme_hooks().replace('kernel="*softmax*"', 'kernel="*vecAdd*"')
    hooks = hooks.replace("> 65536", "> 5")
    assert 'kernel="*vecAdd*"' in hooks and "> 5" in hooks
    path = tmp_path / "hooks.py"
    path.write_text(hooks)
    # WHEN the program launches vecAdd with grids of 1 to 20 blocks, by two entry points
    run = run_params(None, hooks=[path], count=20)
    # THEN each of the 30 launches over 5 blocks was refused, and no other
    results = run.results()
    refused = [rc for (kernel, _), rcs in results.items() if "vecAdd" in kernel
               for rc in rcs if rc == 800]
    allowed = [rc for (kernel, _), rcs in results.items() if "vecAdd" in kernel
               for rc in rcs if rc == 0]
    assert (len(refused), len(allowed)) == (30, 10), run.stderr[-2000:]
    assert "grid too large" in run.stderr
