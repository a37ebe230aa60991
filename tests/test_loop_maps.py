"""A fold.loop whose body works element by element on vector states, written as a map of a loop over scalars
(runtime/loops/loop_maps.py) and run by the loop nest as one pass, each element's steps in registers: the
rewritten program gives the original's results exactly, the numba backend's nests the numpy backend's
values and gradients, and loops whose elements meet each other (or the step's vector differs per element)
are left alone."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import Loop, Map
from fold.runtime.interpreter import eval_program
from fold.runtime.loops import LoopNest, fuse_loop_nests
from fold.runtime.loops.loop_maps import loops_as_maps
from fold.runtime import numpy_impl  # noqa: F401  (the numpy rules eval_program runs)

rng = np.random.default_rng(5)
N = 300


def horner(c, x):
    return fold.sum(fold.loop(lambda i, acc: acc * x + c[i], x * 0.0, c.shape[0]) ** 2)


def logistic_map(r, x):
    return fold.sum(fold.loop(lambda i, a: r * a * (1.0 - a), x, 12))


def long_logistic_map(r, x):
    """Too many steps to unroll (build.UNROLLED_STEPS): a loop of the nest."""
    return fold.sum(fold.loop(lambda i, a: r * a * (1.0 - a), x, 100))


def oscillator(k, x, v):
    """Two states, a captured per-element stiffness and a scalar step: symplectic Euler."""
    def step(i, s):
        p, q = s
        q = q - 0.05 * k * p
        return p + 0.05 * q, q
    p, q = fold.loop(step, (x, v), 20)
    return fold.sum(p * p + q * q)


def counted(x):
    """The counter read element by element (converted, broadcast), and a transcendental."""
    return fold.sum(fold.loop(lambda i, a: fold.tanh(a + 0.1 * i.astype(np.float64) * x), x, 7))


CLOSED_OVER = 0.3 * rng.normal(size=7)


def horner_closed_over(x):
    """Horner's rule's derivative along the coefficients, at coefficients and a direction the function closes
    over: the loops capture arrays that are literals of the program."""
    return fold.jvp(lambda c: horner(c, x), (CLOSED_OVER,), (CLOSED_OVER,))[1]


CASES = {
    "horner": (horner, lambda: ((0.3 * rng.normal(size=9)).astype(np.float32), rng.uniform(-1, 1, N).astype(np.float32))),
    "logistic_map": (logistic_map, lambda: (rng.uniform(3.0, 3.9, N), rng.uniform(0.1, 0.9, N))),
    "long_logistic_map": (long_logistic_map, lambda: (rng.uniform(3.0, 3.9, N), rng.uniform(0.1, 0.9, N))),
    "oscillator": (oscillator, lambda: (rng.uniform(0.5, 2.0, N), rng.normal(size=N), rng.normal(size=N))),
    "counted": (counted, lambda: (rng.normal(size=N),)),
    "horner_closed_over": (horner_closed_over, lambda: (rng.uniform(-1, 1, N),)),
}


def _loops(program) -> list:
    return [s for s in program.stmts if isinstance(s.prim, Loop)]


def _rewritten(f, args) -> tuple:
    """(f's program as jit prepares it for a backend, that program after loops_as_maps, the maps written)."""
    program = dce(cse(fold.trace(f, *args)))
    return (program, *loops_as_maps(program))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_loop_over_vectors_becomes_a_map_of_a_loop_over_scalars_with_the_same_results(case):
    f, make = CASES[case]
    args = make()
    program, rewritten, maps = _rewritten(f, args)
    assert maps and not _loops(rewritten)
    (made,) = [s for s in rewritten.stmts if s.outs[0] in maps][:1]
    assert isinstance(made.prim, Map)
    (inner,) = made.prim.body.stmts
    assert isinstance(inner.prim, Loop) and all(v.aval.shape == () for v in inner.outs)
    for want, got in zip(eval_program(program, list(args)), eval_program(rewritten, list(args)), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_loops_run_in_a_nest_on_the_numba_backend_as_on_numpy(case):
    f, make = CASES[case]
    args = make()
    prepared = fuse_loop_nests(dce(cse(fold.trace(f, *args))))
    assert not _loops(prepared) and any(isinstance(s.prim, LoopNest) for s in prepared.stmts)
    rtol = 1e-5 if args[0].dtype == np.float32 else 1e-12
    np.testing.assert_allclose(fold.jit(f, backend="numba")(*args), fold.jit(f, backend="numpy")(*args), rtol=rtol)
    grad = fold.grad(f, argnums=tuple(range(len(args))))
    for got, want in zip(fold.jit(grad, backend="numba")(*args), fold.jit(grad, backend="numpy")(*args), strict=True):
        np.testing.assert_allclose(got, want, rtol=20 * rtol, atol=20 * rtol)


def _stacks(program) -> list:
    """The top-level values of (steps, N) elements: a forward loop's saved states."""
    return [v for s in program.stmts for v in s.outs if v.aval.ndim == 2 and v.aval.shape[1] == N]


@pytest.mark.parametrize("case", ["logistic_map", "oscillator", "counted", "horner"])
def test_a_reverse_loop_runs_the_forward_loop_again_for_its_element_instead_of_reading_a_stack(case):
    """The gradient's reverse loop reads the forward loop's saved states one row per step (stack[n - 1 - i]),
    each element its own entry of that row. The reverse loop is a map over the elements whose body first runs
    the forward loop over the element's scalars, saving its states there (re-execution, as the reverse mode
    does elsewhere), so no (steps, elements) stack is made, and the forward loop, its stacks unread, is a map
    of a loop over scalars too, or gone where only its stacks were read."""
    f, make = CASES[case]
    args = make()
    grad = fold.grad(f, argnums=tuple(range(len(args))))
    program, rewritten, maps = _rewritten(grad, args)
    assert _loops(program) and _stacks(program), "the reverse loop, and the forward loop's stack"
    assert maps and not _stacks(rewritten), rewritten
    assert not any(s.prim.name == "loop_saving" for s in rewritten.stmts)
    # Horner's coefficients' cotangent stays a loop over the coefficients, reading the elements' sums
    assert not any(N in shape for shapes in _looped_states(rewritten) for shape in shapes), rewritten
    tol = 1e-6 if args[0].dtype == np.float32 else 1e-13
    for want, got in zip(eval_program(program, list(args)), eval_program(rewritten, list(args)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)
    prepared = fuse_loop_nests(program)
    assert not [s.prim.name for s in prepared.stmts if s.prim.name in ("loop_saving", "map")], prepared
    assert not _stacks(prepared) and not any(N in shape for shapes in _looped_states(prepared) for shape in shapes)
    rtol = 1e-5 if args[0].dtype == np.float32 else 1e-12
    for got, want in zip(fold.jit(grad, backend="numba")(*args), fold.jit(grad, backend="numpy")(*args), strict=True):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("closed_over", [False, True])
@pytest.mark.parametrize("case", ["logistic_map", "oscillator"])
def test_a_hessian_vector_product_in_every_argument_makes_no_stack_and_agrees(case, closed_over):
    """The HVP's forward loop carries tangents beside the states and saves both: run again per element too,
    whether the directions are arguments or arrays the function closes over (literals of the program)."""
    f, make = CASES[case]
    args = make()
    grad = fold.grad(f, argnums=tuple(range(len(args))))
    n = len(args)
    directions = tuple(rng.normal(size=a.shape) for a in args)
    if closed_over:
        hvp = lambda *a: fold.jvp(grad, a, directions)[1]  # noqa: E731
    else:
        hvp = lambda *a: fold.jvp(grad, a[:n], a[n:])[1]  # noqa: E731
        args = args + directions
    prepared = fuse_loop_nests(dce(cse(fold.trace(hvp, *args))))
    assert not _stacks(prepared) and not any(s.prim.name in ("loop", "loop_saving") for s in prepared.stmts)
    for got, want in zip(fold.jit(hvp, backend="numba")(*args), fold.jit(hvp, backend="numpy")(*args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def _vector(shape=(N,)):
    return lambda: (rng.normal(size=shape),)


LEFT_ALONE = {
    # the step's vector is the same each step but not for each element
    "iota": (lambda x: fold.loop(lambda i, a: a + fold.iota(N).astype(np.float64), x, 3), _vector()),
    # the elements meet: a sum, a shift
    "sum": (lambda x: fold.loop(lambda i, a: a - fold.sum(a) / N, x, 3), _vector()),
    "shift": (lambda x: fold.loop(lambda i, a: fold.concatenate([a[1:], a[:1]]), x, 3), _vector()),
    # a captured vector read at the counter, not element by element
    "gathered": (lambda x: fold.loop(lambda i, a: a * x[i], x, 3), _vector()),
    # a captured stack of vectors read whole, not one row per step
    "stack read whole": (lambda x, W: fold.loop(lambda i, a: a * W[i] + fold.sum(W), x, 3),
                         lambda: (rng.normal(size=N), rng.normal(size=(3, N)))),
    # matrix states are left to the elementwise kernels
    "matrix": (lambda x: fold.loop(lambda i, a: a * 0.5 + 1.0, x, 3), _vector((20, 15))),
}


@pytest.mark.parametrize("name", sorted(LEFT_ALONE))
def test_loops_whose_elements_meet_are_left_alone(name):
    f, make = LEFT_ALONE[name]
    args = make()
    program, rewritten, maps = _rewritten(f, args)
    assert not maps and rewritten is program
    np.testing.assert_allclose(fold.jit(f, backend="numba")(*args), fold.jit(f, backend="numpy")(*args), rtol=1e-12)


def scaled_sums(c, x):
    """A loop whose scalar state gains, each step, the sum over the elements of the vector state times a
    captured vector: the sum's value is computed again per element from the saved states."""
    def step(i, s):
        a, total = s
        return a * 0.9 + c[i] * x, total + fold.sum(a * x) * c[i]
    a, total = fold.loop(step, (x * 0.0, 0.0), c.shape[0])
    return total + fold.sum(a)


def horner_gradient(c, x):
    return fold.grad(horner, argnums=(0,))(c, x)


def horner_hvp(c, x):
    return fold.jvp(horner_gradient, (c, x), (c, x * 0.0))[1]


SPLIT = {
    "scaled_sums": (scaled_sums, lambda: (rng.normal(size=6), rng.normal(size=N))),
    "horner_gradient": (horner_gradient, CASES["horner"][1]),
    "horner_hvp": (horner_hvp, CASES["horner"][1]),
}


def _looped_states(program) -> list[tuple]:
    return [tuple(v.aval.shape for v in s.outs) for s in _loops(program)]


@pytest.mark.parametrize("case", sorted(SPLIT))
def test_a_loop_whose_other_states_read_the_elements_only_through_sums_splits_in_two(case):
    """A loop's states of n elements that never read its other states, where those read the elements only
    through sums over them (a coefficient's cotangent in a loop's gradient), split: a map over the elements
    of a loop over scalars that also returns each summed value at every step, the sums of those over the
    elements, and a loop over the other states alone reading step i's sums."""
    f, make = SPLIT[case]
    args = make()
    program, rewritten, maps = _rewritten(f, args)
    assert any(N in shape for shapes in _looped_states(program) for shape in shapes)
    assert maps and _loops(rewritten)
    assert not any(N in shape for shapes in _looped_states(rewritten) for shape in shapes), _looped_states(rewritten)
    tol = 1e-5 if args[0].dtype == np.float32 else 1e-12
    for want, got in zip(eval_program(program, list(args)), eval_program(rewritten, list(args)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)
    prepared = fuse_loop_nests(program)
    nests = [s for s in prepared.stmts if isinstance(s.prim, LoopNest)]
    assert any("loop_saving" in str(s.prim.program) for s in nests)
    assert not any(N in shape for shapes in _looped_states(prepared) for shape in shapes)
    for got, want in zip(np.atleast_1d(fold.jit(f, backend="numba")(*args)),
                         np.atleast_1d(fold.jit(f, backend="numpy")(*args)), strict=True):
        np.testing.assert_allclose(got, want, rtol=20 * tol, atol=20 * tol)


def test_the_split_loops_gradient_matches_finite_differences():
    """The split primal loop differentiated (its gradient splits again) on the numba backend, against central
    differences of the numpy backend's primal."""
    c, x = rng.normal(size=5), rng.normal(size=N)
    grad = fold.jit(fold.grad(scaled_sums, argnums=(0, 1)), backend="numba")(c, x)
    primal = fold.jit(scaled_sums, backend="numpy")
    for k, (arg, g) in enumerate(zip((c, x), grad, strict=True)):
        for j in range(0, arg.size, max(1, arg.size // 7)):
            step = np.zeros_like(arg)
            step[j] = 1e-6
            moved = [c, x]
            moved[k] = arg + step
            up = primal(*moved)
            moved[k] = arg - step
            down = primal(*moved)
            np.testing.assert_allclose(g[j], (up - down) / 2e-6, rtol=1e-6, atol=1e-7)


NOT_SPLIT = {
    # the vector state reads the scalar state
    "scalar read by the elements": lambda c, x: fold.loop(
        lambda i, s: (s[0] * s[1] + x, s[1] + fold.sum(s[0]) * 1e-3), (x, 1.0), 4)[1],
    # the sum is read by the vector state too (its elements meet)
    "sum read by the elements": lambda c, x: fold.loop(
        lambda i, s: (s[0] - fold.sum(s[0]) / N, s[1] + fold.sum(s[0])), (x, 0.0), 4)[1],
    # the scalar state reads an element, not a sum
    "an element read": lambda c, x: fold.loop(lambda i, s: (s[0] * 0.5, s[1] + s[0][3]), (x, 0.0), 4)[1],
}


@pytest.mark.parametrize("name", sorted(NOT_SPLIT))
def test_loops_whose_states_meet_otherwise_do_not_split(name):
    f = NOT_SPLIT[name]
    args = (rng.normal(size=4), rng.normal(size=N))
    program, rewritten, maps = _rewritten(f, args)
    assert not maps and rewritten is program
    np.testing.assert_allclose(fold.jit(f, backend="numba")(*args), fold.jit(f, backend="numpy")(*args), rtol=1e-12)
