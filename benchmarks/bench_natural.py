"""Programs written the obvious way, with nested map and reduce (issue 39): fold's numba backend against JAX
jit of the same formulation (jax.vmap for each map) and against the best form in fold where one exists (the
matrix-product form of k-means).

Cases: the k-means cost (n points, k centroids, d dimensions: a map of a reduce(min) of a map of a
reduce(sum)), its gradient with respect to the centroids and its Hessian-vector product; the negative
log-likelihood of a Gaussian mixture with unit variances as a map over points of a logsumexp over components;
a row-wise logsumexp; softmax cross-entropy written with map and reduce (a map over rows of the logits and
one-hot targets); the minimum pairwise squared distance between two point sets; a three-deep nest whose
innermost map captures a weight vector. Gradients are of the summed output with respect to the first argument
(`--modes grad_all`: with respect to every floating argument; `hvp_all`: the Hessian-vector product in a direction in
every floating argument).

Each (case, implementation, mode) runs in a fresh process (`--worker`), with fold's freed-memory retention off
(FOLD_KEEP_FREED_MEMORY=0) and glibc returning big buffers to the system at once (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_), so that the peak RSS of the measured call (VmHWM, reset before it, less the RSS
before it) is the call's own and not hidden by a warm-up call's retained heap. Times are warm medians.

Targets (issue 39): fold's natural form no slower than JAX's same formulation and within 1.5x of fold's best
form; gradient and Hessian-vector product peak memory at most 2x the inputs plus outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

from .bench_gemm import _current_rss_bytes, _peak_rss_bytes, _reset_peak_rss
from . import numpy_style
from .common import RESULTS_DIR, machine, plot_ratios, warm_up, write_json

MODES = ("primal", "grad", "hvp")
# asked for with --modes: the gradient with respect to every floating argument (k-means' points and centroids), and the
# Hessian-vector product with a direction in every argument, steps away from `grad`'s first argument alone
# (bench_ab times MODES only, so that an older tree can run them)
EXTRA_MODES = ("grad_all", "hvp_all")


def sizes(quick: bool) -> dict[str, dict[str, int]]:
    if quick:
        return {"kmeans": dict(n=2000, d=8, k=16), "gmm": dict(n=2000, d=8, k=8), "logsumexp": dict(n=200, m=100),
                "cross_entropy": dict(n=200, m=100), "min_pairwise": dict(n=300, m=200, d=3),
                "three_deep": dict(n=100, m=8, d=8)}
    return {"kmeans": dict(n=10**6, d=16, k=64), "gmm": dict(n=2 * 10**5, d=16, k=32),
            "logsumexp": dict(n=10**4, m=1000), "cross_entropy": dict(n=4096, m=8192),
            "min_pairwise": dict(n=4096, m=4096, d=3), "three_deep": dict(n=10**4, m=16, d=16)}


def untuned_sizes(quick: bool) -> dict[str, dict[str, int]]:
    """`--set untuned`: programs written after the loop nest's mechanisms, to measure them on code no change
    was made for (attention and an MLP layer as maps over rows, an RBF kernel sum, logistic regression's
    loss, each row's largest prefix sum)."""
    if quick:
        return {"attention": dict(n=64, m=48, d=8), "mlp": dict(n=500, d=8, h=16), "rbf": dict(n=200, m=150, d=4),
                "logistic": dict(n=2000, d=8), "prefix_max": dict(n=100, m=40)}
    return {"attention": dict(n=2048, m=2048, d=32), "mlp": dict(n=10**5, d=32, h=64),
            "rbf": dict(n=2048, m=2048, d=8), "logistic": dict(n=10**6, d=32), "prefix_max": dict(n=10**4, m=256)}


def fresh_sizes(quick: bool) -> dict[str, dict[str, int]]:
    """`--set fresh`: programs written in session 51, after every mechanism up to it, and measured before any
    change for them: a two-layer network, layer normalisation of rows, each query's largest cosine similarity,
    a Huber regression loss, and the entropy of each row's softmax."""
    if quick:
        return {"mlp2": dict(n=500, d=8, h=16, o=4), "layernorm": dict(n=200, m=32),
                "cosine_max": dict(n=64, m=48, d=8), "huber": dict(n=2000, d=8), "entropy": dict(n=200, m=100)}
    return {"mlp2": dict(n=10**5, d=32, h=64, o=16), "layernorm": dict(n=10**5, m=256),
            "cosine_max": dict(n=2048, m=2048, d=32), "huber": dict(n=10**6, d=32), "entropy": dict(n=10**4, m=1000)}


CLASSES = 100  # the class_sums case's number of classes


def family_sizes(quick: bool) -> dict[str, dict[str, int]]:
    """`--set families`: programs of the families the earlier sets leave out, written in session 52 and
    measured before any change for them: a linear recurrence (a scan of affine maps, a user operator), a 1-d
    convolution reading its windows by index, a bilinear form per batch element (small matrix-vector
    products), each row's two largest values as a reduce with a user operator of two leaves, a loss over
    per-class sums (a histogram); then a log Mahalanobis distance per point (a captured matrix), a batch of
    matrix-vector products written with @, a smoothed total variation (static slices), a 5-point stencil
    on a periodic grid (a map of maps over iotas gathering neighbours); then NumPy-style pairwise Gaussian
    kernel sums by broadcasting, a polynomial by Horner's rule in a fold.loop, and logistic loss with X @ w;
    then (session 53) the logistic map iterated per element in a fold.loop, whose gradient reads the states
    the forward loop saves."""
    if quick:
        return {"recurrence": dict(n=1000), "conv1d": dict(n=1000, k=5), "bilinear": dict(n=300, d=4),
                "top2": dict(n=100, m=40), "class_sums": dict(n=2000, d=8), "mahalanobis": dict(n=500, d=6),
                "batched_matvec": dict(n=300, d=6), "total_variation": dict(n=1000), "stencil": dict(n=40, m=30),
                "broadcast_pairwise": dict(n=60, m=50, d=3), "horner": dict(n=1000, k=6),
                "logistic_matrix": dict(n=2000, d=8), "logistic_map": dict(n=1000)}
    return {"recurrence": dict(n=10**6), "conv1d": dict(n=10**6, k=16), "bilinear": dict(n=10**5, d=8),
            "top2": dict(n=10**4, m=256), "class_sums": dict(n=10**6, d=32), "mahalanobis": dict(n=10**5, d=32),
            "batched_matvec": dict(n=10**5, d=16), "total_variation": dict(n=10**7),
            "stencil": dict(n=2048, m=2048), "broadcast_pairwise": dict(n=2048, m=2048, d=8),
            "horner": dict(n=10**6, k=16), "logistic_matrix": dict(n=10**6, d=32), "logistic_map": dict(n=10**6)}


LOGISTIC_STEPS = 16  # iterations of the logistic map (families set)


def unseen_sizes(quick: bool) -> dict[str, dict[str, int]]:
    """`--set unseen`: programs written in session 58 and measured before any change for them: a recurrent
    network over each sequence (a fold.loop of a matrix-vector product in a map), softmax regression whose
    loss reads each row's score at its label (a gather at a traced index), a scan of affine maps per row (a
    user operator's scan inside a map), a pairwise ranking hinge (a map of a map of scalars), and a
    per-class logsumexp (a histogram with the logaddexp monoid)."""
    if quick:
        return {"rnn": dict(n=200, t=6, d=4), "softmax_regression": dict(n=2000, d=8, k=5),
                "row_recurrence": dict(n=100, m=40), "ranking_hinge": dict(n=300),
                "class_logsumexp": dict(n=2000, d=8)}
    return {"rnn": dict(n=10**4, t=32, d=16), "softmax_regression": dict(n=10**5, d=32, k=10),
            "row_recurrence": dict(n=10**4, m=256), "ranking_hinge": dict(n=4096),
            "class_logsumexp": dict(n=10**6, d=32)}


SETS = {"natural": sizes, "untuned": untuned_sizes, "fresh": fresh_sizes, "families": family_sizes,
        "numpy": numpy_style.sizes, "unseen": unseen_sizes, "numpy2": numpy_style.later_sizes}


def inputs(case: str, s: dict, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    if case in numpy_style.PROGRAMS:
        return numpy_style.inputs(case, s, rng)
    f32 = np.float32
    if case == "recurrence":
        return rng.uniform(0.5, 0.99, s["n"]).astype(f32), rng.normal(size=s["n"]).astype(f32)
    if case == "rnn":
        return (rng.normal(size=(s["d"], s["d"])) / np.sqrt(s["d"])).astype(f32), \
            rng.normal(size=(s["n"], s["t"], s["d"])).astype(f32)
    if case == "softmax_regression":
        return (0.2 * rng.normal(size=(s["k"], s["d"]))).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32), \
            rng.integers(0, s["k"], s["n"])
    if case == "row_recurrence":
        return rng.uniform(0.5, 0.99, (s["n"], s["m"])).astype(f32), rng.normal(size=(s["n"], s["m"])).astype(f32)
    if case == "ranking_hinge":
        return rng.normal(size=s["n"]).astype(f32), rng.normal(size=s["n"]).astype(f32)
    if case == "class_logsumexp":
        return (0.1 * rng.normal(size=s["d"])).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32), \
            rng.integers(0, CLASSES, s["n"])
    if case == "mahalanobis":
        S = rng.normal(size=(s["d"], s["d"])) / s["d"]
        return (S @ S.T).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32), rng.normal(size=s["d"]).astype(f32)
    if case == "batched_matvec":
        return (rng.normal(size=(s["n"], s["d"], s["d"])) / s["d"]).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32)
    if case == "total_variation":
        return (rng.normal(size=s["n"]).astype(f32),)
    if case == "horner":
        return (0.3 * rng.normal(size=s["k"])).astype(f32), rng.uniform(-1, 1, s["n"]).astype(f32)
    if case == "logistic_map":
        return rng.uniform(3.0, 3.9, s["n"]).astype(f32), rng.uniform(0.1, 0.9, s["n"]).astype(f32)
    if case == "conv1d":
        return rng.normal(size=s["n"]).astype(f32), (rng.normal(size=s["k"]) / s["k"]).astype(f32)
    if case == "bilinear":
        return rng.normal(size=(s["n"], s["d"], s["d"])).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32)
    if case == "class_sums":
        return (0.1 * rng.normal(size=s["d"])).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32), \
            rng.integers(0, CLASSES, s["n"])
    if case == "mlp2":
        return tuple((rng.normal(size=shape) / np.sqrt(shape[-1])).astype(f32)
                     for shape in ((s["h"], s["d"]), (s["o"], s["h"]), (s["n"], s["d"])))
    if case in ("layernorm", "entropy"):
        return rng.normal(size=(s["n"], s["m"])).astype(f32), rng.normal(size=s["m"]).astype(f32)
    if case in ("cosine_max", "broadcast_pairwise"):
        return tuple(rng.normal(size=(r, s["d"])).astype(f32) for r in (s["n"], s["m"]))
    if case == "huber":
        return (0.2 * rng.normal(size=s["d"])).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32), \
            rng.normal(size=s["n"]).astype(f32)
    if case == "attention":
        return tuple(rng.normal(size=(r, s["d"])).astype(f32) for r in (s["n"], s["m"], s["m"]))
    if case == "mlp":
        return (0.2 * rng.normal(size=(s["h"], s["d"]))).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32)
    if case == "rbf":
        return rng.normal(size=(s["n"], s["d"])).astype(f32), rng.normal(size=(s["m"], s["d"])).astype(f32)
    if case in ("logistic", "logistic_matrix"):
        return (0.2 * rng.normal(size=s["d"])).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32), \
            rng.choice(np.array([-1.0, 1.0], f32), s["n"])
    if case in ("prefix_max", "top2", "stencil"):
        return (rng.normal(size=(s["n"], s["m"])).astype(f32),)
    if case == "kmeans":
        return rng.normal(size=(s["k"], s["d"])).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32)
    if case == "gmm":
        return rng.normal(size=(s["k"], s["d"])).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32), \
            np.log(np.full(s["k"], 1.0 / s["k"], f32))
    if case == "logsumexp":
        return (rng.normal(size=(s["n"], s["m"])).astype(f32),)
    if case == "cross_entropy":
        targets = rng.integers(0, s["m"], s["n"])
        return rng.normal(size=(s["n"], s["m"])).astype(f32), np.eye(s["m"], dtype=f32)[targets]
    if case == "min_pairwise":
        return rng.normal(size=(s["n"], s["d"])).astype(f32), rng.normal(size=(s["m"], s["d"])).astype(f32)
    return rng.normal(size=(s["n"], s["m"], s["d"])).astype(f32), rng.normal(size=s["d"]).astype(f32)


