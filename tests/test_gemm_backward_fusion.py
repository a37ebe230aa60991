"""The numba backend runs a gemm_map_reduce and its vjp's block sum as one walk that computes each block's
products once (runtime/numba_backend/gemm_backward_fusion.py). Checked: where it applies (and where it must
not: a cotangent computed from the gemm's own results, kept products over the budget), that it gives the
same bits as the two statements run apart, and the numpy backend's results."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.ad import vjp_program
from examples import gemm_layers as L
from fold.inline import inline_program
from fold.runtime.numba_backend import passes
from fold.runtime.numba_backend.gemm_backward_fusion import GemmWithBackward

M, N, F = 40, 60, 8
BLOCK = (16, 24)  # ragged: 40 = 16 + 16 + 8 rows, 60 = 24 + 24 + 12 columns


def _inputs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    r = lambda *shape: rng.standard_normal(shape)  # noqa: E731
    return {"Q": r(M, F), "K": r(N, F), "V": r(N, F), "G": r(M, F), "P": r(M, F), "C": r(N, F),
            "t": rng.integers(0, N, M), "g": r(M), "Pt": r(M, F), "Ct": r(N, F), "X": r(M, F), "W": r(F, N),
            "Wo": r(N, F), "tau": np.float64(0.7)}


def _scaled_attention(Q, K, V, tau):
    """attention with a traced temperature: the map captures a value (a "whole" operand of the backward)."""
    A = fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s * tau, "v": v}, Q, K, cols=(V,), block=BLOCK)
    return A["v"]


# (name, function, argument names, cotangent name): layers whose cotangents are inputs of the gradient program
LAYERS = [
    ("attention", lambda Q, K, V: L.attention(Q, K, V, block=BLOCK), "QKV", "G"),
    ("causal_attention", lambda Q, K, V: L.causal_attention(Q, K, V, block=BLOCK), "QKV", "G"),
    ("cross_entropy", lambda P, C, t: L.cross_entropy(P, C, t, block=BLOCK), ("P", "C", "t"), "g"),
    ("distillation", lambda P, C, Pt, Ct: L.distillation(P, C, Pt, Ct, block=BLOCK), ("P", "C", "Pt", "Ct"), "g"),
    ("mlp", lambda X, W, Wo: L.mlp(X, W, Wo, block=BLOCK), ("X", "W", "Wo"), "G"),
    ("scaled_attention", _scaled_attention, ("Q", "K", "V", "tau"), "G"),
]


def _gradient_program(f, args):
    program, _ = vjp_program(fold.trace(f, *args), with_primal_outputs=True)
    return program


def _run(program, args, backend: str, fusion: bool = True):
    """The gradient program under fold.jit on `backend`, with the numba backend's fusion on or off."""
    jitted = fold.jit(lambda *a: inline_program(program, list(a)), backend=backend)
    if fusion:
        return jitted(*args)
    original = passes.fuse_gemm_backward
    passes.fuse_gemm_backward = lambda p, prepare: p
    try:
        return jitted(*args)  # the first call traces and prepares the program, without the fusion
    finally:
        passes.fuse_gemm_backward = original


def _names(program) -> list[str]:
    return [s.prim.name for s in passes.prepare(program, whole_arrays=True).stmts]


