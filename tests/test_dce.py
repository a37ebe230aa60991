"""Dead-code elimination of what loops carry and capture: a gradient's reverse loop carries a cotangent for
every input and a forward loop saves every state, whether or not anything reads them; and of what a reduce
or scan folds: a jvp folds a tangent beside each primal leaf, whether or not anything reads it."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.ir import Program
from fold.primitives import Loop, LoopSaving, Reduce, Scan
import fold.runtime.numpy_impl  # noqa: F401  (registers the rules eval_program runs)
from fold.runtime.interpreter import eval_program

rng = np.random.default_rng(7)


def statements_of(program: Program, kinds: tuple) -> list:
    """Every statement of these primitive kinds, nested bodies included."""
    found = []
    for stmt in program.stmts:
        if isinstance(stmt.prim, kinds):
            found.append(stmt)
        for body in stmt.prim.bodies():
            found += statements_of(body, kinds)
    return found


def loops(program: Program) -> list:
    return statements_of(program, (Loop, LoopSaving))


def horner(c, x):
    return fold.sum(fold.loop(lambda i, acc: acc * x + c[i], x * 0.0, c.shape[0]) ** 2)


def test_a_loop_carries_only_the_states_its_results_need():
    # the second leaf feeds nothing returned; the third feeds the first, so it stays
    def f(x):
        a, _, _ = fold.loop(lambda i, s: (s[0] * 2.0 + s[2], s[1] * 3.0, s[2] + 1.0), (x, x, x), 4)
        return a

    x = rng.normal(size=5)
    program = fold.trace(f, x)
    cleaned = dce(program)
    (loop,) = loops(cleaned)
    assert len(loop.outs) == 2 and len(loop.prim.body.inputs) == 1 + 2
    np.testing.assert_allclose(eval_program(cleaned, [x])[0], eval_program(program, [x])[0], rtol=0, atol=0)


def test_a_loop_without_the_values_its_body_no_longer_reads():
    def f(x, w, v):
        a, _ = fold.loop(lambda i, s: (s[0] * w, s[1] * v), (x, x), 3)
        return a

    x, w, v = rng.normal(size=4), rng.normal(size=4), rng.normal(size=4)
    program = fold.trace(f, x, w, v)
    (loop,) = loops(dce(program))
    assert loop.prim.num_consts == 1
    assert program.inputs[2] not in loop.args and program.inputs[1] in loop.args


def test_a_gradient_that_reads_no_saved_state_runs_a_plain_forward_loop():
    # Horner's rule: d(acc * x + c_i)/d acc = x, so no reverse step reads a state the forward loop saved
    c, x = rng.normal(size=6), rng.uniform(-1, 1, 50)
    program = dce(cse(fold.trace(fold.grad(horner), c, x)))
    assert not any(isinstance(s.prim, LoopSaving) for s in loops(program)), program
    want = 2 * np.array([np.sum(_horner_values(c, x) * x ** (5 - i)) for i in range(6)])
    np.testing.assert_allclose(eval_program(program, [c, x])[0], want, rtol=1e-10)


def _horner_values(c, x):
    acc = np.zeros_like(x)
    for ci in c:
        acc = acc * x + ci
    return acc


def test_a_gradient_that_reads_its_saved_states_keeps_them():
    def logistic(r, x0):
        return fold.sum(fold.loop(lambda i, a: r * a * (1.0 - a), x0, 5))

    r, x0 = rng.uniform(3.0, 3.9, 40), rng.uniform(0.1, 0.9, 40)
    program = dce(cse(fold.trace(fold.grad(logistic), r, x0)))
    assert any(isinstance(s.prim, LoopSaving) for s in loops(program))
    eps, got = 1e-6, eval_program(program, [r, x0])[0]
    for k in (0, 17, 39):
        dr = np.zeros_like(r)
        dr[k] = eps
        f = fold.jit(logistic, backend="numpy")
        fd = (f(r + dr, x0) - f(r - dr, x0)) / (2 * eps)
        np.testing.assert_allclose(got[k], fd, rtol=1e-5)


@pytest.mark.parametrize("checkpoint", [None, 3])
def test_the_reverse_sweep_of_a_loop_is_not_a_loop_of_one_step_per_iteration(checkpoint):
    # without checkpointing each reverse step is written in place; with it, a loop over the two stretches
    # recomputes a stretch's states (a loop of 2) and steps back through its 3 iterations (a loop of 3)
    def f(c, x):
        return fold.sum(fold.loop(lambda i, acc: fold.sin(acc) * x + c[i], x, 6, checkpoint=checkpoint))

    c, x = rng.normal(size=6), rng.normal(size=8)
    program = dce(cse(fold.trace(fold.grad(f), c, x)))
    inner = sorted(s.prim.n for s in loops(program) if s.prim.n != 6)
    assert inner == ([] if checkpoint is None else [2, 2, 3]), inner
    eps = 1e-6
    got = eval_program(program, [c, x])[0]
    f_np = fold.jit(f, backend="numpy")
    for k in range(6):
        dc = np.zeros(6)
        dc[k] = eps
        np.testing.assert_allclose(got[k], (f_np(c + dc, x) - f_np(c - dc, x)) / (2 * eps), rtol=1e-5)


def folds(program: Program) -> list:
    return statements_of(program, (Reduce, Scan))


@pytest.mark.parametrize("combinator", ["reduce", "scan"])
def test_a_fold_keeps_only_the_leaves_its_results_need(combinator):
    # three leaves: the sum is not returned and reads no other leaf; the product is returned; the max's
    # weight is returned and reads the max, which therefore stays though nothing returns it
    def op(a, b):
        take_b = b[2] > a[2]
        return a[0] + b[0], a[1] * b[1], fold.where(take_b, b[2], a[2]), fold.where(take_b, b[3], a[3])

    def f(x, y, v, w):
        out = getattr(fold, combinator)(op, (x, y, v, w), identity=(0.0, 1.0, -np.inf, 0.0))
        return out[1], out[3]

    x, y, v, w = rng.normal(size=9), rng.uniform(0.5, 1.5, 9), rng.normal(size=9), rng.normal(size=9)
    program = fold.trace(f, x, y, v, w)
    cleaned = dce(program)
    (stmt,) = folds(cleaned)
    assert len(stmt.outs) == 3 and stmt.prim.num_leaves == 3
    assert program.inputs[0] not in stmt.args and stmt.prim.monoid is None
    for got, want in zip(eval_program(cleaned, [x, y, v, w]), eval_program(program, [x, y, v, w]), strict=True):
        np.testing.assert_array_equal(got, want)
    got = fold.jit(f, backend="numba")(x, y, v, w)
    np.testing.assert_allclose(got[0], eval_program(program, [x, y, v, w])[0], rtol=1e-12)


def test_a_jvp_of_a_minimum_whose_tangent_nothing_reads_folds_the_minimum_alone():
    # the Hessian-vector product of k-means with respect to the points reads the nearest centroid's position,
    # not the tangent of the distance to it: the reduce that carried both carries the minimum alone
    def cost(P, C):
        cc = fold.map(lambda c: fold.sum(c * c), C)
        return fold.sum(fold.map(lambda p: fold.reduce(fold.monoids.min, fold.sum(p * p) - 2.0 * (C @ p) + cc), P))

    P, C, T = rng.normal(size=(30, 4)), rng.normal(size=(5, 4)), rng.normal(size=(30, 4))
    hvp = lambda P, C: fold.jvp(fold.grad(cost), (P, C), (T, np.zeros_like(C)))[1]
    program = dce(cse(fold.trace(hvp, P, C)))
    assert all(s.prim.num_leaves == 1 for s in folds(program)), program
    np.testing.assert_allclose(eval_program(program, [P, C])[0], 2.0 * T, rtol=1e-12)