def fold_natural(case: str) -> Callable:
    import fold

    if case in numpy_style.PROGRAMS:
        return numpy_style.PROGRAMS[case](np)
    M = fold.monoids
    if case == "recurrence":
        def compose(first, second):
            (a1, b1), (a2, b2) = first, second
            return a1 * a2, a2 * b1 + b2

        return lambda a, b: fold.sum(fold.scan(compose, (a, b), identity=(1.0, 0.0))[1] ** 2)
    if case == "rnn":
        def last_state(W, xs):
            return fold.loop(lambda t, h: fold.tanh(W @ h + xs[t]), xs[0] * 0.0, xs.shape[0])

        return lambda W, X: fold.sum(fold.map(lambda xs: fold.sum(last_state(W, xs) ** 2), X))
    if case == "softmax_regression":
        def loss(x, label, W):
            scores = fold.map(lambda w: fold.sum(w * x), W)
            return fold.reduce(M.logaddexp, scores) - scores[label]

        return lambda W, X, labels: fold.sum(fold.map(lambda x, t: loss(x, t, W), X, labels))
    if case == "row_recurrence":
        def compose(first, second):
            (a1, b1), (a2, b2) = first, second
            return a1 * a2, a2 * b1 + b2

        return lambda A, B: fold.sum(fold.map(
            lambda a, b: fold.sum(fold.scan(compose, (a, b), identity=(1.0, 0.0))[1] ** 2), A, B))
    if case == "ranking_hinge":
        return lambda s, y: fold.sum(fold.map(lambda si, yi: fold.sum(fold.map(
            lambda sj, yj: fold.maximum(0.0, 1.0 - (si - sj)) * fold.maximum(yi - yj, 0.0), s, y)), s, y))
    if case == "class_logsumexp":
        def loss(w, X, labels):
            scores = fold.map(lambda x: fold.sum(x * w), X)
            return fold.sum(fold.reduce_by_index(M.logaddexp, CLASSES, labels, scores))

        return loss
    if case == "mahalanobis":
        def distance(x, S, mu):
            d = x - mu
            return fold.sum(d * fold.map(lambda s: fold.sum(s * d), S))

        return lambda S, X, mu: fold.sum(fold.map(lambda x: fold.log(1.0 + distance(x, S, mu)), X))
    if case == "batched_matvec":
        return lambda As, xs: fold.sum(fold.map(lambda A, x: fold.sum(fold.tanh(A @ x)), As, xs))
    if case == "total_variation":
        return lambda x: fold.sum(fold.sqrt((x[1:] - x[:-1]) ** 2 + 1e-3))
    if case == "broadcast_pairwise":  # NumPy style: an (n, m, d) difference summed over d
        return lambda A, B: fold.sum(fold.exp(-fold.sum((A[:, None, :] - B[None, :, :]) ** 2, axis=2)))
    if case == "logistic_map":
        return lambda r, x: fold.sum(fold.loop(lambda i, a: r * a * (1.0 - a), x, LOGISTIC_STEPS))
    if case == "horner":
        return lambda c, x: fold.sum(fold.loop(lambda i, acc: acc * x + c[i], x * 0.0, c.shape[0]) ** 2)
    if case == "logistic_matrix":
        return lambda w, X, y: fold.sum(fold.log1p(fold.exp(-y * (X @ w))))
    if case == "stencil":
        def smoothed(X):
            n, m = X.shape
            return fold.map(lambda i: fold.map(lambda j: X[i][j] - 0.25 * (X[(i + 1) % n][j] + X[(i - 1) % n][j]
                                                                           + X[i][(j + 1) % m] + X[i][(j - 1) % m]),
                                               fold.iota(m)), fold.iota(n))

        return lambda X: fold.sum(smoothed(X) ** 2)
    if case == "conv1d":
        def conv(x, w):
            k = w.shape[0]
            return fold.map(lambda j: fold.sum(x[j + fold.iota(k)] * w), fold.iota(x.shape[0] - k + 1))

        return lambda x, w: fold.sum(fold.tanh(conv(x, w)))
    if case == "bilinear":
        return lambda As, xs: fold.sum(fold.map(lambda A, x: fold.sum(x * fold.map(lambda a: fold.sum(a * x), A)),
                                                As, xs))
    if case == "top2":
        def top_two(first, second):
            (a1, a2), (b1, b2) = first, second
            return fold.maximum(a1, b1), fold.maximum(fold.minimum(a1, b1), fold.maximum(a2, b2))

        def row(r):
            best, second = fold.reduce(top_two, (r, r * 0.0 - np.inf), identity=(-np.inf, -np.inf))
            return best + second

        return lambda X: fold.sum(fold.map(row, X))
    if case == "class_sums":
        def loss(w, X, labels):
            sums = fold.reduce_by_index(M.sum, CLASSES, labels, fold.map(lambda x: fold.sum(x * w), X))
            return fold.sum(fold.tanh(sums))

        return loss
    if case == "mlp2":
        def net(x, W1, W2):
            h = fold.map(lambda w: fold.tanh(fold.sum(x * w)), W1)
            out = fold.map(lambda v: fold.sum(v * h), W2)
            return fold.sum(out * out)

        return lambda W1, W2, X: fold.sum(fold.map(lambda x: net(x, W1, W2), X))
    if case == "layernorm":
        def normalised(x, g):
            mean = fold.sum(x) / x.shape[0]
            var = fold.sum((x - mean) * (x - mean)) / x.shape[0]
            return fold.sum(fold.tanh((x - mean) / fold.sqrt(var + 1e-5) * g))

        return lambda X, g: fold.sum(fold.map(lambda x: normalised(x, g), X))
    if case == "cosine_max":
        def best(q, K):
            return fold.reduce(M.max, fold.map(
                lambda k: fold.sum(q * k) / fold.sqrt(fold.sum(q * q) * fold.sum(k * k)), K))

        return lambda Q, K: fold.sum(fold.map(lambda q: best(q, K), Q))
    if case == "huber":
        def huber(r):
            return fold.where(fold.abs(r) < 1.0, 0.5 * r * r, fold.abs(r) - 0.5)

        return lambda w, X, y: fold.sum(fold.map(lambda x, t: huber(t - fold.sum(x * w)), X, y))
    if case == "entropy":
        def entropy(r, g):
            z = r * g
            e = fold.exp(z - fold.reduce(M.max, z))
            p = e / fold.sum(e)
            return -fold.sum(p * fold.log(p))

        return lambda X, g: fold.sum(fold.map(lambda r: entropy(r, g), X))
    if case == "attention":
        def attend(q, K, V):
            s = fold.map(lambda k: fold.sum(q * k), K)
            e = fold.exp(s - fold.reduce(M.max, s))
            return fold.sum(fold.map(lambda ej, v: ej * v, e, V), axis=0) / fold.sum(e)

        return lambda Q, K, V: fold.sum(fold.map(lambda q: attend(q, K, V), Q))
    if case == "mlp":
        return lambda W, X: fold.sum(fold.map(lambda x: fold.sum(fold.map(
            lambda w: fold.tanh(fold.sum(x * w)) * fold.tanh(fold.sum(x * w)), W)), X))
    if case == "rbf":
        return lambda X, Y: fold.sum(fold.map(lambda x: fold.sum(fold.map(
            lambda y: fold.exp(-0.5 * fold.sum((x - y) * (x - y))), Y)), X))
    if case == "logistic":
        return lambda w, X, y: fold.sum(fold.map(lambda x, t: fold.log(1.0 + fold.exp(-t * fold.sum(x * w))), X, y))
    if case == "prefix_max":
        return lambda X: fold.sum(fold.map(lambda r: fold.reduce(M.max, fold.scan(M.sum, r)), X))
    if case == "kmeans":
        return lambda C, P: fold.reduce(M.sum, fold.map(lambda p: fold.reduce(M.min, fold.map(
            lambda c: fold.reduce(M.sum, (p - c) * (p - c)), C)), P))
    if case == "gmm":
        return lambda Mu, X, logw: -fold.reduce(M.sum, fold.map(lambda x: fold.reduce(M.logaddexp, fold.map(
            lambda mu, lw: lw - 0.5 * fold.reduce(M.sum, (x - mu) * (x - mu)), Mu, logw)), X))
    if case == "logsumexp":
        return lambda X: fold.reduce(M.sum, fold.map(lambda r: fold.reduce(M.logaddexp, r), X))
    if case == "cross_entropy":
        return lambda L, T: fold.reduce(M.sum, fold.map(
            lambda r, t: fold.reduce(M.logaddexp, r) - fold.reduce(M.sum, r * t), L, T))
    if case == "min_pairwise":
        return lambda A, B: fold.reduce(M.min, fold.map(lambda a: fold.reduce(M.min, fold.map(
            lambda b: fold.reduce(M.sum, (a - b) * (a - b)), B)), A))
    return lambda X, w: fold.reduce(M.sum, fold.map(lambda m: fold.reduce(M.max, fold.map(
        lambda r: fold.reduce(M.logaddexp, fold.map(lambda x, v: fold.tanh(x * v), r, w)), m)), X))


