"""Fold's statements written as a loop nest's scalar statements (nest.py), at any depth of maps.

Every value is one of three kinds while a body is written:

- `Scalar`: a 0-d value, computed once where its statement stands (a local name or a literal).
- `Pull`: an array that is not stored: a function from an index (one expression per axis) to its element,
  which writes the statements that compute that element where the element is read. A map is a Pull whose
  element runs the map's body on the row; an elementwise statement is a Pull of its arguments' elements; a
  broadcast, reshape, transpose or static index only changes the index. Reading a map's rows inside a fold
  therefore computes each row inside the fold's loop, and the map's array never exists.
- `Stored`: an array in memory: a kernel argument, or a `Buffer` for a value that is read more than once
  (or read from inside a loop over something else) and costs a loop or a transcendental function to
  compute, which would otherwise be recomputed at every read.

A scan of a row is a sequential loop storing each prefix. A gather is a read at its index where the indices
are known to be in range (facts.py's bounds). Statements with no rule here (gathers at indices not known to be
in range, histograms, folds or scans of elements that are not scalars) raise
`NotNestable`, and the statements stay as they were.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

import numpy as np

from fold.dce import with_producers
from fold.dtypes import ShapedArray
from fold.ir import Lit, Program, Var
from fold.recognize import commutative_fold, recognize_binary_op
from fold.primitives import (LOOPING, TRANSCENDENTAL, BroadcastTo, Concatenate, Convert, Elementwise, Gather,
                             IndexTranspose, Iota,
                             Loop as StepLoop, LoopSaving, Map, MatMul, Reduce, ReduceByIndex, Reshape, Scan,
                             StaticIndex, StopGradient, SumAxes, Transpose)
from fold.rules import RuleTable

from .scalar_language import COMPARISONS as _UNWRAPPED, TEMPLATES, TRANSCENDENTAL_CALLS
from .extreme_pairs import Extreme, extreme_of, first_index_narrowed, first_index_with_extreme
from .facts import broadcast_facts, elementwise_facts, is_zero, reshape_facts, transpose_facts, with_facts
from .nest import Assign, Buffer, If, LaneFold, Loop, Node, Store
from .scattered_states import scattered_states
from .text import defined, names, pure as is_pure, statement_lines
from ..wide_operators import carried_operator, carry_for



# the most pulled statements an element is written through before the array is stored
MAX_CHAIN = 48


class NotNestable(Exception):
    """A statement the loop nest has no rule for; the message says which and why."""


@dataclass(frozen=True)
class Scalar:
    expr: str
    dtype: np.dtype
    shape: tuple = ()
    zero_unless: str | None = None  # the value is 0 unless this condition (computed before) holds
    bounds: tuple[int | None, int | None] | None = None  # an integer known to lie in [low, high] (None: not known)
    source: str | None = None  # the kernel input this is an element of, as read (Writer.require)


@dataclass(frozen=True)
class Pull:
    """An array computed where its elements are read, and what is known of it without computing it (facts.py)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    element: Callable[["Writer", tuple[str, ...]], str]
    heavy: bool  # computing an element runs a loop
    zero_unless: str | None = None  # every element is 0 unless this condition holds
    onehot: tuple[int, str] | None = None  # element idx is 0 unless idx[axis] == this scalar
    index_axis: int | None = None  # element idx equals idx[axis] (an iota, broadcast or reshaped)
    splat: str | None = None  # every element equals this scalar
    equals: tuple[int, str] | None = None  # element idx is (idx[axis] == this scalar)
    bounds: tuple[int | None, int | None] | None = None  # every element is an integer in [low, high] (None: not known)
    first_of: tuple | None = None  # (axis, cond, last): element idx is idx[axis] where cond holds, else last
    equal_to: tuple | None = None  # (x, s): element idx is (x[idx] == s), x an array, s a scalar


@dataclass(frozen=True)
class Stored:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    is_input: bool = False  # a kernel input (its elements can be checked before the kernel runs: Writer.require)


Value = Scalar | Pull | Stored