@pytest.mark.parametrize("name,f,arg_names,ct_name", LAYERS, ids=[c[0] for c in LAYERS])
def test_gradient_of_a_layer_runs_forward_and_backward_as_one_walk(name, f, arg_names, ct_name) -> None:
    x = _inputs()
    args = tuple(x[a] for a in arg_names)
    program = _gradient_program(f, args)
    names = _names(program)
    assert names.count(GemmWithBackward.name) == 1 and "gemm_block_sum" not in names, names
    inputs = args + (x[ct_name],)
    fused = _run(program, inputs, "numba")
    apart = _run(program, inputs, "numba", fusion=False)
    reference = _run(program, inputs, "numpy")
    assert len(fused) == len(apart) == len(reference)
    for a, b, ref in zip(fused, apart, reference, strict=True):
        np.testing.assert_array_equal(a, b)  # the backward reads the very products it would recompute
        np.testing.assert_allclose(a, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", ["attention", "cross_entropy"])
def test_blocks_large_enough_to_compile_share_their_scaled_products(layer) -> None:
    """Blocks of 160 x 256 run compiled kernels, and attention's product is a scaled one ((Q c) K^T, after
    the backend hoists the scale), in the forward and the backward alike: that is the product kept."""
    rng = np.random.default_rng(1)
    m, n, f = 300, 400, 16
    block = (160, 256)
    if layer == "attention":
        fn = lambda Q, K, V: L.attention(Q, K, V, block=block)  # noqa: E731
        args, ct = (rng.standard_normal((m, f)), rng.standard_normal((n, f)), rng.standard_normal((n, f))), rng.standard_normal((m, f))
    else:
        fn = lambda P, C, t: L.cross_entropy(P, C, t, block=block)  # noqa: E731
        args, ct = (rng.standard_normal((m, f)), rng.standard_normal((n, f)), rng.integers(0, n, m)), rng.standard_normal(m)
    program = _gradient_program(fn, args)
    fused = next(s.prim for s in passes.prepare(program, whole_arrays=True).stmts if isinstance(s.prim, GemmWithBackward))
    for shape, backward in fused.backward_blocks:
        before = passes.prepare(fused.backward.block_program(shape), whole_arrays=True)
        count = lambda p: sum(s.prim.name == "matmul" for s in p.stmts)  # noqa: E731
        assert count(backward) == count(before) - 1, shape
    inputs = args + (ct,)
    for a, b, ref in zip(_run(program, inputs, "numba"), _run(program, inputs, "numba", fusion=False),
                         _run(program, inputs, "numpy"), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, ref, rtol=1e-12, atol=1e-12)


def test_grad_of_a_mean_loss_with_closed_over_targets_is_fused() -> None:
    """fold.grad of a mean cross-entropy whose targets the loss closes over: the targets are a literal in
    both the gemm and its vjp, and the loss's cotangent (1 / M) is a constant."""
    x = _inputs()
    loss = lambda P, C: fold.sum(L.cross_entropy(P, C, x["t"], block=BLOCK)) / M  # noqa: E731
    grad = fold.grad(loss, argnums=(0, 1))
    assert _names(fold.trace(grad, x["P"], x["C"])).count(GemmWithBackward.name) == 1
    fused = fold.jit(grad, backend="numba")(x["P"], x["C"])
    reference = fold.jit(grad, backend="numpy")(x["P"], x["C"])
    for a, ref in zip(fused, reference, strict=True):
        np.testing.assert_allclose(a, ref, rtol=1e-12, atol=1e-14)


def test_a_per_example_gradient_through_a_gemm_runs_one_walk_per_row() -> None:
    """gemm_map_reduce inside fold.map (here a per-example gradient, whose forward and backward the numba
    backend fuses into one walk) runs once per row of the map: as a loop over the rows, on both backends."""
    x = _inputs()
    per_row = lambda p, t: fold.sum(L.cross_entropy(fold.reshape(p, (1, F)), x["C"], fold.reshape(t, (1,)), block=BLOCK))  # noqa: E731
    f = lambda P, t: fold.map(fold.grad(per_row), P, t)  # noqa: E731
    P, t = x["P"][:5], x["t"][:5]
    looped = np.stack([fold.grad(per_row)(P[i], t[i]) for i in range(5)])
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(f, backend=backend)(P, t), looped, rtol=1e-12, atol=1e-14)


def test_a_hessian_vector_product_through_a_gemm_is_fused_prints_and_agrees() -> None:
    """jvp of grad: the gemm lifted to (value, tangent) pairs and its block sum run as one walk too."""
    x = _inputs()
    loss = lambda Q, K: fold.sum(fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, Q, K, block=BLOCK))  # noqa: E731
    hvp = lambda Q, K, dQ, dK: fold.jvp(fold.grad(loss, argnums=(0, 1)), (Q, K), (dQ, dK))[1]  # noqa: E731
    args = (x["Q"], x["K"], x["P"], x["C"])
    prepared = passes.prepare(fold.trace(hvp, *args), whole_arrays=True)
    assert "gemm_map_reduce_with_vjp[lifted to (value, tangent) pairs" in str(prepared)
    for a, ref in zip(fold.jit(hvp, backend="numba")(*args), fold.jit(hvp, backend="numpy")(*args), strict=True):
        np.testing.assert_allclose(a, ref, rtol=1e-11, atol=1e-12)


