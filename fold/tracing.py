"""Tracing: running a Python function on tracer values to record a Program.

A `Scope` collects the statements of one function being traced: the whole program, or the body of a
map/reduce/scan/loop. Scopes nest the way the user's lambdas nest. When a body uses a tracer of an
enclosing scope (a weight vector inside a map body), the body's scope captures it: the body gets a fresh
input for it, and the combinator passes the outer variable in as a "const". Capture works at any depth,
each scope asking its parent. A tracer whose scope has closed and is no ancestor of the current one has
escaped its trace, and using it is an error.

`bind` is the one place where statements are made. With no trace active, `bind` evaluates the primitive
at once on the numpy backend (eager mode), so `fold.exp(np.ones(3))` works outside any trace.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable, Sequence

import numpy as np

from .dtypes import SUPPORTED_DTYPES, ShapedArray, check_dtype, native_byte_order
from .errors import ConcretizationError, EscapedTracerError, FoldTypeError
from .ir import Atom, Let, Lit, Primitive, Program, Var
from .pytree import TreeDef, leaf_paths, tree_flatten
from .rules import RuleTable

shape_rules = RuleTable("shape")

_state = threading.local()


def _stack() -> list["Scope"]:
    if not hasattr(_state, "scopes"):
        _state.scopes = []
    return _state.scopes


def current_scope() -> "Scope | None":
    stack = _stack()
    return stack[-1] if stack else None


class Scope:
    """The statements, inputs and captured outer variables of one function being traced."""

    def __init__(self, parent: "Scope | None", label: str):
        self.parent = parent
        self.label = label
        self.inputs: list[Var] = []
        self.stmts: list[Let] = []
        self.captures: dict[Var, Var] = {}  # outer variable -> this scope's input standing for it
        self.closed = False

    def __enter__(self) -> "Scope":
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        popped = _stack().pop()
        assert popped is self
        self.closed = True

    def new_input(self, aval: ShapedArray, hint: str | None = None) -> "Tracer":
        var = Var(aval, hint)
        self.inputs.append(var)
        return Tracer(var, self)

    def ancestors(self) -> list["Scope"]:
        out, scope = [], self.parent
        while scope is not None:
            out.append(scope)
            scope = scope.parent
        return out

    def resolve(self, tracer: "Tracer") -> Var:
        """The variable that stands for `tracer` in this scope, capturing it from an enclosing one if needed."""
        if tracer.scope is self:
            return tracer.var
        if self.parent is None or tracer.scope not in self.ancestors():
            raise EscapedTracerError(
                f"a tracer of shape {tracer.aval} from the trace of '{tracer.scope.label}' was used in "
                f"'{self.label}', outside the trace that created it (was it kept in a global or an "
                f"attribute and used after that trace ended?)"
            )
        outer = self.parent.resolve(tracer)
        inner = self.captures.get(outer)
        if inner is None:
            inner = Var(outer.aval, outer.hint)
            self.captures[outer] = inner
        return inner

    def atom(self, value: "Tracer | np.ndarray") -> Atom:
        if isinstance(value, Tracer):
            return self.resolve(value)
        return Lit(np.asarray(value))


class Tracer:
    """A value inside a traced function: it knows its shape and dtype, and records what is done with it.

    Arithmetic operators, indexing, `.T`, `@` and NumPy ufuncs are installed by `fold.ops`.
    """

    __slots__ = ("var", "scope")
    __array_priority__ = 1000

    def __init__(self, var: Var, scope: Scope):
        self.var = var
        self.scope = scope

    @property
    def aval(self) -> ShapedArray:
        return self.var.aval

    @property
    def shape(self) -> tuple[int, ...]:
        """The static shape, a tuple of ints (known while tracing)."""
        return self.var.aval.shape

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype."""
        return self.var.aval.dtype

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.var.aval.shape)

    @property
    def size(self) -> int:
        """The number of elements (static)."""
        return self.var.aval.size

    def __len__(self) -> int:
        if not self.shape:
            raise FoldTypeError("len() of a 0-d traced array")
        return self.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _concrete(self, what: str):
        raise ConcretizationError(
            f"{what} needs the concrete value of a traced array {self.aval}, which is unknown while tracing; "
            f"use fold.where(...) for data-dependent choices; {STATIC_HINT}"
        )

    def __bool__(self):
        self._concrete("bool() / an if-statement")

    def __float__(self):
        self._concrete("float()")

    def __int__(self):
        self._concrete("int()")

    def __index__(self):
        self._concrete("using it as a Python index")

    def __array__(self, *args, **kwargs):
        # NumPy also asks for this when a traced value indexes a NumPy array (table[i]), and when a NumPy
        # function gets a list holding traced values (np.sum([a, b]) makes an array of the list first)
        self._concrete("converting it to a NumPy array (which NumPy does when it indexes a NumPy array or list "
                       "with it: index a fold value instead, fold.ops.getitem(table, i), or pass the table as an "
                       "argument of the traced function; and when a NumPy function is given a list or tuple that "
                       "holds it, as in np.sum([a, b]): make one fold value of them first, np.stack([a, b]))")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Tracer<{self.aval}>"


