"""What gradient programs keep: re-execution of map bodies (no tape of per-row intermediates) and loop
checkpointing (O(n/k + k) saved states instead of n), read off the Program and fold.memory's estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fold import ad
import fold
from fold.ir import Program, Var
from fold.primitives import Loop, LoopSaving, Map


def top_level_vars(program: Program) -> list[Var]:
    return [v for stmt in program.stmts for v in stmt.outs]


def count_ops(program: Program, op: str) -> int:
    """Statements applying elementwise `op`, nested bodies included."""
    total = 0
    for stmt in program.stmts:
        total += getattr(stmt.prim, "op", None) == op
        total += sum(count_ops(body, op) for body in stmt.prim.bodies())
    return total


# ------------------------------------------------------------------------------------------ re-execution

N, D = 48, 6


def deep_body(k: int):
    """A map over rows (D,) whose body makes k intermediates of shape (D, D) before reducing them."""
    def f(x, w):
        def body(row):
            a = row[:, None] * w[None, :]  # (D, D)
            for j in range(k):
                a = fold.sin(a) * (1.0 + 0.25 * j) + a
            return fold.sum(a * a)

        return fold.reduce(fold.monoids.sum, fold.map(body, x))

    return f


def args_for(seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (N, D)), rng.uniform(-1, 1, D)


@pytest.mark.parametrize("k", [3, 8])
def test_vjp_of_a_map_keeps_no_per_row_intermediate_outside_the_map(k: int) -> None:
    f = deep_body(k)
    args = args_for()
    program = fold.trace(f, *args)
    grad_program, mask = ad.vjp_program(program)
    fold.check_program(grad_program)
    assert mask == [True, True]

    # no top-level array has the shape of the per-row intermediates (N, D, D) ...
    stored = [v for v in top_level_vars(grad_program) if v.aval.shape[:1] == (N,) and v.aval.ndim >= 3]
    assert not stored, f"the vjp program stores per-row intermediates: {[str(v.aval) for v in stored]}"
    # ... and every top-level value is no bigger than an input or the (N, D) cotangents: nothing is taped
    biggest_allowed = max(v.aval.nbytes for v in grad_program.inputs)
    assert all(v.aval.nbytes <= biggest_allowed for v in top_level_vars(grad_program))

    # the k sin statements are re-executed inside the map of the gradient program, once each
    maps = [s for s in grad_program.stmts if isinstance(s.prim, Map)]
    assert len(maps) == 1
    assert count_ops(maps[0].prim.body, "sin") == k
    assert count_ops(grad_program, "sin") == k  # not a separate forward sweep outside the map


@pytest.mark.parametrize("k", [3, 8])
def test_vjp_of_a_map_memory_estimate(k: int) -> None:
    """fold.memory of the gradient program stays within a small factor of the primal's.

    The numpy backend runs a map body batched over all N rows, so during the body's return sweep its re-executed
    intermediates are live for all rows at once: the estimate grows with k by about one (N, D, D) array per
    intermediate, exactly as the body's own working set does. What re-execution guarantees is that nothing
    else is kept: the top level of the gradient program holds O(inputs) bytes, whatever k is.
    """
    f = deep_body(k)
    args = args_for()
    program = fold.trace(f, *args)
    grad_program, _ = ad.vjp_program(program)
    primal, grad = fold.memory(program), fold.memory(grad_program)
    row_intermediate = N * D * D * 8
    assert grad <= 4 * primal + (k + 2) * row_intermediate, (primal, grad)
    if k == 3:
        assert grad <= 4 * primal, (primal, grad)
    top_level = sum(v.aval.nbytes for v in top_level_vars(grad_program))
    assert top_level <= 4 * sum(v.aval.nbytes for v in grad_program.inputs), top_level


def test_memory_of_the_gradient_grows_with_the_body_not_with_a_tape() -> None:
    """Going from 3 to 8 intermediates adds at most about one batched intermediate each to the estimate
    (the body's working set), never a stored copy per intermediate on top of it."""
    args = args_for()
    grads = {}
    for k in (3, 8):
        program = fold.trace(deep_body(k), *args)
        grads[k] = fold.memory(ad.vjp_program(program)[0])
    per_extra = (grads[8] - grads[3]) / 5
    assert per_extra <= 1.5 * N * D * D * 8, (grads, per_extra)


def test_reexecuted_map_gradient_is_right() -> None:
    from fold.testing import check_grads

    check_grads(deep_body(3), args_for(1))


def test_matrix_captured_by_a_map_gets_its_cotangent_without_per_row_products() -> None:
    """A weight matrix W (D, D) used by `W @ row` in every row: its cotangent is a sum over rows of outer
    products; the gradient program must not hold the N outer products (N, D, D)."""
    def f(x, w):
        return fold.reduce(fold.monoids.sum, fold.map(lambda r: fold.sum(fold.tanh(w @ r)), x))

    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(N, D)), rng.normal(size=(D, D)) / D
    program = fold.trace(f, x, w)
    grad_program, _ = ad.vjp_program(program)
    fold.check_program(grad_program)
    stored = [v for v in top_level_vars(grad_program) if v.aval.size >= N * D * D]
    assert not stored, [str(v.aval) for v in stored]
    from fold.testing import check_grads

    check_grads(f, (x, w))


# ------------------------------------------------------------------------------------------ loops

LOOP_N = 64
STATE = 10_000