def test_the_fused_walk_moves_the_cotangents_computation_before_the_forward() -> None:
    x = _inputs()
    args = (x["P"], x["C"], x["t"])
    program = _gradient_program(LAYERS[2][1], args)
    original = [s.prim.name for s in program.stmts]
    assert original.index("neg") > original.index("gemm_map_reduce")  # the cotangent of the loss, -g
    names = _names(program)
    assert names.index("neg") < names.index(GemmWithBackward.name)
    assert "gemm_map_reduce_with_vjp[cross_entropy" in str(passes.prepare(program, whole_arrays=True))


def test_a_cotangent_computed_from_the_gemm_results_is_not_fused() -> None:
    """loss = sum(attention(Q, K, V) ** 2): the backward's cotangent 2 O g needs every row of O first."""
    x = _inputs()
    f = lambda Q, K, V: fold.sum(L.attention(Q, K, V, block=BLOCK) ** 2)  # noqa: E731
    args = (x["Q"], x["K"], x["V"])
    program = _gradient_program(f, args)
    names = _names(program)
    assert GemmWithBackward.name not in names and "gemm_block_sum" in names
    inputs = args + (np.float64(1.5),)
    for a, ref in zip(_run(program, inputs, "numba"), _run(program, inputs, "numpy"), strict=True):
        np.testing.assert_allclose(a, ref, rtol=1e-12, atol=1e-12)


def test_of_two_stacked_layers_only_the_outer_one_is_fused() -> None:
    """attention(attention(Q, K, V), K, V): the inner layer's cotangent comes from the outer backward, which
    reads the inner results; the outer layer's cotangent is G."""
    x = _inputs()
    f = lambda Q, K, V: L.attention(L.attention(Q, K, V, block=BLOCK), K, V, block=BLOCK)  # noqa: E731
    args = (x["Q"], x["K"], x["V"])
    program = _gradient_program(f, args)
    names = _names(program)
    assert names.count(GemmWithBackward.name) == 1 and names.count("gemm_block_sum") == 1
    inputs = args + (x["G"],)
    for a, ref in zip(_run(program, inputs, "numba"), _run(program, inputs, "numpy"), strict=True):
        np.testing.assert_allclose(a, ref, rtol=1e-12, atol=1e-12)


def test_two_independent_layers_are_each_fused() -> None:
    x = _inputs()
    f = lambda Q, K, V, P, C, t: (L.attention(Q, K, V, block=BLOCK), L.cross_entropy(P, C, t, block=BLOCK))  # noqa: E731
    args = (x["Q"], x["K"], x["V"], x["P"], x["C"], x["t"])
    program = _gradient_program(f, args)
    assert _names(program).count(GemmWithBackward.name) == 2
    inputs = args + (x["G"], x["g"])
    for a, ref in zip(_run(program, inputs, "numba"), _run(program, inputs, "numpy"), strict=True):
        np.testing.assert_allclose(a, ref, rtol=1e-12, atol=1e-12)


def _attention_keeping(keep: int):
    def attention(Q, K, V):
        return fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s * 0.3, "v": v}, Q, K, cols=(V,),
                                    block=BLOCK, keep=keep)["v"]
    return attention


@pytest.mark.parametrize("kept_blocks", [0, 1, 2, 3])
def test_column_blocks_past_keep_bytes_compute_their_products_again(kept_blocks, monkeypatch) -> None:
    """Row blocks of 16 rows keep 16 x 24 products (3072 bytes) for each of the first two column blocks and
    16 x 12 for the last; `keep` says how many of them are kept, and the others are recomputed."""
    from fold.runtime.numba_backend import gemm_backward_fusion as fusion

    x = _inputs()
    args = (np.random.default_rng(2).standard_normal((48, F)), x["K"], x["V"])  # three row blocks of 16
    keep = [1, 3072, 6144, 7680][kept_blocks]
    program = _gradient_program(_attention_keeping(keep), args)
    fused = next(s.prim for s in passes.prepare(program, whole_arrays=True).stmts if isinstance(s.prim, GemmWithBackward))
    # the backward programs, told apart by their inputs: the sharing ones also take the product
    recomputing = len(fused.recompute_blocks[0][1].inputs)
    assert {len(p.inputs) for _, p in fused.backward_blocks} == {recomputing + 1}
    ran = []
    real = fusion.eval_program
    monkeypatch.setattr(fusion, "eval_program", lambda p, *a, **k: (ran.append(len(p.inputs)), real(p, *a, **k))[1])
    inputs = args + (np.ones((48, F)),)
    result = _run(program, inputs, "numba")
    row_blocks = 3
    assert ran.count(recomputing + 1) == kept_blocks * row_blocks
    assert ran.count(recomputing) == (3 - kept_blocks) * row_blocks
    monkeypatch.setattr(fusion, "eval_program", real)
    for a, b in zip(result, _run(program, inputs, "numba", fusion=False), strict=True):
        np.testing.assert_array_equal(a, b)


