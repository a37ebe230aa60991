"""The built-in demo that `fold demo` runs: small, and shipped in the package (examples/demo.py, what `make
demo` runs, lives in a checkout only). A program traced and printed, run, differentiated both ways, and the
two reduce rules of a monoid compared; each result checked against NumPy, so a broken install fails loudly."""

from __future__ import annotations

import time

import numpy as np


def main(n: int = 6, d: int = 3, seed: int = 0) -> None:
    """Run the demo on `n` rows of `d` features (printing as it goes); raises AssertionError on a wrong result."""
    import fold

    def f(xs, w):  # prod(xs @ w), as a map of sums folded by a product
        dots = fold.map(lambda x: fold.reduce(fold.monoids.sum, x * w), xs)
        return fold.reduce(lambda a, b: a * b, dots, identity=1.0)

    rng = np.random.default_rng(seed)
    xs, w = rng.random((n, d)), rng.random(d)
    print(f"fold {fold.__version__}: the program of f(xs, w) = prod(xs @ w), xs {xs.shape}, w {w.shape}")
    print(fold.trace(f, xs, w))
    start = time.perf_counter()
    y = fold.jit(f)(xs, w)
    print(f"f(xs, w) = {float(y):.6g} (first call, tracing and compiling included: {time.perf_counter() - start:.2f} s)")
    assert np.isclose(y, np.prod(xs @ w))

    gx, gw = fold.grad(f, argnums=(0, 1))(xs, w)
    dots = xs @ w
    others = np.array([np.prod(np.delete(dots, i)) for i in range(n)])
    assert np.allclose(gw, xs.T @ others) and np.allclose(gx, np.outer(others, w))
    _, ydot = fold.jvp(f, (xs, w), (np.ones_like(xs), np.zeros_like(w)))
    assert np.isclose(ydot, gx.sum())
    print(f"grad by vjp matches the closed form; jvp in the direction of ones = {float(ydot):.6g} = sum of grad xs")

    def logsumexp(x):
        return fold.reduce(fold.monoids.logaddexp, x)

    x = rng.standard_normal(1000)
    by_theorem = fold.grad(logsumexp, reduce_rule="monoid")(x)
    by_scans = fold.grad(logsumexp, reduce_rule="generic")(x)
    softmax = np.exp(x - np.logaddexp.reduce(x))
    assert np.allclose(by_theorem, softmax) and np.allclose(by_scans, softmax)
    print("logsumexp's gradient by Theorem 2.1 (one map) and by the generic rule (two scans) agree: the softmax")
    print("demo passed")
