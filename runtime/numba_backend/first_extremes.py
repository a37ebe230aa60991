"""The first position of a vector's minimum (or maximum), as one statement a product kernel can run.

The gradient of a min or max reduction (ad/reduce_rules.py) re-runs the reduction and finds the first
position that attains it:

    m = reduce(minimum, x);  first = reduce(minimum, where(x == broadcast(m), iota(K), K))

In k-means' gradient x is each point's distances to the centroids, made from a matrix-vector product.
There the product (10^6 x 64 values) was written to memory, and both folds read it back.
`mark_first_extremes(body)` writes these statements as one `FirstExtreme` statement. Its outputs are
(m, first), and its region runs the statements it replaced (the reference). Product-fold fusion
(product_fold_fusion.py) then runs it, together with the map of the product that makes x, in registers
(kernels.cpu.product_first_extreme).

The statements ask for `first` exactly as the kernel computes it. A row holding NaN has an m of NaN, and
nothing equals it, so `first` is the fill. The fill must be at least K, so that it is never an index.
The identity of the reduce must be +inf for minimum (or -inf for maximum), so that m is a value of x.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from fold.ir import Let, Lit, Primitive, Program, Var, use_counts, with_statements_replaced
from fold.primitives import BroadcastTo, Elementwise, Iota, Reduce
from fold.recognize import KNOWN_IDENTITIES, recognize_binary_op

from ..interpreter import eval_program, numpy_impls

_IDENTITY = {op: KNOWN_IDENTITIES[op] for op in ("minimum", "maximum")}


@dataclass(frozen=True, eq=False)
class FirstExtreme(Primitive):
    """(the `extreme` of x, the first position holding it or `fill`): `region` runs the statements it
    stands for. Arguments: x (K,) float64, then the positions iota(K)."""

    region: Program
    extreme: str
    fill: int
    name = "first_extreme"
    backend_internal = True
    body_fields = ("region",)
    num_consts = 0


def _reduce_op(stmt: Let | None) -> str | None:
    """The recognised operator of a one-leaf reduce without consts, or None."""
    if stmt is None or not isinstance(stmt.prim, Reduce) or stmt.prim.num_consts or stmt.prim.num_leaves != 1:
        return None
    return recognize_binary_op(stmt.prim.body)


def _literal(atom) -> int | float | None:
    """A scalar literal's value as a Python number (exact for int64), or None."""
    return atom.value.item() if isinstance(atom, Lit) and atom.value.shape == () else None


def _elementwise(stmt: Let | None, op: str) -> bool:
    return stmt is not None and isinstance(stmt.prim, Elementwise) and stmt.prim.op == op


def _match(first: Let, producer: dict[Var, Let], uses: Counter) -> tuple[list[Let], Var, Var, str, int] | None:
    """(the statements, x, the positions, the extreme, the fill) if `first` ends the pattern (see the
    module), each intermediate value read only by the next statement."""
    if _reduce_op(first) != "minimum" or _literal(first.args[0]) != np.iinfo(np.int64).max:
        return None
    candidates = first.args[1]
    chosen = producer.get(candidates) if isinstance(candidates, Var) else None
    if not _elementwise(chosen, "where") or uses[candidates] != 1:
        return None
    mask, positions, fill = chosen.args
    positions_made = producer.get(positions) if isinstance(positions, Var) else None
    if positions_made is None or not isinstance(positions_made.prim, Iota) or positions.aval.dtype != np.int64:
        return None
    size = positions_made.prim.n
    fill_value = _literal(fill)
    if fill_value is None or fill_value < size or fill.aval.dtype.kind != "i":
        return None
    compared = producer.get(mask) if isinstance(mask, Var) else None
    if not _elementwise(compared, "eq") or uses[mask] != 1:
        return None
    for x, spread in (compared.args, compared.args[::-1]):
        spreading = producer.get(spread) if isinstance(spread, Var) else None
        if spreading is None or not isinstance(spreading.prim, BroadcastTo) or uses[spread] != 1:
            continue
        extreme_var = spreading.args[0]
        extreme = producer.get(extreme_var) if isinstance(extreme_var, Var) else None
        op = _reduce_op(extreme)
        if (op in _IDENTITY and extreme.args[1] is x and _literal(extreme.args[0]) == _IDENTITY[op]
                and isinstance(x, Var) and x.aval.shape == (size,) and x.aval.dtype == np.float64):
            return [extreme, spreading, compared, chosen, first], x, positions, op, int(fill_value)
    return None


def mark_first_extremes(program: Program) -> Program:
    """The program with each first-extreme pattern (see the module) as one FirstExtreme statement, placed
    where its last statement was; the program itself if there is none."""
    uses = use_counts(program)
    producer = {v: s for s in program.stmts for v in s.outs}
    position = {id(s): i for i, s in enumerate(program.stmts)}
    replaced: dict[int, Let] = {}
    removed: set[int] = set()
    for stmt in program.stmts:
        found = _match(stmt, producer, uses)
        if found is None:
            continue
        made, x, positions, extreme, fill = found
        m = made[0].outs[0]
        between = program.stmts[position[id(made[0])] + 1:position[id(stmt)]]
        if any(a is m for s in between if s is not made[1] for a in s.args) or any(id(s) in removed for s in made):
            continue  # m is read before the position the statement takes
        region_inputs = (Var(x.aval), Var(positions.aval))
        rename = {x: region_inputs[0], positions: region_inputs[1]}
        stmts = tuple(Let(s.outs, s.prim, tuple(rename.get(a, a) if isinstance(a, Var) else a for a in s.args))
                      for s in made)
        region = Program(region_inputs, stmts, (m, stmt.outs[0]))
        replaced[id(stmt)] = Let((m, stmt.outs[0]), FirstExtreme(region, extreme, fill), (x, positions))
        removed.update(id(s) for s in made[:-1])
    return with_statements_replaced(program, replaced, removed)


def has_first_extremes(program: Program) -> bool:
    """Whether a FirstExtreme statement is left at the program's top level (one no product kernel took)."""
    return any(isinstance(s.prim, FirstExtreme) for s in program.stmts)


@numpy_impls.register(FirstExtreme)
def _reference(prim: FirstExtreme, args: list, depth: int) -> list:
    return eval_program(prim.region, args, depth)