def fold_best(case: str) -> Callable | None:
    """The matrix-product form, where there is one (k-means: |p|^2 - 2 C p + |c|^2)."""
    if case != "kmeans":
        return None
    from .bench_numba import kmeans_matmul

    return lambda C, P: kmeans_matmul(P, C)


def jax_natural(case: str) -> Callable:
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    if case in numpy_style.PROGRAMS:
        return numpy_style.PROGRAMS[case](jnp)
    vmap = jax.vmap
    if case == "recurrence":
        def compose(first, second):
            (a1, b1), (a2, b2) = first, second
            return a1 * a2, a2 * b1 + b2

        return lambda a, b: jnp.sum(jax.lax.associative_scan(compose, (a, b))[1] ** 2)
    if case == "rnn":
        def last_state(W, xs):
            return jax.lax.fori_loop(0, xs.shape[0], lambda t, h: jnp.tanh(W @ h + xs[t]), xs[0] * 0.0)

        return lambda W, X: jnp.sum(vmap(lambda xs: jnp.sum(last_state(W, xs) ** 2))(X))
    if case == "softmax_regression":
        def loss(x, label, W):
            scores = vmap(lambda w: jnp.sum(w * x))(W)
            return logsumexp(scores) - scores[label]

        return lambda W, X, labels: jnp.sum(vmap(lambda x, t: loss(x, t, W))(X, labels))
    if case == "row_recurrence":
        def compose(first, second):
            (a1, b1), (a2, b2) = first, second
            return a1 * a2, a2 * b1 + b2

        return lambda A, B: jnp.sum(vmap(lambda a, b: jnp.sum(jax.lax.associative_scan(compose, (a, b))[1] ** 2))(A, B))
    if case == "ranking_hinge":
        return lambda s, y: jnp.sum(vmap(lambda si, yi: jnp.sum(vmap(
            lambda sj, yj: jnp.maximum(0.0, 1.0 - (si - sj)) * jnp.maximum(yi - yj, 0.0))(s, y)))(s, y))
    if case == "class_logsumexp":
        def loss(w, X, labels):
            scores = vmap(lambda x: jnp.sum(x * w))(X)
            sums = jax.ops.segment_max(scores, labels, CLASSES)
            sums = sums + jnp.log(jax.ops.segment_sum(jnp.exp(scores - sums[labels]), labels, CLASSES))
            return jnp.sum(sums)

        return loss
    if case == "mahalanobis":
        def distance(x, S, mu):
            d = x - mu
            return jnp.sum(d * vmap(lambda s: jnp.sum(s * d))(S))

        return lambda S, X, mu: jnp.sum(vmap(lambda x: jnp.log(1.0 + distance(x, S, mu)))(X))
    if case == "batched_matvec":
        return lambda As, xs: jnp.sum(vmap(lambda A, x: jnp.sum(jnp.tanh(A @ x)))(As, xs))
    if case == "total_variation":
        return lambda x: jnp.sum(jnp.sqrt((x[1:] - x[:-1]) ** 2 + 1e-3))
    if case == "broadcast_pairwise":
        return lambda A, B: jnp.sum(jnp.exp(-jnp.sum((A[:, None, :] - B[None, :, :]) ** 2, axis=2)))
    if case == "logistic_map":
        return lambda r, x: jnp.sum(jax.lax.fori_loop(0, LOGISTIC_STEPS, lambda i, a: r * a * (1.0 - a), x))
    if case == "horner":
        return lambda c, x: jnp.sum(jax.lax.fori_loop(0, c.shape[0], lambda i, acc: acc * x + c[i], x * 0.0) ** 2)
    if case == "logistic_matrix":
        return lambda w, X, y: jnp.sum(jnp.log1p(jnp.exp(-y * (X @ w))))
    if case == "stencil":
        def smoothed(X):
            n, m = X.shape
            return vmap(lambda i: vmap(lambda j: X[i][j] - 0.25 * (X[(i + 1) % n][j] + X[(i - 1) % n][j]
                                                                   + X[i][(j + 1) % m] + X[i][(j - 1) % m]))(
                jnp.arange(m)))(jnp.arange(n))

        return lambda X: jnp.sum(smoothed(X) ** 2)
    if case == "conv1d":
        def conv(x, w):
            k = w.shape[0]
            return vmap(lambda j: jnp.sum(x[j + jnp.arange(k)] * w))(jnp.arange(x.shape[0] - k + 1))

        return lambda x, w: jnp.sum(jnp.tanh(conv(x, w)))
    if case == "bilinear":
        return lambda As, xs: jnp.sum(vmap(lambda A, x: jnp.sum(x * vmap(lambda a: jnp.sum(a * x))(A)))(As, xs))
    if case == "top2":
        return lambda X: jnp.sum(vmap(lambda r: jnp.sum(jax.lax.top_k(r, 2)[0]))(X))
    if case == "class_sums":
        def loss(w, X, labels):
            return jnp.sum(jnp.tanh(jax.ops.segment_sum(vmap(lambda x: jnp.sum(x * w))(X), labels, CLASSES)))

        return loss
    if case == "mlp2":
        def net(x, W1, W2):
            h = vmap(lambda w: jnp.tanh(jnp.sum(x * w)))(W1)
            out = vmap(lambda v: jnp.sum(v * h))(W2)
            return jnp.sum(out * out)

        return lambda W1, W2, X: jnp.sum(vmap(lambda x: net(x, W1, W2))(X))
    if case == "layernorm":
        def normalised(x, g):
            mean = jnp.sum(x) / x.shape[0]
            var = jnp.sum((x - mean) * (x - mean)) / x.shape[0]
            return jnp.sum(jnp.tanh((x - mean) / jnp.sqrt(var + 1e-5) * g))

        return lambda X, g: jnp.sum(vmap(lambda x: normalised(x, g))(X))
    if case == "cosine_max":
        return lambda Q, K: jnp.sum(vmap(lambda q: jnp.max(vmap(
            lambda k: jnp.sum(q * k) / jnp.sqrt(jnp.sum(q * q) * jnp.sum(k * k)))(K)))(Q))
    if case == "huber":
        def huber(r):
            return jnp.where(jnp.abs(r) < 1.0, 0.5 * r * r, jnp.abs(r) - 0.5)

        return lambda w, X, y: jnp.sum(vmap(lambda x, t: huber(t - jnp.sum(x * w)))(X, y))
    if case == "entropy":
        def entropy(r, g):
            z = r * g
            e = jnp.exp(z - jnp.max(z))
            p = e / jnp.sum(e)
            return -jnp.sum(p * jnp.log(p))

        return lambda X, g: jnp.sum(vmap(lambda r: entropy(r, g))(X))
    if case == "attention":
        def attend(q, K, V):
            s = vmap(lambda k: jnp.sum(q * k))(K)
            e = jnp.exp(s - jnp.max(s))
            return jnp.sum(vmap(lambda ej, v: ej * v)(e, V), axis=0) / jnp.sum(e)

        return lambda Q, K, V: jnp.sum(vmap(lambda q: attend(q, K, V))(Q))
    if case == "mlp":
        return lambda W, X: jnp.sum(vmap(lambda x: jnp.sum(vmap(
            lambda w: jnp.tanh(jnp.sum(x * w)) * jnp.tanh(jnp.sum(x * w)))(W)))(X))
    if case == "rbf":
        return lambda X, Y: jnp.sum(vmap(lambda x: jnp.sum(vmap(
            lambda y: jnp.exp(-0.5 * jnp.sum((x - y) * (x - y))))(Y)))(X))
    if case == "logistic":
        return lambda w, X, y: jnp.sum(vmap(lambda x, t: jnp.log(1.0 + jnp.exp(-t * jnp.sum(x * w))))(X, y))
    if case == "prefix_max":
        return lambda X: jnp.sum(vmap(lambda r: jnp.max(jnp.cumsum(r)))(X))
    if case == "kmeans":
        return lambda C, P: jnp.sum(vmap(lambda p: jnp.min(vmap(lambda c: jnp.sum((p - c) * (p - c)))(C)))(P))
    if case == "gmm":
        return lambda Mu, X, logw: -jnp.sum(vmap(lambda x: logsumexp(vmap(
            lambda mu, lw: lw - 0.5 * jnp.sum((x - mu) * (x - mu)))(Mu, logw)))(X))
    if case == "logsumexp":
        return lambda X: jnp.sum(vmap(logsumexp)(X))
    if case == "cross_entropy":
        return lambda L, T: jnp.sum(vmap(lambda r, t: logsumexp(r) - jnp.sum(r * t))(L, T))
    if case == "min_pairwise":
        return lambda A, B: jnp.min(vmap(lambda a: jnp.min(vmap(lambda b: jnp.sum((a - b) * (a - b)))(B)))(A))
    return lambda X, w: jnp.sum(vmap(lambda m: jnp.max(vmap(lambda r: logsumexp(jnp.tanh(r * w)))(m)))(X))


