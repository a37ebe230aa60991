"""The program representation: A-normal form.

A `Program` binds its inputs, runs a list of `Let` statements, and returns some of the variables (or
literals). Each `Let(outs, prim, args)` applies one primitive to variables or literals and binds fresh
variables; every variable is bound exactly once. The bodies of map/reduce/scan/loop are Programs themselves,
closed: whatever a body uses from an enclosing scope is passed to it explicitly as leading inputs (its
"consts"), so every Program can be interpreted, transformed and printed on its own.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Sequence, Union

import numpy as np

from .dtypes import ShapedArray, aval_of
from .pytree import LEAF, TreeDef

_var_ids = itertools.count()


class Var:
    """A program variable: identity plus an abstract value. Compared and hashed by identity."""

    __slots__ = ("aval", "id", "hint")

    def __init__(self, aval: ShapedArray, hint: str | None = None):
        self.aval = aval
        self.id = next(_var_ids)
        self.hint = hint

    def __repr__(self) -> str:
        return f"Var#{self.id}:{self.aval}"


@dataclass(frozen=True, eq=False)
class Lit:
    """A constant known at trace time (a Python scalar or a NumPy array closed over by the traced function).

    Its value is frozen: a read-only array of its own, copied from the caller's unless it already is one or
    a view of one. A program sees the value its constants had when it was traced, whatever the caller
    later writes into the array it closed over, and an output that is a constant (or a view of one) is
    read-only, so `fold.jit` hands the caller a copy: writing to a result never changes a later call's.
    """

    value: np.ndarray

    def __post_init__(self) -> None:
        value = np.asarray(self.value)
        if not _frozen(value):
            if value is self.value or value.base is not None:  # the caller's array, or a view of memory not ours
                value = np.array(value, copy=True)
            value.setflags(write=False)
        object.__setattr__(self, "value", value)

    @property
    def aval(self) -> ShapedArray:
        return aval_of(self.value)

    def __repr__(self) -> str:
        return f"Lit({self.value!r})"


def _frozen(value: np.ndarray) -> bool:
    """Whether no one can write `value`'s memory: it, and the array that owns the memory, are read-only."""
    root = value
    while isinstance(root.base, np.ndarray):
        root = root.base
    return not value.flags.writeable and root.base is None and not root.flags.writeable


Atom = Union[Var, Lit]


