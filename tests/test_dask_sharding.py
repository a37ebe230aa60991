"""fold.shard on a LocalCluster of 2 worker processes: sharded results equal unsharded ones (float64, 1e-12
relative) for every combinator, both reduce rules' gradients, on random chunkings (uneven, one chunk, more
chunks than workers); clear errors for splits a program cannot run; bytes moved against the formula; a
worker killed mid-gradient. Shard programs run on the numpy backend here (no per-worker compile for each
random program); the examples' tests run them on numba, the default."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("distributed")
from hypothesis import given, settings, strategies as st  # noqa: E402

import fold  # noqa: E402
from fold.runtime.dask_backend import ShardingError  # noqa: E402

RTOL = 1e-12
FEW = settings(max_examples=6, deadline=None, derandomize=True)


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


def chunkings(n: int, multiple: int = 1):
    """Chunk sizes summing to n: uneven, one chunk, or more chunks than the 2 workers (multiples of `multiple`
    except the last)."""
    blocks = -(-n // multiple)

    @st.composite
    def draw(d):
        cuts = sorted(set(d(st.lists(st.integers(1, blocks - 1), max_size=4)))) if blocks > 1 else []
        edges = [0] + [c * multiple for c in cuts] + [n]
        return tuple(b - a for a, b in zip(edges[:-1], edges[1:]))

    return draw()


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=1e-13)


def sharded(f, client, chunks, split=None):
    return fold.shard(f, split=split or {0: 0}, chunks=chunks, client=client, backend="numpy")


def matmul_op(a, b):
    return a @ b


# ------------------------------------------------------------------ forward: every combinator

def dots_logsumexp(x, w):
    return fold.reduce(fold.monoids.logaddexp, fold.map(lambda r: fold.reduce(fold.monoids.sum, r * w), x))


@FEW
@given(chunkings(11))
def test_map_and_reduce(client, chunks):
    x, w = np.random.default_rng(0).normal(size=(11, 3)), np.arange(3.0)
    close(sharded(dots_logsumexp, client, chunks)(x, w), fold.run(dots_logsumexp, x, w))


def product(x):
    return fold.reduce(matmul_op, x, identity=np.eye(2))


@FEW
@given(chunkings(9))
def test_non_commutative_reduce_keeps_order(client, chunks):
    x = np.random.default_rng(1).normal(size=(9, 2, 2))
    close(sharded(product, client, chunks)(x), fold.run(product, x))


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@FEW
@given(chunks=chunkings(8))
def test_non_commutative_scan(client, chunks, exclusive, reverse):
    def f(x):
        return fold.scan(matmul_op, x, identity=np.eye(2), exclusive=exclusive, reverse=reverse)

    x = np.random.default_rng(2).normal(size=(8, 2, 2))
    close(sharded(f, client, chunks)(x), fold.run(f, x))


@FEW
@given(chunkings(13))
def test_reduce_by_index(client, chunks):
    def affine(p, q):  # composition of maps x -> a x + b: associative, not commutative
        return (p[0] * q[0], p[1] * q[0] + q[1])

    def f(idx, a, b):
        return fold.reduce_by_index(affine, 4, idx, (a, b), identity=(1.0, 0.0))

    rng = np.random.default_rng(3)
    idx, a, b = rng.integers(-1, 5, size=13), rng.normal(size=13), rng.normal(size=13)  # -1, 4: out of range, ignored
    got, want = sharded(f, client, chunks, {0: 0, 1: 0, 2: 0})(idx, a, b), fold.run(f, idx, a, b)
    close(got[0], want[0]), close(got[1], want[1])


def cross_entropy(P, C, t):
    j = fold.iota(C.shape[0])
    A = fold.gemm_map_reduce(fold.monoids.cross_entropy, lambda s, t, j: {"p": s, "n": fold.where(j == t, s, 0.0)},
                             P, C, rows=(t,), cols=(j,), block=(4, 4))
    return fold.sum(A["p"] - A["n"])


def ce_rows(P, C, t):
    j = fold.iota(C.shape[0])
    A = fold.gemm_map_reduce(fold.monoids.cross_entropy, lambda s, t, j: {"p": s, "n": fold.where(j == t, s, 0.0)},
                             P, C, rows=(t,), cols=(j,), block=(4, 4))
    return A["p"] - A["n"]


def ce_data():
    rng = np.random.default_rng(4)
    return rng.normal(size=(6, 3)), rng.normal(size=(14, 3)), rng.integers(0, 14, size=6)


@FEW
@given(chunkings(30))
def test_gradient_of_a_gather_in_a_sharded_map_scatters_each_shards_entries(client, chunks):
    # an embedding lookup's gradient: each shard's rows of scatter entries flattened (fold/scatter_sums.py)
    def loss(tokens, E, v):
        return fold.sum(fold.map(lambda t: fold.tanh(fold.sum(E[t] * v)), tokens))

    rng = np.random.default_rng(8)
    tokens, E, v = rng.integers(-20, 20, 30), rng.normal(size=(20, 4)), rng.normal(size=4)
    g = fold.grad(loss, argnums=(1, 2))
    got, want = sharded(g, client, chunks)(tokens, E, v), g(tokens, E, v)
    close(got[0], want[0]), close(got[1], want[1])


@FEW
@given(chunkings(14, multiple=4))
def test_gemm_map_reduce_over_columns(client, chunks):
    P, C, t = ce_data()
    close(sharded(ce_rows, client, chunks, {1: 0})(P, C, t), fold.run(ce_rows, P, C, t))


@FEW
@given(chunkings(6, multiple=4))
def test_gemm_map_reduce_over_rows(client, chunks):
    P, C, t = ce_data()
    close(sharded(ce_rows, client, {0: chunks, 2: chunks}, {0: 0, 2: 0})(P, C, t), fold.run(ce_rows, P, C, t))


# ------------------------------------------------------------------ gradients: both reduce rules

@pytest.mark.parametrize("rule", ["monoid", "generic"])
@FEW
@given(chunks=chunkings(10))
def test_reduce_gradient(client, chunks, rule):
    x, w = np.random.default_rng(5).normal(size=(10, 3)), np.linspace(-1, 1, 3)
    vg = fold.value_and_grad(dots_logsumexp, argnums=(0, 1), reduce_rule=rule)
    value, (gx, gw) = sharded(vg, client, chunks)(x, w)
    value0, (gx0, gw0) = vg(x, w)
    close(value, value0), close(gx, gx0), close(gw, gw0)


@FEW
@given(chunkings(7))
def test_scan_gradient(client, chunks):
    def f(a, b):  # a linear recurrence: the scan of affine maps (associative, not commutative)
        ys = fold.scan(lambda p, q: (p[0] * q[0], p[1] * q[0] + q[1]), (a, b), identity=(1.0, 0.0))
        return fold.reduce(fold.monoids.sum, ys[1] * ys[1])

    rng = np.random.default_rng(6)
    a, b = rng.normal(size=7), rng.normal(size=7)
    g = fold.grad(f, argnums=(0, 1))
    got, want = sharded(g, client, chunks, {0: 0, 1: 0})(a, b), g(a, b)
    close(got[0], want[0]), close(got[1], want[1])


@FEW
@given(chunkings(14, multiple=4))
def test_cross_entropy_gradient_over_columns(client, chunks):
    P, C, t = ce_data()
    g = fold.grad(cross_entropy, argnums=(0, 1))
    gP, gC = sharded(g, client, chunks, {1: 0})(P, C, t)
    gP0, gC0 = g(P, C, t)
    close(gP, gP0), close(gC, gC0)


def test_matmul_megatron_split(client):
    """Y = tanh(X A) B with A split by columns and B by rows: one all-reduce (a tree of partial sums)."""
    def mlp(X, A, B):
        return fold.tanh(X @ A) @ B

    rng = np.random.default_rng(7)
    X, A, B = rng.normal(size=(5, 4)), rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    f = sharded(mlp, client, 2, {1: 1, 2: 0})
    close(f(X, A, B), fold.run(mlp, X, A, B))
    assert f.last_call.merges == 1


# ------------------------------------------------------------------ errors

def test_a_statement_without_a_sharded_rule_is_named(client):
    def f(x, i):
        return x[i]

    with pytest.raises(ShardingError, match=r"statement 0 \(gather\) reads operand 0 \(f64\[6\]\) split on axis 0"):
        sharded(f, client, 2)(np.ones(6), np.array([0, 5]))


def test_a_map_capturing_a_split_value_is_refused(client):
    def f(x, w):
        return fold.map(lambda r: fold.reduce(fold.monoids.sum, r * w), x)

    with pytest.raises(ShardingError, match=r"statement 0 \(map\) reads operand 0 \(f64\[3\]\) split on axis 0.*captures it"):
        sharded(f, client, 2, {1: 0})(np.ones((4, 3)), np.ones(3))


def test_a_fold_over_an_axis_that_is_not_split_is_refused(client):
    with pytest.raises(ShardingError, match=r"statement 0 \(reduce\) reads operand 1 \(f64\[4,6\]\) split on axis 1"):
        sharded(lambda x: fold.reduce(fold.monoids.sum, x), client, 2, {0: 1})(np.ones((4, 6)))


def test_gemm_chunks_must_hold_whole_blocks(client):
    P, C, t = ce_data()
    with pytest.raises(ShardingError, match="multiples of 4"):
        sharded(ce_rows, client, (3, 11), {1: 0})(P, C, t)


def test_bad_split_specs(client):
    with pytest.raises(ShardingError, match="names argument 3"):
        sharded(product, client, 2, {3: 0})(np.ones((4, 2, 2)))
    with pytest.raises(ShardingError, match="sum to the axis length 4"):
        sharded(product, client, (1, 2))(np.ones((4, 2, 2)))


# ------------------------------------------------------------------ bytes moved, compile once, faults

def test_bytes_moved_match_the_combine_formula(client):
    """Vocabulary-parallel cross-entropy forward, 2 chunks on 2 workers: one merge moves M x state bytes."""
    rng = np.random.default_rng(8)
    M, N = 64, 16
    P, C, t = rng.normal(size=(M, 3)), rng.normal(size=(N, 3)), rng.integers(0, N, size=M)
    f = sharded(ce_rows, client, 2, {1: 0})
    close(f(P, C, t), fold.run(ce_rows, P, C, t))
    report = f.last_call
    assert report.cross_worker_merges == 1 and report.combine_bytes == M * 2 * 8
    assert report.combine_bytes <= report.bytes_moved <= report.combine_bytes + 256  # + Dask's container sizes


def _array_bytes(x) -> int:
    """The bytes of the NumPy arrays in `x` (through lists, tuples and dicts; futures are references: 0)."""
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, (list, tuple)):
        return sum(_array_bytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_array_bytes(v) for v in x.values())
    return 0


def test_each_task_is_sent_only_its_chunk_of_the_split_vocabulary(client, monkeypatch):
    """What makes a worker's memory for C 1/workers of it (bench_dask measures the peaks): the client sends
    each task at most one chunk of the split C, C's rows once in all, and the whole arguments (P, t) once
    per worker; the gradient's dC comes back in chunks (no task assembles it). Counted at the client's
    submit and scatter, the only ways data leaves it, over a value_and_grad call in 4 chunks."""
    M, V, D, chunks = 8, 4096, 4, 4
    vg, P, C, t = _vocabulary_gradient(M, V, D, chunks)
    f = sharded(vg, client, chunks, {1: 0})
    f(P, C, t)  # plans and compiles
    f.release()  # the inputs are dropped from the workers: the call counted below sends them as a first call does
    workers = len(client.scheduler_info(n_workers=-1)["workers"])
    sent = _counting_sends(client, monkeypatch)
    value, (gP, gC) = f(P, C, t)
    monkeypatch.undo()
    value0, (gP0, gC0) = vg(P, C, t)
    close(value, value0), close(gP, gP0), close(gC, gC0)
    chunk_bytes = C.nbytes // chunks
    assert max(b for _, b in sent) <= chunk_bytes, sorted(sent, key=lambda s: -s[1])[:3]
    iota_bytes = V * np.dtype(np.int64).itemsize  # j, made on the client, sent in pieces with the chunks
    assert sum(b for _, b in sent) <= C.nbytes + iota_bytes + (P.nbytes + t.nbytes) * workers + 1024, sent


def _counting_sends(client, monkeypatch) -> list[tuple[str, int]]:
    """Record the array bytes of every submit and scatter of `client` (the only ways data leaves it)."""
    sent: list[tuple[str, int]] = []
    submit, scatter = client.submit, client.scatter
    workers = len(client.scheduler_info(n_workers=-1)["workers"])

    def counted_submit(fn, *args, **kwargs):
        sent.append((getattr(fn, "__name__", "?"), _array_bytes(args)))
        return submit(fn, *args, **kwargs)

    def counted_scatter(data, **kwargs):
        sent.append(("scatter", _array_bytes(data) * (workers if kwargs.get("broadcast") else 1)))
        return scatter(data, **kwargs)

    monkeypatch.setattr(client, "submit", counted_submit)
    monkeypatch.setattr(client, "scatter", counted_scatter)
    return sent


def _vocabulary_gradient(M: int, V: int, D: int, chunks: int):
    rng = np.random.default_rng(13)
    P, C, t = rng.normal(size=(M, D)), rng.normal(size=(V, D)), rng.integers(0, V, size=M)

    def loss(P, C, t):
        j = fold.iota(C.shape[0])
        A = fold.gemm_map_reduce(fold.monoids.cross_entropy, lambda s, t, j: {"p": s, "n": fold.where(j == t, s, 0.0)},
                                 P, C, rows=(t,), cols=(j,), block=(M, V // chunks))
        return fold.sum(A["p"] - A["n"])

    return fold.value_and_grad(loss, argnums=(0, 1)), P, C, t


def _close_all(got, want):
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        close(a, b)


def _leaves(x):
    from fold.pytree import tree_flatten

    return tree_flatten(x)[0]


def test_inputs_stay_resident_a_second_call_sends_none_of_them(client, monkeypatch):
    """The first call scatters C's chunks and the whole P and t; the second (same arrays, unchanged) sends
    none of their bytes: no scatter, no task carrying an input, and the report's bytes_sent is at most the
    few bytes of small constants; nor do the workers fetch the whole inputs from each other (P is 4 KB).
    Both calls equal the unsharded gradient."""
    vg, P, C, t = _vocabulary_gradient(8, 4096, 64, 4)
    f = sharded(vg, client, 4, {1: 0})
    want = vg(P, C, t)
    first_sent = _counting_sends(client, monkeypatch)
    _close_all(f(P, C, t), want)
    first = f.last_call
    monkeypatch.undo()
    client.amm.run_once()  # Dask's active memory manager: it would drop a broadcast key's extra replicas
    second_sent = _counting_sends(client, monkeypatch)
    _close_all(f(P, C, t), want)
    second = f.last_call
    monkeypatch.undo()
    assert sum(b for _, b in first_sent) >= C.nbytes + P.nbytes + t.nbytes, first_sent  # the inputs went out once
    assert not [s for s in second_sent if s[0] == "scatter"], second_sent
    assert sum(b for _, b in second_sent) <= 1024, second_sent
    assert first.bytes_sent >= C.nbytes + P.nbytes + t.nbytes and first.bytes_hashed >= C.nbytes
    assert second.bytes_sent <= 1024 and second.bytes_hashed >= C.nbytes
    # nor are the inputs fetched between workers: what moves is the combines' states and partial sums
    assert second.bytes_moved <= second.combine_bytes + 1024, (second, first)


def test_an_input_mutated_in_place_is_sent_again(client):
    """Same array object, new contents: the result is the new one's (the content check sees the change)."""
    vg, P, C, t = _vocabulary_gradient(8, 4096, 4, 4)
    f = sharded(vg, client, 4, {1: 0})
    _close_all(f(P, C, t), vg(P, C, t))
    C[1234, 2] += 1.0   # one element of one chunk: the buffer, shape and dtype are unchanged
    P *= 2.0            # a whole (broadcast) input
    _close_all(f(P, C, t), vg(P, C, t))
    assert f.last_call.bytes_sent >= C.nbytes + P.nbytes


