"""Loop nests on the cuda backend: maps of maps and their folds (k-means, pairwise minima, a three-deep nest, a
non-commutative operator), their gradients and their Hessian-vector products run as the nest's CUDA kernels
(runtime/cuda_backend/loop_nests.py), with the numpy backend's results and without a decline. Runs on Numba's
CUDA simulator where there is no GPU (`make test` sets NUMBA_ENABLE_CUDASIM=1)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")
if not cuda.is_available():
    pytest.skip("no CUDA GPU, and NUMBA_ENABLE_CUDASIM is not set", allow_module_level=True)

import fold  # noqa: E402
from fold.runtime.cuda_backend import loop_nests  # noqa: E402
from fold.runtime.loops.nest import ParallelFold  # noqa: E402
from natural_programs import (kmeans_cost, min_pairwise_distance, ordered_fold, periodic_stencil_energy,  # noqa: E402
                              row_minima, three_deep)

M = fold.monoids
rng = np.random.default_rng(17)


# sizes that give the simulator's launch several blocks and more rows than chunks
CASES = {
    "kmeans": (kmeans_cost, lambda: (rng.normal(size=(5, 3)), rng.normal(size=(70, 3)))),
    "min_pairwise": (min_pairwise_distance, lambda: (rng.normal(size=(40, 3)), rng.normal(size=(9, 3)))),
    "three_deep": (three_deep, lambda: (rng.normal(size=(20, 4, 3)), rng.normal(size=3))),
    "ordered_fold": (ordered_fold, lambda: (rng.normal(size=(50, 6)),)),
    "row_minima": (row_minima, lambda: (rng.normal(size=(4, 3)), rng.normal(size=(30, 3)))),
    "periodic_stencil": (periodic_stencil_energy, lambda: (rng.normal(size=(12, 9)),)),  # its gathers at (i + 1) % n
}


@pytest.fixture
def nest_runs(monkeypatch):
    """How many loop nests ran as CUDA kernels (not as the statements they replaced)."""
    runs = []
    original = loop_nests._run

    def counted(prim, kernel, args):
        runs.append(type(kernel.outer).__name__)
        return original(prim, kernel, args)

    monkeypatch.setattr(loop_nests, "_run", counted)
    return runs


def _both(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a nest that declined would warn
        got = fold.jit(f, backend="cuda")(*args)
    return got, fold.jit(f, backend="numpy")(*args)


def _close(got, want, rtol):
    for g, w in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(w)))))


@pytest.mark.parametrize("case", sorted(CASES))
def test_natural_nests_run_as_cuda_kernels_with_the_reference_results(case, nest_runs):
    f, make = CASES[case]
    args = make()
    got, want = _both(f, *args)
    _close(got, want, 1e-12)
    assert nest_runs == (["ParallelMap"] if case in ("row_minima", "periodic_stencil") else ["ParallelFold"])


@pytest.mark.parametrize("case", ["kmeans", "three_deep", "periodic_stencil"])
def test_gradients_and_hessian_vector_products_run_as_cuda_nests(case, nest_runs):
    f, make = CASES[case]
    args = make()
    grad = fold.grad(f, argnums=0)
    got, want = _both(grad, *args)
    _close(got, want, 1e-10)
    assert nest_runs, "the gradient ran no nest on the GPU"
    v = rng.normal(size=args[0].shape)
    hvp = lambda *a: fold.jvp(grad, a, (v,) + tuple(np.zeros_like(x) for x in a[1:]))[1]  # noqa: E731
    got, want = _both(hvp, *args)
    _close(got, want, 1e-9)


def test_a_fold_of_a_row_state_merges_its_chunks_component_by_component(nest_runs, monkeypatch):
    """The k-means gradient with respect to the centroids sums one (k, d) row per point: a stored state
    folded per chunk, the chunks' partial states then summed over chunks by the device's reduction, not by
    the one-thread merge kernel (whose sequential merge bounded the chunks to a thousand on a GPU)."""
    launches = []
    original = loop_nests.start
    monkeypatch.setattr(loop_nests, "start", lambda kernel, blocks, threads, *args: launches.append(threads)
                        or original(kernel, blocks, threads, *args))
    C, P = rng.normal(size=(4, 3)), rng.normal(size=(90, 3))
    got, want = _both(fold.grad(kmeans_cost, argnums=0), C, P)
    _close(got, want, 1e-12)
    from fold.runtime.cuda_backend.backend import CudaProgram
    from fold.runtime.loops import LoopNest, kernel_of

    program = CudaProgram(fold.trace(fold.grad(kmeans_cost, argnums=0), C, P)).program
    folds = [kernel_of(s.prim).outer for s in program.stmts if isinstance(s.prim, LoopNest)]
    assert any(isinstance(o, ParallelFold) and any(s.shape == (4, 3) and s.summed for s in o.states) for o in folds)
    assert launches and 1 not in launches, f"a one-thread merge ran: {launches}"


def test_a_fold_that_also_stores_the_maps_rows_writes_both(nest_runs):
    """The k-means gradient with respect to the points and the centroids: one nest folds the centroids'
    (4, 3) rows per point while each thread stores its points' gradient rows (a mapped output beside the
    fold's state: the fold kernel takes those outputs, the merge kernel the states')."""
    C, P = rng.normal(size=(4, 3)), rng.normal(size=(90, 3))
    got, want = _both(fold.grad(kmeans_cost, argnums=(0, 1)), C, P)
    _close(got, want, 1e-12)
    from fold.runtime.cuda_backend.backend import CudaProgram
    from fold.runtime.loops import LoopNest, kernel_of

    program = CudaProgram(fold.trace(fold.grad(kmeans_cost, argnums=(0, 1)), C, P)).program
    kernels = [kernel_of(s.prim) for s in program.stmts if isinstance(s.prim, LoopNest)]
    assert any([p.shape for p in k.mapped] == [(90, 3)] and [p.shape for p in k.folded] == [(4, 3)] for k in kernels)
    assert "ParallelFold" in nest_runs


def test_chunks_are_bounded_by_the_merge_of_their_states():
    from fold.runtime.loops.nest import State

    small = ParallelFold("i", 10**6, (State("s", (), np.dtype(np.float64), "out0"),), (), (), ())
    wide = ParallelFold("i", 10**6, (State("s", (256, 64), np.dtype(np.float64), "out0", stored=True),), (), (), ())
    assert loop_nests.chunks_for(small) == loop_nests.MAX_CHUNKS
    assert loop_nests.chunks_for(wide) * 256 * 64 <= loop_nests.MERGED_SCALARS
    assert loop_nests.chunks_for(ParallelFold("i", 3, small.states, (), (), ())) == 3
    # sums: as many chunks as SUMMED_CHUNKS, their partials within SUMMED_BYTES
    sums = ParallelFold("i", 10**7, (State("s", (256, 64), np.dtype(np.float64), "out0", stored=True, summed=True),),
                        (), (), ())
    assert loop_nests.chunks_for(sums) * 256 * 64 * 8 <= loop_nests.SUMMED_BYTES
    assert loop_nests.chunks_for(sums) > loop_nests.chunks_for(wide)
    few = ParallelFold("i", 10**7, (State("s", (3,), np.dtype(np.float64), "out0", stored=True, summed=True),), (), (), ())
    assert loop_nests.chunks_for(few) == loop_nests.SUMMED_CHUNKS


def test_lowered_shows_the_nests_the_cuda_backend_runs():
    C, P = rng.normal(size=(4, 3)), rng.normal(size=(50, 3))
    text = str(fold.lowered(kmeans_cost, C, P, backend="cuda"))
    assert "as the cuda backend runs it" in text and "parallel fold i < 50" in text


@pytest.mark.parametrize("mode", ["primal", "grad"])
def test_numpy_style_broadcasting_runs_as_cuda_nests(mode, nest_runs):
    """A sum of an (n, m, d) value made by broadcasting runs as maps of the nest (runtime/loops/broadcast_maps.py),
    on the cuda backend as on the numba one."""
    def kernel_sum(A, B):
        return fold.sum(fold.exp(-fold.sum((A[:, None, :] - B[None, :, :]) ** 2, axis=2)))

    A, B = rng.normal(size=(30, 3)), rng.normal(size=(20, 3))
    f = kernel_sum if mode == "primal" else fold.grad(kernel_sum, argnums=(0, 1))
    got, want = _both(f, A, B)
    _close(got, want, 1e-10)
    assert nest_runs, "the broadcast ran no nest on the GPU"


def test_a_loops_gradient_split_at_its_sums_runs_as_a_cuda_nest(nest_runs):
    """Horner's gradient with respect to its coefficients: the reverse loop split at its sums over the
    elements (loop_maps._split_at_sums), its elements' part a fold whose rows save each step's state."""
    def horner(c, x):
        return fold.sum(fold.loop(lambda i, acc: acc * x + c[i], x * 0.0, c.shape[0]) ** 2)

    c, x = 0.3 * rng.normal(size=6), rng.uniform(-1, 1, 200)
    got, want = _both(fold.grad(horner, argnums=0), c, x)
    _close(got, want, 1e-12)
    assert nest_runs.count("ParallelFold") == 1, nest_runs
