"""`fold.shard`: a fold function run sharded on a Dask cluster.

Why an entry point of its own rather than `fold.jit(f, backend="dask")`: a backend compiles a Program for
one process and is chosen by name alone, while sharding needs the user's split (per argument and axis),
the chunks and the cluster, and reports per call what a backend does not have (bytes moved between
workers). Each shard's folds still run on a backend (numba by default), compiled once per worker.
"""

from __future__ import annotations

import time
import uuid
import warnings
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from fold.api import signature_of, trace_signature
from fold.cse import cse
from fold.dce import dce
from fold.errors import FoldTypeError
from fold.ir import Program
from fold.pytree import tree_flatten

from .context import Context
from .executor import run_sharded
from .placement import Rep, Split
from .resident import Resident, direct
from .spec import ShardingError, as_split_dict, leaf_splits
from .transfers import bytes_moved

_default_client = None
ATTEMPTS = 3  # runs of one call: a worker lost with resident inputs only it held costs a rerun


def default_client() -> Any:
    """A Client on a LocalCluster of worker processes (one thread each), started on first use."""
    global _default_client
    if _default_client is None:
        from distributed import Client, LocalCluster

        _default_client = Client(LocalCluster(processes=True, threads_per_worker=1, dashboard_address=None))
    return _default_client


@dataclass(frozen=True)
class CallReport:
    """What one sharded call did: `bytes_moved` between workers (Dask's transfer logs), the bytes the
    combine trees' formula predicts (`combine_bytes`: a state per merge whose operands live on different
    workers), the merges, the tasks' key prefix, the call's wall time, and `bytes_sent` from the client
    to the workers (0 for inputs already resident from an earlier call: resident.py)."""

    bytes_moved: int
    combine_bytes: int
    merges: int
    cross_worker_merges: int
    prefix: str
    seconds: float
    tasks: int = 0  # the Dask tasks the call submitted (shard programs, slices, combines, gathers)
    bytes_sent: int = 0  # array bytes the client sent to the workers: inputs not resident yet, task arguments
    bytes_hashed: int = 0  # input bytes hashed to check that resident inputs are unchanged
    attempts: int = 1  # 2 when a worker was lost with inputs only it held, and the call ran again
    phases: dict = field(default_factory=dict)  # seconds on the client: plan (trace, first call), place (hash and
    # scatter the inputs), submit (build and submit the tasks), wait_and_gather (until the results are here),
    # assemble (concatenate split outputs), report (read the transfer logs); the last attempt's


