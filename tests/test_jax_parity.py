"""The same functions through fold and through JAX: vmap, jacfwd, jacrev, hessian, linearize, has_aux, the
vjp/jvp contracts, static arguments, and the NumPy functions fold traces. Skipped (visibly) where JAX is not
installed (it is in the `bench` extra, not the `test` one); tests/test_transformations.py and
tests/test_numpy_reductions.py check the same without JAX.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax, or the bench extra)")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

import fold  # noqa: E402

RNG = np.random.default_rng(7)
X = RNG.normal(size=4)
W = RNG.normal(size=(3, 4))


def close(a, b, rtol=1e-10, atol=1e-12):
    la, ta = fold.tree_flatten(a)
    lb = jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb), (ta, jax.tree_util.tree_structure(b))
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# each function written once against a module `np_` (numpy inside fold's trace, jax.numpy for JAX)
def mlp(np_, x, w):
    return np_.tanh(w @ x)


def scalar(np_, x, w):
    return np_.sum(np_.sin(w @ x) * np_.exp(x[0]))


def with_aux(np_, x, w):
    return np_.sum(np_.tanh(w @ x) ** 2), {"h": w @ x}


def tree_fn(np_, p):
    return {"a": p["u"] * p["v"][0], "b": np_.sum(p["u"] ** 2)}


def looped_fold(x, n):
    return fold.sum(fold.loop(lambda i, s: s * x, x, n))


def looped_jax(x, n):
    return jnp.sum(jax.lax.fori_loop(0, n, lambda i, s: s * x, x))


def both(fn):
    return (lambda *a: fn(np, *a)), (lambda *a: fn(jnp, *a))


@pytest.mark.parametrize("name", ["jacfwd", "jacrev", "hessian"])
@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_jacobians(name, argnums) -> None:
    f_fold, f_jax = both(scalar if name == "hessian" else mlp)
    close(getattr(fold, name)(f_fold, argnums)(X, W), getattr(jax, name)(f_jax, argnums)(X, W))


@pytest.mark.parametrize("name", ["jacfwd", "jacrev"])
def test_jacobian_of_pytrees(name) -> None:
    f_fold, f_jax = both(tree_fn)
    p = {"u": X, "v": np.array([2.0, 3.0])}
    close(getattr(fold, name)(f_fold)(p), getattr(jax, name)(f_jax)(p))


@pytest.mark.parametrize("in_axes, out_axes, shapes", [
    (0, 0, [(5, 4), (5, 3, 4)]),
    ((0, None), 0, [(5, 4), (3, 4)]),
    ((1, None), 1, [(4, 5), (3, 4)]),
    ([None, 2], -1, [(4,), (3, 4, 5)]),
])
def test_vmap(in_axes, out_axes, shapes) -> None:
    f_fold, f_jax = both(mlp)
    args = [RNG.normal(size=s) for s in shapes]
    close(fold.vmap(f_fold, in_axes, out_axes)(*args), jax.vmap(f_jax, in_axes, out_axes)(*args))


def test_vmap_of_grad() -> None:
    f_fold, f_jax = both(scalar)
    xs = RNG.normal(size=(6, 4))
    close(fold.vmap(fold.grad(f_fold), (0, None))(xs, W), jax.vmap(jax.grad(f_jax), (0, None))(xs, W))


def test_has_aux() -> None:
    f_fold, f_jax = both(with_aux)
    close(fold.value_and_grad(f_fold, argnums=(0, 1), has_aux=True)(X, W),
          jax.value_and_grad(f_jax, argnums=(0, 1), has_aux=True)(X, W))
    close(fold.grad(f_fold, has_aux=True)(X, W), jax.grad(f_jax, has_aux=True)(X, W))
    close(fold.jacrev(f_fold, has_aux=True)(X, W), jax.jacrev(f_jax, has_aux=True)(X, W))


def test_vjp_and_jvp_contracts() -> None:
    f_fold, f_jax = both(mlp)
    y, pb = fold.vjp(f_fold, X, W)
    y_j, pb_j = jax.vjp(f_jax, X, W)
    close(y, y_j)
    for ct in (np.ones(3), RNG.normal(size=3)):
        close(pb(ct), pb_j(ct))
    close(fold.jit(pb)(np.ones(3)), jax.jit(pb_j)(np.ones(3)))
    tangents = (RNG.normal(size=4), RNG.normal(size=(3, 4)))
    close(fold.jvp(f_fold, (X, W), tangents), jax.jvp(f_jax, (X, W), tangents))
    y, pb, aux = fold.vjp(lambda x, w: with_aux(np, x, w), X, W, has_aux=True)
    y_j, pb_j, aux_j = jax.vjp(lambda x, w: with_aux(jnp, x, w), X, W, has_aux=True)
    close((y, pb(1.0), aux), (y_j, pb_j(1.0), aux_j))


def test_linearize() -> None:
    f_fold, f_jax = both(mlp)
    y, f_jvp = fold.linearize(f_fold, X, W)
    y_j, f_jvp_j = jax.linearize(f_jax, X, W)
    t = (RNG.normal(size=4), RNG.normal(size=(3, 4)))
    close((y, f_jvp(*t)), (y_j, f_jvp_j(*t)))


def test_integer_primal_with_float0_tangent() -> None:
    ints = np.arange(4)
    f = lambda x, i: x * i  # noqa: E731
    float0 = np.zeros(4, dtype=jax.dtypes.float0)
    close(fold.jvp(f, (X, ints), (np.ones(4), float0)), jax.jvp(f, (X, ints), (np.ones(4), float0)))


@pytest.mark.parametrize("name", ["grad", "jacfwd", "jacrev", "hessian"])
def test_static_argnums_through_transformations(name) -> None:
    x = np.abs(X) + 0.5
    close(fold.jit(getattr(fold, name)(looped_fold), static_argnums=1)(x, 3),
          jax.jit(getattr(jax, name)(looped_jax), static_argnums=1)(x, 3))
    close(fold.jit(getattr(fold, name)(looped_fold), static_argnames="n")(x, n=3),
          jax.jit(getattr(jax, name)(looped_jax), static_argnames="n")(x, n=3))


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean", "var", "std", "argmax", "argmin", "any", "all",
                                  "cumsum", "cumprod"])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_numpy_functions_against_jax_numpy(name, axis) -> None:
    x = RNG.normal(size=(3, 4)) + 0.2
    close(fold.run(lambda x: getattr(np, name)(x, axis=axis), x), getattr(jnp, name)(x, axis=axis))
    if name not in ("argmax", "argmin", "any", "all"):
        loss_fold = lambda x: np.sum(getattr(np, name)(x, axis=axis) ** 2)  # noqa: E731
        loss_jax = lambda x: jnp.sum(getattr(jnp, name)(x, axis=axis) ** 2)  # noqa: E731
        close(fold.grad(loss_fold)(x), jax.grad(loss_jax)(x), rtol=1e-9, atol=1e-11)


def test_norm_against_jax_numpy() -> None:
    x = RNG.normal(size=(3, 4))
    close(fold.grad(lambda x: np.linalg.norm(x) + np.sum(np.linalg.norm(x, ord=1, axis=0)))(x),
          jax.grad(lambda x: jnp.linalg.norm(x) + jnp.sum(jnp.linalg.norm(x, ord=1, axis=0)))(x))


@pytest.mark.parametrize("subscripts,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("bi,bi->b", [(3, 4), (3, 4)]),
    ("ii->i", [(3, 3)]), ("...ij,...jk", [(2, 3, 4), (4, 5)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
])
def test_einsum_against_jax_numpy(subscripts, shapes) -> None:
    operands = [RNG.normal(size=s) for s in shapes]
    close(fold.run(lambda *a: np.einsum(subscripts, *a), *operands), jnp.einsum(subscripts, *operands))
    argnums = tuple(range(len(operands)))
    close(fold.grad(lambda *a: np.sum(np.sin(np.einsum(subscripts, *a))), argnums)(*operands),
          jax.grad(lambda *a: jnp.sum(jnp.sin(jnp.einsum(subscripts, *a))), argnums)(*operands))


@pytest.mark.parametrize("name", ["set", "add", "multiply", "min", "max"])
@pytest.mark.parametrize("index", [1, slice(1, 3), np.array([0, 2, 2]), (np.array([3, 0]), 1)], ids=str)
def test_index_updates_against_jax(name, index) -> None:
    x, shape = RNG.normal(size=(4, 5)), np.empty((4, 5))[index].shape
    v = RNG.normal(size=shape) + 0.05
    if name == "set" and isinstance(index, np.ndarray):
        v = np.broadcast_to(v[:1], shape).copy()  # JAX leaves the winner of a repeated index unspecified: no repeats
    f_fold = lambda x, v: np.sum(np.sin(getattr(x.at[index], name)(v)))  # noqa: E731
    f_jax = lambda x, v: jnp.sum(jnp.sin(getattr(jnp.asarray(x).at[index], name)(v)))  # noqa: E731
    close(fold.run(f_fold, x, v), f_jax(x, v))
    if name == "multiply" and not isinstance(index, (int, slice)):
        return  # JAX differentiates scatter_mul only with unique_indices=True (tests/test_numpy_at.py checks fold's)
    close(fold.grad(f_fold, (0, 1))(x, v), jax.grad(f_jax, (0, 1))(x, v))


def test_masked_reductions_against_jax_numpy() -> None:
    x = RNG.normal(size=(4, 5))
    f_fold = lambda x: np.sum(x[x > 0] ** 2) + np.max(x[x < 0.5], initial=-3.0) + np.var(x, axis=1, where=x > -0.5).sum()  # noqa: E731
    f_jax = lambda x: (jnp.sum(x ** 2, where=x > 0) + jnp.max(x, where=x < 0.5, initial=-3.0)  # noqa: E731
                       + jnp.var(x, axis=1, where=x > -0.5).sum())
    close(fold.run(f_fold, x), f_jax(x))
    close(fold.grad(f_fold)(x), jax.grad(f_jax)(x))
