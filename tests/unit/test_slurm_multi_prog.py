# SPDX-License-Identifier: Apache-2.0
"""The SPANK plugin's reading of an `srun --multi-prog` configuration
(shim/slurm/clc_multi_prog.c): for each task, the line slurmstepd's own parser gives it, as its
source reads (src/slurmd/slurmstepd/multi_prog.c), including texts srun itself would refuse, since
a job can send slurmstepd any text. tests/slurm runs the plugin on a real cluster."""

import ctypes
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "shim" / "slurm" / "clc_multi_prog.c"


@pytest.fixture(scope="module")
def line_for(tmp_path_factory):
    lib = tmp_path_factory.mktemp("multi_prog") / "libmulti_prog.so"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared",
                    "-fPIC", "-o", lib, SOURCE], check=True)
    fn = ctypes.CDLL(str(lib)).clc_multi_prog_line
    fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
    return lambda text, task: fn(text.encode("latin-1"), task)


CASES = [
    # (text, task, the line slurmstepd runs for that task: 0 for none)
    ("0 a\n1 b\n", 0, 1),
    ("0 a\n1 b\n", 1, 2),
    ("0 a\n1 b\n", 2, 0),
    ("# two ranks\n\n   0 a\n", 0, 3),
    ("\r\n0 a\r\n", 0, 2),                 # CRLF: the CR line is blank
    ("\f\v\t0 a", 0, 1),                   # any white space of the C locale
    ("\xa00 a", 0, 0),                     # a no-break space is none in the C locale
    (",0,,1, a", 1, 1),                    # empty pieces between commas are skipped
    ("0-3 a", 3, 1),
    ("0-3 a", 4, 0),
    ("-3 a", 0, 1),                        # atoi("-3") to atoi("3")
    ("- a", 0, 1),                         # atoi("-") to atoi(""): 0 to 0
    ("- a", 1, 0),
    ("5- a", 5, 0),                        # 5 to 0: no task
    ("1-2-3 a", 1, 0),                     # a piece Slurm ignores
    ("x,1 a", 1, 1),
    ("* a", 7, 1),
    ("*,1 a", 0, 0),                       # `*` counts only alone
    ("*,1 a", 1, 1),
    ("0 a\\\n1 b\n", 1, 0),                # a backslash at the end hides the next line
    ("# ranks \\\n0 a\n1 b\n", 0, 0),      # ... a comment's too
    ("# ranks \\\n0 a\n1 b\n", 1, 3),
    ("0\n1 b\n", 1, 0),                    # ranks with no program: Slurm reads no further
    ("0 \n1 b\n", 0, 1),
    ("0 \n1 b\n", 1, 2),
    ("0 'a b' %t %o\n", 0, 1),             # the arguments do not choose the line
    ("2147483647 a", 2147483647, 1),
    ("2147483647 a", 0, 0),
    ("4294967296 a", 0, 1),                # beyond an int: counted as found
    ("0-99999999999999999999 a", 1, 1),
    ("-99999999999 a", 0, 1),
    ("* a", 2**31, 0),                     # slurmstepd's task id is an int: none is negative
    ("", 0, 0),
    ("\n\n\n", 0, 0),
]


@pytest.mark.parametrize("text,task,line", CASES)
def test_the_line_slurmstepd_gives_a_task(line_for, text, task, line):
    assert line_for(text, task) == line


def test_a_large_configuration_is_read_to_its_line(line_for):
    text = "# a comment\n" * 1_000_000 + "1 b\n0 a\n"
    assert line_for(text, 0) == 1_000_002
    assert line_for(text, 2) == 0
