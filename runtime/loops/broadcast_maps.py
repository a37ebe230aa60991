"""NumPy-style broadcasting written as the maps it stands for, so that the loop nest can fuse it.

`sum((A[:, None, :] - B[None, :, :]) ** 2, axis=2)` is, element for element, a map over A's rows of a map
over B's rows of a sum: broadcasting is a map whose other operands are captured. Run as written, it
materialises an (n, m, d) difference and its square (2048 x 2048 x 8 float32: 128 MB each) to return an
(n, m) result; the loop nest, which fuses maps, never saw it, because it was not a map.

`broadcasts_as_maps(program)` rewrites such a group of statements as a map over the leading axis: a sum
over trailing axes (or, as the map's consumer, over the leading one) of a value made by broadcasting,
together with the elementwise statements, broadcasts, reshapes that keep the leading axis and partial sums
that make it. In the map's body, a row of such a value is the same statement one axis down, and a value
that is not indexed by the leading axis (the other operand of a broadcast, a scalar) is captured. The body
is rewritten the same way, so the group becomes as deep a nest of maps as it had broadcast axes, and a row
the body returns that it makes by broadcasting is a map too. The statements a group reads stay where they
are (and are computed once); a statement the group reads that others read too is recomputed in the group
(an elementwise producer: cheaper than the array it would write), and dead code elimination drops it where
nothing else reads it.

Only groups with a broadcast that makes a larger array than it reads are rewritten: without one, the
statements read arrays of their own size, which the elementwise kernels stream already. At the top level the
broadcast must also make more axes than the elementwise kernels take (`ELEMENTWISE_AXES`): they read a
broadcast operand of a matrix in place and fold a row sum into the same pass (a softmax over rows), where a
nest would compute the row's exponentials once for the sum and again for the division.
"""

from __future__ import annotations

from typing import Callable

from fold.dce import dce
from fold.ir import Let, Program, Var
from fold.pytree import tree_flatten
from fold.primitives import BroadcastTo, Convert, Elementwise, Map, Reshape, SumAxes


def _row_of_elementwise(stmt: Let, n: int) -> tuple[Let, list[bool]] | None:
    out = stmt.outs[0].aval
    if out.ndim == 0 or out.shape[0] != n:
        return None
    rows = [isinstance(a, Var) and a.aval.shape == out.shape for a in stmt.args]
    if not all(r or a.aval.ndim == 0 for a, r in zip(stmt.args, rows, strict=True)):
        return None  # an array literal (a constant tangent) is not split into rows here
    return stmt, rows


def _row_of_broadcast(stmt: Let, n: int) -> tuple[Let, list[bool]] | None:
    (x,) = stmt.args
    shape = tuple(stmt.prim.shape)
    if not shape or shape[0] != n or not isinstance(x, Var):
        return None
    by_row = x.aval.ndim == len(shape) and x.aval.shape[0] == n
    return Let(stmt.outs, BroadcastTo(shape[1:]), stmt.args), [by_row]


def _row_of_reshape(stmt: Let, n: int) -> tuple[Let, list[bool]] | None:
    (x,) = stmt.args
    shape = tuple(stmt.prim.shape)
    if not shape or shape[0] != n or not isinstance(x, Var) or x.aval.ndim == 0 or x.aval.shape[0] != n:
        return None
    return Let(stmt.outs, Reshape(shape[1:]), stmt.args), [True]


def _row_of_sum(stmt: Let, n: int) -> tuple[Let, list[bool]] | None:
    (x,) = stmt.args
    axes = tuple(stmt.prim.axes)
    if not isinstance(x, Var) or x.aval.ndim == 0 or x.aval.shape[0] != n or 0 in axes:
        return None
    return Let(stmt.outs, SumAxes(tuple(a - 1 for a in axes)), stmt.args), [True]


# statement kind -> (stmt, leading extent n) -> (the statement on rows (its arguments still the outer ones),
# which arguments it reads by row) or None where it does not keep the leading axis
_ROW_RULES: dict[type, Callable[[Let, int], tuple[Let, list[bool]] | None]] = {
    Elementwise: _row_of_elementwise,
    Convert: _row_of_elementwise,
    BroadcastTo: _row_of_broadcast,
    Reshape: _row_of_reshape,
    SumAxes: _row_of_sum,
}


def _row_rule(stmt: Let, n: int) -> tuple[Let, list[bool]] | None:
    rule = _ROW_RULES.get(type(stmt.prim))
    return None if rule is None or len(stmt.outs) != 1 else rule(stmt, n)


# The backends' elementwise kernels read a broadcast operand of up to this many axes in place (a row's maximum
# against its row, a vector against every row), and fuse a sum over the last axis into the run: a group whose
# broadcasts make no more axes stays theirs at the top level.
ELEMENTWISE_AXES = 2


def _widens(stmt: Let, axes: int) -> bool:
    """Whether `stmt` broadcasts to more elements than it reads, making more than `axes` axes."""
    out = stmt.outs[0].aval
    return isinstance(stmt.prim, BroadcastTo) and out.size > stmt.args[0].aval.size and out.ndim > axes