# What to do when a size, a count or a flag arrives traced: said wherever one is refused
STATIC_HINT = ("a value the trace needs (a size, a count, a flag) must not be traced: close over it, or pass it "
               "to fold.jit(f, static_argnums=...) (the arguments of fold.jit and fold.run are traced, Python "
               "numbers too, and so is every primal of fold.vjp and fold.jvp: there close over it, as in "
               "fold.vjp(lambda x: f(x, n), x); fold.grad, jacfwd, jacrev and vmap pass a Python int they do not "
               "differentiate untraced)")


def bind(prim: Primitive, *args: "Tracer | np.ndarray") -> list[Any]:
    """Apply `prim` to `args`: record a statement in the current scope, or evaluate it now if none is active."""
    scope = current_scope()
    if scope is None:
        for arg in args:
            if isinstance(arg, Tracer):
                scope_label = arg.scope.label
                raise EscapedTracerError(
                    f"a tracer of shape {arg.aval} from the trace of '{scope_label}' was used after that trace "
                    f"ended (in '{prim.name}'): was it kept in a global or an attribute?"
                )
        from fold.runtime.eager import eval_primitive  # lazy: runtime depends on fold, not the other way

        return eval_primitive(prim, [np.asarray(a) for a in args])
    atoms = [scope.atom(a) for a in args]
    out_avals = shape_rules.lookup(prim)(prim, *[a.aval for a in atoms])
    outs = tuple(Var(aval) for aval in out_avals)
    scope.stmts.append(Let(outs, prim, tuple(atoms)))
    return [Tracer(v, scope) for v in outs]


def to_array_leaf(value: Any, where: str, path: str) -> "Tracer | np.ndarray":
    """A pytree leaf as a tracer or a NumPy array of a supported dtype, or a clear error."""
    if isinstance(value, Tracer):
        return value
    if isinstance(value, (bool, int, float, np.ndarray, np.generic)):
        if type(value) is int and not -2**63 <= value < 2**63:
            raise FoldTypeError(f"{where}: leaf {path} is the integer {value}, which does not fit in int64 (a Python "
                                f"int argument is traced as int64); pass a float, or close over it")
        array = native_byte_order(np.asarray(value))
        check_dtype(array.dtype, f"{where} (leaf {path})")
        return array
    raise FoldTypeError(
        f"{where}: leaf {path} is a {type(value).__name__} ({value!r:.60}), not an array: values must be NumPy "
        f"arrays, Python numbers, or tuples/lists/dicts/NamedTuples of them"
    )


def abstractify(args: Any, where: str) -> tuple[list, TreeDef, list[ShapedArray]]:
    """Flatten user arguments, check every leaf, and give each its abstract value."""
    leaves, treedef = tree_flatten(args)
    if all(type(leaf) is np.ndarray and leaf.dtype in SUPPORTED_DTYPES for leaf in leaves):
        checked = leaves  # the common case of a warm call; the leaf paths are only for error messages
    else:
        paths = leaf_paths(treedef)
        checked = [to_array_leaf(leaf, where, path) for leaf, path in zip(leaves, paths, strict=True)]
    avals = [leaf.aval if isinstance(leaf, Tracer) else ShapedArray(leaf.shape, leaf.dtype) for leaf in checked]
    return checked, treedef, avals


class TracedBody:
    """A traced lambda: its closed Program, the outer values it captured, and its output structure."""

    def __init__(self, program: Program, consts: list[Tracer], out_tree: TreeDef):
        self.program = program
        self.consts = consts
        self.out_tree = out_tree


def trace_body(
    fn: Callable, arg_trees: Sequence[Any], label: str, *, hints: Sequence[str] | None = None
) -> TracedBody:
    """Trace `fn` on abstract arguments (pytrees of ShapedArray) in a scope nested in the current one.

    The Program's inputs are the captured outer variables first, then the leaves of the arguments.
    """
    check_callable(fn, len(arg_trees), label)
    parent = current_scope()
    flat_avals, in_tree = tree_flatten(tuple(arg_trees))
    scope = Scope(parent, label)
    with scope:
        leaves = [scope.new_input(aval) for aval in flat_avals]
        args = in_tree.unflatten(leaves)
        result = fn(*args)
        out_leaves, out_tree = tree_flatten(result)
        paths = leaf_paths(out_tree)
        outputs = tuple(
            scope.atom(to_array_leaf(leaf, f"{label}: result of {_fn_name(fn)}", path))
            for leaf, path in zip(out_leaves, paths, strict=True)
        )
    captured_outer = list(scope.captures.keys())
    captured_inner = [scope.captures[v] for v in captured_outer]
    program = Program(
        inputs=tuple(captured_inner) + tuple(scope.inputs),
        stmts=tuple(scope.stmts),
        outputs=outputs,
        in_tree=in_tree,
        out_tree=out_tree,
        meta={"label": label, "num_consts": len(captured_inner)},
    )
    consts = [Tracer(v, parent) for v in captured_outer] if parent is not None else []
    return TracedBody(program, consts, out_tree)


def check_callable(fn: Any, count: int, label: str) -> None:
    """`fn` can be called with `count` positional arguments, or a FoldTypeError saying what it is and what it
    takes (a TypeError raised inside a body that does run is the user's own and passes through)."""
    if not callable(fn):
        raise FoldTypeError(f"{label}: expected a function, got {type(fn).__name__} ({fn!r:.60})")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check before calling it
        return
    try:
        signature.bind(*range(count))
    except TypeError as err:
        raise FoldTypeError(f"{label}: {_fn_name(fn)}{signature} cannot be called with {count} argument(s) "
                            f"({err})") from None


def _fn_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
