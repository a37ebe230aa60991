"""`fold.run` and `fold.jit`: trace once per input signature, compile for a backend, run."""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable, Sequence

import numpy as np

from fold.api import captured_consts, keywords_as_positional, signature_of, trace_signature
from fold.dtypes import is_static_int
from fold.cse import cse
from fold.dce import dce
from fold.errors import FoldRuntimeError, FoldTypeError
from fold.gemm import blocks_of_at_most
from fold.inline import inline_program
from fold.ir import Program
from fold.pytree import tree_flatten
from fold.tracing import Tracer, current_scope

from .backends import get_backend
from .operator_checks import check_identities, check_mode, has_user_folds


def _finish(outs: list[np.ndarray], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs as arrays of the caller's own: a view made by broadcasting is read-only, and an output that
    is an input, a view of one (a reshape) or another output would change with it when written to."""
    finished: list[np.ndarray] = []
    for o in outs:
        if not (o.flags.writeable and o.flags.c_contiguous) or _shares_memory(o, [*inputs, *finished]):
            o = _own_copy(o)
        finished.append(o)
    return finished


def _own_copy(o: np.ndarray) -> np.ndarray:
    """A C-ordered copy; a copy too large to make is a FoldRuntimeError naming its size, as for any statement
    (a broadcast output, replicate(10**12, x), is a view of one element until it is copied for the caller)."""
    try:
        return np.array(o, order="C")
    except MemoryError as err:
        raise FoldRuntimeError(f"the output {o.dtype.name}{list(o.shape)} ({o.nbytes / 2**30:.3g} GiB) cannot be "
                               f"allocated: {err}") from err


def _shares_memory(o: np.ndarray, others: list[np.ndarray]) -> bool:
    if o.base is None:  # o owns its buffer: only o itself or a view of it can overlap it
        return any(other is o or other.base is o for other in others)
    return any(np.may_share_memory(o, other) for other in others)


def _array_key(args: tuple) -> tuple | None:
    """(shape, dtype) of each argument when every one is a NumPy array in the machine's byte order (then it is
    the call's signature), else None."""
    for a in args:
        if type(a) is not np.ndarray or not a.dtype.isnative:
            return None
    return tuple((a.shape, a.dtype) for a in args)


class Jitted:
    """`f` traced once per input signature and compiled once per backend; calls run the compiled program.

    `compile_seconds` (tracing, transformation and the backend's compilation, kernels included) and
    `trace_count` report the one-off costs apart from run time.
    """

    def __init__(self, f: Callable[..., Any], backend: str | None = None, static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = (), results: str = "numpy"):
        if not callable(f):
            raise FoldTypeError(f"fold.jit: expected a function, got {type(f).__name__}")
        if results not in RESULTS:
            raise FoldTypeError(f"fold.jit: results must be one of {', '.join(map(repr, RESULTS))}, got {results!r}")
        self.f = f
        self.backend = backend
        self.results = results
        self.static_argnums = tuple(dict.fromkeys(_argnums(static_argnums) + _argnames(f, static_argnames)))
        self._per_static: dict = {}  # static argument values, or keyword names -> the Jitted that binds them
        self._compiled: dict = {}
        self._by_arrays: dict = {}  # (backend, (shape, dtype) per argument) -> a _compiled entry: warm calls on arrays
        self._trace_seconds = 0.0
        self._trace_count = 0
        self._f_signature: inspect.Signature | None = None
        self.__name__ = getattr(f, "__name__", "jitted")
        self.__doc__ = getattr(f, "__doc__", None)

    @property
    def compile_seconds(self) -> float:
        """Seconds spent tracing and compiling so far; a backend that compiles lazily (numba: kernels on the
        call that first needs them) adds its compile time as it is spent."""
        return (self._trace_seconds + sum(getattr(c, "compile_seconds", 0.0) for _, c in self._compiled.values())
                + sum(j.compile_seconds for j in self._per_static.values()))

    def program(self, *args: Any) -> Program:
        """The traced Program for arguments shaped like `args`."""
        if self.static_argnums:
            bound, dynamic = self._bound(args)
            return bound.program(*dynamic)
        _, signature = signature_of(args, f"fold.jit({self.__name__})")
        return trace_signature(self.f, signature)

    def _bound(self, args: tuple) -> tuple["Jitted", tuple]:
        """(the Jitted of f with the static arguments' values bound, the other arguments)."""
        count = len(args)
        outside = [i for i in self.static_argnums if not -count <= i < count]
        if outside:
            raise FoldTypeError(f"fold.jit({self.__name__}): static_argnums names argument {outside[0]}, but the call "
                                f"has {count} arguments")
        positions = sorted({i % count for i in self.static_argnums})
        values = tuple(args[i] for i in positions)
        try:
            key = (count, tuple(positions), _typed(values))  # with_statics is made for `count` arguments
            bound = self._per_static.get(key)
        except TypeError:
            raise FoldTypeError(f"fold.jit({self.__name__}): static arguments must be hashable (they key the "
                                f"compiled program), got {', '.join(type(v).__name__ for v in values)} at "
                                f"positions {positions}") from None
        if bound is None:
            def with_statics(*dynamic: Any) -> Any:  # holds the static values, not the call's arrays
                rest, static = iter(dynamic), dict(zip(positions, values, strict=True))
                return self.f(*[static[i] if i in static else next(rest) for i in range(count)])

            with_statics.__name__ = self.__name__
            bound = self._per_static[key] = Jitted(with_statics, self.backend, results=self.results)
        return bound, tuple(a for i, a in enumerate(args) if i not in positions)

    def _placed(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call with every argument that can be positional made positional (as `f`'s signature binds it), so
        that static_argnums names the same parameters however they were passed."""
        try:
            bound = self._signature().bind(*args, **kwargs)
        except (TypeError, ValueError):  # a call f itself would refuse, or no signature: f raises its own error
            return args, kwargs
        args, kwargs = bound.args, bound.kwargs
        unplaced = [i for i in self.static_argnums if not -len(args) <= i < len(args)]
        if unplaced and kwargs:
            raise FoldTypeError(f"fold.jit({self.__name__}): static argument {unplaced[0]} cannot be placed: the call "
                                f"passes {', '.join(sorted(kwargs))} by keyword after an omitted argument; pass the "
                                f"arguments up to it positionally")
        return args, kwargs

    def _signature(self) -> inspect.Signature:
        """f's signature, found once (tens of microseconds each time, on every call with keywords)."""
        if self._f_signature is None:
            self._f_signature = inspect.signature(self.f)
        return self._f_signature

    @property
    def trace_count(self) -> int:
        """How many signatures `f` was traced for (with those of each static value and set of keywords)."""
        return self._trace_count + sum(j.trace_count for j in self._per_static.values())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs and self.static_argnums:  # static_argnums counts f's parameters: keyword ones are placed first
            args, kwargs = self._placed(args, kwargs)
        if kwargs:  # traced like the positional arguments: one Jitted per count of those and set of keyword names
            names = tuple(sorted(kwargs))
            per_names = self._per_static.get((len(args), names))
            if per_names is None:
                count = len(args)
                statics = tuple(i % count for i in self.static_argnums)  # all among the positional ones (_placed)
                per_names = self._per_static[(count, names)] = Jitted(keywords_as_positional(self.f, count, names),
                                                                      self.backend, statics, results=self.results)
            return per_names(*args, *(kwargs[k] for k in names))
        if self.static_argnums:
            bound, dynamic = self._bound(args)
            return bound(*dynamic)
        if self.results == "device" or _has_device_leaf(args):
            return self._call_on_device(args)
        arrays = _array_key(args)
        if arrays is not None and current_scope() is None:  # the common warm call, without flattening a pytree
            entry = self._by_arrays.get((get_backend(self.backend).name, arrays))
            if entry is not None:
                program, compiled = entry
                inputs = list(args)
                return program.out_tree.unflatten(_finish(compiled(inputs), inputs))
        leaves, signature = signature_of(args, f"fold.jit({self.__name__})")
        if current_scope() is not None or any(isinstance(leaf, Tracer) for leaf in leaves):
            program = trace_signature(self.f, signature)
            return program.out_tree.unflatten(inline_program(program, captured_consts(program) + list(leaves)))
        backend = get_backend(self.backend)
        key = (backend.name, signature)
        entry = self._compiled.get(key)
        first_call = entry is None
        if first_call:
            start = time.perf_counter()
            program = _traced_for(backend, self.f, signature)
            compiled = backend.compile(dce(cse(program)))  # what the outputs do not need is never run; nothing twice
            if hasattr(compiled, "label"):  # a backend that reports its compiles names the function in them
                compiled.label = self.__name__
            entry = (program, compiled)
            self._trace_seconds += time.perf_counter() - start
            self._trace_count += 1
            self._compiled[key] = entry
        if arrays is not None:
            self._by_arrays[(backend.name, arrays)] = entry
        program, compiled = entry
        inputs = [np.asarray(leaf) for leaf in leaves]
        if first_call and check_mode() and has_user_folds(program):
            check_identities(dce(program), inputs)  # check mode: identities checked on the data, once per signature
        return program.out_tree.unflatten(_finish(compiled(inputs), inputs))


    def _call_on_device(self, args: tuple) -> Any:
        """A call on a backend that keeps values on a device (cuda): device arrays among the arguments are
        taken as they are, and the results are device arrays where `results="device"`, else NumPy arrays."""
        backend = get_backend(self.backend)
        is_device = getattr(backend, "is_device_value", None)
        if is_device is None:
            raise FoldTypeError(f"fold.jit({self.__name__}): the {backend.name} backend keeps no values on a device; "
                                f"results='device' and device-array arguments need backend='cuda'")
        if current_scope() is not None:
            raise FoldTypeError(f"fold.jit({self.__name__}): results='device' cannot be used inside a trace")
        leaves, treedef = tree_flatten(args)
        stand_ins = tuple(_stand_in(leaf) if is_device(leaf) else leaf for leaf in leaves)
        _, signature = signature_of(treedef.unflatten(list(stand_ins)), f"fold.jit({self.__name__})")
        key = (backend.name, signature)
        entry = self._compiled.get(key)
        if entry is None:
            start = time.perf_counter()
            program = _traced_for(backend, self.f, signature)
            entry = (program, backend.compile(dce(cse(program))))
            self._trace_seconds += time.perf_counter() - start
            self._trace_count += 1
            self._compiled[key] = entry
        program, compiled = entry
        inputs = [leaf if is_device(leaf) else np.asarray(leaf) for leaf in leaves]
        if self.results == "device":
            return program.out_tree.unflatten(compiled.on_device(inputs))
        return program.out_tree.unflatten(_finish(compiled(inputs), [i for i in inputs if isinstance(i, np.ndarray)]))


RESULTS = ("numpy", "device")


def _traced_for(backend: Any, f: Callable[..., Any], signature: Any) -> Program:
    """f traced for `backend`: its gemm_map_reduces' automatic blocks within the backend's cap, where it has
    one (`gemm_block_bytes`)."""
    with blocks_of_at_most(getattr(backend, "gemm_block_bytes", None)):
        return trace_signature(f, signature)


def _has_device_leaf(args: tuple) -> bool:
    """Whether an argument is an array that lives on a GPU (it has __cuda_array_interface__, or is Numba's
    simulated device array): checked without importing numba or CuPy."""
    if all(type(a) is np.ndarray for a in args):  # the common call: nothing to flatten
        return False
    return any(type(leaf) is not np.ndarray and (hasattr(leaf, "__cuda_array_interface__") or
                                                  hasattr(leaf, "__cuda_ndarray__")) for leaf in tree_flatten(args)[0])


def _stand_in(leaf: Any) -> np.ndarray:
    """A NumPy array of the device array's shape and dtype that holds no memory: what tracing needs of it."""
    return np.lib.stride_tricks.as_strided(np.zeros((), leaf.dtype), tuple(leaf.shape), (0,) * len(leaf.shape))


def jit(f: Callable[..., Any], backend: str | None = None, static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (), results: str = "numpy") -> Jitted:
    """`f` as a function that is traced once per input signature and runs on `backend`.

    `static_argnums`: the positions of arguments that are not traced but passed to `f` as they are (sizes,
    flags, anything hashable): `f` is traced once per distinct value of them, as `jax.jit`'s.
    `static_argnames`: the same by parameter name (a parameter that may be passed by position or keyword).
    Transformations pass such values on untraced: `fold.jit(fold.grad(f), static_argnums=2)` works where `f`
    uses its third argument as a loop count.
    `results`: "numpy" (the default) returns NumPy arrays; "device" (backend="cuda" only) leaves them on the
    GPU as device arrays (CuPy's on a GPU). On the cuda backend, device arrays may also be passed as
    arguments: they are used where they are, not copied.

    >>> import numpy as np, fold
    >>> g = fold.jit(lambda x: fold.reduce(fold.monoids.sum, x * x))
    >>> float(g(np.arange(4.0)))
    14.0
    """
    return Jitted(f, backend, static_argnums, static_argnames, results)


def _argnames(f: Callable[..., Any], names: str | Sequence[str]) -> tuple[int, ...]:
    """The positions of the parameters `names` of `f` (static_argnames as static_argnums)."""
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        return ()
    try:
        parameters = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        raise FoldTypeError(f"fold.jit: static_argnames={names!r} needs the function's signature, which Python "
                            f"cannot find for {f!r}; use static_argnums") from None
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    missing = [n for n in names if n not in positional]
    if missing:
        raise FoldTypeError(f"fold.jit: static_argnames names {missing}, which are not parameters of "
                            f"{getattr(f, '__name__', 'f')} that can be passed by position (those are {positional})")
    return tuple(positional.index(n) for n in names)


def _typed(value: Any) -> Any:
    """`value` with the type of each part beside it: 2, 2.0 and True are equal and hash alike, but a program
    traced for one is not the program for another (int64 or float64 results, a flag or a count)."""
    if isinstance(value, tuple):  # (a list stays unhashable: static arguments must be)
        return type(value), tuple(_typed(v) for v in value)
    return type(value), value


def _argnums(static_argnums: Any) -> tuple[int, ...]:
    nums = tuple(static_argnums) if isinstance(static_argnums, (tuple, list, range)) else (static_argnums,)
    if not all(is_static_int(i) for i in nums):
        raise FoldTypeError(f"fold.jit: static_argnums must be an int or a sequence of ints, got {static_argnums!r}")
    return tuple(int(i) for i in nums)


def run(f: Callable[..., Any], *args: Any, backend: str | None = None) -> Any:
    """Trace `f` on `args` and run it (on the default backend unless `backend` names one)."""
    return Jitted(f, backend)(*args)