def big_loop(checkpoint):
    def f(x, w):
        final = fold.loop(lambda i, s: fold.sin(s) * w + s, x, LOOP_N, checkpoint=checkpoint)
        return fold.reduce(fold.monoids.sum, final * final)

    return f


def loop_memory(checkpoint) -> int:
    x, w = np.full(STATE, 0.1), np.full(STATE, 0.5)
    program = fold.trace(big_loop(checkpoint), x, w)
    grad_program, _ = ad.vjp_program(program)
    fold.check_program(grad_program)
    return fold.memory(grad_program)


def test_checkpointing_shrinks_the_memory_estimate() -> None:
    state_bytes = STATE * 8
    full = loop_memory(None)
    assert full >= LOOP_N * state_bytes  # every state is saved
    assert loop_memory(1) == full  # checkpoint=1 is the same policy as None
    by_k = {k: loop_memory(k) for k in (2, 4, 8, 16)}
    for k, mem in by_k.items():
        # O(n/k + k): ceil(n/k) checkpoints, one stretch of k recomputed states (and its copy), a few more
        assert mem <= (math.ceil(LOOP_N / k) + 2 * k + 16) * state_bytes, (k, mem / state_bytes)
        assert mem < full, (k, mem, full)
    assert by_k[8] < full / 2 and by_k[4] < full / 2
    best = min(by_k, key=by_k.get)
    assert best in (4, 8), by_k  # the optimum of n/k + 2k is near sqrt(n / 2)


def test_checkpointed_vjp_program_saves_every_kth_state() -> None:
    x, w = np.full(STATE, 0.1), np.full(STATE, 0.5)
    for k, saved_rows in [(None, LOOP_N), (8, 8), (5, 13), (100, 1)]:
        program = fold.trace(big_loop(k), x, w)
        grad_program, _ = ad.vjp_program(program)
        # the forward sweep (a LoopSaving over all n iterations); a stretch's recomputation is a shorter one
        savers = [s for s in grad_program.stmts if isinstance(s.prim, LoopSaving) and s.prim.n == LOOP_N]
        assert len(savers) == 1, [s.prim.name for s in grad_program.stmts]
        (stack,) = savers[0].outs[1:]
        assert stack.aval.shape == (saved_rows, STATE), (k, stack.aval)
        assert not any(isinstance(s.prim, Loop) and s.prim.n == LOOP_N and s.prim.body is program.stmts[0].prim.body
                       for s in grad_program.stmts)


def test_big_checkpointed_loop_runs() -> None:
    x, w = np.full(STATE, 0.1), np.full(STATE, 0.5)
    reference = fold.vjp(big_loop(None), x, w)[1](np.array(1.0))
    got = fold.vjp(big_loop(8), x, w)[1](np.array(1.0))
    for a, b in zip(got, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("n", [0, 1, 6, 7, 12])
def test_gradients_with_and_without_checkpointing_agree(n: int) -> None:
    rng = np.random.default_rng(n)
    x, w, b = rng.uniform(-1, 1, (3,)), rng.uniform(0.2, 0.6, (3,)), rng.uniform(-1, 1, (2, 3))

    def make(k):
        def f(x, w, b):
            def body(i, s):
                h, acc = s
                h = fold.tanh(h * w + b[i % 2] + 0.1 * fold.convert(i, "float64"))
                return h, acc + fold.sum(h * h)

            h, acc = fold.loop(body, (x, np.zeros(())), n, checkpoint=k)
            return fold.sum(h * w) + acc

        return f

    ybar = np.array(1.3)
    reference = fold.vjp(make(None), x, w, b)[1](ybar)
    for k in (1, 2, 3, 4, 5, n, n + 3, 100):
        if k < 1:
            continue
        got = fold.vjp(make(k), x, w, b)[1](ybar)
        for a, r, name in zip(got, reference, "xwb", strict=True):
            np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-14, err_msg=f"n={n} checkpoint={k} d/d{name}")
        t_ref = fold.jvp(make(None), (x, w, b), (np.ones(3), np.ones(3), np.ones((2, 3))))[1]
        np.testing.assert_allclose(fold.jvp(make(k), (x, w, b), (np.ones(3), np.ones(3), np.ones((2, 3))))[1], t_ref, rtol=1e-12)
    from fold.testing import check_grads

    check_grads(make(3), (x, w, b), order=2 if n <= 7 else 1)


# ------------------------------------------------------------------------------------------ caches

def test_programs_of_functions_gone_are_freed():
    """Every cache of traced and transformed programs is keyed weakly: after eager vjp, jvp, grad and jit
    calls on functions that are then dropped, no run plan survives them (an eager vjp's runner once held
    its own key, as did the numba backend's entry for a program no pass changed: both lived forever)."""
    import gc

    from fold.runtime import interpreter

    x = np.arange(3.0)

    def use_once(k: int) -> None:
        f = lambda v: fold.reduce(lambda a, b: a * b, fold.map(lambda e: e * float(k) + 1.0, v), identity=1.0)  # noqa: E731
        fold.vjp(f, x)[1](1.0)
        fold.jvp(f, (x,), (x,))[1]
        fold.grad(f)(x)
        fold.jit(lambda v: fold.vjp(f, v)[1](1.0))(x)

    use_once(-1)  # whatever is made once per process
    gc.collect()
    before = len(interpreter._plans)
    for k in range(10):
        use_once(k)
    gc.collect()
    assert len(interpreter._plans) == before