def literal(value, dtype: np.dtype) -> str:
    """A 0-d constant in the scalar language, typed (a bare 0.0 would make float32 arithmetic float64)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "True" if bool(value) else "False"
    if dtype.kind == "f":
        v = float(value)
        text = "np.nan" if math.isnan(v) else ("np.inf" if v == math.inf else ("-np.inf" if v == -math.inf else repr(v)))
        return f"np.{dtype.name}({text})"
    return f"np.{dtype.name}({int(value)})"


class Writer:
    """Writes statements into the innermost open block; names every temporary uniquely."""

    def __init__(self, constant: Callable[[np.ndarray], str]):
        self.blocks: list[list[Node]] = [[]]
        self._count = 0
        self.constant = constant  # an array literal -> the name of the kernel argument holding it
        # (id of a Pull, index) -> (the name holding that element, the block it was assigned in, the Pull):
        # an element read again where that block is still open is not written again. Without this, a chain of
        # statements that each read the one before twice writes 2^length expressions.
        self._elements: dict[tuple, tuple[str, list, Pull]] = {}
        # expression text -> (the name holding it, the block it was assigned in): the same pure expression
        # written again where that block is still open (a gradient recomputing what its primal computed, a
        # jvp's value beside its tangent) is read from that name, not computed twice
        self._texts: dict[str, tuple[str, list]] = {}
        # id of a Pull -> (the Pull, the block its buffer was made in, the buffer): a rule that stored its
        # argument (a map reading a costly array again) leaves it stored for the statements after it too
        self._stored: dict[int, tuple[Pull, list, Stored]] = {}
        # kernel input -> [low, high] its elements must lie in for the kernel to run (Kernel.checked)
        self.required: dict[str, tuple[int, int]] = {}
        # the accumulator of a row's min or max fold -> that fold (extreme_pairs.py: the first index holding
        # the extreme joins it)
        self.extremes: dict[str, Extreme] = {}

    def require(self, source: str, low: int, high: int) -> None:
        """The kernel runs only where every element of input `source` lies in [low, high] (a backend checks,
        before it runs the kernel): a gather at an index read from an input, a label per row, reads unchecked."""
        known = self.required.get(source, (low, high))
        self.required[source] = (max(known[0], low), min(known[1], high))

    def _open(self, block: list) -> bool:
        """Whether `block` is still being written (a name assigned in it is in scope here)."""
        return any(b is block for b in self.blocks)

    def fresh(self, prefix: str = "t") -> str:
        self._count += 1
        return f"{prefix}{self._count - 1}"

    def emit(self, node: Node) -> None:
        self.blocks[-1].append(node)

    def assign(self, expr: str, prefix: str = "t") -> str:
        pure = prefix in ("t", "e") and is_pure(expr)
        if pure:
            found = self._texts.get(expr)
            if found is not None and self._open(found[1]):
                return found[0]
        name = self.fresh(prefix)
        self.emit(Assign(name, expr))
        if pure:
            self._texts[expr] = (name, self.blocks[-1])
        return name

    def loop(self, extent: int, fill: Callable[[str], None], folds: tuple[LaneFold, ...] = ()) -> Loop:
        """A loop of `extent` iterations whose body `fill(index)` writes (updating the accumulators of `folds`),
        emitted here and returned."""
        index = self.fresh("i")
        self.blocks.append([])
        fill(index)
        body = self.blocks.pop()
        loop = Loop(index, int(extent), tuple(body), folds)
        self.emit(loop)
        return loop

    def written_apart(self, fill: Callable[[], list[str]]) -> tuple[tuple[Node, ...], list[str]]:
        """The statements `fill()` writes, kept out of the open block, and the names it returns."""
        self.blocks.append([])
        try:
            names = fill()
        finally:
            nodes = self.blocks.pop()
        return tuple(nodes), names

    def probed(self, fill: Callable[[], list[str]]) -> tuple[tuple[Node, ...], list[str]]:
        """What `fill()` would write, and the names it returns, leaving no trace: the names it took are
        given out again, so that asking about a value does not change the text written after."""
        count = self._count
        try:
            return self.written_apart(fill)
        finally:
            self._count = count

    def guarded(self, cond: str, fill: Callable[[], None]) -> None:
        """fill() inside `if cond:`."""
        self.blocks.append([])
        fill()
        body = self.blocks.pop()
        self.emit(If(cond, tuple(body)))

    def each_nonzero(self, value: Value, fill: Callable[[tuple[str, ...]], None]) -> None:
        """fill(index) for every index of `value` that may hold a nonzero: all of them, or where `value` is
        one-hot, those at its one index along its axis (none if that index is out of range)."""
        onehot = getattr(value, "onehot", None)
        if onehot is None:
            self.each_index(value.shape, fill)
            return
        axis, s = onehot
        rest = value.shape[:axis] + value.shape[axis + 1:]
        at = self.assign(f"np.int64({s})", "h")

        def inner(idx: tuple) -> None:
            fill(idx[:axis] + (at,) + idx[axis:])

        self.guarded(f"0 <= {at} < {value.shape[axis]}", lambda: self.each_index(rest, inner))

    def element(self, value: Value, index: Sequence[str]) -> str:
        if isinstance(value, Scalar):
            return value.expr
        if isinstance(value, Stored):
            return f"{value.name}[{', '.join(index)}]" if value.shape else f"{value.name}[0]"
        key = (id(value), tuple(index))
        found = self._elements.get(key)
        if found is not None and self._open(found[1]):
            return found[0]
        expr = value.element(self, tuple(index))
        name = expr if expr.isidentifier() else self.assign(expr, "e")
        self._elements[key] = (name, self.blocks[-1], value)
        return name

    def materialise(self, value: Value) -> Value:
        """`value` in a Buffer (its elements computed once, here), unless it is not an array or is stored."""
        if not isinstance(value, Pull):
            return value
        name = self.fresh("b")
        self.emit(Buffer(name, value.shape, value.dtype))
        self.each_index(value.shape, lambda idx: self.emit(Store(name, idx, self.element(value, idx))))
        stored = Stored(name, value.shape, value.dtype)
        self._stored[id(value)] = (value, self.blocks[-1], stored)
        return stored

    def stored_as(self, value: Value) -> Value | None:
        """The buffer `value` was stored in where that buffer is in scope here, else None."""
        found = self._stored.get(id(value))
        return found[2] if found is not None and found[0] is value and self._open(found[1]) else None

    def materialise_together(self, values: list[Pull]) -> list[Stored]:
        """Each value in a Buffer, those of one shape computed in one loop (sharing what their elements share)."""
        stored: dict[int, Stored] = {}
        for shape in dict.fromkeys(v.shape for v in values):
            group = [(k, v) for k, v in enumerate(values) if v.shape == shape]
            for k, v in group:
                stored[k] = Stored(self.fresh("b"), v.shape, v.dtype)
                self.emit(Buffer(stored[k].name, v.shape, v.dtype))

            def fill(idx: tuple, group=group) -> None:
                for k, v in group:
                    self.emit(Store(stored[k].name, idx, self.element(v, idx)))

            self.each_index(shape, fill)
        return [stored[k] for k in range(len(values))]

    def each_index(self, shape: tuple[int, ...], fill: Callable[[tuple[str, ...]], None], prefix: tuple = ()) -> None:
        """fill(index) inside loops over every index of `shape`."""
        if len(prefix) == len(shape):
            fill(prefix)
            return
        self.loop(shape[len(prefix)], lambda i: self.each_index(shape, fill, prefix + (i,)))

    # ------------------------------------------------------------------ programs

    def body(self, program: Program, inputs: Sequence[Value]) -> list[Value]:
        """Write `program` applied to `inputs` here; its outputs."""
        env: dict[Var, Value] = dict(zip(program.inputs, inputs, strict=True))
        uses = _uses(program)
        chain: Counter = Counter()  # how many pulled statements an array's element is written through
        last_read = {a: k for k, stmt in enumerate(program.stmts) for a in stmt.args if isinstance(a, Var)}
        last_read.update({a: len(program.stmts) for a in program.outputs if isinstance(a, Var)})
        for position, stmt in enumerate(program.stmts):
            # where a statement reads the end of a long chain of pulled statements, every pulled array still
            # to be read is stored, in one loop: an element would otherwise be written by recursion as deep
            # as the chain, and each array later stored on its own would compute its whole chain again
            if any(isinstance(a, Var) and chain[a] >= MAX_CHAIN for a in stmt.args):
                live = [v for v, value in env.items() if isinstance(value, Pull) and chain[v] > 0
                        and last_read.get(v, -1) >= position]
                for v, stored in zip(live, self.materialise_together([env[v] for v in live]), strict=True):
                    env[v], chain[v] = stored, 0
            args = [self.value(a, env) for a in stmt.args]
            rule = _rules.get(stmt.prim)
            if rule is None:
                raise NotNestable(f"{stmt.prim.name} has no loop-nest rule")
            outs = rule(self, stmt.prim, args, [v.aval for v in stmt.outs])
            for a, value in zip(stmt.args, args):  # an argument the rule stored is read from its buffer from now on
                stored = self.stored_as(value) if isinstance(a, Var) and isinstance(value, Pull) else None
                if stored is not None:
                    env[a], chain[a] = stored, 0
            depth = 1 + max((chain[a] for a in stmt.args if isinstance(a, Var)), default=0)
            for var, out in zip(stmt.outs, outs, strict=True):
                if isinstance(out, Pull) and out.heavy and uses[var] > 1:  # read twice: stored, not recomputed
                    out = self.materialise(out)
                chain[var] = depth if isinstance(out, Pull) else 0
                env[var] = out
        return [self.value(a, env) for a in program.outputs]

    def value(self, atom, env: dict) -> Value:
        if isinstance(atom, Lit):
            dtype = atom.aval.dtype
            if atom.aval.shape == ():
                known = (int(atom.value),) * 2 if dtype.kind in "iu" else None
                return Scalar(literal(atom.value, dtype), dtype, bounds=known)
            return Stored(self.constant(np.asarray(atom.value)), atom.aval.shape, dtype)
        return env[atom]


def _uses(program: Program) -> Counter:
    """How often each variable is read. A value a body captures counts twice: the body reads it once per
    row, so an array computed with a loop is stored rather than recomputed for every row."""
    uses: Counter = Counter()
    for stmt in program.stmts:
        captured = set(stmt.args[: getattr(stmt.prim, "num_consts", 0)]) if stmt.prim.bodies() else set()
        for a in stmt.args:
            if isinstance(a, Var):
                uses[a] += 2 if a in captured else 1
    uses.update(a for a in program.outputs if isinstance(a, Var))
    return uses


_rules = RuleTable("loop nest")


def _scalar_or_pull(w: Writer, shape: tuple, dtype: np.dtype, element: Callable, heavy: bool) -> Value:
    if shape == ():
        return Scalar(w.assign(element(w, ())), dtype)
    return Pull(tuple(shape), dtype, element, heavy)


def _heavy(*values: Value) -> bool:
    return any(isinstance(v, Pull) and v.heavy for v in values)


@_rules.register(Elementwise)
def _elementwise(w: Writer, prim: Elementwise, args: list[Value], out_avals) -> list[Value]:
    if prim.op not in TEMPLATES:
        raise NotNestable(f"{prim.op} has no scalar template in the loop nest")
    out = out_avals[0]
    template = TEMPLATES[prim.op]
    wrap = (lambda e: e) if prim.op in _UNWRAPPED else (lambda e: f"np.{out.dtype.name}({e})")

    def element(w: Writer, idx: tuple) -> str:
        return wrap(template.format(*(w.element(a, idx if a.shape else ()) for a in args)))

    value = _scalar_or_pull(w, out.shape, out.dtype, element, _heavy(*args))
    return [with_facts(value, elementwise_facts(prim.op, args, value))]


@_rules.register(Convert)
def _convert(w: Writer, prim: Convert, args: list[Value], out_avals) -> list[Value]:
    (x,), out = args, out_avals[0]
    to = np.dtype(prim.dtype)

    def element(w: Writer, idx: tuple) -> str:
        e = w.element(x, idx)
        return f"({e} != 0)" if to == np.bool_ and x.dtype != np.bool_ else f"np.{to.name}({e})"

    value = _scalar_or_pull(w, out.shape, to, element, _heavy(x))
    return [value if to == np.bool_ else with_facts(value, elementwise_facts("convert", [x], value))]


@_rules.register(StopGradient)
def _stop_gradient(w: Writer, prim, args: list[Value], out_avals) -> list[Value]:
    return list(args)


@_rules.register(Iota)
def _iota(w: Writer, prim: Iota, args, out_avals) -> list[Value]:
    dtype = np.dtype(prim.dtype)
    known = (0, prim.n - 1) if dtype.kind in "iu" else None
    return [Pull((prim.n,), dtype, lambda w, idx: f"np.{dtype.name}({idx[0]})", False, index_axis=0, bounds=known)]


@_rules.register(BroadcastTo)
def _broadcast(w: Writer, prim: BroadcastTo, args: list[Value], out_avals) -> list[Value]:
    (x,) = args
    shape, lead = tuple(prim.shape), len(prim.shape) - len(x.shape)

    def element(w: Writer, idx: tuple) -> str:
        return w.element(x, tuple("0" if n == 1 else i for i, n in zip(idx[lead:], x.shape)))

    if not shape:
        return [x]
    return [with_facts(Pull(shape, x.dtype, element, _heavy(x)), broadcast_facts(x, lead))]


def _strides(shape: tuple[int, ...]) -> list[int]:
    return [int(np.prod(shape[k + 1:], dtype=np.int64)) for k in range(len(shape))]


@_rules.register(Reshape)
def _reshape(w: Writer, prim: Reshape, args: list[Value], out_avals) -> list[Value]:
    (x,), shape = args, tuple(prim.shape)
    if shape == x.shape:
        return [x]
    if math.prod(shape) == 1:  # to or from a single element
        one = w.element(x, ("0",) * len(x.shape))
        zero_unless = getattr(x, "zero_unless", None)  # a stored value knows none
        if shape == ():
            return [Scalar(w.assign(one), x.dtype, zero_unless=zero_unless)]
        return [Pull(shape, x.dtype, lambda w, idx: one, False, zero_unless=zero_unless)]
    if _without_units(shape) == _without_units(x.shape):  # unit axes added or dropped: indices carried over
        def element(w: Writer, idx: tuple) -> str:
            kept = iter(i for i, n in zip(idx, shape) if n != 1)
            return w.element(x, tuple("0" if n == 1 else next(kept) for n in x.shape))

        return [with_facts(Pull(shape, x.dtype, element, _heavy(x)), reshape_facts(x, shape))]
    out_strides, in_strides = _strides(shape), _strides(x.shape)

    def element(w: Writer, idx: tuple) -> str:
        flat = " + ".join(i if s == 1 else f"{i} * {s}" for i, s in zip(idx, out_strides)) or "0"
        # the first axis' quotient is below its extent already
        return w.element(x, tuple(_index_of(flat, s, n, k == 0) for k, (s, n) in enumerate(zip(in_strides, x.shape))))

    return [with_facts(Pull(shape, x.dtype, element, _heavy(x)), reshape_facts(x, shape))]


def _without_units(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _index_of(flat: str, stride: int, extent: int, first: bool) -> str:
    """The index along an axis of `stride` and `extent` of the flat position `flat`."""
    quotient = f"({flat})" if stride == 1 else f"(({flat}) // {stride})"
    return quotient if first else f"({quotient} % {extent})"


@_rules.register(Transpose)
def _transpose(w: Writer, prim: Transpose, args: list[Value], out_avals) -> list[Value]:
    (x,), perm = args, tuple(prim.perm)
    shape = tuple(x.shape[p] for p in perm)

    def element(w: Writer, idx: tuple) -> str:
        source = [""] * len(perm)
        for k, p in enumerate(perm):
            source[p] = idx[k]
        return w.element(x, tuple(source))

    return [with_facts(Pull(shape, x.dtype, element, _heavy(x)), transpose_facts(x, perm))]


@_rules.register(StaticIndex)
def _static_index(w: Writer, prim: StaticIndex, args: list[Value], out_avals) -> list[Value]:
    (x,), out = args, out_avals[0]
    entries = list(prim.index) + [(0, n, 1) for n in x.shape[len(prim.index):]]

    def element(w: Writer, idx: tuple) -> str:
        rest, source = iter(idx), []
        for entry in entries:
            if isinstance(entry, tuple):
                start, _, step = entry
                source.append(f"({start} + {step} * {next(rest)})")
            else:
                source.append(str(entry % x.shape[len(source)]))
        return w.element(x, tuple(source))

    return [_scalar_or_pull(w, tuple(out.shape), x.dtype, element, _heavy(x))]


@_rules.register(IndexTranspose)
def _index_transpose(w: Writer, prim: IndexTranspose, args: list[Value], out_avals) -> list[Value]:
    """zeros(shape) with x at a static index (a static index's cotangent): an element is x's where its index
    falls on the indexed positions, else 0; x is read at a clamped index, so the test can select."""
    (x,), out = args, out_avals[0]
    entries = list(prim.index) + [(0, n, 1) for n in out.shape[len(prim.index):]]
    if any(isinstance(e, tuple) and e[2] <= 0 for e in entries):
        raise NotNestable("a static index with a negative step is not in the loop nest")

    def element(w: Writer, idx: tuple) -> str:
        tests, source = [], []
        for axis, (entry, i) in enumerate(zip(entries, idx, strict=True)):
            n = out.shape[axis]
            if not isinstance(entry, tuple):
                tests.append(f"{i} == {entry % n}")
                continue
            start, stop, step = entry
            if (start, stop, step) == (0, n, 1):
                source.append(i)
                continue
            tests.append(f"{start} <= {i} < {stop}" + (f" and ({i} - {start}) % {step} == 0" if step != 1 else ""))
            source.append(f"min(max(({i} - {start}) // {step}, 0), {x.shape[len(source)] - 1})")
        value = w.element(x, tuple(source))
        return f"({value} if {' and '.join(tests)} else {literal(0, out.dtype)})" if tests else value

    return [_scalar_or_pull(w, tuple(out.shape), out.dtype, element, _heavy(x))]


@_rules.register(Gather)
def _gather(w: Writer, prim: Gather, args: list[Value], out_avals) -> list[Value]:
    """x[idx] along x's first axis: a read at the index, where the indices are known to lie in [-n, n) (an
    iota, a map's index, and sums of those; a negative one counts from the end), or are elements of a kernel
    input as read (a label per row), which the backend checks before it runs the kernel (Writer.require);
    otherwise NotNestable, and the gather stays a statement of its own, which checks them."""
    (x, idx), out = args, out_avals[0]
    n, known = x.shape[0], getattr(idx, "bounds", None) or (None, None)
    source = getattr(idx, "source", None)
    if (known[0] is None or known[1] is None) and source is not None and n > 0:
        w.require(source, -n, n - 1)
        known = (-n, n - 1)
    if known[0] is None or known[1] is None or not (-n <= known[0] and known[1] < n):
        raise NotNestable(f"a gather at indices not known to lie in [-{n}, {n})")
    lead = len(idx.shape)

    def element(w: Writer, at: tuple) -> str:
        k = w.element(idx, at[:lead])
        k = k if known[0] >= 0 else w.assign(f"({k} + {n} if {k} < 0 else {k})")
        return w.element(x, (k,) + tuple(at[lead:]))

    return [_scalar_or_pull(w, tuple(out.shape), x.dtype, element, _heavy(x, idx))]


@_rules.register(Concatenate)
def _concatenate(w: Writer, prim: Concatenate, args: list[Value], out_avals) -> list[Value]:
    """The pieces written one after the other into a buffer of the result's size (a row of a gradient's
    scatter entries, fold/scatter_sums.py): each piece's elements are computed once, where the buffer is."""
    out, axis = out_avals[0], prim.axis % len(out_avals[0].shape)
    name = w.fresh("b")
    w.emit(Buffer(name, tuple(out.shape), out.dtype))
    offset = 0
    for piece in args:
        def store(idx: tuple, piece=piece, offset=offset) -> None:
            at = idx[:axis] + (f"{idx[axis]} + {offset}" if offset else idx[axis],) + idx[axis + 1:]
            w.emit(Store(name, at, cast(w.element(piece, idx), out.dtype, piece.dtype)))

        w.each_index(piece.shape, store)
        offset += piece.shape[axis]
    return [Stored(name, tuple(out.shape), out.dtype)]


