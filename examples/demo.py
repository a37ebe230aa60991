"""The fold demo: a program traced, printed and run (grows as fold grows)."""

from __future__ import annotations

import numpy as np

import fold


def weighted_product(xs, w):
    """prod_i <xs_i, w>: a reduce inside a map, then a reduce with a user operator."""
    dots = fold.map(lambda x: fold.reduce(fold.monoids.sum, x * w), xs)
    return fold.reduce(lambda a, b: a * b, dots, identity=1.0)


def linear_recurrence(a, b):
    """x_t = a_t * x_{t-1} + b_t for all t at once: a scan with a non-commutative operator on pairs."""

    def compose(first, second):
        (a1, b1), (a2, b2) = first, second
        return a1 * a2, a2 * b1 + b2

    return fold.scan(compose, (a, b), identity=(1.0, 0.0))[1]


def main(n: int = 6, d: int = 3) -> None:
    rng = np.random.default_rng(0)
    xs, w = rng.uniform(0.5, 1.5, (n, d)), rng.uniform(0.5, 1.5, d)

    print("== weighted_product: the program fold traced ==")
    print(fold.trace(weighted_product, xs, w))
    value = fold.run(weighted_product, xs, w)
    print(f"\nfold.run  = {float(value):.12f}")
    print(f"np.prod(xs @ w) = {float(np.prod(xs @ w)):.12f}")

    a, b = rng.uniform(0.5, 1.0, 8), rng.normal(size=8)
    fast = fold.jit(linear_recurrence)
    xs_scan = fast(a, b)
    x, loop_xs = 0.0, []
    for at, bt in zip(a, b):
        x = at * x + bt
        loop_xs.append(x)
    print("\n== linear_recurrence by scan vs a Python loop ==")
    print("scan:", np.round(xs_scan, 6))
    print("loop:", np.round(loop_xs, 6))
    print(f"estimated peak memory of weighted_product: {fold.memory(weighted_product, xs, w)} bytes")


if __name__ == "__main__":
    main()
