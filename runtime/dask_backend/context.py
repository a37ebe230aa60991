"""One sharded call's bookkeeping: the client, the workers, task keys, and submitting a statement's work.

Every task of a call gets a key with the call's prefix, so the bytes Dask moved for the call can be read
back from the workers' own transfer logs (transfers.py). Shard programs are built once per sharded
function and signature (`programs`, shared across calls) and compiled once per worker (tasks.py).
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from fold.ir import Primitive, Var
from fold.dtypes import ShapedArray

from . import tasks
from .placement import Rep, Split
from .fusion import Elem, LazyOut, ShardBuilder
from .programs import statement_program


class Context:
    def __init__(self, client: Any, workers: Sequence[str], backend: str, prefix: str, plan_id: str, programs: dict,
                 resident: Any, threads: dict[str, int] | None = None):
        self.client = client
        self.threads = threads or {}  # per worker, the threads its shard programs' parallel loops run on
        self.resident = resident  # the sharded function's inputs on the workers (resident.py)
        self.phases: dict[str, float] = {}  # seconds per phase of the call on the client (api.py)
        self.task_bytes = 0  # array bytes given to this call's tasks as arguments (sent with the task)
        self.workers = list(workers)
        self.backend = backend
        self.prefix = prefix
        self.plan_id = plan_id
        self.programs = programs  # (what, shapes) -> (key, Program), kept by the Sharded function
        self.merges: list[tuple[int, bool]] = []  # per combine: (bytes of the right state, moved between workers)
        self._count = itertools.count()
        self._slices: dict = {}
        self._builders: dict[tuple, ShardBuilder] = {}  # the open shard program of each (chunking, chunk)
        self.tasks = 0

    # ------------------------------------------------------------ shard-local work: recorded, fused on flush

    def shard_node(self, group: tuple, worker: str | None, what: tuple, program: Any, inputs: Sequence[Any]) -> list[LazyOut]:
        """Record `program` applied to `inputs` in the open shard program of chunk `group` (on `worker`)."""
        builder = self._builders.get(group)
        if builder is None or builder.closed:
            builder = self._builders[group] = ShardBuilder(worker, f"chunk {group[0]}")
        return builder.add(what, program, inputs)

    def run_shard(self, index: int, tag: str, prim: Primitive, args: Sequence, values: list, avals: list[ShapedArray],
                  worker: str | None, group: tuple, n_out: int) -> list[LazyOut]:
        """Apply `prim` to shard `group`'s `values`, as a node of that chunk's shard program (not a task)."""
        shapes = tuple((a.shape, a.dtype.str) for a in avals)
        what = (index, tag, shapes)
        _, program = self.program(what, lambda: statement_program(prim, args, avals, f"shard of statement {index} ({tag})"))
        variables = [v for v, a in zip(values, args, strict=True) if isinstance(a, Var)]
        return self.shard_node(group, worker, what, program, variables)

    def elem(self, lazy: LazyOut) -> Elem:
        """Where `lazy` lives once computed: its shard program is submitted if it has not been yet."""
        if lazy.elem is None:
            lazy.builder.flush(self)
        return lazy.elem

    def force(self, x: Any) -> Any:
        """`x` with every LazyOut / Elem (in lists and tuples too) replaced by a future of its value alone."""
        if isinstance(x, LazyOut):
            if x.future is None:
                e = self.elem(x)
                x.future = self._submit(tasks.item, e.packed, e.j, worker=x.builder.worker, name="item")
            return x.future
        if isinstance(x, Elem):
            return self._submit(tasks.item, x.packed, x.j, worker=None, name="item")
        if isinstance(x, (list, tuple)):
            return type(x)(self.force(v) for v in x)
        return x

    def pack(self, values: Sequence[Any], worker: str | None) -> Any:
        """A future of the tuple of `values` (a chunk's fold state): one `select` task when they all come out
        of one shard program, instead of a task per value."""
        elems = [self.elem(v) if isinstance(v, LazyOut) else v for v in values]
        if elems and all(isinstance(e, Elem) for e in elems) and len({id(e.packed) for e in elems}) == 1:
            return self.submit(tasks.select, elems[0].packed, [e.j for e in elems], worker=worker, name="pack")
        return self.submit(tasks.pack, *values, worker=worker, name="pack")

    def flush_all(self) -> None:
        """Submit every open shard program (at the end of a call, so every task is submitted)."""
        for builder in list(self._builders.values()):
            builder.flush(self)

    def submit(self, fn: Callable, *args: Any, worker: str | None, name: str) -> Any:
        """A task of this call, run on `worker` if it is alive (elsewhere if not: tasks are pure). Lazy shard
        values among `args` are computed first (their shard programs submitted)."""
        return self._submit(fn, *self.force(list(args)), worker=worker, name=name)

    def _submit(self, fn: Callable, *args: Any, worker: str | None, name: str) -> Any:
        self.tasks += 1
        self.task_bytes += _array_bytes(args)
        where = {"workers": [worker], "allow_other_workers": True} if worker else {}
        return self.client.submit(fn, *args, key=f"{self.prefix}-{name}-{next(self._count)}", pure=False, **where)

    def program(self, what: tuple, build: Callable) -> tuple[str, Any]:
        """The shard program named by `what` (built on first use), with its per-worker cache key."""
        entry = self.programs.get(what)
        if entry is None:
            entry = (f"{self.plan_id}-{len(self.programs)}", build())
            self.programs[what] = entry
        return entry

    def run(self, index: int, tag: str, prim: Primitive, args: Sequence, values: list, avals: list[ShapedArray],
            worker: str | None, n_out: int) -> list:
        """Apply `prim` (the statement's, or its per-shard variant) to `values` on `worker`: a compiled fold
        program when it has bodies (a fold), the NumPy reference for one elementwise or structural step.
        `args` are the statement's atoms (literals are inlined into the program); `tag` names the variant."""
        if prim.bodies():
            shapes = tuple((a.shape, a.dtype.str) for a in avals)
            key, program = self.program((index, tag, shapes),
                                        lambda: statement_program(prim, args, avals, f"shard of statement {index} ({tag})"))
            variables = [v for v, a in zip(values, args, strict=True) if isinstance(a, Var)]
            packed = self.submit(tasks.run_threaded, key, program, self.backend, self.threads.get(worker), *variables,
                                 worker=worker, name=prim.name)
        else:
            packed = self.submit(tasks.run_primitive, prim, *values, worker=worker, name=prim.name)
        return [self.submit(tasks.item, packed, i, worker=worker, name="item") for i in range(n_out)]

    def sliced(self, rep: Rep, axis: int, chunks: tuple[int, ...], workers: Sequence[str]) -> list:
        """A whole value cut to meet a split one, piece k a future on `workers[k]`. A whole input (a copy
        on every worker) is cut on each worker from its own copy: nothing moves. A value the client made
        (a literal, an iota) is cut on the client and its pieces scattered like an input's chunks, kept
        across calls by their contents (resident.py). Otherwise it is cut where it lives. Each cut is made
        once per call however many shard programs read it (a gradient's forward and backward). The cut is
        forgotten when `rep` is freed: a later value may be given its address (its id)."""
        cache_key = (id(rep), axis, chunks, tuple(workers))
        if cache_key not in self._slices:
            weakref.finalize(rep, self._slices.pop, cache_key, None)
            offsets = [int(o) for o in np.cumsum((0,) + chunks)]
            bounds = list(zip(offsets[:-1], offsets[1:], workers, strict=True))
            if isinstance(rep.value, np.ndarray):
                self._slices[cache_key] = self.resident.chunks(rep.value, axis, chunks, workers, constant=True)
            else:
                self._slices[cache_key] = [self.submit(tasks.take, rep.on(w), axis, a, b,
                                                       worker=w if w in rep.copies else rep.worker, name="slice")
                                           for a, b, w in bounds]
        return self._slices[cache_key]


def _array_bytes(x: Any) -> int:
    """The bytes of the NumPy arrays in `x` (through lists and tuples; futures are references: 0)."""
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, (list, tuple)):
        return sum(_array_bytes(v) for v in x)
    return 0


def literal(value: np.ndarray) -> Rep:
    array = np.asarray(value)
    return Rep(array, ShapedArray(array.shape, array.dtype))


def split_like(parts: list, axis: int, template: Split, aval: ShapedArray) -> Split:
    return Split(axis, template.chunks, tuple(parts), template.workers, aval)