def _summed(w: Writer, x: Value, axes: tuple[int, ...], idx: tuple, dtype: np.dtype) -> str:
    """The sum of x over `axes` at the other axes' index `idx`, in a loop written here; over a one-hot axis,
    only its one index is read (none if it is out of range)."""
    acc = w.assign(literal(0, dtype), "s")
    kept = iter(idx)
    slots = [None if k in axes else next(kept) for k in range(len(x.shape))]
    onehot = getattr(x, "onehot", None)
    summed = axes
    if onehot is not None and onehot[0] in axes:
        slots[onehot[0]] = w.assign(f"np.int64({onehot[1]})", "h")
        summed = tuple(k for k in axes if k != onehot[0])

    def add(loop_idx: tuple) -> None:
        it = iter(loop_idx)
        full = tuple(next(it) if s is None else s for s in slots)
        w.emit(Assign(acc, f"np.{dtype.name}({acc} + {w.element(x, full)})"))

    def each() -> None:
        extents = tuple(x.shape[k] for k in summed)
        if len(extents) == 1:  # a row's sum: a commutative fold a backend may split into lanes
            w.loop(extents[0], lambda i: add((i,)), (_lane_merge(w, acc, literal(0, dtype), "{0} + {1}"),))
        else:
            w.each_index(extents, add)

    if summed == axes:
        each()
    else:
        w.guarded(f"0 <= {slots[onehot[0]]} < {x.shape[onehot[0]]}", each)
    return acc