def program(case: str, impl: str, mode: str, args: tuple) -> Callable[[], Any] | None:
    """The timed call: f, its gradient with respect to the first argument (or every floating one), or a
    Hessian-vector product."""
    tangent = np.random.default_rng(1).normal(size=args[0].shape).astype(args[0].dtype)
    floats = tuple(k for k, a in enumerate(args) if np.issubdtype(a.dtype, np.floating))
    directions = tuple(np.random.default_rng(1 + k).normal(size=args[k].shape).astype(args[k].dtype) for k in floats)

    def hvp_all(grad, jvp):
        """The jvp of the gradient with respect to every floating argument, in a direction in each."""
        def gradient(*moved):
            merged = list(args)
            for k, m in zip(floats, moved, strict=True):
                merged[k] = m
            return grad(f, argnums=floats)(*merged)
        return lambda *a: jvp(gradient, tuple(a[k] for k in floats), directions)[1]
    if impl == "jax":
        import jax

        jax.config.update("jax_platforms", "cpu")
        f = jax_natural(case)
        g = jax.grad(f)
        fn = {"primal": f, "grad": g, "grad_all": jax.grad(f, argnums=floats),
              "hvp": lambda *a: jax.jvp(lambda x: g(x, *a[1:]), (a[0],), (tangent,))[1],
              "hvp_all": hvp_all(jax.grad, jax.jvp)}[mode]
        jitted = jax.jit(fn)
        return lambda: jax.block_until_ready(jitted(*args))
    import fold

    f = fold_natural(case) if impl == "fold" else fold_best(case)
    if f is None:
        return None
    g = fold.grad(f)
    zeros = tuple(np.zeros_like(a) for a in args[1:])
    fn = {"primal": f, "grad": g, "grad_all": fold.grad(f, argnums=floats),
          "hvp": lambda *a: fold.jvp(g, a, (tangent,) + zeros)[1],
          "hvp_all": hvp_all(fold.grad, fold.jvp)}[mode]
    jitted = fold.jit(fn)
    return lambda: jitted(*args)


