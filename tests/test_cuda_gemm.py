"""gemm_map_reduce on the cuda backend: the block walk with every value on the device (each block's
products by cuBLAS through CuPy on a GPU), against the numpy backend and the naive formulas, forward and
backward, with its host<->device copies counted: the inputs in, the results out, a few bytes of constants.
Runs on Numba's CUDA simulator where there is no GPU (`make test` sets NUMBA_ENABLE_CUDASIM=1)."""

from __future__ import annotations

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")
if not cuda.is_available():
    pytest.skip("no CUDA GPU, and NUMBA_ENABLE_CUDASIM is not set", allow_module_level=True)

import fold  # noqa: E402
from examples import gemm_layers  # noqa: E402
from fold.runtime.cuda_backend import counting_transfers  # noqa: E402
from fold.runtime.cuda_backend import residency  # noqa: E402

rng = np.random.default_rng(21)
CONSTANT_BYTES = 64  # the literals a program's statements meet on the device (a scale, an identity): copied once


@pytest.fixture
def host_statements(monkeypatch):
    """The statements that ran on the host with device inputs (their inputs copied there), by name."""
    ran: list[str] = []
    original = residency.on_host

    def spy(prim, values, depth):
        if (any(residency.device.is_device(v) for v in values) and not isinstance(prim, residency.Elementwise)
                and type(prim) not in residency.ON_DEVICE):
            ran.append(prim.name)
        return original(prim, values, depth)

    monkeypatch.setattr(residency, "on_host", spy)
    return ran


def test_the_table_1_layers_run_on_the_cuda_backend_unchanged(host_statements):
    """examples/gemm_layers.py's forward and every cotangent against the naive formulas, on the cuda backend,
    blocks (7, 11) over 24 x 40 (partial blocks both ways), no statement on the host."""
    with fold.use_backend("cuda"), counting_transfers() as copies:
        errors = gemm_layers.main(verbose=False)
    assert max(errors.values()) < 1e-12, errors
    assert copies.to_device > 0 and not host_statements, (copies, host_statements)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_and_its_gradient_copy_only_inputs_and_results(dtype):
    """Several row and column blocks (float32 row parts of the backward are added in float64 buffers)."""
    Q, K, V, G = (rng.normal(size=s).astype(dtype) for s in ((40, 8), (70, 8), (70, 4), (40, 4)))
    attention = lambda q, k, v: gemm_layers.attention(q, k, v, block=(16, 24))  # noqa: E731
    grad = lambda q, k, v, g: fold.vjp(attention, q, k, v)[1](g)  # noqa: E731
    tolerance = 1e-12 if dtype == np.float64 else 2e-5
    # the gradient's zero cotangent of the log-normaliser (unused) is broadcast from a literal on the host: one
    # row of M values copied in
    for f, args, literal_bytes in ((attention, (Q, K, V), 0), (grad, (Q, K, V, G), 40 * np.dtype(dtype).itemsize)):
        expected = fold.jit(f, backend="numpy")(*args)
        with counting_transfers() as copies:
            got = fold.jit(f, backend="cuda")(*args)
        expected, got = (list(x) if isinstance(x, (list, tuple)) else [x] for x in (expected, got))
        for a, b in zip(got, expected, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance)
        inputs = sum(a.nbytes for a in args)
        assert inputs <= copies.bytes_to_device <= inputs + literal_bytes + CONSTANT_BYTES, copies
        assert (copies.to_host, copies.bytes_to_host) == (len(got), sum(a.nbytes for a in got)), copies