@_rules.register(SumAxes)
def _sum_axes(w: Writer, prim: SumAxes, args: list[Value], out_avals) -> list[Value]:
    (x,), out = args, out_avals[0]
    axes = tuple(sorted(a % len(x.shape) for a in prim.axes))
    return [_scalar_or_pull(w, tuple(out.shape), out.dtype, lambda w, idx: _summed(w, x, axes, idx, out.dtype), True)]


@_rules.register(MatMul)
def _matmul(w: Writer, prim: MatMul, args: list[Value], out_avals) -> list[Value]:
    """(a @ b)[i, j] as a loop over the shared axis; where an operand is one-hot along it (a gradient's
    cotangent of a min/max times a row), the one term at its index. A one-hot row of `a` (column of `b`) makes
    the product's row (column) one-hot at the same index: a sum of products over the map then adds one row."""
    (a, b), out = args, out_avals[0]
    dtype = out.dtype
    a_row, a_shared = _hot_index(a, 0), _hot_index(a, 1)
    b_shared, b_column = _hot_index(b, 0), _hot_index(b, 1)
    shared = a_shared if a_shared is not None else b_shared

    def term(w: Writer, idx: tuple, k: str) -> str:
        return f"{w.element(a, (idx[0], k))} * {w.element(b, (k, idx[1]))}"

    def element(w: Writer, idx: tuple) -> str:
        acc = w.assign(literal(0, dtype), "s")
        if shared is None:
            w.loop(a.shape[1], lambda k: w.emit(Assign(acc, f"np.{dtype.name}({acc} + {term(w, idx, k)})")),
                   (_lane_merge(w, acc, literal(0, dtype), "{0} + {1}"),))
        else:
            k = w.assign(f"np.int64({shared})", "h")
            # the term read inside the guard: out of range (a row holding NaN has no first index), its
            # elements would be read past the operand's end
            w.guarded(f"0 <= {k} < {a.shape[1]}",
                      lambda: w.emit(Assign(acc, f"np.{dtype.name}({term(w, idx, k)})")))
        return acc

    onehot = (0, a_row) if a_row is not None else ((1, b_column) if b_column is not None else None)
    return [Pull(tuple(out.shape), dtype, element, True, onehot=onehot)]


def _hot_index(x: Value, axis: int) -> str | None:
    """The one index along `axis` where x may be nonzero, if x is one-hot along it."""
    onehot = getattr(x, "onehot", None)
    return onehot[1] if onehot is not None and onehot[0] == axis else None


def _row(w: Writer, x: Value, i: str) -> Value:
    """Row `i` of x (a map's element); a one-hot x's row is zero unless i is its index."""
    onehot = getattr(x, "onehot", None)
    zero_unless = f"({i} == {onehot[1]})" if onehot is not None and onehot[0] == 0 else getattr(x, "zero_unless", None)
    known = getattr(x, "bounds", None)
    if x.shape[1:] == ():
        return Scalar(w.assign(w.element(x, (i,))), x.dtype, zero_unless=zero_unless, bounds=known,
                      source=x.name if getattr(x, "is_input", False) else None)
    inner = (onehot[0] - 1, onehot[1]) if onehot is not None and onehot[0] > 0 else None
    return Pull(x.shape[1:], x.dtype, lambda w, idx: w.element(x, (i,) + idx), _heavy(x), zero_unless=zero_unless,
                onehot=inner, bounds=known)