def _group(root: Var, n: int, produced_by: dict[Var, Let], axes: int) -> list[Let] | None:
    """The statements, in program order, that make `root` keeping its leading axis of extent n (every
    producer back to values made otherwise or read by no row); None if no broadcast among them widens to
    more than `axes` axes."""
    found: dict[int, Let] = {}
    todo = [root]
    while todo:
        v = todo.pop()
        stmt = produced_by.get(v)
        if stmt is None or id(stmt) in found:
            continue
        rule = _row_rule(stmt, n)
        if rule is None:
            continue
        found[id(stmt)] = stmt
        todo += [a for a, by_row in zip(stmt.args, rule[1], strict=True) if by_row]
    if not any(_widens(s, axes) for s in found.values()):
        return None
    return list(found.values())


def _as_map(members: list[Let], result: Var, n: int, out: Var) -> Let | None:
    """One map statement computing the rows of `result` from `members` (in program order) into `out`; None
    where no array is read by row (every row the same, made from captured values alone)."""
    made = {v for s in members for v in s.outs}
    consts: dict[Var, Var] = {}
    elements: dict[Var, Var] = {}
    inner: dict[Var, Var] = {}
    body_stmts = []
    for stmt in members:
        row, by_row = _row_rule(stmt, n)
        args = []
        for a, r in zip(stmt.args, by_row, strict=True):
            if not isinstance(a, Var):
                args.append(a)
            elif not r:  # read whole (a broadcast's operand without the leading axis, a scalar): captured
                args.append(consts.setdefault(a, Var(a.aval)))
            elif a in made:
                args.append(inner[a])
            else:
                args.append(elements.setdefault(a, Var(a.aval.update(shape=a.aval.shape[1:]))))
        if isinstance(row.prim, BroadcastTo) and not by_row[0] and stmt.args[0].aval.ndim == len(stmt.prim.shape):
            # a leading axis of 1, not of n: the row is the value without it
            squeezed = Var(stmt.args[0].aval.update(shape=stmt.args[0].aval.shape[1:]))
            body_stmts.append(Let((squeezed,), Reshape(squeezed.aval.shape), tuple(args)))
            args = [squeezed]
        made_here = stmt.outs[0]
        inner[made_here] = Var(made_here.aval.update(shape=made_here.aval.shape[1:]))
        body_stmts.append(Let((inner[made_here],), row.prim, tuple(args)))
    if not elements:
        return None
    inputs = tuple(consts.values()) + tuple(elements.values())
    _, in_tree = tree_flatten(tuple(range(len(inputs))))
    body = Program(inputs, tuple(body_stmts), (inner[result],), in_tree)
    body = broadcasts_as_maps(dce(body), rows_returned=True)
    return Let((out,), Map(body, len(consts)), tuple(consts) + tuple(elements))


def broadcasts_as_maps(program: Program, rows_returned: bool = False) -> Program:
    """`program` with each sum of a value made by broadcasting written as maps over its leading axes (the
    module's docstring). `rows_returned`: the program is a body this pass made, whose outputs made by
    broadcasting become maps too."""
    return maps_of_broadcasts(program, rows_returned)[0]


def maps_of_broadcasts(program: Program, rows_returned: bool = False) -> tuple[Program, set[Var]]:
    """`broadcasts_as_maps(program)`, and the results of the maps it wrote at the program's top level (the
    fusion pass keeps the rewrite only where each becomes a loop nest)."""
    produced_by = {v: s for s in program.stmts for v in s.outs}
    order = {id(s): k for k, s in enumerate(program.stmts)}

    def lifted(root: Var, last: Let | None = None, out: Var | None = None) -> Let | None:
        """A map making the rows of `root` (`last`: the statement making it, if not the program's), or None."""
        n = root.aval.shape[0] if root.aval.ndim else 0
        known = produced_by if last is None else {**produced_by, root: last}
        members = _group(root, n, known, 0 if rows_returned else ELEMENTWISE_AXES) if n > 1 else None
        if members is None:
            return None
        members.sort(key=lambda s: order.get(id(s), len(order)))
        return _as_map(members, root, n, out or Var(root.aval))

    stmts: list[Let] = []
    maps: set[Var] = set()
    for stmt in program.stmts:
        x = stmt.args[0] if isinstance(stmt.prim, SumAxes) else None
        if not isinstance(x, Var) or x.aval.ndim < 2:
            stmts.append(stmt)
            continue
        axes = tuple(stmt.prim.axes)
        if 0 not in axes:  # a partial sum: the map makes its rows
            made = lifted(stmt.outs[0], out=stmt.outs[0])
            stmts.append(made or stmt)
            maps.update(made.outs if made is not None else ())
            continue
        # a sum over the leading axis: the map's consumer, summing rows the map sums over the other axes
        rest = tuple(a for a in axes if a != 0)
        rows = Var(x.aval.update(shape=tuple(d for k, d in enumerate(x.aval.shape) if k not in rest)))
        made = lifted(rows, Let((rows,), SumAxes(rest), (x,))) if rest else lifted(x)
        if made is None:
            stmts.append(stmt)
            continue
        stmts += [made, Let(stmt.outs, SumAxes((0,)), made.outs)]
        maps.add(made.outs[0])
    outputs = list(program.outputs)
    if rows_returned:
        for k, o in enumerate(outputs):
            made = lifted(o) if isinstance(o, Var) and o.aval.ndim >= 2 else None
            if made is not None:
                stmts.append(made)
                outputs[k] = made.outs[0]
                maps.add(made.outs[0])
    if not maps:
        return program, maps
    return dce(Program(program.inputs, tuple(stmts), tuple(outputs), program.in_tree, program.out_tree,
                       dict(program.meta))), maps