def test_a_dropped_input_is_freed_on_the_workers(client):
    """The resident copy lives as long as the caller's array: dropping the array frees the workers' keys."""
    import gc

    vg, P, C, t = _vocabulary_gradient(8, 4096, 4, 4)
    f = sharded(vg, client, 4, {1: 0})
    f(P, C, t)
    keys = {k for futures in f.resident._by_id[id(C)].placements.values() for k in (x.key for x in futures)}
    assert keys and keys <= set().union(*client.has_what().values())
    del C
    gc.collect()
    deadline = time.monotonic() + 30
    while keys & set().union(*client.has_what().values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not keys & set().union(*client.has_what().values())


def test_each_shard_program_compiles_once_per_worker(client):
    from fold.runtime.dask_backend import tasks

    f = fold.shard(dots_logsumexp, chunks=4, client=client)  # numba, the default
    x, w = np.random.default_rng(9).normal(size=(8, 3)), np.ones(3)
    close(f(x, w), fold.run(dots_logsumexp, x, w))
    before = client.run(tasks.compiled_count)
    close(f(x, w), fold.run(dots_logsumexp, x, w))
    assert client.run(tasks.compiled_count) == before


def _numba_threads(dask_worker=None) -> int:
    import numba

    return numba.get_num_threads()


def test_workers_share_their_hosts_cores_among_their_parallel_loops(client):
    """Each worker's shard programs run numba's parallel loops on its share of the host's cores (2 workers
    of 1 thread on one host: half each), not numba's default of every core per worker; `threads=` sets it.
    Read back on each worker's one Dask thread (numba's setting is per thread), after a call."""
    from fold.runtime.dask_backend import tasks

    x, w = np.random.default_rng(9).normal(size=(8, 3)), np.ones(3)
    info = client.scheduler_info(n_workers=-1)["workers"]
    cores = client.run(tasks.host_cores)
    for threads, want in [(1, {a: 1 for a in info}), (None, {a: max(1, cores[a] // len(info)) for a in info})]:
        f = fold.shard(dots_logsumexp, chunks=len(info), client=client, threads=threads)
        close(f(x, w), fold.run(dots_logsumexp, x, w))
        got = {a: client.submit(_numba_threads, workers=[a], pure=False).result() for a in info}
        assert got == want, (threads, got, cores)
    with pytest.raises(ShardingError, match="threads must be a positive int"):
        fold.shard(dots_logsumexp, client=client, threads=0)


def chain(steps: int):
    """`steps` elementwise statements per row, then a sum over the split axis (one combine)."""
    def f(x, w):
        y = x * w
        for i in range(steps):
            y = fold.tanh(y) + 0.5 * y - float(i)
        return fold.reduce(fold.monoids.logaddexp, fold.map(lambda r: fold.reduce(fold.monoids.sum, r), y))

    return f


def test_tasks_per_call_scale_with_chunks_and_combines_not_statements(client):
    """A run of shard-local statements is one task per chunk (fusion.py): 3 or 30 chained elementwise
    statements before the reduce submit the same tasks, O(chunks x combine levels), and the scheduler's
    task stream shows the same count ran."""
    from distributed import get_task_stream

    chunks, rng = 4, np.random.default_rng(11)
    x, w = rng.normal(size=(12, 3)), rng.normal(size=3)
    counts = []
    for steps in (3, 30):
        f = sharded(chain(steps), client, chunks)
        close(f(x, w), fold.run(chain(steps), x, w))
        with get_task_stream(client) as stream:
            close(f(x, w), fold.run(chain(steps), x, w))
        ran = [t for t in stream.data if str(t["key"]).startswith(f.last_call.prefix)]
        counts.append((f.last_call.tasks, len(ran)))
    (few, few_ran), (many, many_ran) = counts
    assert few == many and few_ran == many_ran, counts
    # per chunk: its shard program, its state's select, its slice of w broadcast to x's shape (x's chunks
    # are scattered once, not tasks: resident.py); w's broadcast (a whole statement) and its item;
    # chunks - 1 merges; the total's item
    assert many == chunks * 3 + 2 + (chunks - 1) + 1, counts
    assert many_ran == many, counts  # nothing submitted that did not run, nothing ran unaccounted


def test_a_cut_is_never_reused_for_another_value_at_a_freed_address(client):
    """A call cuts each whole value once, however many shard programs read it; a value freed mid-call (a
    literal, a dead variable) may leave its address to a new one, which must be cut anew. Found in CI: the
    scan gradient's sharded result read a freed literal's chunks on its first call."""
    from fold.runtime.dask_backend.context import Context, literal
    from fold.runtime.dask_backend.resident import Resident

    workers = sorted(client.scheduler_info()["workers"])
    ctx = Context(client, workers, "numpy", "cut-test", "cut-plan", {}, Resident(client))
    addresses = set()
    for k in range(40):
        rep = literal(np.full(6, float(k)))
        addresses.add(id(rep))
        pieces = client.gather(ctx.sliced(rep, 0, (2, 4), workers))
        np.testing.assert_array_equal(np.concatenate(pieces), np.full(6, float(k)))
        del rep
    assert len(addresses) < 40  # the allocator did reuse an address: the case this test is about happened


def test_a_worker_killed_mid_gradient_costs_a_rerun_not_the_result(client):
    rng = np.random.default_rng(10)
    x, w = rng.normal(size=(40, 3)), rng.normal(size=3)
    vg = fold.value_and_grad(dots_logsumexp, argnums=(0, 1), reduce_rule="generic")
    f = sharded(vg, client, 6)
    pids = client.run(os.getpid)
    victim = sorted(pids)[1]

    def kill(outs):  # every task is submitted and some are done: the worker holding chunks 3-5 dies
        time.sleep(0.3)
        os.kill(pids[victim], signal.SIGKILL)

    f.before_gather = kill
    value, (gx, gw) = f(x, w)
    value0, (gx0, gw0) = vg(x, w)
    close(value, value0), close(gx, gx0), close(gw, gw0)
    # x's chunks 3-5 were scattered to the victim alone (resident.py): lost with it, so the call ran again
    assert f.last_call.attempts == 2, f.last_call
    assert victim not in client.scheduler_info(n_workers=-1)["workers"]
    client.wait_for_workers(2, timeout=60)


# ------------------------------------------------------------------ the examples, sharded on numba (the default)

@pytest.mark.parametrize("name", ["megatron", "vocabulary_parallel", "kmeans"])
def test_examples_run_sharded(client, name):
    from helpers import load_example

    assert getattr(load_example("sharded"), name)(client) < 1e-12
