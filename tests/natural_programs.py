"""Programs written the natural way, as maps of maps with folds, that the loop-nest tests of every backend run."""

from __future__ import annotations

import fold

M = fold.monoids


def kmeans_cost(C, P):
    return fold.reduce(M.sum, fold.map(
        lambda p: fold.reduce(M.min, fold.map(lambda c: fold.reduce(M.sum, (p - c) * (p - c)), C)), P))


def min_pairwise_distance(A, B):
    return fold.reduce(M.min, fold.map(lambda a: fold.reduce(M.min, fold.map(
        lambda b: fold.reduce(M.sum, (a - b) * (a - b)), B)), A))


def gmm_objective(Mu, X, logw):
    """The negative log-likelihood of a mixture of unit Gaussians: a logsumexp over components per point."""
    return -fold.reduce(M.sum, fold.map(lambda x: fold.reduce(M.logaddexp, fold.map(
        lambda mu, lw: lw - 0.5 * fold.reduce(M.sum, (x - mu) * (x - mu)), Mu, logw)), X))


def three_deep(X, w):
    """A map of a map of a map, the innermost capturing a weight vector from the outermost scope."""
    return fold.reduce(M.sum, fold.map(lambda m: fold.reduce(M.max, fold.map(
        lambda r: fold.reduce(M.logaddexp, fold.map(lambda x, v: fold.tanh(x * v), r, w)), m)), X))


def ordered_fold(X):
    """A non-commutative operator (the composition of affine maps) over a map of a map: kept in order."""
    pairs = fold.map(lambda r: (fold.reduce(M.sum, fold.map(lambda x: 1.0 + 0.01 * x, r)),
                                fold.reduce(M.max, fold.map(lambda x: 0.1 * x, r))), X)
    return fold.reduce(lambda a, b: (a[0] * b[0], b[0] * a[1] + b[1]), pairs, identity=(1.0, 0.0))


def row_minima(C, P):
    """A map of a map with no consumer: the nest writes each row (a parallel map)."""
    return fold.map(lambda p: fold.reduce(M.min, fold.map(lambda c: fold.reduce(M.sum, (p - c) * (p - c)), C)), P)


def periodic_stencil_energy(X):
    """The squared residual of a 5-point smoothing on a periodic grid: a map of maps over iotas gathering each
    element's neighbours (whose gradient is a scatter-add of a gathered row per neighbour)."""
    n, m = X.shape
    smoothed = fold.map(lambda i: fold.map(lambda j: X[i][j] - 0.25 * (X[(i + 1) % n][j] + X[(i - 1) % n][j]
                                                                       + X[i][(j + 1) % m] + X[i][(j - 1) % m]),
                                           fold.iota(m)), fold.iota(n))
    return fold.sum(smoothed ** 2)