@_rules.register(Map)
def _map(w: Writer, prim: Map, args: list[Value], out_avals) -> list[Value]:
    """Rows computed where they are read; but a map whose body runs loops and gives arrays, or several
    results, is stored: each element, or each result, read would otherwise run the whole body again. A
    costly argument the body reads again (captured, or read for every element of larger result rows) is
    stored first, for the same reason."""
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    consts = [w.materialise(c) if _costly(w, c) else c for c in consts]
    xs = [w.materialise(x) if _reread(x, out_avals) and _costly(w, x) else x for x in xs]
    heavy = _has_loops(prim.body) or _heavy(*xs)
    vanishing = _vanishing_rows(w, prim, consts, xs)
    if _has_loops(prim.body) and (len(out_avals) > 1 or any(len(a.shape) > 1 for a in out_avals)):
        split = None if vanishing.conditions else row_scalars(prim.body)
        if split is not None:
            return _map_after_its_scalars(w, prim, split, consts, xs, out_avals)
        return _stored_map(w, prim, consts, xs, out_avals, vanishing)

    def output(k: int, aval) -> Value:
        def element(w: Writer, idx: tuple) -> str:
            return w.element(map_row(w, prim.body, consts, xs, idx[0])[k], idx[1:])

        facts = vanishing.facts(k, xs)
        return Pull(tuple(aval.shape), aval.dtype, element, heavy, **facts)

    return [output(k, aval) for k, aval in enumerate(out_avals)]


def row_scalars(body: Program) -> tuple[Program, Program] | None:
    """(head, tail): a map body split where only scalars cross. The head is the body's loops, what they
    read, and every scalar statement that follows from those and the inputs; the tail is the rest, with the
    arrays it reads from the head made again (cheap: the tail may run no loop), reading the head's scalars
    as inputs after the body's own. None where a loop gives an array, the tail runs a loop or a
    transcendental function, or nothing is left for it."""
    produced = {v: s for s in body.stmts for v in s.outs}
    loops = [s for s in body.stmts if isinstance(s.prim, LOOPING)]
    if any(o.aval.shape != () for s in loops for o in s.outs):
        return None
    head = with_producers(body.stmts, loops)
    for stmt in body.stmts:  # in order: a scalar of scalars the head makes is made there too
        if all(o.aval.shape == () for o in stmt.outs) and all(
                not isinstance(a, Var) or a not in produced or id(produced[a]) in head for a in stmt.args):
            head.add(id(stmt))
    rest = {id(s) for s in body.stmts if id(s) not in head}

    def again(stmt) -> None:  # an array the head makes cheaply (x - y), made again where the tail reads it
        if id(stmt) not in rest and stmt.outs[0].aval.shape != ():
            rest.add(id(stmt))
            for a in stmt.args:
                if isinstance(a, Var) and a in produced:
                    again(produced[a])

    for stmt in [s for s in body.stmts if id(s) in rest]:
        for a in stmt.args:
            if isinstance(a, Var) and a in produced:
                again(produced[a])
    tail = [s for s in body.stmts if id(s) in rest]
    if not tail or any(isinstance(s.prim, LOOPING) or _transcendental(s.prim) for s in tail):
        return None
    made = {v for s in body.stmts if id(s) in head and id(s) not in rest for v in s.outs}
    crossing = list(dict.fromkeys([a for s in tail for a in s.args if isinstance(a, Var) and a in made]
                                  + [v for v in body.outputs if isinstance(v, Var) and v in made]))
    if not crossing or any(v.aval.shape != () for v in crossing):
        return None
    head_program = Program(body.inputs, tuple(s for s in body.stmts if id(s) in head), tuple(crossing),
                           _tuple_tree(len(body.inputs)), _tuple_tree(len(crossing)), {})
    tail_program = Program(tuple(body.inputs) + tuple(crossing), tuple(tail), body.outputs,
                           _tuple_tree(len(body.inputs) + len(crossing)), body.out_tree, {})
    return head_program, tail_program


def _transcendental(prim) -> bool:
    return isinstance(prim, Elementwise) and prim.op in TRANSCENDENTAL


def _tuple_tree(n: int):
    from fold.pytree import tree_flatten

    return tree_flatten(tuple(range(n)))[1]


def _map_after_its_scalars(w: Writer, prim: Map, split: tuple[Program, Program], consts, xs, out_avals) -> list[Value]:
    """A map whose body loops but gives arrays made of scalars: the scalars of every row are stored (the loops
    run once per row), and the arrays are pulled from them where they are read: a sum over the map's rows
    then adds each element into its state as it is made, where a stored row would be written and read back
    (a layer's gradient, a rank-1 update per point)."""
    head, tail = split
    n = out_avals[0].shape[0]
    scalars = _stored_map(w, Map(head, prim.num_consts), consts, xs,
                          [ShapedArray((n,), v.aval.dtype) for v in head.outputs], VanishingRows())
    return _map(w, Map(tail, prim.num_consts), [*consts, *xs, *scalars], out_avals)


def _reread(x: Value, out_avals) -> bool:
    """Whether a map's results read an element of its argument `x` more than once: the map gives several
    results, or result rows larger than x's (a weight per component scaling that component's vector)."""
    row = math.prod(x.shape[1:])
    return len(out_avals) > 1 or any(math.prod(a.shape[1:]) > row for a in out_avals)


def _costly(w: Writer, value: Value) -> bool:
    """Whether writing an element of `value` runs a loop or calls a transcendental function, where it is not
    yet computed. An array known to be zero or one-hot is never costly here: storing it would lose that."""
    if not isinstance(value, Pull) or any(getattr(value, f) is not None for f in _FACTS):
        return False
    if value.heavy:
        return True
    text = _element_text(w, value)
    return any(call in text for call in TRANSCENDENTAL_CALLS)


_FACTS = tuple(f.name for f in fields(Pull) if f.default is None)  # what is known of a Pull without computing it


@dataclass(frozen=True)
class VanishingRows:
    """Where a map's result rows are zero: output k's row at index i is 0 unless
    `conditions[k].replace(placeholder, i)` holds, a test of values computed before the map."""

    placeholder: str = ""
    conditions: dict = field(default_factory=dict)

    def row_condition(self, k: int, i: str) -> str | None:
        c = self.conditions.get(k)
        return None if c is None else c.replace(self.placeholder, i)

    def facts(self, k: int, xs: Sequence[Value]) -> dict:
        """The whole result's facts: one-hot along the map's axis where its rows vanish with a one-hot
        argument's; zero unless a condition that does not depend on the row holds."""
        c = self.conditions.get(k)
        if c is None:
            return {}
        for x in xs:
            onehot = getattr(x, "onehot", None)
            if onehot is not None and onehot[0] == 0 and c == f"({self.placeholder} == {onehot[1]})":
                return {"onehot": (0, onehot[1])}
        return {} if self.placeholder in names(c) else {"zero_unless": c}


def _vanishing_rows(w: Writer, prim: Map, consts, xs) -> VanishingRows:
    """The body written once apart, for a placeholder row (the text thrown away), tells which results'
    rows are zero unless a condition holds: a row of a one-hot argument, or a captured value that is zero
    unless something holds (a max's cotangent inside a gradient's map). Conditions that name values the
    body computes are dropped: only a test that can stand before the row is computed is kept."""
    if not any(getattr(v, "zero_unless", None) is not None or (getattr(v, "onehot", None) or (None,))[0] == 0
               for v in (*consts, *xs)):
        return VanishingRows()
    placeholder = f"__{w.fresh('row')}__"
    nodes, outs = w.written_apart(lambda: map_row(w, prim.body, consts, xs, placeholder))
    local = defined(nodes)
    conditions = {k: o.zero_unless for k, o in enumerate(outs)
                  if getattr(o, "zero_unless", None) is not None and not local & set(names(o.zero_unless))}
    return VanishingRows(placeholder, conditions)


