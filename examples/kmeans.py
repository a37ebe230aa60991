"""k-means by Newton's method (the motivating example of the SC22 AD slides).

cost(C) = sum over points p of min over centroids c of ||p - c||^2. Its gradient comes from vjp; its Hessian
is diagonal (2 * |cluster c| on centroid c's coordinates), and jvp over vjp in the direction of all ones gives
exactly that diagonal. A Newton step C - grad / diag moves each centroid to its cluster's mean — Lloyd's step,
which reduce_by_index computes directly from cluster sums and counts; the example checks the two agree.
"""

from __future__ import annotations

import numpy as np

import fold


def squared_distances(p, C):
    return fold.map(lambda c: fold.reduce(fold.monoids.sum, (p - c) * (p - c)), C)


def cost(points, C):
    return fold.reduce(fold.monoids.sum, fold.map(lambda p: fold.reduce(fold.monoids.min, squared_distances(p, C)), points))


def assignments(points, C):
    """Index of the nearest centroid of each point (an argmin, as a reduce over (distance, index) pairs)."""
    def nearest(p):
        def better(a, b):
            return fold.where(b[0] < a[0], b[0], a[0]), fold.where(b[0] < a[0], b[1], a[1])

        return fold.reduce(better, (squared_distances(p, C), fold.iota(C.shape[0])), identity=(np.inf, 0))[1]

    return fold.map(nearest, points)


def lloyd_step(points, C):
    labels = assignments(points, C)
    sums = fold.reduce_by_index(fold.monoids.sum, C.shape[0], labels, points)
    counts = fold.reduce_by_index(fold.monoids.sum, C.shape[0], labels, fold.map(lambda p: 1.0, points))
    return sums / fold.reshape(fold.maximum(counts, 1.0), (C.shape[0], 1))


def newton_step(points, C):
    grad = fold.grad(cost, argnums=1)
    g = grad(points, C)
    hessian_diagonal = fold.jvp(lambda C_: grad(points, C_), (C,), (np.ones_like(C),))[1]
    return C - g / np.maximum(hessian_diagonal, 1e-12), g, hessian_diagonal


def synthetic(n: int, k: int, d: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=6.0, size=(k, d))
    points = centers[rng.integers(0, k, n)] + rng.normal(size=(n, d))
    return points, points[rng.choice(n, k, replace=False)]


def main(n: int = 300, k: int = 4, d: int = 2, steps: int = 6, verbose: bool = True) -> dict:
    points, C = synthetic(n, k, d)
    history = [float(fold.run(cost, points, C))]
    worst_vs_lloyd = 0.0
    for _ in range(steps):
        C_next, g, h = newton_step(points, C)
        worst_vs_lloyd = max(worst_vs_lloyd, float(np.max(np.abs(C_next - fold.run(lloyd_step, points, C)))))
        C = C_next
        history.append(float(fold.run(cost, points, C)))
    if verbose:
        print("k-means by Newton's method: cost per step", " -> ".join(f"{c:.2f}" for c in history))
        print(f"  largest difference between the Newton step and Lloyd's step (reduce_by_index): {worst_vs_lloyd:.2e}")
    return {"history": history, "newton_vs_lloyd": worst_vs_lloyd}


if __name__ == "__main__":
    main()
