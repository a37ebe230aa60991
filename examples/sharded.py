"""Sharded fold programs on a Dask cluster (fold.shard), each checked against the unsharded run.

1. Megatron's MLP (seeds 002 and 004): Y = gelu(X A) B with A split by columns and B by rows. Each worker
   computes its slice of the hidden layer and a partial product; one combine (a sum, in a tree) gives Y.
   Its gradient shards the same way: dA and dB stay split, dX is the backward's one sum.
2. Vocabulary-parallel cross-entropy: the class matrix C split by rows (the vocabulary). Each worker folds
   its classes into partial cross_entropy states {p, n} per row; the states combine with the monoid's
   operator. The gradient broadcasts the totals and applies D locally (Theorem 2.1): dC stays split.
3. A k-means step: the points split (data parallel). Assignments are a map, cluster sums and counts are
   reduce_by_index histograms combined across workers, and the cost's gradient sums over shards.

Run `python examples/sharded.py` (starts a LocalCluster of 2 worker processes).
"""

from __future__ import annotations

import os
import sys

import numpy as np

import fold

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_layers import cross_entropy  # noqa: E402
from kmeans import cost, lloyd_step  # noqa: E402


def gelu(x):
    return 0.5 * x * (1.0 + fold.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def mlp(X, A, B):
    """Megatron's MLP block: gelu(X A) B."""
    return gelu(X @ A) @ B


def mlp_loss(X, A, B, G):
    """<Y, G>: a scalar whose gradient is the MLP's vjp with cotangent G."""
    return fold.sum(fold.sum(mlp(X, A, B) * G, axis=1))


def megatron(client=None, batch=8, d=6, hidden=16, workers=2) -> float:
    """Forward and gradient of the MLP, A column-split and B row-split; the largest relative difference."""
    rng = np.random.default_rng(0)
    X, A, B, G = rng.normal(size=(batch, d)), rng.normal(size=(d, hidden)), rng.normal(size=(hidden, d)), rng.normal(size=(batch, d))
    forward = fold.shard(mlp, split={1: 1, 2: 0}, chunks=workers, client=client)
    grads = fold.shard(fold.grad(mlp_loss, argnums=(0, 1, 2)), split={1: 1, 2: 0}, chunks=workers, client=client)
    errors = [_rel(forward(X, A, B), fold.run(mlp, X, A, B))]
    errors += [_rel(a, b) for a, b in zip(grads(X, A, B, G), fold.grad(mlp_loss, argnums=(0, 1, 2))(X, A, B, G))]
    print(f"Megatron MLP: forward and gradient, {forward.last_call.merges} combine forward; largest difference {max(errors):.1e}")
    return max(errors)


def vocabulary_parallel(client=None, m=16, d=8, vocabulary=64, workers=2, block=(8, 16)) -> float:
    """Mean cross-entropy and its gradient, the vocabulary split over the workers."""
    rng = np.random.default_rng(1)
    P, C, t = rng.normal(size=(m, d)), rng.normal(size=(vocabulary, d)), rng.integers(0, vocabulary, size=m)

    def loss(P, C, t):
        return fold.sum(cross_entropy(P, C, t, block=block)) / P.shape[0]

    vg = fold.value_and_grad(loss, argnums=(0, 1))
    sharded = fold.shard(vg, split={1: 0}, chunks=workers, client=client)
    (value, (gP, gC)), (value0, (gP0, gC0)) = sharded(P, C, t), vg(P, C, t)
    error = max(_rel(value, value0), _rel(gP, gP0), _rel(gC, gC0))
    print(f"vocabulary-parallel cross-entropy: loss {value:.6f}, {sharded.last_call.bytes_moved} bytes moved between "
          f"workers; largest difference {error:.1e}")
    return error


def kmeans(client=None, n=60, k=3, d=2, workers=2) -> float:
    """One Lloyd step and the cost's gradient with the points split over the workers."""
    rng = np.random.default_rng(2)
    points = np.concatenate([rng.normal(loc=3.0 * c, size=(n // k, d)) for c in range(k)])
    C = points[rng.choice(n, k, replace=False)]
    step = fold.shard(lloyd_step, chunks=workers, client=client)
    grad = fold.shard(fold.grad(cost, argnums=1), chunks=workers, client=client)
    error = max(_rel(step(points, C), fold.run(lloyd_step, points, C)), _rel(grad(points, C), fold.grad(cost, argnums=1)(points, C)))
    print(f"k-means: a Lloyd step and the cost's gradient on {n} points in {workers} chunks; largest difference {error:.1e}")
    return error


def _rel(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def main(client=None) -> None:
    assert max(megatron(client), vocabulary_parallel(client), kmeans(client)) < 1e-12


if __name__ == "__main__":
    main()