def worker(spec: dict) -> dict:
    args = inputs(spec["case"], spec["sizes"])
    call = program(spec["case"], spec["impl"], spec["mode"], args)
    if call is None:
        return {"skipped": "no such form"}
    first = warm_up(call)
    samples = []
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        result = call()
        samples.append(time.perf_counter() - start)
        if sum(samples) > spec["budget"]:
            break
    del result
    before = _current_rss_bytes()
    reset_ok = _reset_peak_rss()
    result = call()
    peak = _peak_rss_bytes(reset_ok) - before
    out_bytes = sum(np.asarray(r).nbytes for r in (result if isinstance(result, (tuple, list)) else (result,)))
    return {"seconds": float(np.median(samples)), "samples": samples, "first_call_seconds": first,
            "peak_bytes": int(peak), "io_bytes": int(sum(a.nbytes for a in args) + out_bytes),
            "peak_source": "VmHWM reset before the call" if reset_ok else "ru_maxrss"}


def run_worker(spec: dict, timeout: float) -> dict:
    env = dict(os.environ, FOLD_KEEP_FREED_MEMORY="0", MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_natural", "--worker", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_natural", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--only", default="", help="comma-separated cases")
    parser.add_argument("--set", default="natural", choices=tuple(SETS),
                        help="the issue's cases, or programs written after the mechanisms (untuned_sizes, fresh_sizes)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per worker process")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES + EXTRA_MODES)} (default: {','.join(MODES)})")
    parser.add_argument("--out", default="", help="results/OUT.{json,png} (default: natural, natural_quick)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES + EXTRA_MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {list(MODES + EXTRA_MODES)}")
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return {}
    table = SETS[args.set](args.quick)
    chosen = [c for c in table if not args.only or c in args.only.split(",")]
    records = []
    for case in chosen:
        s = table[case]
        for mode in modes:
            row: dict[str, Any] = {"case": case, "mode": mode, "sizes": s}
            for impl in ("fold", "jax", "fold_best"):
                spec = {"case": case, "impl": impl, "mode": mode, "sizes": s, "repeats": args.repeats,
                        "budget": 20.0}
                row[impl] = run_worker(spec, args.timeout)
            fold_s = row["fold"].get("seconds")
            for ref in ("jax", "fold_best"):
                ref_s = row[ref].get("seconds")
                row[f"ratio_vs_{ref}"] = fold_s / ref_s if fold_s and ref_s else None
            peak, io = row["fold"].get("peak_bytes"), row["fold"].get("io_bytes")
            row["peak_over_io"] = peak / io if peak is not None and io else None
            records.append(row)
            print(_line(row), flush=True)
    payload = {"machine": machine(), "quick": args.quick, "records": records}
    name = args.out or (args.set + ("_quick" if args.quick else ""))
    write_json(RESULTS_DIR / f"{name}.json", payload)
    plot(records, name)
    return payload


