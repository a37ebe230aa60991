"""`fold.memory`: the peak bytes a program holds live on the numpy backend, by liveness over its statements.

The estimate follows how the batched interpreter runs: inside a map n rows deep every intermediate is
n times its element size; a tree reduction or scan holds level buffers of about the input's size; a
variable is freed after its last use. The inputs count as live throughout (the caller holds them).
"""

from __future__ import annotations

from typing import Any, Callable

from fold.api import signature_of, trace_signature
from fold.ir import Program, Var
from fold.primitives import GemmBlockSum, GemmMapReduce, Loop, Map, Reduce, ReduceByIndex, Scan
from fold.rules import RuleTable

from .interpreter import last_use

body_extra_rules = RuleTable("memory")


def _bytes(var: Any, mult: int) -> int:
    return var.aval.nbytes * mult


def program_peak(program: Program, mult: int = 1, count_inputs: bool = True) -> int:
    """Peak live bytes of `program` when every value carries `mult` batch rows."""
    last = last_use(program)
    outputs = {a for a in program.outputs if isinstance(a, Var)}
    live = sum(_bytes(v, mult) for v in program.inputs) if count_inputs else 0
    peak = live
    for i, stmt in enumerate(program.stmts):
        out_bytes = sum(_bytes(v, mult) for v in stmt.outs)
        extra = body_extra_rules.lookup(stmt.prim)(stmt, mult) if type(stmt.prim) in body_extra_rules else 0
        peak = max(peak, live + out_bytes + extra)
        live += out_bytes
        live -= sum(_bytes(a, mult) for a in set(stmt.args) if isinstance(a, Var) and last.get(a) == i and a not in outputs and a not in program.inputs)
    return peak


@body_extra_rules.register(Map)
def _map_extra(stmt, mult: int) -> int:
    n = stmt.outs[0].aval.shape[0] if stmt.outs else 1
    return program_peak(stmt.prim.body, mult * n, count_inputs=False)


@body_extra_rules.register(Reduce, Scan)
def _fold_extra(stmt, mult: int) -> int:
    xs = stmt.args[stmt.prim.num_consts + stmt.prim.num_leaves:]
    n = xs[0].aval.shape[0]
    level = sum(_bytes(x, mult) for x in xs)  # the first level's output is half of it, the rest sums to about as much
    scan_factor = 2 if isinstance(stmt.prim, Scan) else 1
    return scan_factor * level + program_peak(stmt.prim.body, mult * max(n // 2, 1), count_inputs=False)


@body_extra_rules.register(ReduceByIndex)
def _rbi_extra(stmt, mult: int) -> int:
    values = stmt.args[stmt.prim.num_consts + stmt.prim.num_leaves:]
    return 2 * sum(_bytes(v, mult) for v in values)


@body_extra_rules.register(Loop)
def _loop_extra(stmt, mult: int) -> int:
    return program_peak(stmt.prim.body, mult, count_inputs=False)


def memory(f: Callable[..., Any] | Program, *args: Any) -> int:
    """Estimated peak bytes live while `f(*args)` runs on the numpy backend (inputs included).

    `f` may be a function (traced on `args`) or a Program (then `args` are ignored).
    """
    if isinstance(f, Program):
        return program_peak(f)
    _, signature = signature_of(args, "fold.memory")
    return program_peak(trace_signature(f, signature))


@body_extra_rules.register(GemmMapReduce)
def _gemm_extra(stmt, mult: int) -> int:
    """One block's intermediates at a time, plus the running totals of one row block."""
    block_peak = max(program_peak(program, mult, count_inputs=False) for _, program in stmt.prim.blocks) if stmt.prim.blocks else 0
    return block_peak


@body_extra_rules.register(GemmBlockSum)
def _gemm_block_sum_extra(stmt, mult: int) -> int:
    """One block program's intermediates at a time (the accumulated outputs are counted as outputs)."""
    return max((program_peak(p, mult, count_inputs=False) for _, p in stmt.prim.blocks), default=0)
