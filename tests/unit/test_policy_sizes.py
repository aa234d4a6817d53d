# SPDX-License-Identifier: Apache-2.0
"""The policy package reads as a map: each of its modules has one purpose and fits in 700
lines, and none of its functions is longer than 80 lines."""

import ast
import pathlib

import clc.policy

PACKAGE = pathlib.Path(clc.policy.__file__).parent
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80


def test_no_module_of_the_policy_package_is_over_700_lines():
    # GIVEN the package's modules WHEN their lines are counted THEN none is over the limit
    sizes = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py")}
    assert len(sizes) > 1
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_function_of_the_policy_package_is_over_80_lines():
    # GIVEN every function and method of the package
    lengths = {}
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    # WHEN their lines are counted THEN none is over the limit
    assert lengths
    assert {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES} == {}
