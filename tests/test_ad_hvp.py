"""Hessian-vector products, forward over reverse (`fold.jvp` of `fold.grad`), against analytic answers:
the k-means cost sum_p min_c ||p - c||^2 (written with map and reduce(min)) and a quadratic form."""

from __future__ import annotations

import numpy as np
import pytest

from fold import ad
import fold
from fold.testing import check_grads


def kmeans_cost(points, centroids):
    def nearest(p):
        return fold.reduce(fold.monoids.min, fold.map(lambda c: fold.sum((p - c) ** 2), centroids))

    return fold.reduce(fold.monoids.sum, fold.map(nearest, points))


def kmeans_cost_lambda_min(points, centroids):
    """The same cost with min written as a user lambda (recognised as minimum) and the squares as a product."""
    def nearest(p):
        dists = fold.map(lambda c: fold.sum((p - c) * (p - c)), centroids)
        return fold.reduce(lambda a, b: fold.minimum(a, b), dists, identity=np.inf)

    return fold.sum(fold.map(nearest, points))


def kmeans_data(n=40, k=4, d=3, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(k, d))
    labels = rng.integers(0, k, n)
    points = centres[labels] + rng.normal(scale=0.5, size=(n, d))
    centroids = centres + rng.normal(scale=0.3, size=(k, d))
    return points, centroids


def assignment(points, centroids):
    dists = ((points[:, None, :] - centroids[None, :, :]) ** 2).sum(-1)
    order = np.sort(dists, axis=1)
    assert np.all(order[:, 1] - order[:, 0] > 1e-3), "a point is (nearly) tied between two centroids"
    return dists.argmin(1)


@pytest.mark.parametrize("cost", [kmeans_cost, kmeans_cost_lambda_min], ids=["monoid_min", "lambda_min"])
@pytest.mark.parametrize("rule", ["auto", "generic"])
def test_kmeans_hessian_vector_product(cost, rule: str) -> None:
    points, centroids = kmeans_data()
    labels = assignment(points, centroids)
    counts = np.bincount(labels, minlength=len(centroids)).astype(float)
    assert np.all(counts > 0)

    grad_c = fold.grad(cost, argnums=1, reduce_rule=rule)
    # the gradient: 2 sum_{p in c} (c - p)
    expected_grad = 2 * (counts[:, None] * centroids - np.array([points[labels == j].sum(0) for j in range(len(centroids))]))
    np.testing.assert_allclose(grad_c(points, centroids), expected_grad, rtol=1e-10, atol=1e-10)

    # the Hessian in the centroids is block diagonal: 2 count_c I for centroid c
    v = np.random.default_rng(1).normal(size=centroids.shape)
    hvp = fold.jvp(grad_c, (points, centroids), (np.zeros_like(points), v))[1]
    np.testing.assert_allclose(hvp, 2 * counts[:, None] * v, rtol=1e-10, atol=1e-10)

    # and the mixed block: d/dP of the centroid gradient is -2 [p in c]
    u = np.random.default_rng(2).normal(size=points.shape)
    mixed = fold.jvp(grad_c, (points, centroids), (u, np.zeros_like(centroids)))[1]
    expected_mixed = -2 * np.array([u[labels == j].sum(0) for j in range(len(centroids))])
    np.testing.assert_allclose(mixed, expected_mixed, rtol=1e-10, atol=1e-10)


def test_kmeans_hessian_in_the_points_and_newton_step() -> None:
    points, centroids = kmeans_data(n=24, k=3, d=2, seed=3)
    labels = assignment(points, centroids)
    counts = np.bincount(labels, minlength=3).astype(float)
    grad_p = fold.grad(kmeans_cost, argnums=0)
    u = np.random.default_rng(4).normal(size=points.shape)
    np.testing.assert_allclose(fold.jvp(grad_p, (points, centroids), (u, np.zeros_like(centroids)))[1], 2 * u, rtol=1e-12)

    # one Newton step with the diagonal Hessian lands on the cluster means (Lloyd's update)
    grad_c = fold.grad(kmeans_cost, argnums=1)
    diag = fold.jvp(grad_c, (points, centroids), (np.zeros_like(points), np.ones_like(centroids)))[1]
    np.testing.assert_allclose(diag, 2 * counts[:, None] * np.ones_like(centroids), rtol=1e-12)
    newton = centroids - grad_c(points, centroids) / diag
    means = np.array([points[labels == j].mean(0) for j in range(3)])
    np.testing.assert_allclose(newton, means, rtol=1e-10, atol=1e-12)


def test_kmeans_second_derivatives_by_finite_differences() -> None:
    points, centroids = kmeans_data(n=10, k=3, d=2, seed=5)
    assignment(points, centroids)
    check_grads(kmeans_cost, (points, centroids), order=2)


def quadratic(x, a):
    return 0.5 * fold.dot(x, a @ x)


def quadratic_with_map(x, a):
    """0.5 sum_i x_i <a_i, x>, the inner products in a map over the rows of a, the sum a reduce."""
    return 0.5 * fold.reduce(fold.monoids.sum, fold.map(lambda row, xi: xi * fold.dot(row, x), a, x))


@pytest.mark.parametrize("form", [quadratic, quadratic_with_map], ids=["matmul", "map_reduce"])
def test_quadratic_form_hessian_vector_product(form) -> None:
    rng = np.random.default_rng(6)
    m = rng.normal(size=(5, 5))
    a = m + m.T  # symmetric, so the Hessian of 0.5 x^T A x is A
    x, v = rng.normal(size=5), rng.normal(size=5)
    grad_x = fold.grad(form, argnums=0)
    np.testing.assert_allclose(grad_x(x, a), a @ x, rtol=1e-12)
    np.testing.assert_allclose(fold.jvp(grad_x, (x, a), (v, np.zeros_like(a)))[1], a @ v, rtol=1e-12)

    # non-symmetric B: the Hessian is (B + B^T) / 2; and the derivative in B of the gradient is linear
    b = m
    np.testing.assert_allclose(fold.jvp(grad_x, (x, b), (v, np.zeros_like(b)))[1], 0.5 * (b + b.T) @ v, rtol=1e-12)
    db = rng.normal(size=(5, 5))
    np.testing.assert_allclose(fold.jvp(grad_x, (x, b), (np.zeros(5), db))[1], 0.5 * (db + db.T) @ x, rtol=1e-12)

    # reverse over reverse gives the same product: grad of <grad f(x), v>
    hvp_rr = fold.grad(lambda x_, a_: fold.dot(grad_x(x_, a_), v), argnums=0)(x, a)
    np.testing.assert_allclose(hvp_rr, a @ v, rtol=1e-12)


def test_hvp_programs_verify() -> None:
    """The forward-over-reverse program of the k-means cost passes check_program, and so does reverse over it."""
    points, centroids = kmeans_data(n=8, k=2, d=2, seed=7)
    program = fold.trace(kmeans_cost, points, centroids)
    grad_program, _ = ad.vjp_program(program)
    hvp_program, _ = ad.jvp_program(grad_program)
    fold.check_program(grad_program)
    fold.check_program(hvp_program)
    fold.check_program(ad.vjp_program(hvp_program)[0])
