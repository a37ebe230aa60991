"""Two elementwise runs where the second reads the first's values become one run (one pass over memory).

Elementwise fusion (elementwise_fusion.py) closes a run at the first statement of another shape, so a
gradient often holds two runs of one shape with other work between them: attention's backward computes the
probabilities p = exp(s - lse) (a run, whose p the matrix product dV = p^T G also reads), then
dp - delta from a product and a row sum of another shape, then ds = p * (dp - delta) (a second run). As two
runs, p is written and read back; as one, the second run's values are computed from p while it is in
registers, p still written for its other readers. `merge_runs(program)` moves the statements the second run
needs that do not depend on the first (dp - delta there) before the first, and makes the two one
FusedElementwise; for whole arrays (the top level, gemm block programs), where each run is a pass over a
matrix. Runs are merged only where both or neither have F64x4 forms (kernels.cpu.simd), so that a run's
wide kernel is never lost to its partner's scalar one.
"""

from __future__ import annotations

from collections import Counter

from fold.ir import Let, Program, Var, depends_on, use_counts

from .codegen import has_f64x4_form
from .elementwise_fusion import FusedElementwise


def _plain_run(stmt: Let) -> bool:
    """A run that stores its values (no reduce; a closing row sum is allowed in the second of a pair)."""
    return isinstance(stmt.prim, FusedElementwise) and stmt.prim.reduce is None


def _merged(first: Let, second: Let, read_later: set[Var]) -> Let:
    """One FusedElementwise running both regions' statements, returning the values of `read_later`."""
    outer = {v: a for s in (first, second) for v, a in zip(s.prim.region.inputs, s.args, strict=True)}
    members = first.prim.region.stmts + second.prim.region.stmts
    produced = {o for m in members for o in m.outs}
    inputs = tuple(dict.fromkeys(a for m in members for a in m.args if isinstance(a, Var) and a not in produced))
    outputs = tuple(o for m in members for o in m.outs if o in read_later)
    return Let(outputs, FusedElementwise(Program(inputs, members, outputs)), tuple(outer[v] for v in inputs))


def _moved_before(between: list[Let], needed: set[Var], first_outs: set[Var]) -> set[int] | None:
    """The ids of the statements of `between` that compute what the second run needs (`needed`), or None
    if one of them depends on the first run."""
    tainted = depends_on(between, first_outs)
    moved: set[int] = set()
    for stmt in reversed(between):
        if any(v in needed for v in stmt.outs):
            if any(v in tainted for v in stmt.outs):
                return None
            moved.add(id(stmt))
            needed.update(a for a in stmt.args if isinstance(a, Var))
    return moved


def _try_merge(stmts: list[Let], i: int, uses: Counter) -> list[Let] | None:
    first = stmts[i]
    first_outs = set(first.outs)
    for j in range(i + 1, len(stmts)):
        second = stmts[j]
        if not (_plain_run(second) and second.prim.run_shape == first.prim.run_shape
                and any(isinstance(a, Var) and a in first_outs for a in second.args)):
            continue
        if first.prim.row_sum is not None or has_f64x4_form(first.prim.body) != has_f64x4_form(second.prim.body):
            continue
        between = stmts[i + 1: j]
        needed = {a for a in second.args if isinstance(a, Var) and a not in first_outs}
        moved = _moved_before(between, needed, first_outs)
        if moved is None:
            continue
        read_by_second = Counter(a for a in second.args if isinstance(a, Var))
        read_later = {v for v in first.outs if uses[v] > read_by_second[v]} | set(second.outs)
        return (stmts[:i] + [s for s in between if id(s) in moved] + [_merged(first, second, read_later)]
                + [s for s in between if id(s) not in moved] + stmts[j + 1:])
    return None


def merge_runs(program: Program) -> Program:
    """The program with each run (a FusedElementwise storing its values) merged with the first later run of
    its shape that reads them, where what that run needs besides can be computed before the first."""
    stmts = list(program.stmts)
    merged_any = False
    i = 0
    while i < len(stmts):
        if _plain_run(stmts[i]):
            found = _try_merge(stmts, i, use_counts(Program(program.inputs, tuple(stmts), program.outputs)))
            if found is not None:
                stmts, merged_any = found, True
                continue  # the merged run may take a third
        i += 1
    if not merged_any:
        return program
    return Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree, dict(program.meta))