class Primitive:
    """Base class of primitives: frozen dataclasses whose fields are the static parameters.

    Subclasses set `name` (what the printer shows). Primitives whose parameters hold Programs (the
    combinators) list those fields in `body_fields` so that generic passes can walk into them.
    """

    name: str = "?"
    body_fields: tuple[str, ...] = ()

    def bodies(self) -> list["Program"]:
        return [getattr(self, f) for f in self.body_fields]

    def params(self) -> dict[str, Any]:
        """The static parameters that are not bodies, for printing."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.body_fields}


@dataclass(frozen=True, eq=False)
class Let:
    outs: tuple[Var, ...]
    prim: Primitive
    args: tuple[Atom, ...]


@dataclass(eq=False)
class Program:
    """A closed function in A-normal form.

    `in_tree`/`out_tree` describe how the flat inputs and outputs group into the user's pytrees; for the
    bodies of combinators they are the element structures.
    """

    inputs: tuple[Var, ...]
    stmts: tuple[Let, ...]
    outputs: tuple[Atom, ...]
    in_tree: TreeDef = LEAF
    out_tree: TreeDef = LEAF
    meta: dict = field(default_factory=dict)

    @property
    def in_avals(self) -> tuple[ShapedArray, ...]:
        return tuple(v.aval for v in self.inputs)

    @property
    def out_avals(self) -> tuple[ShapedArray, ...]:
        return tuple(a.aval for a in self.outputs)

    def __str__(self) -> str:
        from .printer import print_program

        return print_program(self)

    def __repr__(self) -> str:
        return f"<Program {len(self.inputs)} inputs, {len(self.stmts)} statements, {len(self.outputs)} outputs>"


def same_atom(a: Atom, b: Atom) -> bool:
    """One variable, or literals of one value and dtype (a closed-over array appears as a separate literal in
    each statement that reads it): what rewrites use to tell that two statements read the same operand."""
    if isinstance(a, Var) or isinstance(b, Var):
        return a is b
    x, y = np.asarray(a.value), np.asarray(b.value)
    return x is y or (x.dtype == y.dtype and np.array_equal(x, y))


def count_statements(program: Program) -> int:
    """Statements in the program, nested bodies included: the size of a (gradient) program."""
    total = 0
    for stmt in program.stmts:
        total += 1 + sum(count_statements(body) for body in stmt.prim.bodies())
    return total


def use_counts(program: Program) -> Counter:
    """How many times each variable is read at the top level: as a statement's argument or as an output.
    Rewrites use it to tell a value with one reader (which may be fused away) from a shared one."""
    uses = Counter(a for s in program.stmts for a in s.args if isinstance(a, Var))
    uses.update(a for a in program.outputs if isinstance(a, Var))
    return uses


def depends_on(stmts: list[Let], sources: set[Var]) -> set[Var]:
    """The variables of `stmts` (in order) computed from `sources`, and the sources: what a rewrite moving
    statements across those that produce `sources` must not move."""
    tainted = set(sources)
    for stmt in stmts:
        if any(isinstance(a, Var) and a in tainted for a in stmt.args):
            tainted.update(stmt.outs)
    return tainted


def with_bodies(stmt: Let, rewrite: Callable[[Program], Program]) -> Let:
    """The statement with each of its combinator's bodies replaced by `rewrite(body)` (the passes that clean
    every depth of a program); the statement itself where no body changed."""
    prim = stmt.prim
    if not prim.body_fields:
        return stmt
    bodies = {f: rewrite(getattr(prim, f)) for f in prim.body_fields}
    if all(bodies[f] is getattr(prim, f) for f in prim.body_fields):
        return stmt
    return Let(stmt.outs, replace(prim, **bodies), stmt.args)


def with_statements_replaced(program: Program, replaced: dict[int, Let], removed: set[int]) -> Program:
    """The program with the statement of each id in `replaced` swapped for its replacement and those whose ids
    are in `removed` dropped (the bookkeeping of a rewrite that fuses statements into one); the program
    itself when nothing is replaced."""
    return with_statements_spliced(program, {k: (stmt,) for k, stmt in replaced.items()}, removed)


def with_statements_spliced(program: Program, spliced: dict[int, Sequence[Let]], removed: set[int]) -> Program:
    """The program with the statement of each id in `spliced` swapped for the statements it maps to, in order,
    and those whose ids are in `removed` dropped (a rewrite that writes one statement as several); the
    program itself when nothing is spliced in."""
    if not spliced:
        return program
    stmts = tuple(new for s in program.stmts if id(s) not in removed for new in spliced.get(id(s), (s,)))
    return Program(program.inputs, stmts, program.outputs, program.in_tree, program.out_tree, dict(program.meta))


def reorder_inputs(program: Program, order: list[int]) -> Program:
    """The same Program taking its inputs in another order: input i of the result is input order[i]."""
    return Program(tuple(program.inputs[i] for i in order), program.stmts, program.outputs,
                   program.in_tree, program.out_tree, dict(program.meta))


def flat_program(program: Program) -> Program:
    """The same Program with flat input and output structures (a tuple in, a list out): for the programs that
    transformations make, whose arguments are lists of leaves."""
    flat_in = TreeDef("tuple", None, (LEAF,) * len(program.inputs))
    flat_out = TreeDef("list", None, (LEAF,) * len(program.outputs))
    return Program(program.inputs, program.stmts, program.outputs, flat_in, flat_out, dict(program.meta))
