"""A matrix product scaled by a constant, rewritten to scale its smaller operand: (A @ B) * c = (A * c) @ B.

A gemm_map_reduce block computes s = L R^T and then often s * c (attention's 1 / sqrt(F)). Where s has
two readers (the row maximum and the exponentials of softmax) the scaling cannot join either's kernel and
is a pass of its own over the bi x bj block, in the forward sweep and again where the backward one
recomputes it; scaling L costs bi x F. The numba backend applies `hoist_scales` after writing nested maps
as elementwise statements (where `s * c` appears). The result differs from the original by rounding only
(not at all where c is a power of two).
"""

from __future__ import annotations

from collections import Counter

from fold.ir import Let, Lit, Program, Var, use_counts, with_statements_spliced
from fold.primitives import Elementwise, MatMul


def _scaled_product(stmt: Let, producer: dict, uses: Counter) -> tuple[Let, Lit] | None:
    """(the matmul statement, the scalar) if `stmt` multiplies a product read nowhere else by a scalar literal."""
    if not (isinstance(stmt.prim, Elementwise) and stmt.prim.op == "mul"):
        return None
    for x, c in (stmt.args, reversed(stmt.args)):
        source = producer.get(x) if isinstance(x, Var) else None
        if (source is not None and isinstance(source.prim, MatMul) and uses[x] == 1 and isinstance(c, Lit)
                and c.aval.shape == () and c.aval.dtype == x.aval.dtype and stmt.outs[0].aval == x.aval):
            return source, c
    return None


def hoist_scales(program: Program) -> Program:
    """`program` with each matmul whose only reader scales it by a scalar literal computing the scaled product
    directly, the scale applied to the operand with fewer entries (top level only)."""
    uses = use_counts(program)
    producer = {v: s for s in program.stmts for v in s.outs}
    rewritten: dict[int, list[Let]] = {}
    removed: set[int] = set()
    for stmt in program.stmts:
        found = _scaled_product(stmt, producer, uses)
        if found is None:
            continue
        product, scale = found
        a, b = product.args
        side = 0 if a.aval.size <= b.aval.size else 1
        operand = product.args[side]
        scaled = Var(operand.aval, "scaled")
        args = (scaled, b) if side == 0 else (a, scaled)
        rewritten[id(product)] = [Let((scaled,), Elementwise("mul"), (operand, scale)), Let(stmt.outs, product.prim, args)]
        removed.add(id(stmt))
    return with_statements_spliced(program, rewritten, removed)
