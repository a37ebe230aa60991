"""Elementwise statements moved down to their first reader, so that the runs elementwise fusion fuses are
not cut by statements that have nothing to do with them.

fuse_elementwise fuses consecutive statements. Array code is traced in the order it is written, and a value
is often computed well before it is used: a Gaussian kernel's |a|^2 + |b|^2 is written before the product
a.b it is combined with (`sum(A*A, 1)[:, None] + sum(B*B, 1)[None, :] - 2 * A @ B.T`), so the addition ran as
a pass of its own, writing an (n, m) matrix the next run read back. `sink_elementwise(program)` places each
elementwise statement over an array just before the first statement that reads its value (the statements
that read it in turn staying after it), keeping the program's order otherwise; the addition then opens the
run that subtracts the product, exponentiates and sums, and the matrix is never written.
"""

from __future__ import annotations

from fold.ir import Let, Program, Var

from .elementwise_fusion import ELEMENTWISE


def sink_elementwise(program: Program) -> Program:
    """`program` with each elementwise statement over an array (of one or more dimensions) moved down to
    just before its first reader (module docstring); the others in their order."""
    placed: list[Let] = []
    pending: list[Let] = []  # elementwise statements not placed yet, in program order
    made_by: dict[Var, Let] = {}
    for stmt in program.stmts:
        if _sinkable(stmt):
            pending.append(stmt)
            made_by.update((v, stmt) for v in stmt.outs)
            continue
        if pending:
            needed = _needed(stmt, made_by)
            taken = [p for p in pending if id(p) in needed]
            pending = [p for p in pending if id(p) not in needed]
            placed += taken
            for v in (v for p in taken for v in p.outs):
                del made_by[v]
        placed.append(stmt)
    placed += pending  # read by the program's outputs only
    if all(a is b for a, b in zip(placed, program.stmts)):
        return program
    return Program(program.inputs, tuple(placed), program.outputs, program.in_tree, program.out_tree,
                   dict(program.meta))


def _sinkable(stmt: Let) -> bool:
    return (isinstance(stmt.prim, ELEMENTWISE) and len(stmt.outs) == 1 and stmt.outs[0].aval.ndim >= 1
            and not stmt.prim.bodies())


def _needed(stmt: Let, made_by: dict[Var, Let]) -> set[int]:
    """The pending statements `stmt` reads, through one another."""
    needed: set[int] = set()
    todo = [a for a in stmt.args if isinstance(a, Var)]
    while todo:
        maker = made_by.get(todo.pop())
        if maker is not None and id(maker) not in needed:
            needed.add(id(maker))
            todo += [a for a in maker.args if isinstance(a, Var)]
    return needed