def plot(records: list[dict], name: str) -> None:
    """results/<name>.png: each case's time against JAX's and fold's best form, with the targets."""
    bars = []
    for r in records:
        for ref, target in (("jax", 1.0), ("fold_best", 1.5)):
            if r.get(f"ratio_vs_{ref}") is not None:
                bars.append({"name": f"{r['case']} {r['mode']}", "reference": ref.replace("_", " "),
                             "ratio": r[f"ratio_vs_{ref}"], "target": target,
                             "passed": r[f"ratio_vs_{ref}"] <= target})
    plot_ratios(RESULTS_DIR / f"{name}.png", bars, "natural nested programs: fold numba backend / reference (time)",
                machine()["cpu"])


def _line(row: dict) -> str:
    def ms(r: dict) -> str:
        return f"{1e3 * r['seconds']:.1f} ms" if "seconds" in r else r.get("error", r.get("skipped", "?"))[:60]

    def mb(r: dict) -> str:
        return f"{r['peak_bytes'] / 2**20:.0f} MB" if "peak_bytes" in r else "-"

    return (f"{row['case']:>14} {row['mode']:>6}: fold {ms(row['fold'])} ({mb(row['fold'])}), jax {ms(row['jax'])} "
            f"({mb(row['jax'])}), best {ms(row['fold_best'])}; peak/io {row['peak_over_io'] or 0:.2f}")


if __name__ == "__main__":
    main()
