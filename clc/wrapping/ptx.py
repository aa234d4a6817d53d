# SPDX-License-Identifier: Apache-2.0
"""A small structural PTX reader (clc.wrapping.ptx_reader), and whether a kernel's body may run
in a persistent loop (clc.wrapping.loop_safety): both, under the one name the rest of clc and
its users import.
"""

from clc.wrapping.loop_safety import (INDIRECT, Call, SpecialRead, Verdict, barriers, callees,
                                      calls, cluster_directives, cluster_uses, ctaid_reads,
                                      envreg_reads, exits, is_block_barrier, loop_verdict,
                                      nctaid_reads, remap_ok, remap_verdict, special_reads)
from clc.wrapping.ptx_reader import (Block, Directive, Function, Instruction, Label, Module,
                                     Operand, Param, PtxError, Token, Variable, parse, tokenize)

__all__ = ["PtxError", "Token", "tokenize", "parse", "Module", "Function", "Param", "Block",
           "Label", "Instruction", "Operand", "Directive", "Variable", "SpecialRead", "Call",
           "Verdict", "special_reads", "ctaid_reads", "nctaid_reads", "envreg_reads",
           "cluster_uses", "cluster_directives", "exits", "barriers", "calls", "callees",
           "is_block_barrier", "loop_verdict", "remap_ok", "remap_verdict", "INDIRECT"]