class Sharded:
    """`f` run sharded on a Dask cluster: traced once per input signature, each statement run where its
    operands live (see `shard`). `last_call` reports the latest call."""

    def __init__(self, f: Callable, split: Mapping[int, int] | None, chunks: Any, client: Any, backend: str,
                 threads: int | None = None):
        if not callable(f):
            raise FoldTypeError(f"fold.shard: expected a function, got {type(f).__name__}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ShardingError(f"fold.shard: threads must be a positive int or None, got {threads!r}")
        self.f, self.split, self.chunks, self.backend, self.threads = f, as_split_dict(split), chunks, backend, threads
        self._cores: tuple | None = None
        self._client = client
        self._plans: dict = {}
        self._resident: Resident | None = None
        self.last_call: CallReport | None = None
        self.before_gather: Callable[[list], None] | None = None  # a test's hook: runs with the outputs' placements

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = default_client()
        return self._client

    @property
    def resident(self) -> Resident:
        """The inputs this function has placed on the workers, kept across calls while unchanged."""
        if self._resident is None:
            self._resident = Resident(self.client)
        return self._resident

    def release(self) -> None:
        """Drop the resident inputs (the workers free them); the next call sends its inputs again."""
        if self._resident is not None:
            self._resident.clear()

    def _threads(self, info: dict) -> dict[str, int]:
        """Per worker, its share of its host's cores for the shard programs' parallel loops: the host's cores
        times the worker's Dask threads over all the Dask threads of the host's workers (at least 1). Given,
        the `threads=` of fold.shard for every worker. The hosts' cores are asked once per set of workers."""
        if self.threads is not None:
            return {w: self.threads for w in info}
        key = tuple(sorted(info))
        if self._cores is None or self._cores[0] != key:
            from . import tasks

            self._cores = (key, self.client.run(tasks.host_cores))
        cores = self._cores[1]
        on_host: dict[str, int] = {}
        for w, i in info.items():
            on_host[i["host"]] = on_host.get(i["host"], 0) + int(i["nthreads"])
        return {w: max(1, cores.get(w, 1) * int(i["nthreads"]) // on_host[i["host"]]) for w, i in info.items()}

    def program(self, *args: Any) -> Program:
        """The Program that runs sharded for these arguments (dead code removed)."""
        return self._plan(args)[0]

    def _plan(self, args: tuple) -> tuple[Program, dict, str]:
        leaves, signature = signature_of(args, "fold.shard")
        plan = self._plans.get(signature)
        if plan is None:
            program = dce(cse(trace_signature(self.f, signature)))
            if len(program.inputs) != len(leaves):
                raise ShardingError("fold.shard: the function captures values of an enclosing trace; call it outside one")
            plan = self._plans[signature] = (program, {}, uuid.uuid4().hex[:12])
        return plan

    def __call__(self, *args: Any) -> Any:
        start = time.perf_counter()
        program, programs, plan_id = self._plan(args)
        leaves = [np.asarray(leaf) for leaf in tree_flatten(args)[0]]
        planned = time.perf_counter()
        for attempt in range(ATTEMPTS):
            try:
                values, ctx, prefix, since = self._run(program, programs, plan_id, args, leaves, first=attempt == 0)
                break
            except CancelledError:  # scattered inputs lost with a worker: send them again and rerun
                if not self.resident.drop_lost() or attempt == ATTEMPTS - 1:
                    raise
        resident = self.resident
        reported = time.perf_counter()
        moved = bytes_moved(self.client, prefix, resident.used_keys, since)
        phases = {"plan": planned - start, **ctx.phases, "report": time.perf_counter() - reported}
        self.last_call = CallReport(moved, sum(b for b, crossed in ctx.merges if crossed), len(ctx.merges),
                                    sum(crossed for _, crossed in ctx.merges), prefix, time.perf_counter() - start,
                                    ctx.tasks, resident.sent + ctx.task_bytes, resident.hashed, attempt + 1, phases)
        return program.out_tree.unflatten(values)

    def _run(self, program: Program, programs: dict, plan_id: str, args: tuple, leaves: list[np.ndarray],
             first: bool) -> tuple:
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        if not info:  # a cluster between a lost worker and its restart: wait for one rather than fail
            self.client.wait_for_workers(1, timeout=120)
            info = self.client.scheduler_info(n_workers=-1)["workers"]
        workers = sorted(info)
        splits = leaf_splits(args, self.split, self.chunks, len(workers))
        prefix = f"fold-{uuid.uuid4().hex[:12]}"
        since = time.time()
        self.resident.reset_counts()
        ctx = Context(self.client, workers, self.backend, prefix, plan_id, programs, self.resident, self._threads(info))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Dask warns of large arguments: they are the inputs, sent once
            mark = time.perf_counter()
            inputs = [_place(ctx, leaf, split, workers) for leaf, split in zip(leaves, splits, strict=True)]
            ctx.phases["place"] = time.perf_counter() - mark
            mark = time.perf_counter()
            outs = run_sharded(ctx, program, inputs)
            ctx.phases["submit"] = time.perf_counter() - mark
        if first and self.before_gather is not None:
            self.before_gather(outs)
        return _gather(ctx, outs), ctx, prefix, since


def _place(ctx: Context, leaf: np.ndarray, split: tuple[int, tuple[int, ...]] | None, workers: list[str]) -> Rep | Split:
    """An input on the workers, resident across calls while unchanged (resident.py). A whole one is
    scattered to every worker (a copy on each, which the tasks on that worker read, and which is cut there
    when it meets a split value); a split one is scattered chunk by chunk, chunk k to
    worker k * workers // chunks (chunks in contiguous runs)."""
    from fold.dtypes import ShapedArray

    aval = ShapedArray(leaf.shape, leaf.dtype)
    if split is None:
        copies = ctx.resident.whole(leaf, workers)
        return Rep(copies[workers[0]], aval, None, copies)
    axis, chunks = split
    owners = tuple(workers[k * len(workers) // len(chunks)] for k in range(len(chunks)))
    return Split(axis, chunks, tuple(ctx.resident.chunks(leaf, axis, chunks, owners)), owners, aval)


def _gather(ctx: Context, outs: list) -> list[np.ndarray]:
    futures = ctx.force([o.value if isinstance(o, Rep) else list(o.parts) for o in outs])
    start = time.perf_counter()
    got = ctx.client.gather(futures, direct=direct(ctx.client))  # waits for the tasks, then fetches
    ctx.phases["wait_and_gather"] = time.perf_counter() - start
    start = time.perf_counter()
    values = [np.asarray(g) if isinstance(o, Rep) else _assemble(g, o.axis) for o, g in zip(outs, got, strict=True)]
    ctx.phases["assemble"] = time.perf_counter() - start
    return values


def _assemble(chunks: list, axis: int) -> np.ndarray:
    """A split output from its gathered chunks: one chunk as it came (concatenating it would copy it all:
    4.6 s for the 1.07 GB dC of a one-worker gradient on this loaded machine), several concatenated."""
    if len(chunks) == 1:
        return np.asarray(chunks[0])
    return np.concatenate([np.asarray(x) for x in chunks], axis=axis)


def shard(f: Callable[..., Any], split: Mapping[int, int] | None = None, chunks: Any = None, *, client: Any = None,
          backend: str = "numba", threads: int | None = None) -> Sharded:
    """`f` run sharded over the workers of a Dask `client` (a LocalCluster of processes when None).

    `split` maps a positional argument to the axis its leaves are cut along (default {0: 0}: the first
    argument's rows); the other arguments are whole on every worker. `chunks`: how many even chunks (default:
    one per worker), the chunk sizes (as dask.array's), or a dict argument -> either. Chunk k lives on worker
    k * workers // chunks. Maps, elementwise code, reduce, scan, reduce_by_index and gemm_map_reduce run on
    the chunks where they live; folds combine their partial states with the operator in a tree, in order.
    Each shard's folds run as fold programs on `backend`, compiled once per worker. A statement that cannot
    run with its operands' split raises ShardingError naming it and the axis. Gradients shard the same way:
    `fold.shard(fold.value_and_grad(f, argnums=...), split=...)`. `Sharded.last_call` reports the bytes
    moved between workers and sent from the client, and where the call's time went.

    Inputs stay on the workers between calls: an array passed again, unchanged (same object, same bytes:
    hashed every call), is not sent again; `Sharded.release()` drops them. `threads`: the threads of each
    shard program's parallel loops (numba); None gives each worker its share of its host's cores.
    """
    return Sharded(f, split, chunks, client, backend, threads)