def test_multi_head_attention_walks_the_blocks_once_per_head():
    """gemm_map_reduce inside a map (a head per row): the walk runs per row, its results stacked on the device."""
    H, M, N, F = 3, 12, 20, 4
    Q, K, V, G = (rng.normal(size=s) for s in ((H, M, F), (H, N, F), (H, N, F), (H, M, F)))
    heads = lambda q, k, v: fold.map(lambda a, b, c: gemm_layers.attention(a, b, c, block=(5, 8)), q, k, v)  # noqa: E731
    expected = np.stack([gemm_layers.attention_naive(Q[h], K[h], V[h], G[h])[0] for h in range(H)])
    with counting_transfers() as copies:
        got = fold.jit(heads, backend="cuda")(Q, K, V)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert (copies.to_host, copies.bytes_to_host) == (1, got.nbytes), copies
    grads = fold.jit(lambda q, k, v, g: fold.vjp(heads, q, k, v)[1](g), backend="cuda")(Q, K, V, G)
    for h in range(H):
        for got_h, want in zip((g[h] for g in grads), gemm_layers.attention_naive(Q[h], K[h], V[h], G[h])[1], strict=True):
            np.testing.assert_allclose(got_h, want, rtol=1e-11, atol=1e-11)


def test_no_columns_gives_the_identity_on_the_device():
    """N = 0: no block runs, every row's total is the monoid's identity (logsumexp of nothing: -inf)."""
    P, C = rng.normal(size=(5, 3)), np.zeros((0, 3))
    f = lambda p, c: fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, p, c)  # noqa: E731
    got = fold.jit(f, backend="cuda")(P, C)
    np.testing.assert_array_equal(got, np.full(5, -np.inf))


def test_elementwise_runs_are_one_kernel_each(monkeypatch):
    """A gemm's block map (exp(s - m) with its guards for infinities) and a top-level run run as
    kernels.cuda.map_over, once per run: per block of the gemm, once for the top-level run."""
    from fold.kernels import cuda as cuda_kernels

    calls = []
    original = cuda_kernels.map_over
    monkeypatch.setattr(cuda_kernels, "map_over", lambda *a, **k: calls.append(a[2]) or original(*a, **k))
    Q, K, V = (rng.normal(size=s) for s in ((40, 8), (70, 8), (70, 4)))
    attention = lambda q, k, v: gemm_layers.attention(q, k, v, block=(16, 24))  # noqa: E731
    np.testing.assert_allclose(fold.jit(attention, backend="cuda")(Q, K, V),
                               gemm_layers.attention_naive(Q, K, V, np.zeros((40, 4)))[0], rtol=1e-12, atol=1e-12)
    over_blocks = [shape for shape in calls if len(shape) == 2 and shape[1] > 1]  # not a run over rows' values
    assert len(over_blocks) == 3 * 3 and {shape[1] for shape in over_blocks} == {24, 22}, calls  # 70 = 24 + 24 + 22
    calls.clear()
    x, m = rng.normal(size=(30, 5)), rng.normal(size=(30, 1))
    got = fold.jit(lambda x, m: fold.exp(x - m) * 2.0 + x, backend="cuda")(x, m)
    np.testing.assert_allclose(got, np.exp(x - m) * 2.0 + x, rtol=1e-14)
    assert calls == [(30, 5)], calls


def test_a_blocks_map_of_its_scores_runs_as_elementwise_statements():
    """The block program maps the user's function over the block's scores as a map of a map (rows, then
    entries); the cuda backend runs it as the elementwise statements it amounts to (unnest.py), not as
    maps batched two deep."""
    from fold.primitives import GemmMapReduce, Map
    from fold.runtime.cuda_backend.fused import prepared

    Q, K, V = (rng.normal(size=s) for s in ((40, 8), (70, 8), (70, 4)))
    program = fold.trace(lambda q, k, v: gemm_layers.attention(q, k, v, block=(16, 24)), Q, K, V)
    block = next(s.prim for s in program.stmts if isinstance(s.prim, GemmMapReduce)).block_program((16, 24))
    maps_of_maps = lambda p: [s for s in p.stmts if isinstance(s.prim, Map)  # noqa: E731
                              and any(isinstance(t.prim, Map) for t in s.prim.body.stmts)]
    assert maps_of_maps(block) and not maps_of_maps(prepared(block))
