# SPDX-License-Identifier: Apache-2.0
"""Hook files: loading, importing, what goes wrong, and references to their functions
(clc.runtime.hooks)."""

import os
import sys

import pytest

import clc
from clc import abi
from clc.runtime.hooks import HookLoadError, Launch, load_hook_file, resolve_hook_ref

from hook_cases import kernel, write


# ---- hook files ---------------------------------------------------------------------------------

GOOD = """\
    import clc

    @clc.on_launch(kernel="*softmax*")
    def guard(launch):
        if launch.grid.blocks > 65536:
            return clc.deny("grid too large for this tenant")
        return clc.allow(record=True)

    @clc.on_launch(kernel="*gemm*", every_launch=True)
    def log_big(launch):
        return None

    @clc.on_exit
    def summary(stats):
        pass

    @clc.on_launch
    def everything(launch):
        return None

    def plain(launch):
        return clc.allow()

    NOT_A_FUNCTION = 3
    """


def test_load_hook_file_collects_hooks_in_definition_order(tmp_path):
    # GIVEN a hook file with three launch hooks and an exit function
    path = write(tmp_path, "good_hooks.py", GOOD)
    # WHEN it is loaded
    hook_file = load_hook_file(path)
    # THEN its hooks come in definition order with their options and names
    assert [h.name for h in hook_file.hooks] == \
        ["good_hooks.py:guard", "good_hooks.py:log_big", "good_hooks.py:everything"]
    guard, log_big, everything = hook_file.hooks
    assert guard.kernel == ("*softmax*",) and guard.mode == abi.MODE_CACHED
    assert log_big.every_launch and everything.kernel is None
    assert [f.__name__ for f in hook_file.exit_functions] == ["summary"]
    assert hook_file.name == "good_hooks.py" and hook_file.path == os.fsdecode(path)
    assert all(h.file == str(path.resolve()) for h in hook_file.hooks)
    # AND the hooks decide as written
    big = Launch(name="softmax", grid=(70000, 1, 1))
    assert guard.call(big) == clc.deny("grid too large for this tenant")
    assert guard.call(Launch(name="softmax")) == clc.allow(record=True)
    # AND the file's directory is not left on sys.path
    assert str(tmp_path) not in sys.path


def test_each_file_has_its_own_registry(tmp_path):
    # GIVEN two hook files
    first = write(tmp_path, "first_reg.py", "import clc\n@clc.on_launch\ndef a(l): pass\n")
    second = write(tmp_path, "second_reg.py", "import clc\n@clc.on_launch\ndef b(l): pass\n")
    # WHEN both are loaded, with a decorator used outside any load in between
    one = load_hook_file(first)

    @clc.on_launch
    def stray(launch):
        return None
    two = load_hook_file(second)
    # THEN each file holds only its own hooks
    assert [h.name for h in one.hooks] == ["first_reg.py:a"]
    assert [h.name for h in two.hooks] == ["second_reg.py:b"]


def test_a_file_is_imported_once(tmp_path):
    # GIVEN a hook file that notes each import of itself
    marker = tmp_path / "imports.txt"
    path = write(tmp_path, "once_hooks.py", f"""\
        import clc
        with open({str(marker)!r}, "a") as f:
            f.write("x")

        @clc.on_launch
        def guard(launch):
            return None
        """)
    # WHEN it is loaded twice, through another spelling of its path, and by reference
    first = load_hook_file(path)
    again = load_hook_file(tmp_path / "." / "once_hooks.py")
    hook = resolve_hook_ref("once_hooks.py:guard", tmp_path)
    # THEN it was imported once and every route gives the same objects
    assert marker.read_text() == "x"
    assert again is first and hook is first.hooks[0]


def test_a_file_imports_its_neighbours(tmp_path):
    # GIVEN a hook file that imports a module next to it
    neighbour = f"limits_{tmp_path.name}"
    write(tmp_path, f"{neighbour}.py", "MAX_BLOCKS = 17\n")
    path = write(tmp_path, "neighbour_hooks.py", f"""\
        import clc
        from {neighbour} import MAX_BLOCKS

        @clc.on_launch
        def guard(launch):
            return clc.deny() if launch.grid.blocks > MAX_BLOCKS else None
        """)
    # WHEN it is loaded
    hook_file = load_hook_file(path)
    # THEN the neighbour was found, and sys.path is as before
    assert hook_file.module.MAX_BLOCKS == 17
    assert hook_file.hooks[0].call(Launch(grid=(18, 1, 1))) == clc.deny()
    assert str(tmp_path) not in sys.path


def test_syntax_error_gives_the_line(tmp_path):
    # GIVEN a hook file with a syntax error on line 4
    path = write(tmp_path, "syntax_hooks.py", """\
        import clc

        @clc.on_launch
        def guard(launch) return None
        """)
    # WHEN it is loaded
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN the message gives the file, the error and the line
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot import: SyntaxError: ")
    assert f"{path}, line 4" in message
    assert "def guard(launch) return None" in message
    assert caught.value.path == str(path)


def test_import_error_gives_the_frames_in_the_file(tmp_path):
    # GIVEN a hook file that imports a module that does not exist, on line 2
    path = write(tmp_path, "import_hooks.py", """\
        import clc
        import no_such_module_for_clc_tests
        """)
    # WHEN it is loaded
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN the message has the exception and the line in the file
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot import: ModuleNotFoundError: No module named "
                              "'no_such_module_for_clc_tests'")
    assert f"{path}, line 2, in <module>" in message
    assert "import no_such_module_for_clc_tests" in message
    # AND a failed import is not cached as a module
    assert not [m for m in sys.modules if m.endswith("_import_hooks")]