def map_row(w: Writer, body: Program, consts: Sequence[Value], xs: Sequence[Value], i: str) -> list[Value]:
    """The outputs of a map's body on row `i`, written here."""
    return w.body(body, list(consts) + [_row(w, x, i) for x in xs])


def store_rows(w: Writer, targets: Sequence[str], outs: Sequence[Value], lead: tuple[str, ...]) -> None:
    """Every element of each row value stored into its target at `lead` + its index; values of one shape in
    one loop, so that what their elements share (a jvp's exponential in its value and its tangent) is
    computed once."""
    for shape in dict.fromkeys(o.shape for o in outs):
        group = [(t, o) for t, o in zip(targets, outs, strict=True) if o.shape == shape]
        w.each_index(shape, lambda idx, group=group: [w.emit(Store(t, lead + idx, w.element(o, idx))) for t, o in group])


def _stored_map(w: Writer, prim: Map, consts, xs, out_avals, vanishing: VanishingRows) -> list[Value]:
    """The map's results in buffers, row by row; where every result's rows vanish under one condition, the
    buffers start at zero and a row is computed only where its condition holds."""
    names = [w.fresh("b") for _ in out_avals]
    for name, aval in zip(names, out_avals, strict=True):
        w.emit(Buffer(name, tuple(aval.shape), aval.dtype))
    conditions = {vanishing.conditions.get(k) for k in range(len(out_avals))}
    guarded = len(conditions) == 1 and None not in conditions
    if guarded:
        for name, aval in zip(names, out_avals, strict=True):
            w.each_index(tuple(aval.shape), lambda idx: w.emit(Store(name, idx, literal(0, aval.dtype))))

    def row(i: str) -> None:
        def compute() -> None:
            store_rows(w, names, map_row(w, prim.body, consts, xs, i), (i,))

        if guarded:
            w.guarded(vanishing.row_condition(0, i), compute)
        else:
            compute()

    w.loop(out_avals[0].shape[0], row)
    return [Stored(name, tuple(a.shape), a.dtype) for name, a in zip(names, out_avals, strict=True)]


def _has_loops(program: Program) -> bool:
    return any(isinstance(s.prim, (Map, Reduce, SumAxes, MatMul)) for s in program.stmts)


@_rules.register(Reduce)
def _reduce(w: Writer, prim: Reduce, args: list[Value], out_avals) -> list[Value]:
    k, nc = prim.num_leaves, prim.num_consts
    consts, identity, xs = args[:nc], args[nc: nc + k], args[nc + k:]
    if any(x.shape[1:] != () for x in xs):
        raise NotNestable("a reduce of elements that are not scalars is not in the loop nest yet")
    op = recognize_binary_op(prim.body, nc) if k == 1 else None
    if nc == 0 and op == "logaddexp":
        return [_logsumexp(w, identity[0], xs[0], out_avals[0].dtype)]
    if nc == 0 and op == "minimum":
        dtype = np.dtype(out_avals[0].dtype)
        paired = (first_index_with_extreme(w, xs[0], identity[0], dtype)
                  or first_index_narrowed(w, xs[0], identity[0], dtype))
        if paired is not None:
            return [paired]
    dtypes = [np.dtype(a.dtype) for a in out_avals]
    operator, carried = carried_operator(prim.body, nc, dtypes) if _long(xs[0]) else (prim.body, None)
    carried = list(carried or dtypes)
    identities = [cast(w.element(e, ()), c, d) for e, c, d in zip(identity, carried, dtypes, strict=True)]
    accs = [w.assign(e, "acc") for e in identities]

    def step(i: str) -> None:
        fold_into(w, operator, consts, accs, carried, [Scalar(w.assign(w.element(x, (i,))), x.dtype) for x in xs])

    commutative = commutative_fold(prim)
    folds = (lane_fold(w, operator, consts, accs, identities, carried),) if commutative else ()
    loop = w.loop(xs[0].shape[0], step, folds)
    extreme = extreme_of(xs[0], op, identity[0], accs[0], loop) if nc == 0 and carried == dtypes else None
    if extreme is not None:
        w.extremes[extreme.acc] = extreme
    return [Scalar(a if c == d else w.assign(cast(a, d, c)), d) for a, c, d in zip(accs, carried, dtypes, strict=True)]


# A row's float32 fold longer than this is carried in float64 and rounded once, as the backends' other
# folds (wide_operators.py), so its error does not grow with its length. A shorter one is folded in float32:
# NumPy's own pairwise sum adds up to 128 elements in a straight run, and the conversions cost a nest with
# short rows a quarter of its time (k-means' distances over 16 coordinates, 265 against 342 ms).
CARRY_FROM = 128


def _long(x: Value) -> bool:
    return x.shape[0] > CARRY_FROM


def fold_into(w: Writer, operator: Program, consts: list, accs: list[str], dtypes: list, elements: list) -> None:
    """accs = operator(consts, accs, elements), written here: one step of a fold or a scan."""
    combined = w.body(operator, list(consts) + [Scalar(a, d) for a, d in zip(accs, dtypes, strict=True)] + elements)
    results = [w.assign(w.element(c, ())) for c in combined]
    for acc, r in zip(accs, results, strict=True):
        w.emit(Assign(acc, r))


def cast(expr: str, to: np.dtype, was: np.dtype) -> str:
    """`expr` (of dtype `was`) as `to`."""
    return expr if to == was else f"np.{np.dtype(to).name}({expr})"


@_rules.register(ReduceByIndex)
def _histogram_of_row(w: Writer, prim: ReduceByIndex, args: list[Value], out_avals) -> list[Value]:
    """A histogram inside a row (a gather's cotangent scattered back: one value, or one row, at the label's
    index): bins in buffers started at the identity, each element folded into its bin in order (`bin_into`)."""
    k, nc = prim.num_leaves, prim.num_consts
    one_entry = _one_entry_into_zeros(w, prim, args, out_avals)
    if one_entry is not None:
        return [one_entry]
    identity = args[nc: nc + k]
    dtypes = [np.dtype(a.dtype) for a in out_avals]
    bins = [Stored(w.fresh("b"), tuple(a.shape), d) for a, d in zip(out_avals, dtypes, strict=True)]
    for b, start in zip(bins, identity, strict=True):
        w.emit(Buffer(b.name, b.shape, b.dtype))
        w.each_index(b.shape, lambda idx, b=b, start=start: w.emit(
            Store(b.name, idx, cast(w.element(start, idx[1:]), b.dtype, start.dtype))))
    bin_into(w, prim, args[:nc], bins, args[nc + k], args[nc + k + 1:])
    return bins


def _one_entry_into_zeros(w: Writer, prim: ReduceByIndex, args: list[Value], out_avals) -> Pull | None:
    """One value added into zeros at one index (a scatter of one element, as `x.at[i].add(v)` on zeros
    makes): an array one-hot at that index, computed where it is read, so that a consumer adding it up
    reads the one element (facts.py). None where the histogram is another."""
    out = out_avals[0]
    if (prim.num_leaves, prim.num_consts, out.ndim) != (1, 0, 1) or args[1].shape != (1,) \
            or recognize_binary_op(prim.body, 0) != "add" or not is_zero(args[0]):
        return None
    dtype, indices, value = np.dtype(out.dtype), args[1], args[2]
    at = w.assign(f"np.int64({w.element(indices, ('0',))})", "h")
    v = w.assign(cast(w.element(value, ('0',)), dtype, np.dtype(value.dtype)))
    zero = literal(0, dtype)
    return Pull((prim.n,), dtype, lambda w, idx: f"({v} if {idx[0]} == {at} else {zero})", False,
                onehot=(0, at))


