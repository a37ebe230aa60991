"""The reference interpreter: walks a Program's statements with an environment, on batched NumPy arrays.

A map is not run row by row: its body is evaluated once, on arrays that carry the mapped axis as a leading
*batch* dimension. Inside a body nested `depth` maps deep, every value has `depth` leading batch dimensions,
each either full size or 1 (a value that does not vary along that map: a captured weight vector is never
copied per row). NumPy broadcasting then does the rest, and each primitive's implementation takes `depth`.
"""

from __future__ import annotations

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


class lowering:
    """`with lowering(table):` statements evaluated in the block try `table`'s rules before the numpy
    implementations. (A class, not a generator: a backend enters it on every call.)"""

    def __init__(self, table: RuleTable):
        self.table = table

    def __enter__(self) -> None:
        self.outer = getattr(_overrides, "stack", ())
        _overrides.stack = (*self.outer, self.table)

    def __exit__(self, *exc) -> None:
        _overrides.stack = self.outer


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
    """One statement as eval_program runs it, resolved once per (program, depth, backend tables): its rule
    (the first table's that has one, else None) and the numpy implementation (None where there is none: the
    lookup then raises, naming the primitive, when the statement runs), its arguments and results as slots
    of the environment list, the result dtypes, and the slots whose last use it is (freed after it)."""

    prim: object
    rule: object
    impl: object
    args: tuple[int, ...]
    outs: tuple[int, ...]
    dtypes: tuple
    dead: tuple[int, ...]


@dataclass(frozen=True)
class _Plan:
    """A program laid out for running: every variable and literal an index into one list (literals already
    reshaped for the depth, in `template`), so a call copies the template, runs the steps, reads outputs."""

    template: list
    inputs: tuple[int, ...]
    steps: tuple[_Step, ...]
    outputs: tuple[int, ...]


_plans: "weakref.WeakKeyDictionary[Program, dict[tuple, _Plan]]" = weakref.WeakKeyDictionary()


def _plan(program: Program, depth: int, tables: tuple) -> _Plan:
    per_program = _plans.get(program)
    if per_program is None:
        per_program = _plans[program] = {}
    found = per_program.get((depth, tables))
    if found is None:
        found = per_program[(depth, tables)] = _make_plan(program, depth, tables)
    return found


def _make_plan(program: Program, depth: int, tables: tuple) -> _Plan:
    slots: dict[Var, int] = {}
    template: list = []

    def slot(atom: Atom) -> int:
        if isinstance(atom, Lit):
            template.append(_literal(atom, depth))
            return len(template) - 1
        if atom not in slots:
            slots[atom] = len(template)
            template.append(None)
        return slots[atom]

    inputs = tuple(slot(v) for v in program.inputs)
    keep = {a for a in program.outputs if isinstance(a, Var)}
    last = last_use(program)
    steps = []
    for i, stmt in enumerate(program.stmts):
        dead = tuple(slots[a] for a in dict.fromkeys(stmt.args) if isinstance(a, Var) and last[a] == i and a not in keep)
        steps.append(_Step(stmt.prim, _first_rule(tables, stmt.prim), numpy_impls.get(stmt.prim),
                           tuple(slot(a) for a in stmt.args), tuple(slot(v) for v in stmt.outs),
                           tuple(v.aval.dtype for v in stmt.outs), dead))
    return _Plan(template, inputs, tuple(steps), tuple(slot(a) for a in program.outputs))


def _first_rule(tables: tuple, prim):
    for table in reversed(tables):
        rule = table.get(prim)
        if rule is not None:
            return rule
    return None


def _literal(atom: Lit, depth: int) -> np.ndarray:
    """A literal's value with `depth` leading batch dimensions of size 1 (it is the same for every row)."""
    value = atom.value
    return value.reshape((1,) * depth + value.shape) if depth else value


_quiet = threading.local()  # set while eval_program runs: the bodies it evaluates need no np.errstate of their own


def eval_program(program: Program, args: Sequence[np.ndarray], depth: int = 0) -> list[np.ndarray]:
    """Run `program` on `args` (each with `depth` leading batch dimensions) and return its outputs."""
    plan = _plan(program, depth, getattr(_overrides, "stack", ()))
    env = plan.template.copy()
    for i, value in zip(plan.inputs, args, strict=True):
        env[i] = value
    if getattr(_quiet, "on", False):
        _run_steps(plan.steps, env, depth)
    else:
        _quiet.on = True
        try:
            with np.errstate(all="ignore"):  # once per call, not per statement: it costs as much as a small one
                _run_steps(plan.steps, env, depth)
        finally:
            _quiet.on = False
    return [env[i] for i in plan.outputs]


def _run_steps(steps: tuple[_Step, ...], env: list, depth: int) -> None:
    for step in steps:
        values = [env[i] for i in step.args]
        for i in step.dead:  # released before the step: an operand only `values` holds may take its result
            env[i] = None
        _store(env, step.outs, _run_step(step, values, depth))  # no local name keeps a result alive


def _store(env: list, slots: tuple[int, ...], values: list) -> None:
    for i, value in zip(slots, values, strict=True):
        env[i] = value


def _run_step(step: _Step, values: list[np.ndarray], depth: int) -> list[np.ndarray]:
    try:
        outs = step.rule(step.prim, values, depth) if step.rule is not None else None
        if outs is None:
            outs = (step.impl or numpy_impls.lookup(step.prim))(step.prim, values, depth)
    except FoldError:
        raise
    except Exception as err:  # a NumPy failure deep inside: name the statement instead of leaking a traceback
        raise _runtime_error(step.prim, values, depth, err) from err
    return [o if o.dtype == dtype else o.astype(dtype) for o, dtype in zip(outs, step.dtypes, strict=True)]


def run_statement(prim, values: list[np.ndarray], depth: int, out_avals: list) -> list[np.ndarray]:
    """One primitive on batched arrays, with NumPy's own errors turned into a FoldRuntimeError."""
    with np.errstate(all="ignore"):
        return _run(prim, values, depth, out_avals)


def _run(prim, values: list[np.ndarray], depth: int, out_avals: Sequence) -> list[np.ndarray]:
    """run_statement for callers already inside np.errstate(all="ignore")."""
    tables = getattr(_overrides, "stack", ())
    step = _Step(prim, _first_rule(tables, prim), numpy_impls.get(prim), (), (), tuple(a.dtype for a in out_avals), ())
    return _run_step(step, values, depth)


def _runtime_error(prim, values: list[np.ndarray], depth: int, err: Exception) -> FoldRuntimeError:
    shapes = ", ".join(f"{v.dtype.name}{list(v.shape[depth:])}" for v in values)
    return FoldRuntimeError(f"{prim.name} failed on arguments ({shapes}): {type(err).__name__}: {err}")