def test_keep_zero_runs_the_forward_and_backward_apart() -> None:
    x = _inputs()
    program = _gradient_program(_attention_keeping(0), (x["Q"], x["K"], x["V"]))
    assert GemmWithBackward.name not in _names(program)


def test_memory_estimate_of_the_prepared_program_counts_the_kept_products() -> None:
    from fold.runtime.memory import program_peak

    x = _inputs()
    program = _gradient_program(LAYERS[0][1], (x["Q"], x["K"], x["V"]))
    stripe = 16 * N * 8
    assert program_peak(passes.prepare(program, whole_arrays=True)) >= program_peak(program) + stripe - 16 * 24 * 8 * 2


@pytest.mark.parametrize("keep", [-1, 2.5, True])
def test_a_bad_keep_is_refused(keep) -> None:
    x = _inputs()
    with pytest.raises(fold.FoldError, match="keep"):
        fold.trace(_attention_keeping(keep), x["Q"], x["K"], x["V"])


# ------------------------------------------------------------------------------- random grids and keeps

from hypothesis import given, note  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _grids(draw):
    m, n, f = draw(st.integers(1, 37)), draw(st.integers(1, 53)), draw(st.integers(1, 5))
    block = (draw(st.integers(1, m + 2)), draw(st.integers(1, n + 2)))
    keep = draw(st.sampled_from([1, 8 * block[0] * block[1], 8 * block[0] * n - 1, 2**30]))
    layer = draw(st.sampled_from(["attention", "causal_attention", "cross_entropy"]))
    return m, n, f, block, keep, layer, draw(st.integers(0, 2**16))


@given(_grids())
def test_fused_walk_agrees_with_the_numpy_backend_on_any_grid(grid) -> None:
    """Any row and column counts, block shape (ragged edges, blocks wider than the matrix) and keep: the
    fused walk's gradient is the numpy backend's, and the unfused walk's to the bit."""
    m, n, f, block, keep, layer, seed = grid
    note(f"M={m} N={n} F={f} block={block} keep={keep} {layer}")
    rng = np.random.default_rng(seed)
    Q, K, V = rng.standard_normal((m, f)), rng.standard_normal((n, f)), rng.standard_normal((n, f))
    if layer == "cross_entropy":
        fn = lambda P, C: fold.gemm_map_reduce(  # noqa: E731
            fold.monoids.cross_entropy, lambda s, t, j: {"p": s, "n": fold.where(j == t, s, 0.0)}, P, C,
            rows=(rng.integers(0, n, m),), cols=(fold.iota(n),), block=block, keep=keep)["p"]
        args, ct = (Q, K), rng.standard_normal(m)
    else:
        causal = layer == "causal_attention"
        fn = lambda Q, K, V: fold.gemm_map_reduce(  # noqa: E731
            fold.monoids.logwsum,
            lambda s, i, v, j: {"z": fold.where((j <= i) | (not causal), s * 0.5, -np.inf), "v": v},
            Q, K, rows=(fold.iota(m),), cols=(V, fold.iota(n)), block=block, keep=keep)["v"]
        args, ct = (Q, K, V), rng.standard_normal((m, f))
    program = _gradient_program(fn, args)
    assert _names(program).count(GemmWithBackward.name) == 1
    inputs = args + (ct,)
    fused, apart, reference = (_run(program, inputs, "numba"), _run(program, inputs, "numba", fusion=False),
                               _run(program, inputs, "numpy"))
    for a, b, ref in zip(fused, apart, reference, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, ref, rtol=1e-11, atol=1e-12)
