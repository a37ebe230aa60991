"""The functions that run on the workers. Each is pure (its result depends on its arguments alone), so a
worker lost mid-run costs Dask a rerun of its tasks, never a wrong result.

Compiled programs are cached per worker process under a key the client gives (stable across calls of one
sharded function), so each shard program is compiled once per worker, not once per call.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

_compiled: dict[str, Callable] = {}


def run_program(key: str, program: Any, backend: str, *args: np.ndarray) -> tuple:
    """Run a flat fold Program on `backend` (compiled on first use in this worker) and return its outputs."""
    runner = _compiled.get(key)
    if runner is None:
        import fold
        from fold.inline import inline_program

        runner = fold.jit(lambda *xs: inline_program(program, list(xs)), backend=backend)
        _compiled[key] = runner
    return tuple(np.asarray(o) for o in runner(*args))


def run_fused(key: str, program: Any, backend: str, sources: list, slots: list, threads: int | None = None) -> tuple:
    """A fused shard program (fusion.py): input m is `sources[s]`, or its element j, for (s, j) = slots[m];
    its parallel loops on `threads` threads (see `use_threads`)."""
    args = [sources[s] if j is None else sources[s][j] for s, j in slots]
    use_threads(backend, threads)
    return run_program(key, program, backend, *args)


def run_threaded(key: str, program: Any, backend: str, threads: int | None, *args: np.ndarray) -> tuple:
    """`run_program` with its parallel loops on `threads` threads (see `use_threads`)."""
    use_threads(backend, threads)
    return run_program(key, program, backend, *args)


def use_threads(backend: str, threads: int | None) -> None:
    """Run this Dask thread's numba parallel loops on `threads` threads (numba's setting is per calling
    thread). The client gives each worker its share of its host's cores, so that workers sharing a host
    do not each start a thread per core: 2 workers on 2 cores, numba's default of 2 threads each, ran 4
    threads on 2 cores."""
    if threads is None or backend != "numba":
        return
    import numba

    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


def host_cores(dask_worker: Any = None) -> int:
    """The cores this worker process may run on (client.run: the client shares them among a host's workers)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def select(values: tuple, positions: list) -> tuple:
    """The elements at `positions` of a task's tuple result: a fold's per-chunk state out of a shard program."""
    return tuple(values[p] for p in positions)


def run_primitive(prim: Any, *args: np.ndarray) -> tuple:
    """One elementwise or structural primitive, evaluated by the NumPy reference (nothing to compile)."""
    from fold.runtime.eager import eval_primitive

    return tuple(eval_primitive(prim, [np.asarray(a) for a in args]))


def compiled_count() -> int:
    """How many programs this worker has compiled (tests check each is compiled once per worker)."""
    return len(_compiled)


def item(values: tuple, i: int) -> np.ndarray:
    return values[i]


def whole(value: np.ndarray) -> np.ndarray:
    """A value given to a task by the client: the task that holds it, so Dask can rerun it on loss."""
    return np.asarray(value)


def take(value: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of `value` along `axis`, as an array of its own (not a view of the whole)."""
    index = [slice(None)] * value.ndim
    index[axis] = slice(start, stop)
    return np.array(value[tuple(index)])


def pack(*values: np.ndarray) -> tuple:
    """A shard's fold state as one value (the tuple of its leaves), to be combined with another."""
    return tuple(values)


def run_offset(key: str, program: Any, backend: str, consts: list, offset: tuple, ys: list) -> tuple:
    """A chunk's local scan `ys` combined with the fold of the chunks before it (the scan's local pass)."""
    return run_program(key, program, backend, *consts, *offset, *ys)
