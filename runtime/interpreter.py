"""The reference interpreter: walks a Program's statements with an environment, on batched NumPy arrays.

A map is not run row by row: its body is evaluated once, on arrays that carry the mapped axis as a leading
*batch* dimension. Inside a body nested `depth` maps deep, every value has `depth` leading batch dimensions,
each either full size or 1 (a value that does not vary along that map: a captured weight vector is never
copied per row). NumPy broadcasting then does the rest, and each primitive's implementation takes `depth`.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fold.errors import FoldError, FoldRuntimeError
from fold.ir import Atom, Lit, Program, Var
from fold.rules import RuleTable

numpy_impls = RuleTable("numpy backend")

# A backend built on this interpreter registers rules that run first, for the statements it lowers
# differently; a rule that returns None declines, and the numpy implementation runs instead.
_overrides = threading.local()


@contextlib.contextmanager
def lowering(table: RuleTable):
    """Statements evaluated in this block try `table`'s rules before the numpy implementations."""
    stack = getattr(_overrides, "stack", [])
    _overrides.stack = stack + [table]
    try:
        yield
    finally:
        _overrides.stack = stack


def _override(prim):
    for table in reversed(getattr(_overrides, "stack", ())):
        rule = table.get(prim)
        if rule is not None:
            return rule
    return None

def last_use(program: Program) -> dict[Var, int]:
    """The index of the last statement that reads each variable."""
    last: dict[Var, int] = {}
    for i, stmt in enumerate(program.stmts):
        for a in stmt.args:
            if isinstance(a, Var):
                last[a] = i
    return last


@dataclass(frozen=True)
class _Step:
    """One statement as eval_program runs it, worked out once per program: the arguments (all variables, or
    not), the result avals, and the variables whose last use it is (their arrays are freed after it)."""

    prim: object
    args: tuple
    all_vars: bool
    outs: tuple
    out_avals: tuple
    dead: tuple


_plans: "weakref.WeakKeyDictionary[Program, tuple[_Step, ...]]" = weakref.WeakKeyDictionary()


def _plan(program: Program) -> tuple[_Step, ...]:
    found = _plans.get(program)
    if found is None:
        last = last_use(program)
        keep = {a for a in program.outputs if isinstance(a, Var)}
        dead: list[list[Var]] = [[] for _ in program.stmts]
        for var, i in last.items():
            if var not in keep:
                dead[i].append(var)
        found = _plans[program] = tuple(
            _Step(stmt.prim, tuple(stmt.args), all(isinstance(a, Var) for a in stmt.args), tuple(stmt.outs),
                  tuple(v.aval for v in stmt.outs), tuple(d))
            for stmt, d in zip(program.stmts, dead, strict=True))
    return found


def read_atom(env: dict, atom: Atom, depth: int) -> np.ndarray:
    if isinstance(atom, Lit):
        value = atom.value
        return value.reshape((1,) * depth + value.shape) if depth else value
    return env[atom]


def eval_program(program: Program, args: Sequence[np.ndarray], depth: int = 0) -> list[np.ndarray]:
    """Run `program` on `args` (each with `depth` leading batch dimensions) and return its outputs."""
    env: dict = dict(zip(program.inputs, args, strict=True))
    with np.errstate(all="ignore"):  # once per program, not per statement: it costs as much as a small one
        for step in _plan(program):
            values = [env[a] for a in step.args] if step.all_vars else [read_atom(env, a, depth) for a in step.args]
            outs = _run(step.prim, values, depth, step.out_avals)
            for var, value in zip(step.outs, outs, strict=True):
                env[var] = value
            for var in step.dead:
                env.pop(var, None)
    return [read_atom(env, a, depth) for a in program.outputs]


def run_statement(prim, values: list[np.ndarray], depth: int, out_avals: list) -> list[np.ndarray]:
    """One primitive on batched arrays, with NumPy's own errors turned into a FoldRuntimeError."""
    with np.errstate(all="ignore"):
        return _run(prim, values, depth, out_avals)


def _run(prim, values: list[np.ndarray], depth: int, out_avals: Sequence) -> list[np.ndarray]:
    """run_statement for callers already inside np.errstate(all="ignore")."""
    override = _override(prim)
    try:
        outs = override(prim, values, depth) if override is not None else None
        if outs is None:
            outs = numpy_impls.lookup(prim)(prim, values, depth)
    except FoldError:
        raise
    except Exception as err:  # a NumPy failure deep inside: name the statement instead of leaking a traceback
        shapes = ", ".join(f"{v.dtype.name}{list(v.shape[depth:])}" for v in values)
        raise FoldRuntimeError(f"{prim.name} failed on arguments ({shapes}): {type(err).__name__}: {err}") from err
    return [o if o.dtype == aval.dtype else o.astype(aval.dtype) for o, aval in zip(outs, out_avals, strict=True)]
