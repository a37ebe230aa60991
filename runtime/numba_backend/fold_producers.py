"""Each fold recomputes the cheap elementwise values it reads instead of sharing them with other readers.

A reduce can join the elementwise statements that make its input as one map-reduce kernel (the values are
then never stored) only if nothing else reads them. Gradient programs share such values: the prod monoid's
rule tests a == 0 once, and from that counts the zeros, multiplies the non-zero factors and divides the
product by each factor, so the whole test, the factors and the count are written to memory and read back,
three passes over 10^7 elements more than needed. `private_fold_producers` gives each fold its own copy of
the cheap elementwise statements its input is computed by, placed just before it, and drops the originals
that nobody reads any more; elementwise fusion then joins each fold with its copy.

Cheap means arithmetic, comparisons, selections and conversions: recomputing one costs less than storing
and reloading its value. Transcendental functions are not copied (their values are read from memory).
"""

from __future__ import annotations

from collections import Counter

from fold.dce import dce
from fold.ir import Let, Program, Var, use_counts
from fold.primitives import Convert, Elementwise
from fold.primitives.elementwise import SCALAR_OPS

from .elementwise_fusion import joinable_fold

CHEAP_OPS = frozenset(name for name, op in SCALAR_OPS.items() if op.kind in ("compare", "logical", "select")) | {
    "add", "sub", "mul", "div", "neg", "abs", "sign", "maximum", "minimum"}
MAX_COPIED = 16  # statements copied into one fold, at most


def _cheap(stmt: Let, shape: tuple) -> bool:
    prim = stmt.prim
    elementwise = isinstance(prim, Convert) or (isinstance(prim, Elementwise) and prim.op in CHEAP_OPS)
    return elementwise and len(stmt.outs) == 1 and stmt.outs[0].aval.shape == shape


def folded_input(stmt: Let) -> Var | None:
    """The vector a fold reads, if elementwise fusion could join the fold to the statements making it."""
    fold = joinable_fold(stmt)
    x = None if fold is None else fold.args[-1]
    return x if isinstance(x, Var) and x.aval.ndim == 1 else None


def _producers(x: Var, producer: dict[Var, Let], position: dict[int, int]) -> list[Let] | None:
    """The cheap elementwise statements x is computed by, back to values made otherwise, in program order;
    None if there are none or too many, or if they read an elementwise value of x's shape (the fold would
    read that from memory anyway: copying saves nothing)."""
    found: dict[int, Let] = {}
    pending = [x]
    while pending:
        stmt = producer.get(pending.pop())
        if stmt is None or id(stmt) in found:
            continue
        if not _cheap(stmt, x.aval.shape):
            if isinstance(stmt.prim, (Elementwise, Convert)) and stmt.outs[0].aval.shape == x.aval.shape:
                return None
            continue
        found[id(stmt)] = stmt
        if len(found) > MAX_COPIED:
            return None
        pending.extend(a for a in stmt.args if isinstance(a, Var))
    return sorted(found.values(), key=lambda s: position[id(s)]) or None


def _copy(stmts: list[Let]) -> dict[Var, Var]:
    """Fresh variables for the statements' results, keyed by the originals."""
    return {o: Var(o.aval, o.hint) for s in stmts for o in s.outs}


def private_fold_producers(program: Program) -> Program:
    """The program with every fold whose cheap elementwise producers are also read elsewhere given copies of
    them of its own, just before it (see the module docstring)."""
    uses = use_counts(program)
    producer = {o: s for s in program.stmts for o in s.outs}
    position = {id(s): i for i, s in enumerate(program.stmts)}
    stmts: list[Let] = []
    changed = False
    for stmt in program.stmts:
        x = folded_input(stmt)
        copied = None if x is None else _producers(x, producer, position)
        if copied is not None and _shared(copied, stmt, uses):
            fresh = _copy(copied)
            stmts.extend(Let(tuple(fresh[o] for o in s.outs), s.prim, tuple(fresh.get(a, a) if isinstance(a, Var) else a
                                                                                  for a in s.args)) for s in copied)
            stmt = Let(stmt.outs, stmt.prim, tuple(fresh.get(a, a) if isinstance(a, Var) else a for a in stmt.args))
            changed = True
        stmts.append(stmt)
    if not changed:
        return program
    return dce(Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree, dict(program.meta)))


def _shared(copied: list[Let], fold: Let, uses: Counter) -> bool:
    """Whether a value of `copied` is read by anything but `copied` and `fold` (else fusion needs no copy)."""
    inside = Counter(a for s in copied + [fold] for a in s.args if isinstance(a, Var))
    return any(uses[o] > inside[o] for s in copied for o in s.outs)