def test_runtime_error_at_import_lists_the_last_frames(tmp_path):
    # GIVEN a hook file whose import calls a function that fails
    path = write(tmp_path, "raise_hooks.py", """\
        import clc

        def limits():
            return {}["tenant"]

        LIMITS = limits()
        """)
    # WHEN it is loaded
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN both frames in the file are given, innermost last
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot import: KeyError: 'tenant'")
    assert message.index(f"{path}, line 6, in <module>") < \
        message.index(f"{path}, line 4, in limits")


def test_bad_decorator_option_in_a_file_is_a_load_error(tmp_path):
    # GIVEN a hook file whose decorator has an unclosed '[' on line 3
    path = write(tmp_path, "glob_hooks.py", """\
        import clc

        @clc.on_launch(kernel="[gemm")
        def guard(launch):
            return None
        """)
    # WHEN it is loaded
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN the import fails with the function, the glob and the line
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot import: HookError: @clc.on_launch on "
                              "glob_hooks.py:guard: invalid glob '[gemm' in kernel")
    assert f"{path}, line 3, in <module>" in message


def test_sys_exit_at_import_does_not_end_the_program(tmp_path):
    # GIVEN a hook file that calls sys.exit()
    path = write(tmp_path, "exit_hooks.py", "import sys\nsys.exit(3)\n")
    # WHEN it is loaded
    # THEN it is a load error, not an exit
    with pytest.raises(HookLoadError, match="cannot import: SystemExit: 3"):
        load_hook_file(path)


def test_file_without_hooks_is_refused(tmp_path):
    # GIVEN a file that defines no hook
    path = write(tmp_path, "empty_hooks.py", "import clc\n\ndef guard(launch):\n    pass\n")
    # WHEN it is loaded as a hook file
    with pytest.raises(HookLoadError) as caught:
        load_hook_file(path)
    # THEN it is refused with what it lacks
    assert str(caught.value) == f"{path}: defines no @clc.on_launch or @clc.on_exit hook"


def test_missing_hook_file(tmp_path):
    # WHEN a hook file does not exist, or is a directory
    # THEN the error names it
    with pytest.raises(HookLoadError, match="no_such.py: no such file"):
        load_hook_file(tmp_path / "no_such.py")
    with pytest.raises(HookLoadError, match="not a file"):
        load_hook_file(tmp_path)


# ---- hook references -----------------------------------------------------------------------------

def test_resolve_decorated_and_plain_functions(tmp_path):
    # GIVEN a hook file with decorated and plain functions
    path = write(tmp_path, "ref_hooks.py", GOOD)
    hook_file = load_hook_file(path)
    # WHEN a policy refers to a decorated function
    # THEN it gets that function's Hook, with its options
    assert resolve_hook_ref("ref_hooks.py:log_big", tmp_path) is hook_file.hooks[1]
    # WHEN it refers to a plain function
    plain = resolve_hook_ref("ref_hooks.py:plain", str(tmp_path))
    # THEN it is a Hook for every kernel, cached per kernel, the same one each time
    assert plain.name == "ref_hooks.py:plain" and plain.mode == abi.MODE_CACHED
    assert plain.matches(kernel()) and plain.call(Launch()) == clc.allow()
    assert resolve_hook_ref("ref_hooks.py:plain", tmp_path) is plain
    # AND an absolute FILE ignores base_dir
    assert resolve_hook_ref(f"{path}:plain", "/nonexistent") is plain


def test_resolve_relative_to_the_base_directory(tmp_path):
    # GIVEN a hook file in a subdirectory of the policy's directory
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "nested_hooks.py", "def check(launch):\n    return None\n")
    # THEN FILE is found relative to base_dir
    assert resolve_hook_ref("sub/nested_hooks.py:check", tmp_path).name == \
        "nested_hooks.py:check"


@pytest.mark.parametrize("ref,fragment", [
    ("bad_ref_hooks.py", "a hook reference is FILE:FUNCTION"),
    (":guard", "a hook reference is FILE:FUNCTION"),
    ("bad_ref_hooks.py:", "a hook reference is FILE:FUNCTION"),
    ("missing.py:guard", "missing.py: no such file"),
    ("bad_ref_hooks.py:gaurd", "has no function 'gaurd' (hook 'bad_ref_hooks.py:gaurd'); "
                               "did you mean 'guard'?"),
    ("bad_ref_hooks.py:LIMIT", "'LIMIT' is not a function, it is a int"),
    ("bad_ref_hooks.py:summary", "'summary' is an @clc.on_exit function, not a launch hook"),
])
def test_resolve_errors(tmp_path, ref, fragment):
    # GIVEN a hook file
    write(tmp_path, "bad_ref_hooks.py", """\
        import clc
        LIMIT = 3

        def guard(launch):
            return None

        @clc.on_exit
        def summary(stats):
            pass
        """)
    # WHEN a reference to it is wrong
    with pytest.raises(HookLoadError) as caught:
        resolve_hook_ref(ref, tmp_path)
    # THEN the message says how
    assert fragment in str(caught.value)