def bin_into(w: Writer, prim: ReduceByIndex, consts: Sequence[Value], bins: Sequence[Stored], indices: Value,
             values: Sequence[Value]) -> None:
    """Each element of `values` folded by `prim`'s operator into its bin of `bins` (buffers, updated in
    place), in order; an index outside [0, n) ignored (as reduce_by_index does everywhere). A bin that is an
    array gets its new value stored apart, then copied in, so an operator reading a bin's other elements sees
    the old ones."""
    spare = [w.fresh("b") if b.shape[1:] else None for b in bins]
    for b, apart in zip(bins, spare, strict=True):
        if apart is not None:
            w.emit(Buffer(apart, b.shape[1:], b.dtype))

    def element(j: str) -> None:
        at = w.assign(f"np.int64({w.element(indices, (j,))})", "h")

        def bin_at(b: Stored) -> Value:
            if not b.shape[1:]:
                return Scalar(w.assign(f"{b.name}[{at}]"), b.dtype)
            return Pull(b.shape[1:], b.dtype, lambda w, idx, b=b: f"{b.name}[{', '.join((at,) + idx)}]", False)

        def fold_in() -> None:
            made = w.body(prim.body, list(consts) + [bin_at(b) for b in bins] + [_row(w, v, j) for v in values])
            scalars = {leaf: w.assign(w.element(m, ())) for leaf, (b, m) in enumerate(zip(bins, made)) if not b.shape[1:]}
            for b, m, apart in zip(bins, made, spare):
                if apart is not None:
                    w.each_index(b.shape[1:], lambda idx, b=b, m=m, apart=apart: w.emit(
                        Store(apart, idx, cast(w.element(m, idx), b.dtype, m.dtype))))
            for leaf, r in scalars.items():
                w.emit(Store(bins[leaf].name, (at,), cast(r, bins[leaf].dtype, bins[leaf].dtype)))
            for b, apart in zip(bins, spare):
                if apart is not None:
                    w.each_index(b.shape[1:], lambda idx, b=b, apart=apart: w.emit(
                        Store(b.name, (at,) + idx, f"{apart}[{', '.join(idx)}]")))

        w.guarded(f"0 <= {at} < {prim.n}", fold_in)

    w.loop(indices.shape[0], element)  # in order: a bin's elements are folded as they come


@_rules.register(Scan)
def _scan(w: Writer, prim: Scan, args: list[Value], out_avals) -> list[Value]:
    """A scan of a row: one sequential loop (forward or backward) storing each prefix, float32 carried in
    float64 and rounded as it is stored (as the numpy backend's scans). Elements that are small arrays (the
    2 x 2 Jacobians a user operator's generic gradient scans) are carried in buffers (CarriedState)."""
    k, nc = prim.num_leaves, prim.num_consts
    consts, identity, xs = args[:nc], args[nc: nc + k], args[nc + k:]
    dtypes = [np.dtype(a.dtype) for a in out_avals]
    operator, carried = carried_operator(prim.body, nc, dtypes)
    states = carried_states(w, identity, list(carried or dtypes))
    n = xs[0].shape[0]
    outs = [Stored(w.fresh("b"), tuple(a.shape), d) for a, d in zip(out_avals, dtypes, strict=True)]
    for out in outs:
        w.emit(Buffer(out.name, out.shape, out.dtype))

    def store(at: str) -> None:
        for out, state in zip(outs, states, strict=True):
            w.each_index(out.shape[1:], lambda idx, out=out, state=state: w.emit(
                Store(out.name, (at,) + idx, f"np.{out.dtype.name}({w.element(state.value, idx)})")))

    def step(i: str) -> None:
        at = w.assign(f"{n - 1} - {i}", "j") if prim.reverse else i
        elements = [_row(w, x, at) for x in xs]
        if prim.exclusive:
            store(at)
        held = [s.value for s in states]
        # a reverse scan puts each element on the left of what it has folded so far (as the numpy backend's
        # scan_leaves): the order a user operator that does not commute (a product of Jacobians) sees
        operands = elements + held if prim.reverse else held + elements
        advance(w, states, w.body(operator, list(consts) + operands))
        if not prim.exclusive:
            store(at)

    w.loop(n, step)  # in order: a scan's prefixes are not reassociated
    return outs


@_rules.register(StepLoop, LoopSaving)
def _loop(w: Writer, prim: StepLoop | LoopSaving, args: list[Value], out_avals) -> list[Value]:
    """fold.loop: one sequential loop of the nest carrying the states, its body written once, the counter
    known to lie in [0, n - 1] (a gather of a captured coefficient at it is a read). A scalar state is a
    name reassigned each step (a loop over vectors written as a map of a loop over scalars, loop_maps.py);
    an array state (a recurrent network's hidden vector, which each step multiplies by a matrix) is a buffer,
    its next value stored apart and copied in once the step has read the old one (`carried_states`). A loop
    saving its states (the states a loop's sums over elements are taken of, loop_maps.py) also stores each
    saved state in a buffer of the row's steps."""
    nc = prim.num_consts
    consts, init = args[:nc], args[nc:]
    saving = isinstance(prim, LoopSaving)
    if saving and prim.stride != 1:
        raise NotNestable("a loop saving every few states is not in the loop nest")
    states = carried_states(w, init, [a.dtype for a in out_avals[: len(init)]])
    stacks = [Stored(w.fresh("saved"), (prim.num_saved,) + tuple(v.shape), state.dtype)
              for v, state in zip(init, states)] if saving else []
    for stack in stacks:
        w.emit(Buffer(stack.name, stack.shape, stack.dtype))

    body, scattered = scattered_states(prim.body, nc)

    def step(i: str) -> None:
        for stack, state in zip(stacks, states):
            w.each_index(stack.shape[1:], lambda idx, stack=stack, state=state: w.emit(
                Store(stack.name, (i,) + idx, w.element(state.value, idx))))
        counter = Scalar(i, np.dtype(np.int64), bounds=(0, prim.n - 1))
        made = w.body(body, list(consts) + [counter] + [state.value for state in states])
        for s in scattered:  # before any state changes: the histogram's values may read the other states
            indices, values = made[s.first_output], made[s.first_output + 1]
            bin_into(w, s.histogram, [], [states[s.state].value], indices, [values])
        advance(w, states, made[: len(states)])

    if prim.n * max(len(prim.body.stmts), 1) <= UNROLLED_STEPS and all(v.shape == () for v in init):
        for k in range(prim.n):  # unrolled: the map's loop over elements is then the innermost, which vectorises
            step(str(k))
    else:
        w.loop(prim.n, step)  # in order: each step reads the last one's states
    return [state.value for state in states] + stacks


@dataclass(frozen=True)
class CarriedState:
    """A state a sequential loop of the nest carries: a scalar in a reassigned name, an array in `value`'s
    buffer with `next` beside it, where a step's new value is stored while the step still reads the old."""

    value: Value
    next: str | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype


