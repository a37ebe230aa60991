"""Check mode (FOLD_CHECK=1): a fold's identity checked on a sample of the data it folds, at first call.

A fold may combine its identity into the elements any number of times (per parallel chunk, bin or block), so
an identity that is not one on the data gives answers that depend on the backend: `identity=0.0` for
`where(p > q, p, q)` is an identity for positive data only, and on negative data the numba backend said 0.0
where the numpy one said -1.0. Tracing checks an identity on a few fixed values (fold/combinators.py's
`_check_identity`); the data's own range is only known when the program runs. In check mode the first call
of a compiled program for each input signature also runs it on the reference interpreter, and every reduce,
scan and reduce_by_index of single-leaf elements with a plain operator (not a fold.Monoid, not one of the operators whose identity
fold knows, capturing nothing) checks op(e, x) and op(x, e) == x for up to SAMPLE elements x of its actual
input: evenly spaced ones and those holding the smallest and largest value. A failure raises
fold.MonoidLawError naming the fold, the operator, the identity and the offending element.

Off by default: it runs the program once more, on NumPy. The test suite turns it on (the Makefile and
tests/conftest.py set FOLD_CHECK=1). Associativity is not checked here (it needs triples, and a sample of
them proves little): `fold.check_operator(op, identity, sample)` tests both laws on a user's data.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from fold.combinators import _same_up_to_rounding, _shown
from fold.errors import MonoidLawError
from fold.ir import Program
from fold.primitives import Reduce, ReduceByIndex, Scan
from fold.recognize import recognize_binary_op
from fold.rules import RuleTable

from .interpreter import eval_program, lowering

SAMPLE = 32
checks = RuleTable("check mode")


def check_mode() -> bool:
    """Whether FOLD_CHECK=1 (read at each first call, so that a test or a user can set it at any time)."""
    return os.environ.get("FOLD_CHECK", "0") == "1"


def has_user_folds(program: Program) -> bool:
    """Whether `program` (its nested bodies included) holds a fold whose identity check mode would check."""
    for stmt in program.stmts:
        if type(stmt.prim) in _LAYOUT and _checkable(stmt.prim):
            return True
        if any(has_user_folds(body) for body in _bodies(stmt.prim)):
            return True
    return False


def check_identities(program: Program, inputs: Sequence[np.ndarray]) -> None:
    """Run `program` on the reference interpreter with every user fold's identity checked on its input."""
    with lowering(checks):
        eval_program(program, list(inputs))


def _bodies(prim) -> list[Program]:
    return [getattr(prim, name) for name in getattr(prim, "body_fields", ())]


def _checkable(prim) -> bool:
    """A fold of single-leaf elements with a plain operator. Records are not judged: their leaves need not
    compare one by one (a weight beside a -inf log-weight may be any value), and the folds that jvp and vjp
    make are records of values and tangents."""
    return (prim.monoid is None and prim.num_consts == 0 and prim.num_leaves == 1
            and recognize_binary_op(prim.body, 0) is None)


# where a fold's identity and elements sit among its arguments: (offset of the elements after the identity)
_LAYOUT = {Reduce: 0, Scan: 0, ReduceByIndex: 1}


@checks.register(Reduce)
@checks.register(Scan)
@checks.register(ReduceByIndex)
def _check_fold(prim, args: list, depth: int) -> None:
    """Checks the identity, then declines: the numpy implementation runs the fold."""
    if _checkable(prim):
        k = prim.num_leaves
        ident = [np.asarray(e) for e in args[:k]]
        elements = args[k + _LAYOUT[type(prim)]:]
        _check_on_sample(prim, [e.reshape(e.shape[depth:]) for e in ident], elements, depth)
    return None


def _check_on_sample(prim, ident: list[np.ndarray], leaves: list[np.ndarray], depth: int) -> None:
    flat = [np.asarray(x).reshape((-1,) + e.shape) for x, e in zip(leaves, ident, strict=True)]
    count = flat[0].shape[0] if flat else 0
    if count == 0:
        return
    sample = [x[_sample_rows(flat[0], count)] for x in flat]
    e = [np.broadcast_to(v, (sample[0].shape[0],) + v.shape) for v in ident]
    for name, args in (("op(identity, x)", e + sample), ("op(x, identity)", sample + e)):
        try:
            with np.errstate(all="ignore"):
                got = eval_program(prim.body, args, 1)
        except Exception:  # noqa: BLE001 - an operator that fails here fails in the fold itself, named there
            return
        for g, x, v in zip(got, sample, ident, strict=True):
            ok = _same_up_to_rounding(np.asarray(g), x).reshape(x.shape[0], -1).all(axis=1)
            if not ok.all():
                i = int(np.argmin(ok))
                operator = "; ".join(line.strip() for line in str(prim.body).splitlines())
                raise MonoidLawError(
                    f"fold.{prim.name}: identity {_shown(v)} is not an identity of its operator ({operator}) on "
                    f"this data: {name} gives {_shown(np.asarray(g[i]))} for x = {_shown(x[i])}. The identity "
                    f"is the result for no elements and may be combined with the elements any number of times, "
                    f"so the backends would disagree; give the identity of the operator on the whole range of "
                    f"the data (FOLD_CHECK=1 checks it on a sample of each fold's input)")


def _sample_rows(first: np.ndarray, count: int) -> np.ndarray:
    """Evenly spaced rows, and those holding the smallest and largest first scalar (the data's range)."""
    rows = np.linspace(0, count - 1, min(count, SAMPLE)).astype(np.intp)
    column = first.reshape(count, -1)[:, 0]
    if column.size and column.dtype.kind in "iuf":
        column = column.astype(np.float64)
        if not np.isnan(column).all():
            rows = np.concatenate([rows, [np.nanargmin(column), np.nanargmax(column)]])
    return np.unique(rows)