def carried_states(w: Writer, init: Sequence[Value], dtypes: Sequence) -> list[CarriedState]:
    """The states of a loop started at `init` (as `dtypes`), written here (CarriedState)."""
    states = []
    for v, dtype in zip(init, dtypes, strict=True):
        dtype = np.dtype(dtype)
        if v.shape == ():
            states.append(CarriedState(Scalar(w.assign(cast(w.element(v, ()), dtype, v.dtype), "acc"), dtype)))
            continue
        now, after = w.fresh("b"), w.fresh("b")
        for name in (now, after):
            w.emit(Buffer(name, tuple(v.shape), dtype))
        w.each_index(tuple(v.shape), lambda idx, v=v, now=now: w.emit(Store(now, idx, cast(w.element(v, idx), dtype, v.dtype))))
        states.append(CarriedState(Stored(now, tuple(v.shape), dtype), after))
    return states


def advance(w: Writer, states: Sequence[CarriedState], made: Sequence[Value]) -> None:
    """Each state set to its value in `made`: every new value computed from the old states before any state
    is overwritten. An array state whose new element reads only its own old element, and which no other
    state's new value reads (a gradient's sum of outer products, `G <- G + a b^T`), is updated in place; the
    others are stored apart and copied in."""
    scalars = {k: w.assign(w.element(m, ())) for k, (s, m) in enumerate(zip(states, made, strict=True))
               if s.next is None}
    arrays = [(s, m) for s, m in zip(states, made) if s.next is not None and m != s.value]  # unchanged: no copy
    probes = {s.value.name: _element_text(w, m) for s, m in arrays}
    places = {s.value.name: ", ".join(_probe_index(len(s.value.shape))) for s, _ in arrays}
    in_place = {name for name, text in probes.items()
                if len(_subscripts(name, text)) == len(_subscripts(name, text, places[name]))
                and not any(_subscripts(name, other) for o, other in probes.items() if o != name)}
    for s, m in sorted(arrays, key=lambda sm: sm[0].value.name in in_place):  # those stored apart first
        target = s.value.name if s.value.name in in_place else s.next
        w.each_index(s.value.shape, lambda idx, s=s, m=m, target=target: w.emit(
            Store(target, idx, cast(w.element(m, idx), s.dtype, m.dtype))))
    for k, result in scalars.items():
        w.emit(Assign(states[k].value.expr, result))
    for s, _ in arrays:
        if s.value.name not in in_place:
            w.each_index(s.value.shape, lambda idx, s=s: w.emit(Store(s.value.name, idx, f"{s.next}[{', '.join(idx)}]")))


UNROLLED_STEPS = 256  # a loop over scalar states of at most this many statements in all is written unrolled


def _logsumexp(w: Writer, identity: Value, x: Value, dtype: np.dtype) -> Scalar:
    """A logaddexp fold as its maximum m, then m + log(sum of exp(x - m)): two folds whose steps carry no
    transcendental function (a backend runs the exponentials of several elements at once), where the fold
    of logaddexp itself computes an exponential and a logarithm per element, each waiting for the last.
    Non-finite m (all -inf, an inf, a NaN) is the result, as logaddexp gives it."""
    t = f"np.{np.dtype(dtype).name}"
    if isinstance(x, Pull) and (x.heavy or _calls_a_function(w, x)):  # read by both folds: computed once
        x = w.materialise(x)
    start = w.element(identity, ())
    most = w.assign(start, "acc")
    w.loop(x.shape[0], lambda i: w.emit(Assign(most, f"_maximum({most}, {w.element(x, (i,))})")),
           (_lane_merge(w, most, start, "_maximum({0}, {1})"),))
    carried = carry_for("add", [dtype]) if _long(x) else None  # a long row's float32 sum carried in float64
    wide = f"np.{(carried or (np.dtype(dtype),))[0].name}"
    total = w.assign(f"{wide}(math.exp({t}(({start} - {most}))))", "acc")

    def add(i: str) -> None:
        term = w.assign(f"{t}(math.exp({t}(({w.element(x, (i,))} - {most}))))")
        w.emit(Assign(total, f"{wide}(({total} + {term}))"))

    w.loop(x.shape[0], add, (_lane_merge(w, total, f"{wide}(0.0)", "{0} + {1}"),))
    # m - m is 0 for a finite m; otherwise (NaN, inf) m is the result, and the sum (NaN then) is not read
    return Scalar(w.assign(f"({most} if {most} - {most} != 0 else {t}(({most} + {t}(_log({total})))))"), dtype)


_FUNCTION_CALL = re.compile(r"math\.|(?<![\w.])_[a-z]\w*\(")


def _calls_a_function(w: Writer, x: Pull) -> bool:
    """Whether an element of `x` calls a function (a transcendental, a NaN-aware helper): worth storing
    rather than computing twice."""
    return _FUNCTION_CALL.search(_element_text(w, x)) is not None


def _subscripts(name: str, text: str, index: str | None = None) -> list[str]:
    """The places `text` subscripts array `name` (at `index` only, where given)."""
    return re.findall(rf"(?<![\w.]){name}\[" + (re.escape(index + "]") if index is not None else ""), text)


def _probe_index(ndim: int) -> tuple[str, ...]:
    return tuple(f"__probe{k}__" for k in range(ndim))


def _element_text(w: Writer, x: Value) -> str:
    """The text computing an element of `x` would write here (what is already computed where it is read is
    not written again), asked without writing it; the element's index is `_probe_index`."""
    nodes, [expr] = w.probed(lambda: [w.element(x, _probe_index(len(x.shape)))])
    return "\n".join([*statement_lines(nodes, 0, lambda buffer, indent: ""), expr])


def _lane_merge(w: Writer, acc: str, identity: str, operator: str) -> LaneFold:
    """The LaneFold of one accumulator folded with `operator` (a template of two operands)."""
    left, right = w.fresh("l"), w.fresh("r")
    merge, results = w.written_apart(lambda: [w.assign(operator.format(left, right))])
    return LaneFold((acc,), (identity,), (left,), (right,), merge, tuple(results))


def lane_fold(w: Writer, operator: Program, consts, accs: list[str], identities: list[str], dtypes) -> LaneFold:
    """The fold's operator written once apart, on two states named here, for a backend that folds in lanes."""
    left, right = [w.fresh("l") for _ in accs], [w.fresh("r") for _ in accs]

    def combine() -> list[str]:
        states = [Scalar(n, d) for n, d in zip(left + right, dtypes + dtypes)]
        return [w.assign(w.element(c, ())) for c in w.body(operator, list(consts) + states)]

    merge, results = w.written_apart(combine)
    return LaneFold(tuple(accs), tuple(identities), tuple(left), tuple(right), merge, tuple(results))


def nestable(program: Program) -> str | None:
    """Why `program` (a body) has a statement the loop nest cannot write, or None."""
    for stmt in program.stmts:
        if _rules.get(stmt.prim) is None or (isinstance(stmt.prim, Elementwise) and stmt.prim.op not in TEMPLATES):
            return f"{stmt.prim.name} has no loop-nest rule"
        if isinstance(stmt.prim, Reduce) and any(a.aval.ndim != 1 for a in stmt.args[stmt.prim.num_consts + stmt.prim.num_leaves:]):
            return f"a {stmt.prim.name} of elements that are not scalars"
        for body in stmt.prim.bodies():
            problem = nestable(body)
            if problem is not None:
                return problem
    return None
